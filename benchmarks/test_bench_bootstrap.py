"""The sweep aggregate's interval, :func:`attnmetrics.stats.seed_instance_ci`, for a mean (every
battery statistic but the medians and macro F1): the counted path (each resample's instances as how
often each is drawn, one matrix product) against gathering the resampled ``[R, S, N]`` values, the
general path, on one SST group's shape (5 seeds × 1,725 test instances, 9,999 resamples, an eighth
of the instances undefined). Intervals checked equal first; ``extra_info`` holds the ratio. A sweep
aggregates about 70 such statistics a group."""

from __future__ import annotations

import os

import numpy as np

from attnmetrics.stats import nanmean, seed_instance_ci
from benchmarks.measure import median_seconds, timed

RESAMPLES = 99 if os.environ.get("CI") else 9999


def _values() -> np.ndarray:
    x = np.random.default_rng(0).gamma(2.0, 0.1, size=(5, 1725))
    x[:, ::8] = np.nan
    return x


def _gathering(v, axis=-1):  # not attnmetrics.stats.nanmean: seed_instance_ci's general path
    return np.nanmean(v, axis=axis)


def test_seed_instance_ci_of_a_mean(benchmark):
    x = _values()
    general = seed_instance_ci(x, _gathering, n_resamples=RESAMPLES)
    counted = benchmark.pedantic(seed_instance_ci, args=(x, nanmean), kwargs={"n_resamples": RESAMPLES}, rounds=3)
    np.testing.assert_allclose(counted, general, rtol=1e-12)
    _, gathering_s = timed(lambda: seed_instance_ci(x, _gathering, n_resamples=RESAMPLES))
    counted_s = median_seconds(benchmark, lambda: seed_instance_ci(x, nanmean, n_resamples=RESAMPLES))
    benchmark.extra_info.update(gathering_s=gathering_s, counted_s=counted_s, speedup=gathering_s / counted_s)
