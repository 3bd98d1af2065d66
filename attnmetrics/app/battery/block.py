"""One instance block as the battery runs on it (:class:`Block`), the run-wide settings every block
shares (:class:`Run`) and the progress bar over blocks and steps (:class:`Progress`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

import attnmetrics
from attnmetrics import KeyedRows
from attnmetrics.app.battery.registry import Importance, Settings
from attnmetrics.protocol import Forward, TestedAttention, capability, forward


class Progress:
    """One bar over every (instance block, experiment) step of the battery: it moves as each
    experiment of each block finishes and names the one running, e.g. ``block 3/8: loo``."""

    def __init__(self, blocks: int, parts: Sequence[str], enabled: bool):
        self.blocks, self.block, self.running = blocks, 0, None
        self.bar = tqdm(total=blocks * len(parts), desc="faithfulness", unit="step", disable=not enabled, leave=False)

    def start(self, block: int, part: str) -> None:
        """Block ``block`` (0-based) starts ``part``, one of ``parts``: the step before it is done."""
        if self.running is not None:
            self.bar.update()
        self.block, self.running = block, part
        self.show(part)

    def show(self, label: str) -> None:
        """Name what the running step is doing now (e.g. an importance within Kendall's step)."""
        self.bar.set_postfix_str(f"block {self.block + 1}/{self.blocks}: {label}")

    def close(self) -> None:
        if self.running is not None:
            self.bar.update()
        self.bar.close()


def tested_forward(model, tokens: Tensor, lengths: Tensor):
    """The model's forward output and the attention the battery tests: a transformer's own
    (``model.tested_attention``: ``[B, heads, T]``, docs/definitions.md §15) where the model
    offers it, else None and the attention head's (``out.attention``, ``[B, T]``). With its
    own attention, ``out.attention`` is their head mean, which every token-level view uses."""
    out = forward(model, tokens, lengths)
    tested = capability(model, "tested_attention")
    own = tested(tokens, lengths) if tested else None
    if own is not None:
        out = out._replace(attention=own.attention.mean(1))
    return out, own


@dataclass(frozen=True)
class Run:
    """What every block of one battery run shares: its configuration (``runner.BatteryConfig``),
    the importances it computes, and each random experiment's seed."""

    config: object
    settings: Settings
    importances: list[Importance]
    seeds: dict[str, int]


@dataclass
class Block:
    """One instance block as the battery runs on it: its forward pass, the attention the
    procedures test, its keyed random draws, the importances found so far, and where every
    per-instance value and wall time goes."""

    run: Run
    model: torch.nn.Module
    acc: dict[str, list[Tensor]]
    seconds: dict[str, float]
    bar: Progress
    index: int
    scores: dict[str, Tensor] = field(default_factory=dict)  # attention and every importance, [B, T_real]
    # set by forward():
    tokens: Tensor = field(init=False)
    lengths: Tensor = field(init=False)
    out: Forward = field(init=False)  # the forward pass, real tokens (attention: the head mean if own)
    own: TestedAttention | None = field(init=False)  # a transformer's own attention, or None
    args: tuple = field(init=False)  # (attention, values, decoder, lengths): what the procedures test
    keyed: dict[str, KeyedRows] = field(init=False)  # each experiment's draws, keyed by instance
    t0: float = field(init=False)  # the last lap's time

    @property
    def config(self):
        return self.run.config

    def chose(self, experiment: str) -> bool:
        """Whether the run asked for ``experiment``."""
        return experiment in self.run.config.experiments

    def start(self, part: str) -> None:
        self.bar.start(self.index, part)

    def lap(self, part: str) -> None:
        """Add the time since the last lap to ``part``'s wall time."""
        now = time.perf_counter()
        self.seconds[part] += now - self.t0
        self.t0 = now

    def keep(self, key: str, value: Tensor) -> None:
        self.acc[key].append(value)

    def forward(self, first: int, tokens: Tensor, lengths: Tensor) -> None:
        """The block's forward pass and the attention the procedures test (``self.args``:
        attention, values, decoder, lengths), its draws keyed by instance from ``first``."""
        self.start("forward")
        self.t0 = time.perf_counter()
        self.tokens, self.lengths = tokens, lengths
        self.keyed = {name: KeyedRows(s, first) for name, s in self.run.seeds.items()}
        self.keep("instance", torch.arange(first, first + len(lengths)))
        with torch.no_grad():  # no procedure differentiates through it (each runs its own passes)
            self.out, self.own = out, own = tested_forward(self.model, tokens, lengths)
        if own is not None:
            self.args = (own.attention, own.values, own.decoder, own.lengths)
        else:
            self.args = (out.attention, out.hidden, self.model.decoder, out.lengths)
        self.keep("predicted", attnmetrics.decision(out.logits))
        self.keep("lengths", out.lengths)
        self.keep("max_attention", out.attention.max(1).values)
        self.scores = {"attention": out.attention}
        self.lap("forward")

    def flip(self, name: str, order, samples: int = 1, generator=None) -> None:
        """S&S's flip search in ``order`` (a name or scores), its rows kept under ``flip/NAME``
        (``[B]``, or ``[samples, B]`` with the samples side by side)."""
        r = attnmetrics.flip_fraction(
            *self.args, order=order, samples=samples, generator=generator, never_flipped=self.config.never_flipped
        )
        rows = r.removed.shape[-1]
        self.keep(f"flip/{name}/removed", r.removed.reshape(-1, rows).T)
        self.keep(f"flip/{name}/fraction", r.fraction.reshape(-1, rows).T)
