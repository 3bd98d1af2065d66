"""The token importances the battery sets beside attention, one entry each.

Every importance is a Kendall τ partner of attention and of the others (J&W 2019, sec. 4.1), an
ERASER ordering (DeYoung et al. 2020), a per-head τ partner of a transformer's own attention, a
score in the token view, and, unless the flip search already has it as an order, an ordering for
the flip search (S&S 2019, sec. 4). Adding an importance to the battery is adding one entry to
:data:`IMPORTANCES` (and, when it is optional, its flag in ``parser.py``): collection, timing,
progress, the Kendall pairs, ERASER, the token view and the reports follow from the entry.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from attnmetrics.importance import gradient_importance, input_x_gradient, integrated_gradients
from attnmetrics.loo import leave_one_out
from attnmetrics.protocol import capability


@dataclass(frozen=True)
class Settings:
    """What the run asked for: the battery's experiments and the optional importances' flags."""

    experiments: Sequence[str] = ()
    ig_steps: int = 0  # --integrated-gradients STEPS (0: off)
    input_x_gradient: bool = False  # --input-x-gradient


@dataclass(frozen=True)
class Importance:
    """One token importance of the battery.

    ``compute(model, tokens, lengths, settings)`` returns ``[B, T - lead]`` scores over each row's
    real tokens; ``enabled(model, settings)`` says whether the run computes it. ``flip_order``: the
    flip search also removes tokens in its order (False where the flip search has the order
    already, or never took it); ``head_partner``: each head of a transformer's own attention gets
    a τ against it (not rollout, which mixes every layer's heads). ``experiment``: the battery experiment that turns it on, which
    then is a step of its own in the progress bar. ``flag`` and ``package``: the command-line flag
    that asks for it and the optional package it needs (checked before any training).
    """

    name: str  # its key in results: "kendall/attention vs NAME", "eraser/NAME/...", "flip/NAME"
    compute: Callable[[Any, Tensor, Tensor, Settings], Tensor]
    enabled: Callable[[Any, Settings], bool]
    flip_order: bool = True
    head_partner: bool = True  # a per-head τ partner of a transformer's own attention
    experiment: str | None = None
    flag: str | None = None
    package: tuple[str, str] | None = None  # (module to import, its name for the user)


IMPORTANCES: tuple[Importance, ...] = (
    # J&W's gradient: always beside attention (the flip search has it as the order "gradient")
    Importance(
        "gradient",
        lambda model, tokens, lengths, s: gradient_importance(model, tokens, lengths),
        lambda model, s: True,
        flip_order=False,
    ),
    # J&W's leave-one-out (never a flip order, as in S&S)
    Importance(
        "loo",
        lambda model, tokens, lengths, s: leave_one_out(model, tokens, lengths),
        lambda model, s: "loo" in s.experiments,
        flip_order=False,
        experiment="loo",
    ),
    # a transformer's attention rollout (Abnar & Zuidema 2020), where the model offers it
    Importance(
        "rollout",
        lambda model, tokens, lengths, s: model.rollout(tokens, lengths),
        lambda model, s: capability(model, "rollout") is not None,
        head_partner=False,
    ),
    # integrated gradients (Sundararajan et al. 2017), through Captum
    Importance(
        "ig",
        lambda model, tokens, lengths, s: integrated_gradients(model, tokens, lengths, steps=s.ig_steps),
        lambda model, s: s.ig_steps > 0,
        flag="--integrated-gradients",
        package=("captum", "Captum"),
    ),
    # the whole model's gradient x input (Shrikumar et al. 2016), through Captum
    Importance(
        "input_x_gradient",
        lambda model, tokens, lengths, s: input_x_gradient(model, tokens, lengths),
        lambda model, s: s.input_x_gradient,
        flag="--input-x-gradient",
        package=("captum", "Captum"),
    ),
)

#: the importances' names, in the battery's order
NAMES = tuple(i.name for i in IMPORTANCES)


def chosen(model, settings: Settings) -> list[Importance]:
    """The importances ``settings`` turn on for ``model``, in :data:`IMPORTANCES`' order."""
    return [i for i in IMPORTANCES if i.enabled(model, settings)]


def missing_package(settings: Settings) -> str | None:
    """The error for the first optional importance asked for whose package is not installed
    (``"--integrated-gradients needs Captum: pip install captum"``), or None. Model-independent:
    run before training."""
    for i in IMPORTANCES:
        if i.package and i.flag and i.enabled(None, settings) and importlib.util.find_spec(i.package[0]) is None:
            return f"{i.flag} needs {i.package[1]}: pip install {i.package[0]}"
    return None
