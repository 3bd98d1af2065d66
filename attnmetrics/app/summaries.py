"""The summary statistics every experiment shares (numpy in, JSON-ready dicts out): n, mean, std and
quartiles of the defined values, per predicted class, by max attention; NaN-aware means and medians.

Instances that an experiment leaves undefined (fewer than two tokens, an all-tied row) are
counted apart, never silently averaged in.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

from attnmetrics.stats import nanmean  # noqa: F401  (re-exported: the battery's statistics reduce with it)

SIGNIFICANCE = 0.05
#: J&W 2019 (figs. 3-6) bin instances by their largest attention weight
MAX_ATTENTION_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)


def stats(x: np.ndarray) -> dict[str, float]:
    """n, mean, std, median and quartiles of the finite values of ``x``."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0, "mean": math.nan, "std": math.nan, "median": math.nan, "q1": math.nan, "q3": math.nan}
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return {
        "n": int(x.size),
        "mean": float(x.mean()),
        "std": float(x.std()),
        "median": float(med),
        "q1": float(q1),
        "q3": float(q3),
    }


def by_class(x: np.ndarray, predicted: np.ndarray, class_names: Sequence[str]) -> dict[str, dict]:
    """:func:`stats` of ``x`` per predicted class."""
    return {name: stats(x[predicted == c]) for c, name in enumerate(class_names)}


def by_max_attention(x: np.ndarray, max_attention: np.ndarray) -> dict[str, dict]:
    """:func:`stats` of ``x`` per bin of the instance's largest attention weight (J&W's figures)."""
    edges = MAX_ATTENTION_BINS
    out = {}
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (max_attention >= lo) & ((max_attention < hi) if hi < 1 else (max_attention <= hi))
        out[f"[{lo:.2f}, {hi:.2f}{']' if hi == 1 else ')'}"] = stats(x[sel])
    return out


def nanmedian(x, axis=-1):
    """``np.nanmedian``, NaN (without a warning) where a slice is all NaN."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(x, axis=axis)


def as_floats(values) -> np.ndarray:
    """A list from ``results.json`` as a float array, None (JSON's null) as NaN."""
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def get(d, *keys, default=None):
    """``d[k1][k2]...``, or ``default`` where a key (or a dict on the way) is missing."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d
