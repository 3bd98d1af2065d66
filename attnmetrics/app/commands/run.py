"""``attnmetrics run``: train a model, run every experiment of the battery (and W&P's trained
experiments when asked for), write a report."""

from __future__ import annotations

import time

from attnmetrics.app.config import RunConfig
from attnmetrics.app.consistent_adversary import consistent_adversaries, jain_wallace_point
from attnmetrics.app.diagnostic_mlps import diagnostic_mlps
from attnmetrics.app.distributed import World
from attnmetrics.app.factory import Built
from attnmetrics.app.pipeline import execute
from attnmetrics.app.results import Results
from attnmetrics.models.text import EncodedSplit


def run(config: RunConfig, w: World) -> int:
    """The ``run`` subcommand (this rank's part of it under torchrun)."""
    return execute(config, w, with_battery=True, after_battery=wiegreffe)


def wiegreffe(config: RunConfig, built: Built, test: EncodedSplit, results: Results) -> None:
    """W&P 2019's trained experiments, when the flags ask for them: model-consistent adversaries
    and diagnostic MLPs, trained with the model's recipe."""
    if not (config.consistent_adversary or config.diagnostic):
        return
    model, recipe = built.model, built.recipe
    make, tconf, train_data, dev_data = recipe.make, recipe.train_config, recipe.train_data, recipe.dev_data
    adversaries = []
    if config.consistent_adversary:
        t0 = time.perf_counter()
        summary, instances, adversaries = consistent_adversaries(
            model, make, train_data, dev_data, test, config.consistent_adversary, tconf
        )
        jw = jain_wallace_point(results)
        if jw:
            summary["jain_wallace"] = jw
        results["consistent_adversary"] = summary
        results["instances"]["consistent_adversary"] = instances
        results["wall_time_s"]["consistent_adversary"] = time.perf_counter() - t0
    if config.diagnostic:
        t0 = time.perf_counter()
        summary, instances = diagnostic_mlps(
            model, make, train_data, dev_data, test, tconf, adversaries[0] if adversaries else None
        )
        results["diagnostic"] = summary
        results["instances"]["diagnostic"] = instances
        results["wall_time_s"]["diagnostic"] = time.perf_counter() - t0
