"""The battery's two registries: its experiments and the token importances it sets beside attention.

Every module of this package declares what it adds, as a module-level ``EXPERIMENT``
(:class:`Experiment`) and/or ``IMPORTANCE`` (:class:`Importance`); :func:`experiments` and
:func:`importances` find them. Adding an experiment or an importance to the battery is adding one
module here (and its test): collection, timing, progress, summaries, the report's section and
figure, the conventions written to ``results.json``, the sweep's aggregate rows and (for an
importance) its command-line flag, the Kendall pairs, flip and ERASER orders and the token view
all follow from the declaration. ``docs/architecture.md`` walks through one.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnmetrics._validation import DEFAULT_MEMORY_BUDGET

#: The most working memory a battery procedure's chunk of rows may hold on a GPU
GPU_MEMORY_BUDGET = 4 * 2**30


def memory_budget(device: torch.device) -> int:
    """Bytes of working memory a battery procedure's chunk of rows may hold on ``device``: the
    procedures' default (256 MiB) on the CPU, where chunks that size already run at the
    arithmetic's pace; on a GPU up to :data:`GPU_MEMORY_BUDGET` and at most an eighth of the
    device's free memory, so SST's test set is one chunk: every chunk repeats its launches
    (the adversary's 500 optimiser steps; the attributions' per-layer calls), which on a GPU
    cost more than the arithmetic."""
    if device.type != "cuda":
        return DEFAULT_MEMORY_BUDGET
    free, _ = torch.cuda.mem_get_info(device)
    return max(DEFAULT_MEMORY_BUDGET, min(GPU_MEMORY_BUDGET, free // 8))


@dataclass(frozen=True)
class Settings:
    """What the run asked for that decides which importances it computes: the battery's
    experiments and the importances' options (each :attr:`Importance.option`'s value by its
    ``dest``, e.g. ``{"integrated_gradients": 50}``; an option left out has its default)."""

    experiments: Sequence[str] = ()
    options: Mapping[str, Any] = field(default_factory=dict)

    def option(self, dest: str) -> Any:
        """The value of the importance option ``dest``: the run's, else the option's default."""
        if dest in self.options:
            return self.options[dest]
        return next(i.option["default"] for i in importances() if i.option and i.option["dest"] == dest)


@dataclass(frozen=True)
class Importance:
    """One token importance of the battery.

    ``compute(model, tokens, lengths, settings)`` returns ``[B, T - lead]`` scores over each row's
    real tokens; ``enabled(model, settings)`` says whether the run computes it (``model`` is None
    when asked before any model exists). ``flip_order``: the flip search also removes tokens in
    its order (False where the flip search has the order already, or never took it);
    ``head_partner``: each head of a transformer's own attention gets a τ against it (not
    rollout, which mixes every layer's heads). ``experiment``: the battery experiment that turns
    it on, which then is a step of its own in the progress bar. ``option``: the keyword
    arguments of its command-line flag (``argparse``'s ``add_argument``, with ``"flags"`` and
    ``"dest"``), when the run asks for it by one; ``package``: (module to import, its name for
    the user), an optional dependency checked before any training. ``conventions``: the
    definition written to ``results.json`` under "conventions". ``on``: the option's value when
    ``--importances`` names it (by its ``dest``) and its own flag does not turn it on already.
    """

    name: str  # its key in results: "kendall/attention vs NAME", "eraser/NAME/...", "flip/NAME"
    compute: Callable[[Any, Tensor, Tensor, Settings], Tensor]
    enabled: Callable[[Any, Settings], bool]
    order: int  # its place among the importances (the Kendall pairs, the token view)
    flip_order: bool = True
    head_partner: bool = True
    experiment: str | None = None
    option: Mapping[str, Any] | None = None
    package: tuple[str, str] | None = None
    conventions: Mapping[str, str] = field(default_factory=dict)
    on: Any = True  # its option's value when ``--importances`` names it (a flag's True; IG's STEPS)


@dataclass(frozen=True)
class Context:
    """What every experiment's summary reads beside its own values: the instances' lengths (real
    tokens), predicted classes and largest attention weights (each ``[N]`` numpy), the class
    names and the battery's configuration."""

    lengths: np.ndarray
    predicted: np.ndarray
    max_attention: np.ndarray
    class_names: Sequence[str]
    config: Any  # runner.BatteryConfig


