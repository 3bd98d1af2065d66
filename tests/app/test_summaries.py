"""Per-experiment summaries: rows an experiment leaves undefined are counted apart, never averaged in."""

import math

import numpy as np

from attnmetrics.app.battery.adversarial import adversarial_summary


def test_adversarial_share_above_half_leaves_out_short_rows():
    # row 1 has one token: no adversary, so it is neither above nor below 0.5
    s = adversarial_summary(np.array([0.6, 0.6]), np.zeros(2), np.ones(2), np.array([5, 1]), np.zeros(2, int), ["a"])
    assert s["share_above_0.5"] == 1.0
    assert s["overall"]["n"] == 1 and s["too_short"] == 1


def test_adversarial_share_above_half_leaves_out_undefined_jsd():
    s = adversarial_summary(
        np.array([0.6, 0.1, np.nan]), np.zeros(3), np.ones(3), np.array([5, 5, 5]), np.zeros(3, int), ["a"]
    )
    assert s["share_above_0.5"] == 0.5 and s["overall"]["n"] == 2


def test_adversarial_share_above_half_nan_without_rows():
    s = adversarial_summary(np.array([0.6]), np.zeros(1), np.ones(1), np.array([1]), np.zeros(1, int), ["a"])
    assert math.isnan(s["share_above_0.5"])
