"""S&S 2019's single-weight removal (sec. 3): the output JSD and decision flips when the top, the
second or a random attention weight is zeroed and the rest renormalised."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

import attnmetrics
from attnmetrics.app.battery.registry import Context, Experiment
from attnmetrics.app.markdown import fmt, table
from attnmetrics.app.summaries import get, nanmean, stats
from attnmetrics.single_removal import WHICH
from attnmetrics.stats import mcnemar

#: what the random weight is, by ``BatteryConfig.random_removal`` (``--random-removal``)
RANDOM_CONVENTIONS = {
    "non_top": "uniform among the non-top tokens (S&S 2019: randint(1, L - 1) over the descending order, "
    "serrano-s/attn-tests test_model.py:1028); rows with L <= 1 left out",
    "all": "uniform among all real tokens, the top one included (--random-removal all); rows with L <= 1 left out",
    "not_first": "uniform among the real tokens but the first (--random-removal not-first: S&S's test_model.py as "
    "it runs, indexing the weights by the drawn rank); rows with L <= 1 left out",
}


def step(b) -> None:
    for which in WHICH:
        r = attnmetrics.single_removal(
            *b.args, which=which, random_among=b.config.random_removal, generator=b.keyed["single_removal"]
        )
        b.keep(f"single_removal/{which}/jsd", r.jsd)
        b.keep(f"single_removal/{which}/flipped", r.flipped)
    b.lap("single_removal")


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


def summarise(x: dict, c: Context):
    jsd = {w: x[f"single_removal/{w}/jsd"] for w in WHICH}
    flipped = {w: x[f"single_removal/{w}/flipped"] for w in WHICH}
    instances = {w: {"jsd": jsd[w].tolist(), "flipped": flipped[w].tolist()} for w in WHICH}
    summary = single_removal_summary(jsd, flipped, c.lengths)
    summary["random_among"] = c.config.random_removal  # which tokens "random" drew among
    return summary, instances


def section(results: dict) -> list[str]:
    s = results["single_removal"]
    rows = [
        [w, fmt(v["jsd"]["mean"]), fmt(v["jsd"]["median"]), fmt(v["flip_rate"]), v["jsd"]["n"]]
        for w, v in s.items()
        if isinstance(v, dict) and "jsd" in v
    ]
    lines = [
        "## Removing a single attention weight (Serrano & Smith 2019, sec. 3)",
        "",
        table(rows, ["weight removed", "mean output JSD", "median", "decision flips", "n"]),
        "",
    ]
    if "random_among" in s:
        lines += [f"The random weight: {RANDOM_CONVENTIONS[s['random_among']]}.", ""]
    if "top_vs_random" in s:
        t = s["top_vs_random"]
        m = t["mcnemar"]
        lines += [
            f"Top vs random: the top weight's removal moves the output more (JSD) in "
            f"{fmt(t['jsd_top_greater'])} of instances; flips only after top: {m['b10']}, only after "
            f"random: {m['b01']}, McNemar exact p = {fmt(m['pvalue'], 4)}.",
            "",
        ]
    return lines


def statistics(results: dict, inst: dict, ok) -> dict:
    out = {}
    for which, s in results.get("single_removal", {}).items():
        if isinstance(s, dict) and "jsd" in s:
            r = get(inst, "single_removal", which) or {}
            out[f"single removal JSD ({which})"] = ("ss", s["jsd"]["mean"], ok(r["jsd"]) if r else None, nanmean)
            out[f"single removal flips ({which})"] = ("ss", s["flip_rate"], ok(r["flipped"]) if r else None, nanmean)
    return out


EXPERIMENT = Experiment(
    "single_removal",
    order=60,
    step=step,
    summarise=summarise,
    section=section,
    conventions=lambda config: {
        "single_removal": "one weight zeroed, rest renormalised; output JSD in nats; McNemar exact test of top vs "
        f"random flips; random: {RANDOM_CONVENTIONS[config.random_removal]}"
    },
    statistics=statistics,
)
