"""S&S 2019's decision-flip search (sec. 4): attention items removed in each ordering's order, the
rest renormalised, until the decision changes; the fraction removed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from attnmetrics.app.battery.registry import Context, Experiment
from attnmetrics.app.figures import save_figure, subplots, violins
from attnmetrics.app.markdown import fmt, table
from attnmetrics.app.summaries import as_floats, get, nanmean, stats
from attnmetrics.stats import bootstrap_ci

#: S&S 2019's orderings (sec. 4): attention, random, gradient w.r.t. attention, attention x gradient; plus reverse.
DEFAULT_ORDERS = ("attention", "random", "gradient", "attn_grad", "reverse")


def step(b) -> None:
    """The flip search in each chosen order (the importances' orders join in Kendall's step)."""
    for name in b.config.orders:
        b.flip(name, name, b.config.random_samples if name == "random" else 1, b.keyed["flip"])
    b.lap("flip")


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


def paired_on_common_rows(fractions: dict[str, np.ndarray], lengths: np.ndarray, baseline: str = "random") -> dict:
    """The orderings compared on the same rows (issue: comparisons over different instance sets
    reverse S&S's reading): the rows of >= 2 tokens that flip under every ordering (each sample
    of a random one), each ordering's mean fraction there, and its paired difference from
    ``baseline`` with a 95% percentile bootstrap CI over those rows (attnmetrics.stats.bootstrap_ci,
    rows resampled in pairs). ``fractions[name]``: ``[N]`` or ``[N, samples]``."""
    common, means = common_rows(fractions, lengths)
    out: dict[str, Any] = {"rows": int(common.sum()), "fraction": {k: _mean(v) for k, v in means.items()}}
    if baseline in means:
        base = means[baseline]
        out[f"minus {baseline}"] = {
            k: {
                "mean": _mean(v - base),
                "ci95": list(bootstrap_ci((v, base), lambda a, b, axis=-1: (a - b).mean(axis))),
            }
            for k, v in means.items()
            if k != baseline
        }
    return out


def common_rows(fractions: dict[str, np.ndarray], lengths: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rows every ordering of ``fractions`` is compared on (:func:`paired_on_common_rows`):
    ``[N]`` booleans, True for the rows of >= 2 tokens whose fraction is finite under every
    ordering (each sample of a random one), and each ordering's fraction on those rows (a random
    order's samples averaged per row), in row order. ``fractions[name]``: ``[N]`` or ``[N, samples]``."""
    per_row = {k: np.asarray(v, dtype=float).reshape(len(lengths), -1) for k, v in fractions.items()}
    finite = [np.isfinite(v).all(1) for v in per_row.values()]
    common = (np.asarray(lengths) > 1) & np.all(finite, axis=0) if finite else np.asarray(lengths) > 1
    return common, {k: v[common].mean(1) for k, v in per_row.items()}


def _mean(v: np.ndarray) -> float:
    return float(v.mean()) if v.size else math.nan


def summarise(x: dict, c: Context):
    summary, instances = {}, {}
    names = list(dict.fromkeys(k.split("/")[1] for k in x if k.startswith("flip/")))  # orders, importances
    for name in names:
        # sample after sample (app/table.py's layout)
        removed, fraction = x[f"flip/{name}/removed"].T.reshape(-1), x[f"flip/{name}/fraction"].T.reshape(-1)
        reps = removed.size // c.lengths.size  # random with several samples
        summary[name] = flip_summary(removed, fraction, np.tile(c.lengths, reps))
        instances[name] = {"removed": removed.tolist(), "fraction": fraction.astype(float).tolist()}
    if len(names) > 1:  # not an ordering: kept beside them, under a name no ordering has
        summary["paired"] = paired_on_common_rows({k: x[f"flip/{k}/fraction"] for k in names}, c.lengths)
    return summary, instances


def section(results: dict) -> list[str]:
    conv = results.get("conventions", {})
    rows = [
        [
            k,
            fmt(v["fraction"]["mean"]),
            fmt(v["fraction"]["median"]),
            fmt(v["fraction"]["std"]),
            fmt(v["never_flipped_rate"]),
            v["fraction"]["n"],
        ]
        for k, v in results["flip"].items()
        if k != "paired"
    ]
    return [
        "## Decision flip under attention removal (Serrano & Smith 2019, sec. 4)",
        "",
        "Items are removed in each ordering's order, the rest renormalised (L1), until the decision",
        f"changes. Fraction = removed / number of real tokens; never-flipping rows: {conv.get('never_flipped', 'NaN')}.",
        "",
        table(rows, ["ordering", "mean fraction", "median", "std", "never flips", "rows in fraction stats"]),
        "",
        *_paired_lines(results["flip"].get("paired")),
    ]


