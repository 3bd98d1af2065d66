"""``attnmetrics report RUN [RUN ...]``: re-render a run's report.md and figures, or compare
several runs into ``--out``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from attnmetrics.app.io import UnwritableFolder, check_folder_path, check_writable, is_run_folder, read_results
from attnmetrics.app.report import render, render_comparison


@dataclass(frozen=True)
class ReportArgs:
    run_dirs: list[Path]  # run folders holding results.json
    out: Path | None = None  # folder for comparison.md (needed with several runs)
    overwrite: bool = False  # replace an existing comparison.md


def report(args: ReportArgs) -> int:
    """The ``report`` subcommand: re-render one run's report.md (printed), or compare several runs
    into ``--out``/comparison.md, which it never replaces (nor writes into a run folder); 2 if refused."""
    runs = []
    for run in args.run_dirs:
        path = run / "results.json"
        if not path.is_file():
            print(f"attnmetrics: {run} is not a run folder (no results.json)", file=sys.stderr)
            return 2
        try:
            results = read_results(path)
        except ValueError as e:
            print(f"attnmetrics: {e}", file=sys.stderr)
            return 2
        runs.append((run.name, results))
    if len(runs) == 1 and args.out is None:
        print(render(runs[0][1], args.run_dirs[0]))
        return 0
    if args.out is None:
        print("attnmetrics: comparing several runs needs --out FOLDER for comparison.md", file=sys.stderr)
        return 2
    try:
        _check_comparison_out(args)
    except (FileExistsError, FileNotFoundError, UnwritableFolder) as e:
        print(f"attnmetrics: {e}", file=sys.stderr)
        return 2
    print(render_comparison(runs, args.out))
    return 0


def _check_comparison_out(args: ReportArgs) -> None:
    """Refuse an ``--out`` the comparison must not be written to, before any work: a path where no
    folder can be (:func:`~attnmetrics.app.io.check_folder_path`), a run folder, a folder holding a
    comparison.md without ``--overwrite``, a folder that cannot be written."""
    check_folder_path(args.out)
    if is_run_folder(args.out):
        raise FileExistsError(f"--out {args.out} is a run folder; write the comparison to a folder of its own")
    if (args.out / "comparison.md").exists() and not args.overwrite:
        raise FileExistsError(
            f"{args.out / 'comparison.md'} already exists; pass --overwrite to replace it, or choose another --out"
        )
    check_writable(args.out)
