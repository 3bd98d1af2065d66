"""W&P 2019's model-consistent adversary (sec. 4.3-4.4), trained outside the battery (one new model
per λ: ``attnmetrics.app.consistent_adversary``): its report section, figure and
conventions, beside J&W's per-instance adversary."""

from __future__ import annotations

from pathlib import Path

from attnmetrics.app.battery.registry import Experiment
from attnmetrics.app.figures import save_figure, subplots, tvd_vs_jsd
from attnmetrics.app.markdown import fmt, table

#: the loss's TVD term by ``tvd_scale`` (a results.json without one predates W&P's ½: standard)
LOSS_TVD = {
    "wiegreffe-pinter": "½·TVD(ŷ_adv, ŷ_base) (W&P's scale, so λ is theirs)",
    "standard": "TVD(ŷ_adv, ŷ_base) (λ here is 2λ in W&P's code)",
}


def section(results: dict) -> list[str]:
    c = results["consistent_adversary"]
    rows = [
        [
            fmt(r["lambda"], 4),
            fmt(r["tvd_mean"], 4),
            fmt(r["jsd_mean"], 4),
            fmt(r["accuracy"]),
            fmt(r["macro_f1"]),
            r.get("best_epoch", "–"),
        ]
        for r in c["per_lambda"]
    ]
    lines = [
        "## Model-consistent adversary (Wiegreffe & Pinter 2019, sec. 4.3–4.4)",
        "",
        f"A new model per λ, trained with loss Σ {LOSS_TVD[c.get('tvd_scale', 'standard')]} − λ·KL(α_adv ‖ α_base); "
        "test means of the output TVD (½ Σ |Δp|, twice the TVD W&P's code reports for two classes) to the base "
        "and of the attention JSD (nats) to the base.",
        "",
        table(rows, ["λ", "mean output TVD", "mean attention JSD", "accuracy", "macro F1", "epoch kept"]),
        "",
    ]
    if "jain_wallace" in c:
        jw = c["jain_wallace"]
        lines += [
            f"Jain & Wallace's per-instance adversary (battery): mean output TVD {fmt(jw['tvd_mean'], 4)}, "
            f"mean max JSD {fmt(jw['jsd_mean'], 4)}.",
            "",
        ]
    return lines


def figure(results: dict, folder: Path) -> str | None:
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


EXPERIMENT = Experiment(
    "consistent_adversary",
    order=90,
    section=section,
    figure=figure,
    alt="TVD vs JSD",
    skippable=False,
    conventions=lambda config: {
        "consistent_adversary": "W&P 2019: loss sum over batch of 1/2 TVD(y_adv, y_base) - lambda KL(a_adv || a_base) "
        "(TVD scaled by 1/2 (W&P's: sarahwie/attention common_code/metrics.py:12-13 sums 1/2 |dp| of the positive "
        "class, model/Binary_Classification.py:126), so lambda means theirs), KL over real tokens (0 log 0 = 0), "
        "base frozen; same init, data and recipe as the base; epoch kept: lowest mean dev objective; test TVD "
        "(1/2 sum |dp|, twice W&P's for two classes) of outputs, JSD of attention (means)"
    },
)
