"""ERASER's comprehensiveness and sufficiency (DeYoung et al. 2020, sec. 4) of every ordering the
battery has for a row: attention, each importance of the run, and a random baseline."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnmetrics.app.battery.registry import Context, Experiment
from attnmetrics.app.markdown import fmt, table
from attnmetrics.app.summaries import by_class, stats
from attnmetrics.eraser import NAMED_FRACTIONS, comprehensiveness_and_sufficiency

#: ERASER's metrics (DeYoung et al. 2020, sec. 4), over every importance ordering the battery has
#: (computed together by ``comprehensiveness_and_sufficiency``)
ERASER_METRICS = ("comprehensiveness", "sufficiency")
#: k from a fraction f of a row's L real tokens, by ``BatteryConfig.eraser_rounding`` (``--eraser-rounding``)
ROUNDING_TEXT = {
    "ceil": "k = ceil(f L) (this library's definition: every fraction removes at least one token; ERASER's "
    "encode_attend.py removes ceil(f L) for comprehensiveness but keeps floor(f L) for sufficiency)",
    "floor": "k = floor(f L) (--eraser-rounding floor: ERASER's encode_attend.py:425 sufficiency rationale, "
    "int(k_fraction * len(doc))); a fraction with k = 0 is left out of the row's AOPC",
    "decompx": "k = floor(L * f) of the float product (--eraser-rounding decompx: DecompX's "
    "experiments/notebooks/v3/analysis_v3.ipynb, int(np.floor(len(rank) * self.masking_ratio)), "
    "mohsenfayyaz/DecompX@b6bddf0b); a fraction with k = 0 counts: 0 for comprehensiveness, p(y|x) - p(y|the "
    "empty rationale) for sufficiency",
}
#: how the fractions' values make the AOPC, by ``BatteryConfig.eraser_aopc`` (``--eraser-aopc``)
AOPC_TEXT = {
    "eraser": "AOPC is the mean over the fractions",
    "alti": "AOPC = ALTI's (--eraser-aopc alti: Ferrando et al. 2022, mt-upc/transformer-contributions@4f890398 "
    "aupc.py and evaluation.ipynb): the running minimum (comprehensiveness, from p(y|x)) or maximum "
    "(sufficiency, from p(y|the empty rationale)) of the probability along the fractions, p(y|x) minus it "
    "summed over the fractions and divided by their number + 1 (6 for ERASER's 5)",
}
#: a token's integrated-gradients and gradient x input score, by ``--attribution-aggregation``
AGGREGATION_TEXT = {
    "sum": "a token's integrated-gradients and gradient x input score is |sum over the embedding dimensions| of "
    "its attribution",
    "l2": "a token's integrated-gradients and gradient x input score is the L2 norm of its attribution vector "
    "(--attribution-aggregation l2: ALTI's ig_l2/grad_input_l2, DecompX's IG/IXG NORM)",
    "mean_abs": "a token's integrated-gradients and gradient x input score is the mean over the embedding "
    "dimensions of its attribution's absolute values (--attribution-aggregation mean_abs: ALTI's "
    "ig_abs_mean/grad_input_mean_abs_mean)",
}
#: the summary's keys that are not orderings
SETTINGS = ("fractions", "rounding", "aopc_protocol", "mask_token")


def _mode(config) -> dict[str, Any]:
    """``mode`` and ``mask_token`` of the ERASER calls: deleted, or replaced by ``--eraser-mask-token``."""
    token = getattr(config, "eraser_mask_token", None)
    return {"mode": "delete"} if token is None else {"mode": "mask", "mask_token": int(token)}


def _removal_text(config) -> str:
    token = getattr(config, "eraser_mask_token", None)
    return "deleted" if token is None else f"replaced by token id {token} (--eraser-mask-token)"


def _conventions(config) -> dict[str, str]:
    """results.json's "conventions": ERASER's definition as the run computes it (the default run's
    text as before issue 47's options), and, where ``--attribution-aggregation`` is not the default,
    the integrated-gradients and gradient x input score (the importances' conventions are fixed
    texts, so the run's choice is written here, beside the ERASER orderings it changes)."""
    fractions = ", ".join(f"{x:g}" for x in NAMED_FRACTIONS[getattr(config, "eraser_fractions", "eraser")])
    aopc = getattr(config, "eraser_aopc", "eraser")
    averaged = f"AOPC = mean over f in {fractions}" if aopc == "eraser" else f"f in {fractions}; {AOPC_TEXT[aopc]}"
    out = {
        "eraser": "DeYoung et al. 2020: comprehensiveness p(y|x) - p(y|x without the top k), sufficiency p(y|x) - "
        f"p(y|the top k alone), top k real tokens by score (ties to the lower index), {_removal_text(config)}; "
        f"{averaged}; {ROUNDING_TEXT[config.eraser_rounding]}"
    }
    aggregation = getattr(config, "options", {}).get("attribution_aggregation", "sum")
    if aggregation != "sum":
        out["attribution_aggregation"] = AGGREGATION_TEXT[aggregation]
    return out


def step(b) -> None:
    """Each ordering's metrics for these rows (the importances: those Kendall's step found)."""
    ranked = {
        "attention": b.out.attention,
        "random": b.keyed["eraser"].uniform(len(b.lengths), b.out.attention.shape[1:]),
    }
    ranked.update((k, v) for k, v in b.scores.items() if k != "attention")
    # every ordering's and metric's perturbed rows at once (the unperturbed rows run once; a
    # causal decoder's rows prepared once, a perturbed row two orderings share run once)
    results = comprehensiveness_and_sufficiency(
        b.model,
        b.tokens,
        b.lengths,
        {name: ranking.to(b.tokens.device) for name, ranking in ranked.items()},
        NAMED_FRACTIONS[b.config.eraser_fractions],
        rounding=b.config.eraser_rounding,
        aopc=b.config.eraser_aopc,
        **_mode(b.config),
    )
    for name, metrics in results.items():
        for metric, r in metrics.items():
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
    summary: dict = {
        "fractions": list(NAMED_FRACTIONS[c.config.eraser_fractions]),
        "rounding": c.config.eraser_rounding,
        "aopc_protocol": c.config.eraser_aopc,
        "mask_token": c.config.eraser_mask_token,
    }
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
    token = s.get("mask_token")
    removed = "deleted" if token is None else f"replaced by token id {token}"
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
        f"{removed} (comprehensiveness: higher is more faithful) or kept alone (sufficiency: "
        "lower is), as the drop in the probability of the predicted class; "
        f"{AOPC_TEXT[s.get('aopc_protocol', 'eraser')]}. The random ordering is the baseline. "
        f"{ROUNDING_TEXT[s.get('rounding', 'ceil')]}.",
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
    conventions=lambda config: _conventions(config),
)
