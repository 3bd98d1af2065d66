"""J&W 2019's permuted attention (sec. 4.2): the median output TVD over random permutations of the
attention among each row's real tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import attnmetrics
from attnmetrics.app.battery.registry import Context, Experiment
from attnmetrics.app.figures import per_class_by_bins, save_figure, subplots
from attnmetrics.app.markdown import breakdown
from attnmetrics.app.summaries import as_floats, by_class, by_max_attention, nanmedian, stats


def step(b) -> None:
    r = attnmetrics.permutation_test(*b.args, permutations=b.config.permutations, generator=b.keyed["permutation"])
    b.keep("permutation/median_tvd", r.median_tvd)
    b.lap("permutation")


def permutation_summary(
    median_tvd: np.ndarray, max_attention: np.ndarray, lengths: np.ndarray, predicted: np.ndarray, class_names
) -> dict[str, Any]:
    """J&W 2019 (sec. 4.2, fig. 5): median output TVD under permuted attention, overall, per
    predicted class and by the instance's max attention. Rows with one token are left out."""
    ok = np.asarray(lengths) > 1
    tvd = np.where(ok, median_tvd, np.nan)
    return {
        "overall": stats(tvd),
        "per_class": by_class(tvd, predicted, class_names),
        "by_max_attention": by_max_attention(tvd, max_attention),
        "too_short": int((~ok).sum()),
    }


def summarise(x: dict, c: Context):
    tvd = x["permutation/median_tvd"]
    summary = permutation_summary(tvd, c.max_attention, c.lengths, c.predicted, c.class_names)
    summary["permutations"] = c.config.permutations
    return summary, {"median_tvd": tvd.tolist()}


def section(results: dict) -> list[str]:
    p = results["permutation"]
    return [
        "## Permuted attention (Jain & Wallace 2019, sec. 4.2)",
        "",
        f"Median output TVD over {p.get('permutations', 100)} permutations of the attention among the real tokens.",
        "",
        breakdown(p),
        "",
    ]


def figure(results: dict, folder: Path) -> str | None:
    inst = results.get("instances", {})
    if "permutation" not in inst:
        return None
    fig, ax = subplots(figsize=(7, 4))
    per_class_by_bins(
        ax,
        as_floats(inst["permutation"]["median_tvd"]),
        inst,
        results["data"]["classes"],
        "median output TVD over permutations",
    )
    ax.set_title("Permuted attention (J&W 2019)")
    return save_figure(fig, folder / "permutation.png")


def statistics(results: dict, inst: dict, ok) -> dict:
    if "permutation" not in results:
        return {}
    tvd = ok(inst["permutation"]["median_tvd"])
    return {"permutation median TVD": ("jw", results["permutation"]["overall"]["median"], tvd, nanmedian)}


EXPERIMENT = Experiment(
    "permutation",
    order=40,
    step=step,
    summarise=summarise,
    section=section,
    figure=figure,
    alt="permutation",
    conventions=lambda config: {
        "permutation": f"{config.permutations} permutations among real tokens, median output TVD per instance"
    },
    statistics=statistics,
)
