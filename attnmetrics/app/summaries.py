"""Per-experiment summary statistics from per-instance results (numpy in, JSON-ready dicts out).

Instances that an experiment leaves undefined (fewer than two tokens, an all-tied row) are
counted apart, never silently averaged in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attnmetrics.stats import mcnemar

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


def _by_class(x: np.ndarray, predicted: np.ndarray, class_names: Sequence[str]) -> dict[str, dict]:
    return {name: stats(x[predicted == c]) for c, name in enumerate(class_names)}


def _by_max_attention(x: np.ndarray, max_attention: np.ndarray) -> dict[str, dict]:
    edges = MAX_ATTENTION_BINS
    out = {}
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (max_attention >= lo) & ((max_attention < hi) if hi < 1 else (max_attention <= hi))
        out[f"[{lo:.2f}, {hi:.2f}{']' if hi == 1 else ')'}"] = stats(x[sel])
    return out


def flip_summary(removed: np.ndarray, fraction: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
    """Decision-flip statistics of one ordering (S&S 2019, sec. 4).

    ``fraction`` statistics cover the rows whose fraction is finite (by default the rows that
    flip; with ``never_flipped=1.0`` also those that never do); rows with fewer than 2
    attention items cannot flip and are counted apart (``too_short``).
    """
    removed, fraction, lengths = map(np.asarray, (removed, fraction, lengths))
    eligible = lengths > 1
    flipped = (removed > 0) & eligible
    n = int(eligible.sum())
    return {
        "rows": int(removed.size),
        "too_short": int((~eligible).sum()),
        "flipped_rate": float(flipped.sum() / n) if n else math.nan,
        "never_flipped_rate": float((eligible & ~flipped).sum() / n) if n else math.nan,
        "fraction": stats(np.where(eligible, fraction, np.nan)),
    }


def tau_summary(
    tau: np.ndarray, pvalue: np.ndarray, predicted: np.ndarray, class_names: Sequence[str]
) -> dict[str, Any]:
    """Kendall tau-b summary as J&W 2019 (sec. 4.1, Table 2): mean ± std and share with
    p <= 0.05, overall and per predicted class. Rows where tau is undefined (NaN: fewer
    than 2 tokens or all tied) are left out and counted."""
    tau, pvalue, predicted = map(np.asarray, (tau, pvalue, predicted))

    def one(sel: np.ndarray) -> dict[str, Any]:
        ok = sel & np.isfinite(tau)
        s = stats(tau[ok])
        s["significant"] = float((pvalue[ok] <= SIGNIFICANCE).mean()) if ok.any() else math.nan
        s["undefined"] = int((sel & ~np.isfinite(tau)).sum())
        return s

    return {
        "overall": one(np.ones_like(tau, dtype=bool)),
        "per_class": {name: one(predicted == c) for c, name in enumerate(class_names)},
    }


def permutation_summary(
    median_tvd: np.ndarray,
    max_attention: np.ndarray,
    lengths: np.ndarray,
    predicted: np.ndarray,
    class_names: Sequence[str],
) -> dict[str, Any]:
    """J&W 2019 (sec. 4.2, fig. 5): median output TVD under permuted attention, overall, per
    predicted class and by the instance's max attention. Rows with one token are left out."""
    ok = np.asarray(lengths) > 1
    tvd = np.where(ok, median_tvd, np.nan)
    return {
        "overall": stats(tvd),
        "per_class": _by_class(tvd, predicted, class_names),
        "by_max_attention": _by_max_attention(tvd, max_attention),
        "too_short": int((~ok).sum()),
    }


def adversarial_summary(
    max_jsd: np.ndarray,
    output_tvd: np.ndarray,
    max_attention: np.ndarray,
    lengths: np.ndarray,
    predicted: np.ndarray,
    class_names: Sequence[str],
) -> dict[str, Any]:
    """J&W 2019 (sec. 4.3, figs. 6-7): max attention JSD within the output-TVD bound, overall,
    per predicted class and by max attention; the share that reaches JSD > 0.5 nats (of ln 2).
    Like every other statistic here, the share covers the rows with at least 2 tokens and a
    finite JSD (``overall["n"]`` of them); NaN if there are none."""
    ok = np.asarray(lengths) > 1
    jsd = np.where(ok, max_jsd, np.nan)
    defined = jsd[np.isfinite(jsd)]
    return {
        "overall": stats(jsd),
        "per_class": _by_class(jsd, predicted, class_names),
        "by_max_attention": _by_max_attention(jsd, max_attention),
        "share_above_0.5": float((defined > 0.5).mean()) if defined.size else math.nan,
        "output_tvd": stats(np.where(ok, output_tvd, np.nan)),
        "too_short": int((~ok).sum()),
    }


def single_removal_summary(
    jsd: Mapping[str, np.ndarray], flipped: Mapping[str, np.ndarray], lengths: np.ndarray
) -> dict[str, Any]:
    """S&S 2019 (sec. 3): output JSD and flip rate after removing one weight, per choice of
    weight, and McNemar's exact test of top vs random flips on the same instances."""
    ok = np.asarray(lengths) > 1
    out: dict[str, Any] = {
        which: {
            "jsd": stats(np.where(ok, j, np.nan)),
            "flip_rate": float(flipped[which][ok].mean()) if ok.any() else math.nan,
        }
        for which, j in jsd.items()
    }
    if "top" in jsd and "random" in jsd:
        test = mcnemar(flipped["top"][ok], flipped["random"][ok])
        out["top_vs_random"] = {
            "jsd_top_greater": float((jsd["top"][ok] > jsd["random"][ok]).mean()) if ok.any() else math.nan,
            "mcnemar": test._asdict(),
        }
    out["too_short"] = int((~ok).sum())
    return out


def eraser_summary(
    aopc: np.ndarray, values: np.ndarray, predicted: np.ndarray, class_names: Sequence[str]
) -> dict[str, Any]:
    """ERASER (DeYoung et al. 2020, sec. 4): the AOPC over the instances (mean ± std, quartiles),
    per predicted class, and the mean of each fraction's value (``values`` [N, F]). Rows without
    real tokens (NaN) are left out."""
    values = np.asarray(values, dtype=float)
    with np.errstate(invalid="ignore"):
        per_fraction = [float(np.nanmean(v)) if np.isfinite(v).any() else math.nan for v in values.T]
    return {
        "aopc": stats(aopc),
        "per_class": _by_class(np.asarray(aopc), np.asarray(predicted), class_names),
        "per_fraction": per_fraction,
    }
