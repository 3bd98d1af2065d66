"""T&Š 2020's single-token inputs (sec. 4): each real token alone between the row's special tokens;
Kendall τ-b between the attention and each token's alone-probability of the full decision."""

from __future__ import annotations

from attnmetrics.app.battery.kendall import tau_summary
from attnmetrics.app.battery.registry import Context, Experiment
from attnmetrics.app.markdown import TAU_HEADERS, fmt, table, tau_row
from attnmetrics.app.summaries import as_floats, get, nanmean
from attnmetrics.single_token import single_token_test


def step(b) -> None:
    r = single_token_test(b.model, b.tokens, b.lengths, full=b.out)
    b.keep("single_token/tau", r.tau)
    b.keep("single_token/pvalue", r.pvalue)
    b.keep("single_token/top_agrees", r.top_agrees)
    b.lap("single_token")


def summarise(x: dict, c: Context):
    tau, p, agrees = x["single_token/tau"], x["single_token/pvalue"], x["single_token/top_agrees"]
    taus = tau_summary(tau, p, c.predicted, c.class_names)
    has_tokens = c.lengths > 0
    summary = {
        "tau": taus["overall"],
        "tau_per_class": taus["per_class"],
        "top_token_agreement": float(agrees[has_tokens].mean()) if has_tokens.any() else float("nan"),
        "n": int(has_tokens.sum()),
    }
    return summary, {"tau": tau.tolist(), "pvalue": p.tolist(), "top_token_agrees": agrees.tolist()}


def section(results: dict) -> list[str]:
    s = results["single_token"]
    rows = [["all", *tau_row(s["tau"])]]
    rows += [[f"predicted {c}", *tau_row(v)] for c, v in s.get("tau_per_class", {}).items()]
    return [
        "## Single-token inputs (Tutek & Šnajder 2020, sec. 4)",
        "",
        "Each real token alone between the row's special tokens; Kendall τ-b between the attention and each "
        "token's alone-probability of the full input's predicted class. The top-attention token alone gives "
        f"the full input's decision in {fmt(s['top_token_agreement'])} of {s['n']} instances.",
        "",
        table(rows, TAU_HEADERS),
        "",
    ]


def statistics(results: dict, inst: dict, ok) -> dict:
    if "single_token" not in results:
        return {}
    tau = get(inst, "single_token", "tau")
    return {
        "single-token τ": (
            "ts",
            get(results, "single_token", "tau", "mean"),
            as_floats(tau) if isinstance(tau, list) else None,
            nanmean,
        )
    }


EXPERIMENT = Experiment(
    "single_token",
    order=70,
    step=step,
    summarise=summarise,
    section=section,
    conventions=lambda config: {
        "single_token": "T&S 2020: each real token alone between the row's own special tokens; tau-b between "
        "attention and the alone-probability of the full input's predicted class; top-attention token (ties: "
        "lower index) alone gives the full decision"
    },
    statistics=statistics,
)
