"""Markdown building blocks of the reports: numbers, GitHub tables, and the breakdowns the papers
tabulate (overall / per predicted class / by max attention; Kendall τ rows)."""

from __future__ import annotations

import math
from typing import Any

from tabulate import tabulate

from attnmetrics.app.summaries import SIGNIFICANCE

#: the columns of a τ table (:func:`tau_row`)
TAU_HEADERS = ["instances", "mean τ", "std", f"p ≤ {SIGNIFICANCE}", "n", "undefined"]


def fmt(x: Any, digits: int = 3) -> str:
    """A number as the reports print it: ``digits`` decimals, "–" for None, NaN and infinities."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def table(rows, headers) -> str:
    """A GitHub-flavoured markdown table, cells as given (no number parsing)."""
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _stat_row(label: str, s: dict) -> list[str]:
    return [label, fmt(s["mean"]), fmt(s["std"]), fmt(s["median"]), s["n"]]


def breakdown(summary: dict) -> str:
    """Overall / per predicted class / by max attention, as J&W tabulate their figures."""
    rows = [_stat_row("all", summary["overall"])]
    rows += [_stat_row(f"predicted {c}", s) for c, s in summary["per_class"].items()]
    rows += [_stat_row(f"max attention {b}", s) for b, s in summary["by_max_attention"].items()]
    return table(rows, ["instances", "mean", "std", "median", "n"])


def tau_row(s: dict) -> list[str]:
    """A τ summary's cells under :data:`TAU_HEADERS` (after the row's label)."""
    return [fmt(s["mean"]), fmt(s["std"]), fmt(s["significant"]), s["n"], s["undefined"]]
