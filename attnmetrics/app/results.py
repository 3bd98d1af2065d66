"""results.json's schema: :class:`Results`, what ``run``, ``train`` and ``evaluate`` write into a
run folder, key by key, in the order they are written; and :func:`new_results`, its first keys.

Types only: the values are plain JSON (dicts, lists, numbers, strings), as the report
(:mod:`attnmetrics.app.report`), the per-instance table (:mod:`attnmetrics.app.table`) and the
sweep's aggregation (:mod:`attnmetrics.app.aggregate`) read them.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import scipy
import torch

import attnmetrics
from attnmetrics.app.config import RunConfig


class Versions(TypedDict):
    attnmetrics: str
    python: str
    torch: str
    numpy: str
    scipy: str


class Data(TypedDict, total=False):
    """The data set: filled once the splits are loaded (``glove_coverage`` first, while the
    GloVe-initialised model is built; ``vocabulary`` and ``info`` after training only)."""

    glove_coverage: float  # the fraction of the vocabulary (specials aside) found in GloVe
    name: str
    classes: list[str]
    sizes: dict[str, int]  # train, dev, test
    vocabulary: int
    info: dict[str, Any]


class WallTimes(TypedDict, total=False):
    """Seconds: training, the battery (``experiments``, ``per_experiment``; ``per_rank`` under
    torchrun), W&P's experiments and the whole command (``total``)."""

    training: float
    experiments: float
    per_experiment: dict[str, float]
    per_rank: list[float]
    consistent_adversary: float
    diagnostic: float
    total: float


class Distributed(TypedDict, total=False):
    """Under torchrun: the ranks, the backend and each rank's share of the test instances."""

    ranks: int
    backend: str
    instances: list[int]


class Training(TypedDict):
    config: dict[str, Any]  # models/training.py's train_config_dict
    best_epoch: int
    best_dev: dict[str, float]
    history: list[dict[str, Any]]


class Results(TypedDict, total=False):
    """results.json. Written by every command: ``command`` to ``wall_time_s``, then the model
    (``split_seed``, ``model``; ``pretrained`` and ``training`` when trained), ``protocol`` and the
    test metrics; by ``run`` and ``evaluate`` the battery (``battery`` when it does not test an
    attention head, the experiments' summaries, ``instances``, ``conventions``, ``examples``); by
    ``run`` also W&P's experiments when asked for."""

    command: str  # run, train or evaluate
    config: dict[str, Any]  # RunConfig.to_dict(); evaluate adds the checkpoint's ``dataset``
    seed: int
    device: str
    threads: int
    versions: Versions
    machine: str
    data: Data
    wall_time_s: WallTimes
    distributed: Distributed  # only under torchrun
    resumable: dict[str, Any]  # only under --resumable: its blocks, those resumed, their commits
    pretrained: dict[str, Any] | None  # GPT-1's and Hugging Face models' checkpoint; None from scratch
    model: dict[str, Any]  # the model's config.to_dict()
    training: Training
    split_seed: int
    protocol: dict[str, Any]  # the --protocol preset's to_dict()
    test: dict[str, Any] | None  # prediction_metrics of the test split (None on ranks other than 0)
    battery: str  # what the battery tests when it is not the model's attention head
    # and, beside these, each battery experiment's summary under its name (flip, kendall, heads,
    # permutation, ...: app/battery/runner.py's summarise), for the experiments that ran; a module
    # added to app/battery/ adds its key with no change here
    instances: dict[str, Any]  # per-instance values (also instances.parquet)
    conventions: dict[str, str]  # app/conventions.py
    consistent_adversary: dict[str, Any]  # W&P 2019 (--consistent-adversary)
    diagnostic: dict[str, Any]  # W&P 2019 (--diagnostic)
    examples: list[dict[str, Any]]  # report.html's token view (--examples)


def source_commit() -> str | None:
    """The git commit the attnmetrics package runs from, ``+dirty`` when tracked files differ from it
    (the numbers then come from code no commit holds); None outside a git checkout (an installed
    wheel) or without git."""
    root = Path(attnmetrics.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def environment(seed: int, device: str = "cpu") -> dict:
    """results.json's ``seed``, ``device``, ``threads``, ``versions`` and ``machine``."""
    return {
        "seed": seed,
        "device": device,
        "threads": torch.get_num_threads(),
        "versions": {
            "attnmetrics": attnmetrics.__version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "commit": source_commit(),
        },
        "machine": platform.platform(),
    }


def new_results(config: RunConfig) -> Results:
    """results.json's first keys, before any work: the command, its flags and the environment."""
    return {
        "command": config.command,
        "config": config.to_dict(),
        **environment(config.seed, config.device),
        "data": {},
        "wall_time_s": {},
    }
