"""``attnmetrics sweep CONFIG.toml``: run a grid of ``attnmetrics run`` cells, resumably, then
aggregate them into one report (:mod:`attnmetrics.app.aggregate`).

- :mod:`~attnmetrics.app.sweep.config`: the TOML format, its checks, the cells;
- :mod:`~attnmetrics.app.sweep.runner`: running the cells here, resume and status;
- :mod:`~attnmetrics.app.sweep.slurm`: the cells as Slurm jobs through submitit (optional).
"""

from __future__ import annotations

import argparse
import sys

from attnmetrics.app.sweep.config import SLURM_KEYS, Cell, Sweep, cell_command, load_config
from attnmetrics.app.sweep.runner import Runner, run_sweep

__all__ = ["Cell", "Sweep", "cell_command", "load_config", "main", "run_sweep"]


def main(args: argparse.Namespace) -> int:
    """The ``sweep`` subcommand: run (or list, or only aggregate) a config's cells, then write
    OUT/report.md, OUT/aggregate.json and the figures."""
    from attnmetrics.app.aggregate import aggregate_sweep

    try:
        slurm = {k: getattr(args, k) for k in SLURM_KEYS if getattr(args, k, None) is not None}
        sweep = load_config(args.config, args.out, args.jobs, args.executor, slurm, dict(args.data_dir or ()))
    except (ValueError, FileNotFoundError) as e:
        print(f"attnmetrics sweep: {e}", file=sys.stderr)
        return 2
    missing = [] if args.report_only else sweep.missing_data()
    if missing:  # before any cell starts, not as a failure in each cell's log
        for line in missing:
            print(f"attnmetrics sweep: {line}", file=sys.stderr)
        return 2
    if args.dry_run:
        for c in sweep.cells:
            state = "done" if c.is_done(sweep.out) else "todo"
            print(f"{state}\t{c.grid}/{c.name}\t{' '.join(cell_command(c, sweep.out)[3:])}")
        print(f"{len(sweep.cells)} cells in {sweep.out}", file=sys.stderr)
        return 0
    rc = 0
    if not args.report_only:
        try:
            runner = Runner
            if sweep.executor != "local":
                from attnmetrics.app.sweep.slurm import SubmititRunner  # submitit: an optional extra

                runner = SubmititRunner
            rc = run_sweep(sweep, args.overwrite, progress=not args.no_progress, runner_type=runner)
        except FileExistsError as e:
            print(f"attnmetrics sweep: {e}", file=sys.stderr)
            return 2
        if rc in (2, 130):
            return rc
    path = aggregate_sweep(sweep)
    print(f"wrote {path}", file=sys.stderr)
    return rc
