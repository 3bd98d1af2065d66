"""J&W 2019's adversarial attention (sec. 4.3): the largest attention JSD from the model's own whose
output stays within a TVD bound, per instance."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

import attnmetrics
from attnmetrics.app.battery.registry import Context, Experiment, memory_budget
from attnmetrics.app.figures import per_class_by_bins, save_figure, subplots
from attnmetrics.app.markdown import breakdown, fmt
from attnmetrics.app.summaries import as_floats, by_class, by_max_attention, nanmean, stats

#: the max-JSD thresholds whose per-class shares a sweep aggregates (J&W's histogram read at 0.3 and 0.5)
SHARE_THRESHOLDS = (0.3, 0.5)


def step(b) -> None:
    attention, values, decoder, lengths = b.args
    if b.own is not None and b.own.factored is not None:  # a transformer's: each step mixes d / heads wide
        values = b.own.factored
    r = attnmetrics.adversarial_attention(
        attention,
        values,
        decoder,
        lengths,
        steps=b.config.adversarial_steps,
        diversity_weight=b.config.adversarial_diversity,
        amsgrad=b.config.adversarial_amsgrad,
        generator=b.keyed["adversarial"],
        memory_budget=memory_budget(b.lengths.device),
    )
    b.keep("adversarial/max_jsd", r.max_jsd)
    b.keep("adversarial/output_tvd", r.output_tvd)
    b.lap("adversarial")


def adversarial_summary(
    max_jsd: np.ndarray,
    output_tvd: np.ndarray,
    max_attention: np.ndarray,
    lengths: np.ndarray,
    predicted: np.ndarray,
    class_names,
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
        "per_class": by_class(jsd, predicted, class_names),
        "by_max_attention": by_max_attention(jsd, max_attention),
        "share_above_0.5": float((defined > 0.5).mean()) if defined.size else math.nan,
        "output_tvd": stats(np.where(ok, output_tvd, np.nan)),
        "too_short": int((~ok).sum()),
    }


def summarise(x: dict, c: Context):
    jsd, tvd = x["adversarial/max_jsd"], x["adversarial/output_tvd"]
    summary = adversarial_summary(jsd, tvd, c.max_attention, c.lengths, c.predicted, c.class_names)
    summary["steps"] = c.config.adversarial_steps
    summary["diversity_weight"] = c.config.adversarial_diversity
    summary["amsgrad"] = c.config.adversarial_amsgrad
    return summary, {"max_jsd": jsd.tolist(), "output_tvd": tvd.tolist()}


def section(results: dict) -> list[str]:
    a = results["adversarial"]
    return [
        "## Adversarial attention (Jain & Wallace 2019, sec. 4.3)",
        "",
        f"Max JSD (nats, ≤ ln 2 ≈ 0.693) between the attention and an adversarial one whose output TVD "
        f"stays ≤ 0.05 ({a.get('steps', 500)} Adam steps, 5 candidates); share above 0.5: "
        f"{fmt(a['share_above_0.5'])}.",
        "",
        breakdown(a),
        "",
    ]


def figure(results: dict, folder: Path) -> str | None:
    inst = results.get("instances", {})
    if "adversarial" not in inst:
        return None
    jsd = as_floats(inst["adversarial"]["max_jsd"])
    pred = np.array(inst["predicted"])
    fig, (ax, bx) = subplots(1, 2, figsize=(12, 4))
    for c, name in enumerate(results["data"]["classes"]):
        j = jsd[(pred == c) & np.isfinite(jsd)]
        if j.size:
            ax.hist(j, bins=np.linspace(0, np.log(2), 36), alpha=0.6, label=f"predicted {name}")
    ax.set_xlabel("max JSD(adversarial attention, attention), nats")
    ax.set_ylabel("instances")
    ax.legend(fontsize=8)
    ax.set_title("Adversarial attention (J&W 2019)")
    per_class_by_bins(bx, jsd, inst, results["data"]["classes"], "max JSD within the output bound")
    return save_figure(fig, folder / "adversarial.png")


def statistics(results: dict, inst: dict, ok) -> dict:
    if "adversarial" not in results:
        return {}
    jsd = ok(inst["adversarial"]["max_jsd"])
    out = {"adversarial max JSD (mean)": ("jw", results["adversarial"]["overall"]["mean"], jsd, nanmean)}
    # J&W's histogram (figs. 6-7) as shares: per predicted class, the rows whose max JSD reaches t
    predicted = np.asarray(inst.get("predicted", []))
    defined = np.isfinite(jsd)
    for c, name in enumerate(results["data"]["classes"]):
        mine = defined & (predicted == c)
        for t in SHARE_THRESHOLDS:
            share = np.where(mine, jsd >= t, np.nan)
            out[f"adversarial share max JSD ≥ {t} (predicted {name})"] = ("jw", float(nanmean(share)), share, nanmean)
    return out


EXPERIMENT = Experiment(
    "adversarial",
    order=50,
    step=step,
    summarise=summarise,
    section=section,
    figure=figure,
    alt="adversarial",
    conventions=lambda config: {
        "adversarial": f"J&W: 5 candidates, {config.adversarial_steps} "
        f"{'AMSGrad' if config.adversarial_amsgrad else 'Adam'} steps lr 0.01, "
        "loss -JSD + 500 ReLU(TVD - 0.01) - pairwise JSD; max JSD among outputs with TVD <= 0.05"
    },
    statistics=statistics,
)
