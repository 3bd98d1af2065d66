"""``attnmetrics``: train an attention classifier on real data, run the faithfulness battery,
write a report.

    attnmetrics run --dataset mr --out runs/mr-lstm            # train + experiments + report
    attnmetrics run --dataset sst --data-dir path/to/sst
    attnmetrics train --dataset sst --data-dir DIR --out runs/sst-model
    attnmetrics evaluate runs/sst-model --out runs/sst-eval      # experiments on a saved model
    attnmetrics report runs/sst-lstm                             # re-render report.md and figures
    attnmetrics report runs/sst-lstm runs/sst-average --out runs/compare   # compare runs
    attnmetrics sweep configs/sweep.toml --jobs 2                # a grid of runs + one aggregated report

The dispatch only: the options are :mod:`attnmetrics.app.parser`'s, each subcommand is a module of
:mod:`attnmetrics.app.commands` taking its typed arguments (``run``, ``train`` and ``evaluate`` a
:class:`~attnmetrics.app.config.RunConfig`), built here from argparse's namespace.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

import torch

from attnmetrics.app import distributed
from attnmetrics.app.commands import args_from
from attnmetrics.app.commands.evaluate import evaluate
from attnmetrics.app.commands.pretrain import PretrainArgs, pretrain
from attnmetrics.app.commands.report import ReportArgs, report
from attnmetrics.app.commands.run import run
from attnmetrics.app.commands.sweep import SweepArgs, sweep
from attnmetrics.app.commands.train import train
from attnmetrics.app.config import RunConfig
from attnmetrics.app.distributed import World
from attnmetrics.app.errors import INPUT_ERRORS, input_error
from attnmetrics.app.parser import build_parser
from attnmetrics.app.recipes import recipe_defaults
from attnmetrics.models.parallel import StrayLaunch

#: the subcommands that train or test a model: each takes a RunConfig and the torchrun world
RUNS = {"run": run, "train": train, "evaluate": evaluate}
#: the other subcommands' typed arguments
ARGS = {"report": ReportArgs, "sweep": SweepArgs, "pretrain": PretrainArgs}


def _typed(args: argparse.Namespace) -> RunConfig | ReportArgs | SweepArgs | PretrainArgs:
    """The subcommand's typed arguments: the one place that reads argparse's namespace for it."""
    if args.command in RUNS:
        return RunConfig.from_namespace(args)
    return args_from(ARGS[args.command], args)


def _exit_on_sigterm(signum, frame):
    # SIGTERM (a sweep stopping its cells, a scheduler's time limit) unwinds like Ctrl-C, so the
    # run folder's claim is given back and partial outputs are named, instead of a silent kill.
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("run", "train"):
        try:
            recipe_defaults(args)
        except ValueError as e:
            print(f"attnmetrics: {e}", file=sys.stderr)
            return 2
    typed = _typed(args)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.command == "report":
        return report(typed)
    if args.command == "sweep":
        return sweep(typed)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"attnmetrics: --device cuda, but torch sees no CUDA GPU (torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}); use --device cpu",
            file=sys.stderr,
        )
        return 2
    if args.device == "cuda":  # deterministic cuBLAS (read when its first handle is made)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        w = distributed.world()
    except StrayLaunch as e:
        print(f"attnmetrics: {e}", file=sys.stderr)
        return 2
    if w.size == 1:
        return _command(args.command, typed, w)
    if getattr(args, "consistent_adversary", None) or getattr(args, "diagnostic", False):
        print(
            f"attnmetrics: under torchrun ({w.size} ranks), --consistent-adversary and --diagnostic are not "
            "sharded; run them as one process",
            file=sys.stderr,
        )
        return 2
    try:
        distributed.start(w, args.device)
    except RuntimeError as e:
        print(f"attnmetrics: {e}", file=sys.stderr)
        return 2
    code = _command(args.command, typed, w)
    # Only a rank that succeeded leaves the group, once every rank has: tearing down a group
    # while another rank may still be in a collective with it can abort the process or hang.
    # A rank that fails exits as it is, and torchrun stops the others.
    if code == 0:
        distributed.stop()
    return code


def _command(command: str, typed: RunConfig | PretrainArgs, w: World) -> int:
    if command == "pretrain":
        try:
            return pretrain(typed, w)
        except INPUT_ERRORS as e:
            return input_error(e, typed.debug)
    return RUNS[command](typed, w)


if __name__ == "__main__":
    sys.exit(main())
