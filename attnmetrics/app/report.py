"""report.md of a run (tables, with the figures beside it) and a comparison of several runs.

Everything here reads the plain ``results`` dictionary written to ``results.json``, so
``attnmetrics report RUN`` re-renders a report without the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from attnmetrics.app import figures
from attnmetrics.app.io import write_text_atomic
from attnmetrics.app.summaries import SIGNIFICANCE
from attnmetrics.app.token_view import render_token_view


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _table(rows, headers) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _stat_row(label: str, s: dict) -> list[str]:
    return [label, _fmt(s["mean"]), _fmt(s["std"]), _fmt(s["median"]), s["n"]]


def _breakdown(summary: dict) -> str:
    """Overall / per predicted class / by max attention, as J&W tabulate their figures."""
    rows = [_stat_row("all", summary["overall"])]
    rows += [_stat_row(f"predicted {c}", s) for c, s in summary["per_class"].items()]
    rows += [_stat_row(f"max attention {b}", s) for b, s in summary["by_max_attention"].items()]
    return _table(rows, ["instances", "mean", "std", "median", "n"])


def _model_line(results: dict) -> str:
    m = results.get("model", {})
    return f"{m.get('encoder', '?')} encoder + {m.get('attention', '?')} attention"


def _flip_section(results: dict) -> list[str]:
    conv = results.get("conventions", {})
    rows = [
        [
            k,
            _fmt(v["fraction"]["mean"]),
            _fmt(v["fraction"]["median"]),
            _fmt(v["fraction"]["std"]),
            _fmt(v["never_flipped_rate"]),
            v["fraction"]["n"],
        ]
        for k, v in results["flip"].items()
    ]
    return [
        "## Decision flip under attention removal (Serrano & Smith 2019, sec. 4)",
        "",
        "Items are removed in each ordering's order, the rest renormalised (L1), until the decision",
        f"changes. Fraction = removed / number of real tokens; never-flipping rows: {conv.get('never_flipped', 'NaN')}.",
        "",
        _table(rows, ["ordering", "mean fraction", "median", "std", "never flips", "rows in fraction stats"]),
        "",
    ]


def _kendall_section(results: dict) -> list[str]:
    lines = ["## Kendall τ-b between importance measures (Jain & Wallace 2019, sec. 4.1)", ""]
    for pair, summ in results["kendall"].items():
        rows = [["all", *_tau_row(summ["overall"])]]
        rows += [[f"predicted {c}", *_tau_row(s)] for c, s in summ["per_class"].items()]
        lines += [
            f"**{pair}**",
            "",
            _table(rows, ["instances", "mean τ", "std", f"p ≤ {SIGNIFICANCE}", "n", "undefined"]),
            "",
        ]
    return lines


def _tau_row(s: dict) -> list[str]:
    return [_fmt(s["mean"]), _fmt(s["std"]), _fmt(s["significant"]), s["n"], s["undefined"]]


def _permutation_section(results: dict) -> list[str]:
    p = results["permutation"]
    return [
        "## Permuted attention (Jain & Wallace 2019, sec. 4.2)",
        "",
        f"Median output TVD over {p.get('permutations', 100)} permutations of the attention among the real tokens.",
        "",
        _breakdown(p),
        "",
    ]


def _adversarial_section(results: dict) -> list[str]:
    a = results["adversarial"]
    return [
        "## Adversarial attention (Jain & Wallace 2019, sec. 4.3)",
        "",
        f"Max JSD (nats, ≤ ln 2 ≈ 0.693) between the attention and an adversarial one whose output TVD "
        f"stays ≤ 0.05 ({a.get('steps', 500)} Adam steps, 5 candidates); share above 0.5: "
        f"{_fmt(a['share_above_0.5'])}.",
        "",
        _breakdown(a),
        "",
    ]


def _single_removal_section(results: dict) -> list[str]:
    s = results["single_removal"]
    rows = [
        [w, _fmt(v["jsd"]["mean"]), _fmt(v["jsd"]["median"]), _fmt(v["flip_rate"]), v["jsd"]["n"]]
        for w, v in s.items()
        if isinstance(v, dict) and "jsd" in v
    ]
    lines = [
        "## Removing a single attention weight (Serrano & Smith 2019, sec. 3)",
        "",
        _table(rows, ["weight removed", "mean output JSD", "median", "decision flips", "n"]),
        "",
    ]
    if "top_vs_random" in s:
        t = s["top_vs_random"]
        m = t["mcnemar"]
        lines += [
            f"Top vs random: the top weight's removal moves the output more (JSD) in "
            f"{_fmt(t['jsd_top_greater'])} of instances; flips only after top: {m['b10']}, only after "
            f"random: {m['b01']}, McNemar exact p = {_fmt(m['pvalue'], 4)}.",
            "",
        ]
    return lines


def _single_token_section(results: dict) -> list[str]:
    s = results["single_token"]
    rows = [["all", *_tau_row(s["tau"])]]
    rows += [[f"predicted {c}", *_tau_row(v)] for c, v in s.get("tau_per_class", {}).items()]
    return [
        "## Single-token inputs (Tutek & Šnajder 2020, sec. 4)",
        "",
        "Each real token alone between the row's special tokens; Kendall τ-b between the attention and each "
        "token's alone-probability of the full input's predicted class. The top-attention token alone gives "
        f"the full input's decision in {_fmt(s['top_token_agreement'])} of {s['n']} instances.",
        "",
        _table(rows, ["instances", "mean τ", "std", f"p ≤ {SIGNIFICANCE}", "n", "undefined"]),
        "",
    ]


def _consistent_adversary_section(results: dict) -> list[str]:
    c = results["consistent_adversary"]
    rows = [
        [
            _fmt(r["lambda"], 4),
            _fmt(r["tvd_mean"], 4),
            _fmt(r["jsd_mean"], 4),
            _fmt(r["accuracy"]),
            _fmt(r["macro_f1"]),
            r.get("best_epoch", "–"),
        ]
        for r in c["per_lambda"]
    ]
    lines = [
        "## Model-consistent adversary (Wiegreffe & Pinter 2019, sec. 4.3–4.4)",
        "",
        "A new model per λ, trained with loss Σ TVD(ŷ_adv, ŷ_base) − λ·KL(α_adv ‖ α_base); test means of the "
        "output TVD to the base and of the attention JSD (nats) to the base.",
        "",
        _table(rows, ["λ", "mean output TVD", "mean attention JSD", "accuracy", "macro F1", "epoch kept"]),
        "",
    ]
    if "jain_wallace" in c:
        jw = c["jain_wallace"]
        lines += [
            f"Jain & Wallace's per-instance adversary (battery): mean output TVD {_fmt(jw['tvd_mean'], 4)}, "
            f"mean max JSD {_fmt(jw['jsd_mean'], 4)}.",
            "",
        ]
    return lines


def _diagnostic_section(results: dict) -> list[str]:
    rows = [[name, _fmt(v["accuracy"]), _fmt(v["macro_f1"])] for name, v in results["diagnostic"].items()]
    return [
        "## Diagnostic MLP (Wiegreffe & Pinter 2019, sec. 4.2)",
        "",
        "Per-token MLP (no context) trained and tested with the attention imposed from each source.",
        "",
        _table(rows, ["attention", "accuracy", "macro F1"]),
        "",
    ]


def _heads_section(results: dict) -> list[str]:
    per_head = results["heads"]
    metrics = list(per_head)
    rows = [[f"head {h}", *(_fmt(per_head[m][h]) for m in metrics)] for h in range(len(per_head[metrics[0]]))]
    return [
        "## Per head (the tested attention's heads)",
        "",
        "Each head of the tested attention row on its own, mean over instances: its largest weight, its",
        "JSD (nats) from the head mean the orders and τ use, and its Kendall τ-b with gradient and",
        "leave-one-out importance.",
        "",
        _table(rows, ["head", *metrics]),
        "",
    ]


def _eraser_section(results: dict) -> list[str]:
    s = results["eraser"]
    fractions = s["fractions"]
    rows = []
    for name, metrics in s.items():
        if name == "fractions":
            continue
        c, f = metrics["comprehensiveness"], metrics["sufficiency"]
        rows.append([name, _fmt(c["aopc"]["mean"]), _fmt(f["aopc"]["mean"]), c["aopc"]["n"]])
    lines = [
        "## Comprehensiveness and sufficiency (ERASER, DeYoung et al. 2020, sec. 4)",
        "",
        f"Each ordering's top {', '.join(f'{100 * x:g}' for x in fractions)} % of the real tokens "
        "(k = ceil(f L)) deleted (comprehensiveness: higher is more faithful) or kept alone (sufficiency: "
        "lower is), as the drop in the probability of the predicted class; AOPC is the mean over the "
        "fractions. The random ordering is the baseline.",
        "",
        _table(rows, ["ordering", "comprehensiveness AOPC", "sufficiency AOPC", "n"]),
        "",
    ]
    per = [
        [name, metric, *(_fmt(v) for v in s[name][metric]["per_fraction"])]
        for name in s
        if name != "fractions"
        for metric in ("comprehensiveness", "sufficiency")
    ]
    lines += [_table(per, ["ordering", "metric", *(f"{100 * x:g} %" for x in fractions)]), ""]
    return lines


_SECTIONS = (
    ("flip", _flip_section, figures.flips, "flip fraction"),
    ("kendall", _kendall_section, figures.kendall, "kendall tau"),
    ("permutation", _permutation_section, figures.permutation, "permutation"),
    ("adversarial", _adversarial_section, figures.adversarial, "adversarial"),
    ("single_removal", _single_removal_section, None, None),
    ("single_token", _single_token_section, None, None),
    ("eraser", _eraser_section, None, None),
    ("heads", _heads_section, figures.heads, "per-head heat map"),
    ("consistent_adversary", _consistent_adversary_section, figures.consistent_adversary, "TVD vs JSD"),
    ("diagnostic", _diagnostic_section, None, None),
)


def _timing(wall: dict) -> list[str]:
    """A line of where the wall time went: training, then each part of the battery."""
    parts = [f"training {_fmt(wall['training'], 1)} s"] if "training" in wall else []
    per = wall.get("per_experiment", {})
    if per:
        inner = ", ".join(f"{name} {_fmt(sec, 1)}" for name, sec in per.items())
        parts.append(f"battery {_fmt(wall.get('experiments'), 1)} s ({inner})")
    return [f"Wall time: {'; '.join(parts)}.", ""] if parts else []


def render(results: dict, folder: str | Path) -> Path:
    """Write ``report.md`` (and its figures) for ``results`` into ``folder``; returns the report path."""
    folder = Path(folder)
    cfg, data = results["config"], results["data"]
    lines = [
        f"# attnmetrics report: {cfg.get('dataset')} / {_model_line(results)}",
        "",
        f"Seed {results.get('seed')}, device {results.get('device')}, "
        f"wall time {_fmt(results.get('wall_time_s', {}).get('total'), 1)} s, "
        f"attnmetrics {results.get('versions', {}).get('attnmetrics')}, torch {results.get('versions', {}).get('torch')}.",
        "",
        *_timing(results.get("wall_time_s", {})),
        "## Data and model",
        "",
        _table(
            [
                [
                    data["name"],
                    data["sizes"]["train"],
                    data["sizes"]["dev"],
                    data["sizes"]["test"],
                    ", ".join(data["classes"]),
                ]
            ],
            ["dataset", "train", "dev", "test", "classes"],
        ),
        "",
    ]
    if "test" in results:
        t = results["test"]
        lines += [
            _table(
                [
                    [
                        _fmt(t.get("accuracy")),
                        _fmt(t.get("macro_f1")),
                        _fmt(t.get("roc_auc")),
                        results.get("training", {}).get("best_epoch", "–"),
                    ]
                ],
                ["test accuracy", "macro F1", "ROC-AUC", "best epoch"],
            ),
            "",
        ]
    if isinstance(results.get("battery"), str):
        lines += ["## Faithfulness battery", "", results["battery"], ""]
    for key, section, figure, alt in _SECTIONS:
        if key in results:
            lines += section(results)
            name = figure(results, folder) if figure else None
            if name:
                lines += [f"![{alt}]({name})", ""]
    if render_token_view(results, folder):
        lines += ["The evidence on the text, for a few instances: [report.html](report.html).", ""]
    path = folder / "report.md"
    write_text_atomic(path, "\n".join(lines))
    return path


def _get(d: dict, *keys, default=math.nan):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def render_comparison(runs: Sequence[tuple[str, dict]], folder: str | Path) -> Path:
    """Write ``comparison.md`` into ``folder``: one row per run, the headline number of each
    experiment side by side (each run's own report.md holds the details)."""
    folder = Path(folder)
    rows = []
    for name, r in runs:
        rows.append(
            [
                name,
                r["data"]["name"],
                _model_line(r),
                _fmt(_get(r, "test", "accuracy")),
                _fmt(_get(r, "test", "macro_f1")),
                _fmt(_get(r, "flip", "attention", "never_flipped_rate")),
                _fmt(_get(r, "flip", "attention", "fraction", "mean")),
                _fmt(_get(r, "flip", "random", "fraction", "mean")),
                _fmt(_get(r, "kendall", "attention vs gradient", "overall", "mean")),
                _fmt(_get(r, "kendall", "attention vs loo", "overall", "mean")),
                _fmt(_get(r, "permutation", "overall", "median")),
                _fmt(_get(r, "adversarial", "overall", "mean")),
                _fmt(_get(r, "single_removal", "top", "flip_rate")),
                _fmt(_get(r, "single_removal", "random", "flip_rate")),
            ]
        )
    headers = [
        "run",
        "dataset",
        "model",
        "accuracy",
        "macro F1",
        "never flips (attention order)",
        "flip fraction (attention)",
        "flip fraction (random)",
        "τ attention–gradient",
        "τ attention–LOO",
        "permutation median TVD",
        "adversarial mean max JSD",
        "flips, top removed",
        "flips, random removed",
    ]
    lines = [
        "# attnmetrics comparison",
        "",
        _table(rows, headers),
        "",
        "Each run's report.md has the per-class and per-bin breakdowns and the figures.",
        "",
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "comparison.md"
    write_text_atomic(path, "\n".join(lines))
    return path
