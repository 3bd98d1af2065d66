"""A transformer's own attention, each head on its own (docs/definitions.md §15): how far it is from
the head mean the procedures test, and (with Kendall's experiment) how it ranks tokens against
each importance. Runs wherever the model has heads of its own, right after Kendall's step."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import attnmetrics
from attnmetrics.app.battery.registry import Context, Experiment
from attnmetrics.app.figures import save_figure, subplots
from attnmetrics.app.markdown import fmt, table
from attnmetrics.app.summaries import as_floats, stats


def step(b) -> None:
    for h in range(b.own.attention.shape[1]):
        head = b.own.attention[:, h]
        b.keep(f"heads/h{h}/max attention", head.max(-1).values)
        b.keep(f"heads/h{h}/JSD from the head mean", attnmetrics.jsd(head, b.out.attention))
        if b.chose("kendall"):
            for importance in b.run.importances:
                if importance.head_partner:
                    tau = attnmetrics.kendall_tau(head, b.scores[importance.name], b.out.lengths).tau
                    b.keep(f"heads/h{h}/tau vs {importance.name}", tau)
    b.lap("heads")


def summarise(x: dict, c: Context):
    heads = sorted({k.split("/")[1] for k in x if k.startswith("heads/")}, key=lambda h: int(h[1:]))
    if not heads:
        return None
    metrics = list(dict.fromkeys(k.split("/", 2)[2] for k in x if k.startswith("heads/")))
    instances = {h: {m: x[f"heads/{h}/{m}"].astype(float).tolist() for m in metrics} for h in heads}
    real = c.lengths > 0
    # the mean over the rows where the value is defined (τ is NaN for rows of ties), NaN if none
    summary = {m: [stats(x[f"heads/{h}/{m}"][real])["mean"] for h in heads] for m in metrics}
    return summary, instances


def section(results: dict) -> list[str]:
    per_head = results["heads"]
    metrics = list(per_head)
    rows = [[f"head {h}", *(fmt(per_head[m][h]) for m in metrics)] for h in range(len(per_head[metrics[0]]))]
    return [
        "## Per head (the tested attention's heads)",
        "",
        "Each head of the tested attention row on its own, mean over instances: its largest weight, its",
        "JSD (nats) from the head mean the orders and τ use, and its Kendall τ-b with gradient and",
        "leave-one-out importance.",
        "",
        table(rows, ["head", *metrics]),
        "",
    ]


def figure(results: dict, folder: Path) -> str | None:
    """Heads x metrics heat map of a transformer's tested attention (each metric's mean per head)."""
    per_head = results.get("heads")
    if not per_head:
        return None
    metrics = list(per_head)
    values = np.array([as_floats(per_head[m]) for m in metrics]).T  # [heads, metrics]
    fig, ax = subplots(figsize=(1.6 + 1.5 * len(metrics), 0.9 + 0.45 * values.shape[0]))
    # each column on its own colour scale: the metrics have different ranges
    finite = np.where(np.isfinite(values), values, np.nan)
    low = np.array([np.min(c[np.isfinite(c)], initial=0.0) for c in finite.T])
    high = np.array([np.max(c[np.isfinite(c)], initial=0.0) for c in finite.T])
    scaled = np.nan_to_num((values - low) / np.where(high > low, high - low, 1), nan=0.0)
    ax.imshow(scaled, cmap="viridis", aspect="auto", vmin=0, vmax=1)
    for (i, j), v in np.ndenumerate(values):
        ax.text(j, i, f"{v:.3f}", ha="center", va="center", color="white" if scaled[i, j] < 0.6 else "black")
    ax.set_xticks(range(len(metrics)), metrics, rotation=20, ha="right")
    ax.set_yticks(range(values.shape[0]), [f"head {h}" for h in range(values.shape[0])])
    ax.set_title("tested attention, per head (mean over instances; colour per column)")
    return save_figure(fig, folder / "heads.png")


EXPERIMENT = Experiment(
    "heads",
    order=30,
    step=step,
    summarise=summarise,
    section=section,
    figure=figure,
    alt="per-head heat map",
    skippable=False,
    runs=lambda b: b.own is not None,
    report_order=85,
)
