"""J&W 2019's Kendall τ-b between importance measures (sec. 4.1): every importance of the run
(registry.importances) is computed here, then τ between each pair, attention included."""

from __future__ import annotations

import math
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

import attnmetrics
from attnmetrics.app.battery.registry import Context, Experiment
from attnmetrics.app.figures import save_figure, subplots
from attnmetrics.app.markdown import TAU_HEADERS, table, tau_row
from attnmetrics.app.summaries import SIGNIFICANCE, as_floats, get, nanmean, stats


def step(b) -> None:
    """Every importance (each timed on its own; an optional experiment's a step of its own in
    the progress bar, and a flip order where it is one), then τ between each pair."""
    for importance in b.run.importances:
        if importance.experiment:
            b.start(importance.experiment)
        else:
            b.bar.show(importance.name)
        name = importance.name
        score = importance.compute(b.model, b.tokens, b.lengths, b.run.settings)
        b.scores[name] = score.to(b.out.attention.dtype)
        b.lap(name)
        if importance.flip_order and b.chose("flip"):  # an order to remove by, never an attention
            b.flip(name, b.scores[name])
            b.lap("flip")
    for x, y in combinations(b.scores, 2):
        kt = attnmetrics.kendall_tau(b.scores[x], b.scores[y], b.out.lengths)
        b.keep(f"kendall/{x} vs {y}/tau", kt.tau)
        b.keep(f"kendall/{x} vs {y}/pvalue", kt.pvalue)
    b.lap("kendall")


def tau_summary(tau: np.ndarray, pvalue: np.ndarray, predicted: np.ndarray, class_names: Any) -> dict[str, Any]:
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


def summarise(x: dict, c: Context):
    summary, instances = {}, {}
    for pair in dict.fromkeys(k.split("/")[1] for k in x if k.startswith("kendall/")):
        tau, p = x[f"kendall/{pair}/tau"], x[f"kendall/{pair}/pvalue"]
        summary[pair] = tau_summary(tau, p, c.predicted, c.class_names)
        instances[pair] = {"tau": tau.tolist(), "pvalue": p.tolist()}
    return summary, instances


def section(results: dict) -> list[str]:
    lines = ["## Kendall τ-b between importance measures (Jain & Wallace 2019, sec. 4.1)", ""]
    for pair, summ in results["kendall"].items():
        rows = [["all", *tau_row(summ["overall"])]]
        rows += [[f"predicted {c}", *tau_row(s)] for c, s in summ["per_class"].items()]
        lines += [f"**{pair}**", "", table(rows, TAU_HEADERS), ""]
    return lines


def figure(results: dict, folder: Path) -> str | None:
    inst = results.get("instances", {})
    pairs = inst.get("kendall")
    if not pairs:
        return None
    pred = np.array(inst["predicted"])
    fig, axes = subplots(1, len(pairs), figsize=(5 * len(pairs), 3.8), squeeze=False)
    for ax, (pair, v) in zip(axes[0], pairs.items()):
        tau = as_floats(v["tau"])
        for c, name in enumerate(results["data"]["classes"]):
            t = tau[(pred == c) & np.isfinite(tau)]
            if t.size:
                ax.hist(t, bins=np.linspace(-1, 1, 41), alpha=0.6, label=f"predicted {name}")
        ax.set_xlabel(f"Kendall τ-b ({pair})")
        ax.set_ylabel("instances")
        if ax.get_legend_handles_labels()[0]:  # no histogram when τ is undefined everywhere (uniform attention)
            ax.legend(fontsize=8)
    return save_figure(fig, folder / "kendall_tau.png")


def statistics(results: dict, inst: dict, ok) -> dict:
    out = {}
    for pair, s in results.get("kendall", {}).items():
        tau = get(inst, "kendall", pair, "tau")
        out[f"τ {pair}"] = ("jw", s["overall"]["mean"], as_floats(tau) if tau else None, nanmean)
    return out


EXPERIMENT = Experiment(
    "kendall",
    order=20,
    step=step,
    summarise=summarise,
    section=section,
    figure=figure,
    alt="kendall tau",
    conventions=lambda config: {"kendall": "tau-b, two-sided p as scipy.stats.kendalltau defaults"},
    statistics=statistics,
)
