"""The paper-style figures of a report, drawn from the per-instance values in ``results.json``.

Each function returns the PNG's file name, or None when the run has no data for it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from attnmetrics.app.summaries import MAX_ATTENTION_BINS


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kwargs):
    """``(figure, axes)`` like ``pyplot.subplots``, on a bare ``matplotlib.figure.Figure``: no
    pyplot state, no GUI backend to choose, nothing to close (files only, never a window)."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_figure(fig: Figure, path: Path) -> str:
    """Write ``fig`` to ``path`` as a PNG, atomically (a re-rendered report never leaves a
    half-written figure); returns the file name."""
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)
    return path.name


def _array(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def violins(ax, data: list[np.ndarray], positions, width=0.8, color=None):
    """One violin (with its median) per array of ``data`` at ``positions`` on ``ax``; NaNs
    dropped, arrays with fewer than two finite values left out."""
    keep = [(d[np.isfinite(d)], p) for d, p in zip(data, positions) if np.isfinite(d).sum() > 1]
    if keep:
        parts = ax.violinplot([d for d, _ in keep], positions=[p for _, p in keep], widths=width, showmedians=True)
        if color:
            for body in parts["bodies"]:
                body.set_facecolor(color)


def by_bins(values: np.ndarray, max_attention: np.ndarray) -> list[np.ndarray]:
    """``values`` split by their instance's max attention into J&W's bins (MAX_ATTENTION_BINS)."""
    edges = MAX_ATTENTION_BINS
    return [
        values[(max_attention >= lo) & ((max_attention < hi) if hi < 1 else (max_attention <= hi))]
        for lo, hi in zip(edges[:-1], edges[1:])
    ]


def bin_labels() -> list[str]:
    """The max-attention bins' labels, ``"0.00–0.25"`` and so on."""
    e = MAX_ATTENTION_BINS
    return [f"{lo:.2f}–{hi:.2f}" for lo, hi in zip(e[:-1], e[1:])]


def _per_class_by_bins(ax, values, inst, classes, ylabel):
    """J&W's violins: one group per max-attention bin, one violin per predicted class."""
    max_att, pred = _array(inst["max_attention"]), np.array(inst["predicted"])
    k = len(classes)
    width = 0.8 / k
    for c, name in enumerate(classes):
        sel = pred == c
        pos = [i + (c - (k - 1) / 2) * width for i in range(len(MAX_ATTENTION_BINS) - 1)]
        violins(ax, by_bins(values[sel], max_att[sel]), pos, width=width * 0.9, color=f"C{c}")
        ax.plot([], [], color=f"C{c}", lw=6, label=f"predicted {name}")
    ax.set_xticks(range(len(MAX_ATTENTION_BINS) - 1), bin_labels())
    ax.set_xlabel("max attention of the instance")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


def flips(results: dict, folder: Path) -> str | None:
    inst = results.get("instances", {}).get("flip")
    if not inst:
        return None
    names = list(inst)
    fig, (ax, bx) = subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1.4]})
    violins(ax, [_array(inst[k]["fraction"]) for k in names], range(len(names)))
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


def kendall(results: dict, folder: Path) -> str | None:
    inst = results.get("instances", {})
    pairs = inst.get("kendall")
    if not pairs:
        return None
    pred = np.array(inst["predicted"])
    fig, axes = subplots(1, len(pairs), figsize=(5 * len(pairs), 3.8), squeeze=False)
    for ax, (pair, v) in zip(axes[0], pairs.items()):
        tau = _array(v["tau"])
        for c, name in enumerate(results["data"]["classes"]):
            t = tau[(pred == c) & np.isfinite(tau)]
            if t.size:
                ax.hist(t, bins=np.linspace(-1, 1, 41), alpha=0.6, label=f"predicted {name}")
        ax.set_xlabel(f"Kendall τ-b ({pair})")
        ax.set_ylabel("instances")
        if ax.get_legend_handles_labels()[0]:  # no histogram when τ is undefined everywhere (uniform attention)
            ax.legend(fontsize=8)
    return save_figure(fig, folder / "kendall_tau.png")


def permutation(results: dict, folder: Path) -> str | None:
    inst = results.get("instances", {})
    if "permutation" not in inst:
        return None
    fig, ax = subplots(figsize=(7, 4))
    _per_class_by_bins(
        ax,
        _array(inst["permutation"]["median_tvd"]),
        inst,
        results["data"]["classes"],
        "median output TVD over permutations",
    )
    ax.set_title("Permuted attention (J&W 2019)")
    return save_figure(fig, folder / "permutation.png")


def adversarial(results: dict, folder: Path) -> str | None:
    inst = results.get("instances", {})
    if "adversarial" not in inst:
        return None
    jsd = _array(inst["adversarial"]["max_jsd"])
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
    _per_class_by_bins(bx, jsd, inst, results["data"]["classes"], "max JSD within the output bound")
    return save_figure(fig, folder / "adversarial.png")


def tvd_vs_jsd(
    ax,
    per_lambda: list[tuple[float, float, float]],
    jain_wallace: tuple[float, float] | None,
    label: str,
    color: str = "C0",
    jw_label: str = "per-instance adversary (J&W)",
) -> None:
    """W&P 2019 (fig. 4) on ``ax``: the model-consistent adversary's (λ, mean attention JSD,
    mean output TVD) points as a curve, λ-labelled when there are several, and J&W's
    per-instance adversary (JSD, TVD) as a star."""
    ax.plot([j for _, j, _ in per_lambda], [t for _, _, t in per_lambda], "o-", color=color, label=label)
    if len(per_lambda) > 1:  # a λ sweep: label its points (a single λ is named in the legend)
        for k, (lam, j, t) in enumerate(per_lambda):
            ax.annotate(
                f"λ={lam:g}", (j, t), fontsize=7, xytext=(4, 4 - 10 * (k % 2)), textcoords="offset points", color=color
            )
    if jain_wallace is not None:
        ax.plot([jain_wallace[0]], [jain_wallace[1]], "*", ms=12, color=color, label=jw_label)
    ax.set_xlabel("mean attention JSD to the base (nats)")
    ax.set_ylabel("mean output TVD to the base")
    ax.set_title("Model-consistent adversary (W&P 2019)")


def consistent_adversary(results: dict, folder: Path) -> str | None:
    """W&P 2019 (fig. 4): mean output TVD against mean attention JSD, one point per λ, with
    J&W's per-instance adversary as a separate marker when the battery ran it."""
    c = results.get("consistent_adversary")
    if not c or not c.get("per_lambda"):
        return None
    jw = c.get("jain_wallace")
    fig, ax = subplots(figsize=(6, 4))
    tvd_vs_jsd(
        ax,
        [(r["lambda"], r["jsd_mean"], r["tvd_mean"]) for r in c["per_lambda"]],
        (jw["jsd_mean"], jw["tvd_mean"]) if jw else None,
        "model-consistent adversary (W&P)",
    )
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return save_figure(fig, folder / "consistent_adversary.png")


def heads(results: dict, folder: Path) -> str | None:
    """Heads x metrics heat map of a transformer's tested attention (each metric's mean per head)."""
    per_head = results.get("heads")
    if not per_head:
        return None
    metrics = list(per_head)
    values = np.array([_array(per_head[m]) for m in metrics]).T  # [heads, metrics]
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