@dataclass(frozen=True)
class Experiment:
    """One experiment of the battery, or one section of the report written by a procedure outside it.

    - ``step(block)``: runs it on one instance block (``block.Block``), keeping per-instance
      tensors under keys ``"NAME/..."``; None for an experiment that runs within another's step
      (``within``: leave-one-out within Kendall's) or outside the battery (W&P's trainings).
    - ``summarise(values, context)``: ``(summary, instances)`` for ``results.json`` from every
      block's values, or None when the values hold nothing of it.
    - ``section(results)``: its lines of ``report.md``; ``figure(results, folder)``: its PNG's
      name (or None), shown below the section with ``alt`` as the alternative text.
    - ``conventions(config)``: its definitions for ``results.json`` "conventions".
    - ``statistics(results, instances, ok)``: its rows of a sweep's aggregate, name ->
      (paper, the cell's summary number, per-instance values or None, the statistic over
      instances); ``ok(values)`` is ``values`` with the rows of fewer than 2 tokens NaN.
    - ``skippable``: a name of ``--skip`` (and of :data:`runner.EXPERIMENTS`); an experiment
      that is not runs whenever ``runs(block)`` says so (the per-head view, where the model has
      heads of its own). ``order`` places its step (and summary), ``report_order`` its section.
    """

    name: str
    order: int
    step: Callable[[Any], None] | None = None
    summarise: Callable[[dict[str, np.ndarray], Context], tuple[dict, dict] | None] | None = None
    section: Callable[[dict], list[str]] | None = None
    figure: Callable[[dict, Path], str | None] | None = None
    alt: str = ""
    conventions: Callable[[Any], Mapping[str, str]] | None = None
    statistics: Callable[[dict, dict, Callable], dict] | None = None
    skippable: bool = True
    within: str | None = None
    runs: Callable[[Any], bool] | None = None
    report_order: int | None = None


@cache
def _declared() -> tuple[tuple[Experiment, ...], tuple[Importance, ...]]:
    """Every ``EXPERIMENT`` and ``IMPORTANCE`` of this package's modules, each sorted by its order."""
    found_e, found_i = [], []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        module = importlib.import_module(f"{__package__}.{info.name}")
        found_e += [module.EXPERIMENT] if hasattr(module, "EXPERIMENT") else []
        found_i += [module.IMPORTANCE] if hasattr(module, "IMPORTANCE") else []
    for kind, found in (("experiment", found_e), ("importance", found_i)):
        names = [x.name for x in found]
        if len(set(names)) != len(names):
            raise RuntimeError(f"two battery {kind}s share a name: {sorted(names)}")
    return tuple(sorted(found_e, key=lambda e: e.order)), tuple(sorted(found_i, key=lambda i: i.order))


def experiments() -> tuple[Experiment, ...]:
    """The battery's experiments (and report-only sections), in the order they run."""
    return _declared()[0]


def importances() -> tuple[Importance, ...]:
    """The battery's importances, in their order."""
    return _declared()[1]


def chosen(model, settings: Settings) -> list[Importance]:
    """The importances ``settings`` turn on for ``model``, in :func:`importances`' order."""
    return [i for i in importances() if i.enabled(model, settings)]


def missing_package(settings: Settings) -> str | None:
    """The error for the first optional importance asked for whose package is not installed
    (``"--integrated-gradients needs Captum: pip install captum"``), or None. Model-independent:
    run before training."""
    for i in importances():
        if i.package and i.option and i.enabled(None, settings) and importlib.util.find_spec(i.package[0]) is None:
            return f"{i.option['flags'][0]} needs {i.package[1]}: pip install {i.package[0]}"
    return None


#: ``--importances``' word for every optional importance (each one's ``enabled`` then decides on the model)
ALL = "all"


def optional_names() -> tuple[str, ...]:
    """The names ``--importances`` takes: each optional importance's option ``dest`` (e.g.
    ``"integrated_gradients"``, ``"alti"``), in :func:`importances`' order."""
    return tuple(i.option["dest"] for i in importances() if i.option)


def _installed(i: Importance) -> bool:
    return i.package is None or importlib.util.find_spec(i.package[0]) is not None


def with_importances(names: Sequence[str], options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (the optional importances' values by ``dest``) with each importance that
    ``names`` asks for turned on: set to its :attr:`Importance.on` unless its own flag turned it
    on already (``--integrated-gradients 20`` keeps its 20 steps). ``"all"`` asks for every
    optional importance whose package is installed (:func:`left_out_of_all` names the others);
    whether one applies to the model is its ``enabled``'s to decide (the attention-derived
    attributions: BERT-like Hugging Face models only). Raises ``ValueError`` naming the valid
    names for one that is not."""
    valid = optional_names()
    unknown = [n for n in names if n != ALL and n not in valid]
    if unknown:
        raise ValueError(
            f"unknown importance{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))} for --importances; "
            f"choose from {ALL}, {', '.join(valid)}"
        )
    out = dict(options)
    for i in importances():
        if not i.option:
            continue
        dest = i.option["dest"]
        if (dest in names or (ALL in names and _installed(i))) and not out.get(dest):
            out[dest] = i.on
    return out


def left_out_of_all(names: Sequence[str]) -> list[str]:
    """The optional importances that ``--importances all`` leaves out because their package is
    not installed, each as ``"NAME (needs PACKAGE: pip install MODULE)"``; [] when ``names``
    does not say "all"."""
    if ALL not in names:
        return []
    return [
        f"{i.option['dest']} (needs {i.package[1]}: pip install {i.package[0]})"
        for i in importances()
        if i.option and not _installed(i)
    ]
