"""``attnmetrics evaluate RUN``: run the battery on the model a run folder saved."""

from __future__ import annotations

from attnmetrics.app.config import RunConfig
from attnmetrics.app.distributed import World
from attnmetrics.app.pipeline import execute


def evaluate(config: RunConfig, w: World) -> int:
    """The ``evaluate`` subcommand (this rank's part of it under torchrun)."""
    return execute(config, w, with_battery=True)
