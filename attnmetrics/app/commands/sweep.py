"""``attnmetrics sweep CONFIG.toml``: run a grid of ``attnmetrics run`` cells, resumably, then
aggregate them into one report (:mod:`attnmetrics.app.sweep`, :mod:`attnmetrics.app.aggregate`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from attnmetrics.app.io import UnwritableFolder, check_folder_path, check_writable
from attnmetrics.app.sweep import Runner, cell_command, load_config, run_sweep
from attnmetrics.app.sweep.config import SLURM_KEYS
from attnmetrics.app.sweep.runner import cell_state, invalid_cells

#: files only a sweep writes in its folder: a folder holding one is a sweep's own
SWEEP_FILES = ("status.json", "aggregate.json", ".sweep.lock")


def refuse_out(out: Path, overwrite: bool) -> str | None:
    """Why the sweep must not write into the folder ``out`` (None: it may; a file is
    :func:`~attnmetrics.app.io.check_folder_path`'s): a run folder (its report.md and
    instances.parquet are the run's); or a folder of other files, neither empty nor a sweep's own
    (:data:`SWEEP_FILES`), unless ``overwrite``."""
    if not out.is_dir():
        return None
    if (out / "results.json").is_file():
        return f"--out {out} is a run folder (results.json); choose a folder of its own for the sweep"
    if overwrite or not any(out.iterdir()) or any((out / f).exists() for f in SWEEP_FILES):
        return None
    return (
        f"--out {out} is not a sweep folder (no {', '.join(SWEEP_FILES)}) and is not empty: its report.md, "
        "sweep.toml, ... would be replaced; choose a new folder, or pass --overwrite to write the sweep into it"
    )


@dataclass(frozen=True)
class SweepArgs:
    """``sweep``'s flags (attnmetrics/app/parser.py has their help); None: the config's."""

    config: Path
    out: Path | None
    jobs: int | None
    data_dir: list[tuple[str, Path]] | None  # --data-dir DATASET=FOLDER, repeated
    executor: str | None
    partition: str | None
    time_min: int | None
    gpus: int | None
    cpus: int | None
    mem_gb: int | None
    dry_run: bool
    report_only: bool
    overwrite: bool
    no_progress: bool


def sweep(args: SweepArgs) -> int:
    """The ``sweep`` subcommand: run (or list, or only aggregate) a config's cells, then write
    OUT/report.md, OUT/aggregate.json and the figures."""
    from attnmetrics.app.aggregate import aggregate_sweep

    flag = "--out" if args.out else f"{args.config}'s [sweep] out"
    try:
        if args.out is not None:  # as given: reading the config resolves its links
            check_folder_path(args.out)
        slurm = {k: getattr(args, k) for k in SLURM_KEYS if getattr(args, k) is not None}
        grid = load_config(args.config, args.out, args.jobs, args.executor, slurm, dict(args.data_dir or ()))
        check_folder_path(grid.out, flag)
    except (ValueError, FileNotFoundError, FileExistsError, UnwritableFolder) as e:
        print(f"attnmetrics sweep: {e}", file=sys.stderr)
        return 2
    missing = [] if args.report_only else [*invalid_cells(grid), *grid.missing_data()]
    if missing:  # before any cell starts, not as a failure in each cell's log
        for line in missing:
            print(f"attnmetrics sweep: {line}", file=sys.stderr)
        return 2
    if args.dry_run:
        for c in grid.cells:
            state = cell_state(c, grid.out)
            print(f"{state}\t{c.grid}/{c.name}\t{' '.join(cell_command(c, grid.out)[3:])}")
        print(f"{len(grid.cells)} cells in {grid.out}", file=sys.stderr)
        return 0
    if refused := refuse_out(grid.out, args.overwrite):
        print(f"attnmetrics sweep: {refused}", file=sys.stderr)
        return 2
    try:
        check_writable(grid.out, flag)
    except UnwritableFolder as e:
        print(f"attnmetrics sweep: {e}", file=sys.stderr)
        return 2
    rc = 0
    if not args.report_only:
        try:
            runner = Runner
            if grid.executor != "local":
                from attnmetrics.app.sweep.slurm import SubmititRunner  # submitit: an optional extra

                runner = SubmititRunner
            rc = run_sweep(grid, args.overwrite, progress=not args.no_progress, runner_type=runner)
        except FileExistsError as e:
            print(f"attnmetrics sweep: {e}", file=sys.stderr)
            return 2
        if rc in (2, 130):
            return rc
    path = aggregate_sweep(grid)
    print(f"wrote {path}", file=sys.stderr)
    return rc
