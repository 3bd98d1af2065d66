"""What the reports' figures share: bare ``Figure`` objects, atomic PNG writes, violins, J&W's
max-attention bins and per-class violins, W&P's TVD-vs-JSD curve. Each experiment draws its own
figure in its module (``attnmetrics/app/battery/``) from the per-instance values in ``results.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attnmetrics.app.io import write_png_atomic
from attnmetrics.app.summaries import MAX_ATTENTION_BINS, as_floats

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kwargs):
    """``(figure, axes)`` like ``pyplot.subplots``, on a bare ``matplotlib.figure.Figure``: no
    pyplot state, no GUI backend to choose, nothing to close (files only, never a window).
    matplotlib loads here, on the first figure: the experiment modules that draw import this
    module, and every command (``--help`` included) imports them."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_figure(fig: Figure, path: Path) -> str:
    """Write ``fig`` to ``path`` as a PNG, atomically (a re-rendered report never leaves a
    half-written figure); returns the file name."""
    fig.tight_layout()
    write_png_atomic(path, fig, dpi=120)
    return path.name


#: the markers of :func:`point_styles`, a new one after each nine colours; never "x", the baseline's
MARKERS = "osD^vP*p<h"
#: the colour and marker of a baseline beside :func:`point_styles`' points (tab20's greys are left out of theirs)
BASELINE_STYLE = {"color": "grey", "marker": "x"}


def point_styles(n: int) -> list[dict[str, object]]:
    """``n`` distinct styles (``color``, ``marker``) for one point each in a legend: tab20's colours
    but its greys (the baseline's), the nine dark shades, then the nine light, each nine with a
    marker of its own (:data:`MARKERS`), so the first 18 differ in colour and the first 90 in
    colour or marker."""
    from matplotlib import colormaps

    tab20 = [c for k, c in enumerate(colormaps["tab20"].colors) if k not in (14, 15)]  # 14, 15: grey
    colours = [*tab20[0::2], *tab20[1::2]]
    hues = len(colours) // 2
    return [{"color": colours[k % len(colours)], "marker": MARKERS[k // hues % len(MARKERS)]} for k in range(n)]


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


def per_class_by_bins(ax, values, inst, classes, ylabel):
    """J&W's violins: one group per max-attention bin, one violin per predicted class."""
    max_att, pred = as_floats(inst["max_attention"]), np.array(inst["predicted"])
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
