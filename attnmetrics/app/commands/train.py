"""``attnmetrics train``: train a model and save it in a run folder (no battery)."""

from __future__ import annotations

from attnmetrics.app.config import RunConfig
from attnmetrics.app.distributed import World
from attnmetrics.app.pipeline import execute


def train(config: RunConfig, w: World) -> int:
    """The ``train`` subcommand (this rank's part of it under torchrun)."""
    return execute(config, w, with_battery=False)
