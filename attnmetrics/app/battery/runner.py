"""The faithfulness battery on a trained model's test split (J&W 2019; S&S 2019; DeYoung et al.
2020; T&Š 2020's single-token-input test): every registered experiment, block by block.

Runs per evaluation batch and gathers per-instance results, so memory stays bounded by
the batch size whatever the size of the test set.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnmetrics.app.battery.block import Block, Progress, Run
from attnmetrics.app.battery.flip import DEFAULT_ORDERS
from attnmetrics.app.battery.registry import Context, Settings, chosen, experiments, importances
from attnmetrics.eraser import AOPCS, NAMED_FRACTIONS, ROUNDINGS
from attnmetrics.permutation import draw_seed
from attnmetrics.single_removal import RANDOM_AMONG

#: the experiments a run can choose (``--skip``), in the order they run
EXPERIMENTS = tuple(e.name for e in experiments() if e.skippable)
#: the experiments that draw at random, each from a seed of its own
RANDOM_EXPERIMENTS = ("flip", "permutation", "adversarial", "single_removal", "eraser")


@dataclass(frozen=True)
class BatteryConfig:
    """The battery's settings (the command line's battery flags).

    ``options``: the optional importances' options by ``dest`` (e.g. ``{"integrated_gradients":
    50, "input_x_gradient": True}``); ``never_flipped``: the fraction a row that never flips
    counts as (NaN: left out, S&S; 1.0: Mohankumar et al. 2020); ``random_removal``: the tokens
    the random single removal draws among (``attnmetrics.single_removal``'s ``random_among``:
    ``"non_top"``, S&S; ``"all"``; ``"not_first"``, S&S's code as it runs); ``eraser_rounding``:
    k from ERASER's fractions (``"ceil"``: ceil(f L); ``"floor"``: floor(f L), k = 0 not counted;
    ``"decompx"``: DecompX's floor, k = 0 counted); ``eraser_aopc``, ``eraser_fractions`` (a name of
    ``attnmetrics.eraser.NAMED_FRACTIONS``) and ``eraser_mask_token`` (None: delete; an id: mask): the
    ERASER step's (attnmetrics/app/battery/eraser.py).
    """

    experiments: Sequence[str] = EXPERIMENTS
    orders: Sequence[str] = DEFAULT_ORDERS
    seed: int = 0
    random_samples: int = 1
    never_flipped: float = float("nan")
    random_removal: str = "non_top"
    eraser_rounding: str = "ceil"
    eraser_aopc: str = "eraser"
    eraser_fractions: str = "eraser"
    eraser_mask_token: int | None = None
    permutations: int = 100
    adversarial_steps: int = 500
    adversarial_diversity: float = 1.0
    adversarial_amsgrad: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        unknown = set(self.experiments) - set(EXPERIMENTS)
        if unknown:
            raise ValueError(f"unknown experiments {sorted(unknown)}; choose from {EXPERIMENTS}")
        if self.random_removal not in RANDOM_AMONG:
            raise ValueError(f"random_removal must be one of {RANDOM_AMONG}, got {self.random_removal!r}")
        if self.eraser_rounding not in ROUNDINGS:
            raise ValueError(f"eraser_rounding must be one of {ROUNDINGS}, got {self.eraser_rounding!r}")
        if self.eraser_aopc not in AOPCS:
            raise ValueError(f"eraser_aopc must be one of {AOPCS}, got {self.eraser_aopc!r}")
        if self.eraser_fractions not in NAMED_FRACTIONS:
            raise ValueError(f"eraser_fractions must be one of {tuple(NAMED_FRACTIONS)}, got {self.eraser_fractions!r}")

    @property
    def settings(self) -> Settings:
        return Settings(tuple(self.experiments), dict(self.options))


def battery_parts(chosen_experiments: Sequence[str]) -> list[str]:
    """The steps the battery runs on each instance block: the forward pass, then each chosen
    experiment in :data:`EXPERIMENTS`' order (one that runs within another's step, such as
    leave-one-out within Kendall's, only with it)."""
    return ["forward"] + [
        e.name
        for e in experiments()
        if e.skippable and e.name in chosen_experiments and (e.within is None or e.within in chosen_experiments)
    ]


def experiment_seeds(seed: int) -> dict[str, int]:
    """One int64 seed per experiment that draws at random, derived from the run's ``seed``, so
    the experiments' draws are independent of each other (and of the batches: KeyedRows)."""
    g = torch.Generator().manual_seed(seed)
    return {name: draw_seed(g) for name in RANDOM_EXPERIMENTS}


def _runs(experiment, block: Block) -> bool:
    if experiment.step is None:
        return False
    return experiment.runs(block) if experiment.runs else block.chose(experiment.name)