def _paired_lines(paired: dict | None) -> list[str]:
    """The orderings on the rows that flip under all of them, each against random (paired)."""
    if not paired or "minus random" not in paired:
        return []
    rows = [
        [k, fmt(paired["fraction"][k]), fmt(d["mean"]), f"[{fmt(d['ci95'][0])}, {fmt(d['ci95'][1])}]"]
        for k, d in paired["minus random"].items()
    ]
    rows.append(["random", fmt(paired["fraction"]["random"]), "", ""])
    return [
        f"Paired, on the {paired['rows']} rows that flip under every ordering (the means above are each over "
        "its own rows, so they compare different instances):",
        "",
        table(rows, ["ordering", "mean fraction", "minus random", "95% CI (paired bootstrap over rows)"]),
        "",
    ]


def figure(results: dict, folder: Path) -> str | None:
    inst = results.get("instances", {}).get("flip")
    if not inst:
        return None
    names = list(inst)
    fig, (ax, bx) = subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1.4]})
    violins(ax, [as_floats(inst[k]["fraction"]) for k in names], range(len(names)))
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("fraction of attention items removed\nbefore the decision flips")
    ax.set_ylim(0, 1)
    ax.set_title("Decision flip (S&S 2019)")
    never = [results["flip"][k]["never_flipped_rate"] or 0.0 for k in names]
    bx.bar(range(len(names)), never, color="tab:gray")
    bx.set_xticks(range(len(names)), names, rotation=45, ha="right")
    bx.set_ylim(0, 1)
    bx.set_title("never flips")
    return save_figure(fig, folder / "flip_fraction.png")


def conventions(config) -> dict[str, str]:
    never = "NaN, left out of fraction statistics" if math.isnan(config.never_flipped) else None
    return {
        "renormalisation": "L1 over the remaining attention weights",
        "flip_ties": "equal scores removed lower index first",
        "flip_denominator": "number of real tokens (attention items)",
        "flip_max_removed": "L - 1 (the last item is never removed)",
        "never_flipped": never or "fraction 1.0 (Mohankumar et al. 2020)",
    }


def statistics(results: dict, inst: dict, ok) -> dict:
    lengths = inst.get("lengths", [])
    out = {}
    for order, s in results.get("flip", {}).items():
        if order == "paired":  # the orderings compared on common rows, not an ordering
            continue
        f = get(inst, "flip", order)
        same = f is not None and len(f["fraction"]) == len(lengths)
        out[f"flip fraction ({order})"] = ("ss", s["fraction"]["mean"], ok(f["fraction"]) if same else None, nanmean)
        never = ok(np.asarray(f["removed"]) < 0) if same else None
        out[f"never flips ({order})"] = ("ss", s["never_flipped_rate"], never, nanmean)
    out.update(_paired_statistics(results, inst))
    return out


def _paired_statistics(results: dict, inst: dict) -> dict:
    """S&S's comparison of orderings on the same rows, per instance for a sweep's seeds-then-instances
    intervals: each ordering's flip fraction on the rows that flip under every ordering (a random
    order's samples averaged per row; NaN elsewhere), and attention's minus each other's there."""
    lengths = np.asarray(inst.get("lengths", []))
    names = [k for k in results.get("flip", {}) if k != "paired"]
    flips = {k: get(inst, "flip", k) for k in names}
    if len(names) < 2 or "attention" not in names or any(f is None for f in flips.values()) or not lengths.size:
        return {}
    # instances keep a random order's samples one after the other: [samples * N] -> [N, samples]
    fractions = {k: as_floats(f["fraction"]).reshape(-1, lengths.size).T for k, f in flips.items()}
    common, _ = common_rows(fractions, lengths)
    per_row = {k: np.where(common, v.mean(1), np.nan) for k, v in fractions.items()}
    out = {}
    for k, v in per_row.items():
        out[f"flip fraction, common rows ({k})"] = ("ss", float(nanmean(v)), v, nanmean)
    for k, v in per_row.items():
        if k != "attention":
            d = per_row["attention"] - v
            out[f"flip fraction, common rows: attention − {k}"] = ("ss", float(nanmean(d)), d, nanmean)
    return out


EXPERIMENT = Experiment(
    "flip",
    order=10,
    step=step,
    summarise=summarise,
    section=section,
    figure=figure,
    alt="flip fraction",
    conventions=conventions,
    statistics=statistics,
)
