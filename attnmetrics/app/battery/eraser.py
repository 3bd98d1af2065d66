"""ERASER's comprehensiveness and sufficiency (DeYoung et al. 2020, sec. 4) of every ordering the
battery has for a row: attention, each importance of the run, and a random baseline."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnmetrics.app.battery.registry import Context, Experiment
from attnmetrics.app.markdown import fmt, table
from attnmetrics.app.summaries import by_class, stats
from attnmetrics.eraser import ERASER_FRACTIONS, comprehensiveness, full_rows, sufficiency

#: ERASER's metrics (DeYoung et al. 2020, sec. 4), over every importance ordering the battery has
ERASER_METRICS = {"comprehensiveness": comprehensiveness, "sufficiency": sufficiency}
#: k from a fraction f of a row's L real tokens, by ``BatteryConfig.eraser_rounding`` (``--eraser-rounding``)
ROUNDING_TEXT = {
    "ceil": "k = ceil(f L) (this library's definition: every fraction removes at least one token; ERASER's "
    "encode_attend.py removes ceil(f L) for comprehensiveness but keeps floor(f L) for sufficiency)",
    "floor": "k = floor(f L) (--eraser-rounding floor: ERASER's encode_attend.py:425 sufficiency rationale, "
    "int(k_fraction * len(doc))); a fraction with k = 0 is left out of the row's AOPC",
}
#: the summary's keys that are not orderings
SETTINGS = ("fractions", "rounding")


def step(b) -> None:
    """Each ordering's metrics for these rows (the importances: those Kendall's step found)."""
    ranked = {
        "attention": b.out.attention,
        "random": b.keyed["eraser"].uniform(len(b.lengths), b.out.attention.shape[1:]),
    }
    ranked.update((k, v) for k, v in b.scores.items() if k != "attention")
    full = full_rows(b.model, b.tokens, b.lengths)  # the unperturbed rows, once for every ordering and metric
    for name, ranking in ranked.items():
        for metric, fn in ERASER_METRICS.items():
            r = fn(
                b.model,
                b.tokens,
                b.lengths,
                ranking.to(b.tokens.device),
                rounding=b.config.eraser_rounding,
                full_rows=full,
            )
            b.keep(f"eraser/{name}/{metric}/aopc", r.aopc)
            b.keep(f"eraser/{name}/{metric}/values", r.values)
    b.lap("eraser")


def eraser_summary(aopc: np.ndarray, values: np.ndarray, predicted: np.ndarray, class_names) -> dict[str, Any]:
    """ERASER (DeYoung et al. 2020, sec. 4): the AOPC over the instances (mean ± std, quartiles),
    per predicted class, and the mean of each fraction's value (``values`` [N, F]). Rows without
    real tokens (NaN) are left out."""
    values = np.asarray(values, dtype=float)
    with np.errstate(invalid="ignore"):
        per_fraction = [float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for v in values.T]
    return {
        "aopc": stats(aopc),
        "per_class": by_class(np.asarray(aopc), np.asarray(predicted), class_names),
        "per_fraction": per_fraction,
    }


def summarise(x: dict, c: Context):
    summary: dict = {"fractions": list(ERASER_FRACTIONS), "rounding": c.config.eraser_rounding}
    instances: dict = {}
    for name in dict.fromkeys(k.split("/")[1] for k in x if k.startswith("eraser/")):
        summary[name], instances[name] = {}, {}
        for metric in ERASER_METRICS:
            aopc, values = x[f"eraser/{name}/{metric}/aopc"], x[f"eraser/{name}/{metric}/values"]
            summary[name][metric] = eraser_summary(aopc, values, c.predicted, c.class_names)
            # fraction after fraction (app/table.py's samples)
            instances[name][metric] = {"aopc": aopc.tolist(), "values": values.T.reshape(-1).tolist()}
    return summary, instances


def section(results: dict) -> list[str]:
    s = results["eraser"]
    fractions = s["fractions"]
    names = [name for name in s if name not in SETTINGS]
    rows = []
    for name in names:
        c, f = s[name]["comprehensiveness"], s[name]["sufficiency"]
        rows.append([name, fmt(c["aopc"]["mean"]), fmt(f["aopc"]["mean"]), c["aopc"]["n"]])
    per = [
        [name, metric, *(fmt(v) for v in s[name][metric]["per_fraction"])]
        for name in names
        for metric in ERASER_METRICS
    ]
    return [
        "## Comprehensiveness and sufficiency (ERASER, DeYoung et al. 2020, sec. 4)",
        "",
        f"Each ordering's top {', '.join(f'{100 * x:g}' for x in fractions)} % of the real tokens "
        "deleted (comprehensiveness: higher is more faithful) or kept alone (sufficiency: "
        "lower is), as the drop in the probability of the predicted class; AOPC is the mean over the "
        f"fractions. The random ordering is the baseline. {ROUNDING_TEXT[s.get('rounding', 'ceil')]}.",
        "",
        table(rows, ["ordering", "comprehensiveness AOPC", "sufficiency AOPC", "n"]),
        "",
        table(per, ["ordering", "metric", *(f"{100 * x:g} %" for x in fractions)]),
        "",
    ]


EXPERIMENT = Experiment(
    "eraser",
    order=80,
    step=step,
    summarise=summarise,
    section=section,
    conventions=lambda config: {
        "eraser": "DeYoung et al. 2020: comprehensiveness p(y|x) - p(y|x without the top k), sufficiency p(y|x) - "
        "p(y|the top k alone), top k real tokens by score (ties to the lower index), deleted; AOPC = mean over "
        f"f in {', '.join(f'{x:g}' for x in ERASER_FRACTIONS)}; {ROUNDING_TEXT[config.eraser_rounding]}"
    },
)