def collect(
    model: torch.nn.Module,
    batches: Iterable[tuple[int, Tensor, Tensor]],
    *,
    progress: bool = True,
    on_block: Callable[[int, dict[str, np.ndarray], dict[str, float]], None] | None = None,
    **config,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The battery's per-instance values over ``batches`` of (first, tokens [B, T] int64,
    lengths [B] int64), special tokens included, on the model's device (each batch is moved
    there); ``config``: the fields of :class:`BatteryConfig`. ``first`` is the global index of
    the batch's first instance, which keys every random draw of its rows
    (:class:`attnmetrics.KeyedRows`), so an instance's values do not depend on the batch it is
    in or on the process that runs it (``torchrun``, one share of the batches per rank).

    Returns (values, seconds): ``values[name]`` an array with one entry (a row of
    ``random_samples`` for the random flip order) per instance, ``values["instance"]`` the
    global indices; ``seconds[part]`` wall time summed over the batches (the forward pass, each
    experiment; Kendall's importances apart from the τ themselves). Raises ``ValueError`` for an
    experiment that is not in :data:`EXPERIMENTS`.
    """
    cfg = BatteryConfig(**config)
    model.eval()
    device = next(model.parameters()).device  # batches run where the model is
    run = Run(cfg, cfg.settings, chosen(model, cfg.settings), experiment_seeds(cfg.seed))
    acc: dict[str, list[Tensor]] = defaultdict(list)  # per-instance tensors, concatenated at the end
    seconds: dict[str, float] = defaultdict(float)  # wall time of each experiment, over all batches
    batches = list(batches)
    with contextlib.closing(Progress(len(batches), battery_parts(cfg.experiments), progress)) as bar:
        for index, (first, tokens, lengths) in enumerate(batches):
            mine: dict[str, list[Tensor]] = defaultdict(list)
            spent: dict[str, float] = defaultdict(float)
            block = Block(run, model, mine, spent, bar, index)
            block.forward(first, tokens.to(device), lengths.to(device))
            for experiment in experiments():
                if _runs(experiment, block):
                    if experiment.skippable:
                        block.start(experiment.name)
                    experiment.step(block)
            if on_block is not None:
                on_block(first, {k: torch.cat(v).cpu().numpy() for k, v in mine.items()}, dict(spent))
            for k, v in mine.items():
                acc[k].extend(v)
            for k, v in spent.items():
                seconds[k] += v
    return {k: torch.cat(v).cpu().numpy() for k, v in acc.items()}, dict(seconds)


def merge(parts: Sequence[tuple[dict[str, np.ndarray], dict[str, float]]]) -> tuple[dict, dict]:
    """:func:`collect`'s outputs on disjoint shares of the instances, as one: values in instance
    order, seconds summed (the processes' total, not the wall time)."""
    parts = [(x, s) for x, s in parts if len(x.get("instance", ()))]
    if not parts:
        return {}, {}
    order = np.argsort(np.concatenate([x["instance"] for x, _ in parts]), kind="stable")
    values = {k: np.concatenate([x[k] for x, _ in parts])[order] for k in parts[0][0]}
    seconds: dict[str, float] = defaultdict(float)
    for _, s in parts:
        for k, v in s.items():
            seconds[k] += v
    return values, dict(seconds)


def summarise(x: dict[str, np.ndarray], seconds: dict[str, float], class_names: Sequence[str], **config) -> tuple:
    """(summary, instances) for ``results.json`` from :func:`collect`'s (merged) values, each
    experiment's under its name; ``summary["seconds"]`` the rounded wall times. ``config``: the
    fields of :class:`BatteryConfig` (those that the summaries record)."""
    cfg = BatteryConfig(**config)
    context = Context(x["lengths"], x["predicted"], x["max_attention"], tuple(class_names), cfg)
    summary: dict = {"seconds": {k: round(v, 3) for k, v in seconds.items()}}
    instances: dict = {
        "predicted": context.predicted.tolist(),
        "lengths": context.lengths.tolist(),
        "max_attention": context.max_attention.tolist(),
    }
    for experiment in experiments():
        chosen_here = experiment.name in cfg.experiments or not experiment.skippable
        done = experiment.summarise(x, context) if experiment.summarise and chosen_here else None
        if done is not None:
            summary[experiment.name] = done[0]
            if done[1]:  # a section built from the others' values has none of its own
                instances[experiment.name] = done[1]
    return summary, instances


def run_conventions(config: BatteryConfig) -> dict[str, str]:
    """Every registered experiment's and importance's definitions for ``results.json``
    "conventions", whether or not the run chose it (the record says what each would mean)."""
    out: dict[str, str] = {}
    for experiment in experiments():
        if experiment.conventions:
            out.update(experiment.conventions(config))
    for importance in importances():
        out.update(importance.conventions)
    return out
