"""W&P 2019's diagnostic MLP (sec. 4.2), trained outside the battery
(``attnmetrics.app.diagnostic_mlps``): its report section and conventions."""

from __future__ import annotations

from attnmetrics.app.battery.registry import Experiment
from attnmetrics.app.markdown import fmt, table


def section(results: dict) -> list[str]:
    rows = [[name, fmt(v["accuracy"]), fmt(v["macro_f1"])] for name, v in results["diagnostic"].items()]
    return [
        "## Diagnostic MLP (Wiegreffe & Pinter 2019, sec. 4.2)",
        "",
        "Per-token MLP (no context) trained and tested with the attention imposed from each source.",
        "",
        table(rows, ["attention", "accuracy", "macro F1"]),
        "",
    ]


EXPERIMENT = Experiment(
    "diagnostic",
    order=95,
    section=section,
    skippable=False,
    conventions=lambda config: {
        "diagnostic": "W&P 2019: average encoder (Linear + tanh per token) with imposed attention in training and "
        "testing; epoch kept: best dev ROC-AUC (ties: lowest dev loss)"
    },
)
