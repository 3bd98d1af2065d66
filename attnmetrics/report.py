"""Summaries, tables and figures of a run's results (report.md and PNGs beside results.json).

Everything here reads the plain ``results`` dictionary written to ``results.json``, so
``attnmetrics report RUN`` can re-render a report without the model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tabulate import tabulate

from attnmetrics.io import write_text_atomic

SIGNIFICANCE = 0.05


def _stats(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0, "mean": math.nan, "std": math.nan, "median": math.nan}
    return {"n": int(x.size), "mean": float(x.mean()), "std": float(x.std()), "median": float(np.median(x))}


def flip_summary(removed: np.ndarray, fraction: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
    """Decision-flip statistics of one ordering (S&S 2019, sec. 4).

    ``fraction`` statistics cover the rows whose fraction is finite (by default the rows that
    flip); rows with fewer than 2 attention items cannot flip and are counted apart (``too_short``).
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
        # NaN marks never-flipping rows by default (left out); with never_flipped=1.0 they count as 1.0.
        "fraction": _stats(np.where(eligible, fraction, np.nan).astype(float)),
    }


def tau_summary(tau: np.ndarray, pvalue: np.ndarray, predicted: np.ndarray, class_names: Sequence[str]) -> dict[str, Any]:
    """Kendall tau-b summary as J&W 2019 (sec. 4.1, Table 2): mean ± std and share with p <= 0.05,
    overall and per predicted class. Rows where tau is undefined (NaN: fewer than 2 tokens
    or all tied) are left out and counted."""
    tau, pvalue, predicted = map(np.asarray, (tau, pvalue, predicted))

    def one(sel: np.ndarray) -> dict[str, Any]:
        ok = sel & np.isfinite(tau)
        s = _stats(tau[ok])
        s["significant"] = float((pvalue[ok] <= SIGNIFICANCE).mean()) if ok.any() else math.nan
        s["undefined"] = int((sel & ~np.isfinite(tau)).sum())
        return s

    return {
        "overall": one(np.ones_like(tau, dtype=bool)),
        "per_class": {name: one(predicted == c) for c, name in enumerate(class_names)},
    }


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)  # atomic: a re-rendered report never leaves a half-written figure
    return path.name


def _figure_flips(results: dict, folder: Path) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inst = results.get("instances", {}).get("flip_fraction")
    if not inst:
        return None
    names = list(inst)
    data = [np.array([v for v in inst[k] if v is not None], dtype=float) for k in names]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1.4]})
    pos = [i for i, d in enumerate(data) if d.size > 1]
    if pos:
        ax.violinplot([data[i] for i in pos], positions=pos, showmedians=True)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("fraction of attention items removed\nbefore the decision flips")
    ax.set_ylim(0, 1)
    ax.set_title("Decision flip (rows that flip)")
    never = [results["flip"][k]["never_flipped_rate"] or 0.0 for k in names]
    bx.bar(range(len(names)), never, color="tab:gray")
    bx.set_xticks(range(len(names)), names, rotation=45, ha="right")
    bx.set_ylim(0, 1)
    bx.set_title("never flips")
    fig.tight_layout()
    return _save(fig, folder / "flip_fraction.png")


def _figure_tau(results: dict, folder: Path) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inst = results.get("instances", {})
    if "kendall_tau" not in inst:
        return None
    tau = np.array([np.nan if v is None else v for v in inst["kendall_tau"]], dtype=float)
    pred = np.array(inst["predicted"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for c, name in enumerate(results["data"]["classes"]):
        t = tau[(pred == c) & np.isfinite(tau)]
        if t.size:
            ax.hist(t, bins=np.linspace(-1, 1, 41), alpha=0.6, label=f"predicted {name} (n={t.size})")
    ax.set_xlabel("Kendall τ-b (attention vs gradient importance)")
    ax.set_ylabel("instances")
    ax.legend()
    fig.tight_layout()
    return _save(fig, folder / "kendall_tau.png")


def render(results: dict, folder: str | Path) -> Path:
    """Write ``report.md`` (and its figures) for ``results`` into ``folder``; returns the report path."""
    folder = Path(folder)
    cfg, data = results["config"], results["data"]
    lines = [
        f"# attnmetrics report: {cfg.get('dataset')} / {cfg.get('encoder', 'lstm')} + {cfg.get('attention', 'tanh')} attention",
        "",
        f"Seed {results.get('seed')}, device {results.get('device')}, "
        f"wall time {_fmt(results.get('wall_time_s', {}).get('total'), 1)} s, "
        f"attnmetrics {results.get('versions', {}).get('attnmetrics')}, torch {results.get('versions', {}).get('torch')}.",
        "",
        "## Data and model",
        "",
        tabulate(
            [[data["name"], data["sizes"]["train"], data["sizes"]["dev"], data["sizes"]["test"], ", ".join(data["classes"])]],
            headers=["dataset", "train", "dev", "test", "classes"],
            tablefmt="github",
        ),
        "",
    ]
    if "test" in results:
        t = results["test"]
        lines += [
            tabulate(
                [[_fmt(t.get("accuracy")), _fmt(t.get("macro_f1")), _fmt(t.get("roc_auc")), results.get("training", {}).get("best_epoch", "–")]],
                headers=["test accuracy", "macro F1", "ROC-AUC", "best epoch"],
                tablefmt="github",
            ),
            "",
        ]
    if "flip" in results:
        conv = results.get("conventions", {})
        lines += [
            "## Decision flip under attention removal (Serrano & Smith 2019)",
            "",
            "Items are removed in each ordering's order, the rest renormalised (L1), until the decision",
            f"changes. Fraction = removed / number of real tokens; never-flipping rows: {conv.get('never_flipped', 'NaN')}.",
            "",
            tabulate(
                [
                    [k, _fmt(v["fraction"]["mean"]), _fmt(v["fraction"]["median"]), _fmt(v["fraction"]["std"]), _fmt(v["never_flipped_rate"]), v["fraction"]["n"]]
                    for k, v in results["flip"].items()
                ],
                headers=["ordering", "mean fraction", "median", "std", "never flips", "rows flipped"],
                tablefmt="github",
            ),
            "",
        ]
        fig = _figure_flips(results, folder)
        if fig:
            lines += [f"![flip fraction]({fig})", ""]
    if "kendall" in results:
        lines += ["## Kendall τ-b between attention and gradient importance (Jain & Wallace 2019)", ""]
        for pair, summ in results["kendall"].items():
            rows = [["all", *_tau_row(summ["overall"])]] + [[f"predicted {c}", *_tau_row(s)] for c, s in summ["per_class"].items()]
            lines += [
                f"**{pair}**",
                "",
                tabulate(rows, headers=["instances", "mean τ", "std", f"p ≤ {SIGNIFICANCE}", "n", "undefined"], tablefmt="github"),
                "",
            ]
        fig = _figure_tau(results, folder)
        if fig:
            lines += [f"![kendall tau]({fig})", ""]
    path = folder / "report.md"
    write_text_atomic(path, "\n".join(lines))
    return path


def _tau_row(s: dict) -> list[str]:
    return [_fmt(s["mean"]), _fmt(s["std"]), _fmt(s["significant"]), s["n"], s["undefined"]]
