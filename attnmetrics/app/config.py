"""The typed configuration of ``attnmetrics run``, ``train`` and ``evaluate``: :class:`RunConfig`,
built once from argparse's namespace (after :func:`~attnmetrics.app.recipes.recipe_defaults`) and
read by the commands (:mod:`attnmetrics.app.commands`) and the model factory
(:mod:`attnmetrics.app.factory`) in its place.

results.json's ``config`` is :meth:`RunConfig.to_dict`: the command's flags as argparse parsed
them, in its order, and only those the command has (``train`` has no battery flags, ``evaluate``
no training flags); the optional importances' flags as ``--importances`` turned them on.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from attnmetrics.app.battery import importances
from attnmetrics.app.battery.registry import with_importances


@dataclass(frozen=True)
class RunConfig:
    """The flags of ``run``, ``train`` and ``evaluate`` (attnmetrics/app/parser.py has their help).
    A flag that the command does not take holds its default here: None, False, 0 or ()."""

    command: str
    # the data (run, train; evaluate: --data-dir and --limit only, the rest from the checkpoint)
    protocol: str | None = None
    dataset: str | None = None
    data_dir: Path | None = None
    limit: int | None = None
    test_limit: int | None = None
    stratify: bool = False
    max_tokens: int | None = None
    split_seed: int = 0
    # the model and its training (run, train)
    model: str | None = None
    prompt: str | None = None
    label_words: tuple[str, ...] | None = None
    max_length: int | None = None
    train_last_layers: int | None = None
    encoder: str | None = None
    attention: str | None = None
    embeddings: str | None = None
    embed_dim: int | None = None
    hidden_size: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    regulariser: str | None = None
    tying_weight: float | None = None
    mlm_weight: float | None = None
    pretrained: Path | None = None
    lm_weight: float | None = None
    transfer_layers: int | None = None
    gpt_config: str | None = None
    grad_clip: float | None = None
    warmup: float | None = None
    # the battery (run, evaluate)
    skip: tuple[str, ...] = ()
    permutations: int | None = None
    adversarial_steps: int | None = None
    adversarial_optimiser: str | None = None  # None: the protocol preset's
    orders: tuple[str, ...] = ()
    random_samples: int | None = None
    #: the optional importances' flags (attnmetrics/app/battery/: each declared by its module), by dest,
    #: with those that ``--importances`` names turned on
    importance_options: Mapping[str, Any] = field(default_factory=dict)
    importances: tuple[str, ...] = ()
    attribution_aggregation: str | None = None  # integrated gradients' and gradient x input's (faithfulness.py)
    examples: int = 0
    never_flipped: str | None = None
    random_removal: str | None = None
    eraser_rounding: str | None = None
    eraser_aopc: str | None = None
    eraser_fractions: str | None = None
    eraser_mask_token: int | None = None
    resumable: bool = False
    # Wiegreffe & Pinter's trained experiments (run)
    consistent_adversary: tuple[float, ...] | None = None
    diagnostic: bool = False
    # evaluate's saved model
    model_run: Path | None = None
    # the run folder and the runtime (every command)
    out: Path | None = None
    overwrite: bool = False
    seed: int = 0
    debug: bool = False
    threads: int | None = None
    device: str = "cpu"
    no_progress: bool = False
    #: the flags the command has, in argparse's order: results.json's ``config``
    flags: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> RunConfig:
        """The command's parsed flags (lists kept as tuples; :meth:`to_dict` gives them back)."""
        given = vars(args)
        declared = {i.option["dest"] for i in importances() if i.option}
        unknown = set(given) - {f.name for f in fields(cls)} - declared
        if unknown:
            raise TypeError(f"RunConfig has no field for {sorted(unknown)}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if k not in declared}
        options = with_importances(given.get("importances") or (), {k: v for k, v in given.items() if k in declared})
        return cls(**values, importance_options=options, flags=tuple(given))

    def to_dict(self) -> dict:
        """results.json's ``config``: the command's flags as parsed, paths as strings."""
        options = self.importance_options
        values = {k: options[k] if k in options else getattr(self, k) for k in self.flags}
        return {k: str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v for k, v in values.items()}
