"""A sweep's report.md and figures, rendered from its aggregate (attnmetrics/app/aggregate.py) alone:
one section per paper's question; a section without data is left out."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from attnmetrics.app.battery.methods import eraser_figure, sweep_lines
from attnmetrics.app.figures import bin_labels, by_bins, save_figure, subplots, tvd_vs_jsd, violins
from attnmetrics.app.io import write_text_atomic
from attnmetrics.app.markdown import fmt, table

STAT_HEADERS = ["group", "statistic", "estimate", "95% CI (seeds, instances)", "std over seeds", "min", "max", "seeds"]


def _ci(ci95) -> str:
    """A 95% CI as "[lo, hi]", or "–" where it is undefined."""
    lo, hi = ci95
    return "–" if lo is None or hi is None or lo != lo else f"[{fmt(lo)}, {fmt(hi)}]"


def _stat_rows(agg: dict, section: str) -> list[list[str]]:
    rows = []
    for group, g in agg["groups"].items():
        for name, s in g["statistics"].items():
            if s["section"] == section:
                ci, estimate = _ci(s["ci95"]), s.get("estimate", s["mean"])
                rows.append([group, name, fmt(estimate), ci, fmt(s["std"]), fmt(s["min"]), fmt(s["max"]), s["seeds"]])
    return rows


def _mcnemar_rows(agg: dict, axis: str) -> list[list[str]]:
    return [
        [
            t["group"],
            t["baseline"],
            t["seed"],
            fmt(t["accuracy"]),
            fmt(t["baseline_accuracy"]),
            t["b10"],
            t["b01"],
            fmt(t["pvalue"], 4),
        ]
        for t in agg["paired_tests"]
        if t["axis"] == axis
    ]


MCNEMAR_HEADERS = [
    "model",
    "baseline",
    "seed",
    "accuracy",
    "baseline accuracy",
    "only model right",
    "only baseline right",
    "McNemar p",
]


def _gpt_rows(agg: dict) -> list[list[str]]:
    """GPT-1's ablations (Radford et al. 2018, sec. 5): one row per group of a sweep with a GPT
    group, every group's test accuracy beside its setting (the BiLSTM's rows as the reference)."""
    groups = agg["groups"].items()
    if not any(g.get("model", {}).get("encoder") == "gpt" for _, g in groups):
        return []
    rows = []
    for name, g in sorted(groups, key=lambda kv: (kv[1]["axes"].get("dataset", ""), kv[0])):
        m, acc = g.get("model", {}), g["statistics"].get("test accuracy")
        if acc is None:
            continue
        if m.get("encoder") == "gpt":
            blocks = f"{m['transfer_layers']} of {m['n_layer']}" if m.get("pretrained") else "none (from scratch)"
            model, lm, lr = "GPT", fmt(m.get("lm_weight"), 2), f"{m['lr']:g}" if m.get("lr") else "–"
        else:
            model, blocks, lm, lr = f"{m.get('encoder')} (J&W)", "–", "–", "–"
        ci = _ci(acc["ci95"])
        rows.append(
            [
                g["axes"].get("dataset", "?"),
                name,
                model,
                blocks,
                lm,
                lr,
                fmt(acc.get("estimate", acc["mean"])),
                fmt(acc["std"]),
                ci,
                acc["seeds"],
            ]
        )
    return rows


def transfer_figure(agg: dict, folder: Path) -> str | None:
    """GPT-1's Figure 2 (left): test accuracy (the estimate over seeds, its 95% CI over seeds and instances) against the
    pre-trained blocks transferred, one line per dataset and λ; the from-scratch model at -1."""
    points: dict[tuple[str, float], list[tuple[int, float, float, float]]] = {}
    for g in agg["groups"].values():
        m, acc = g.get("model", {}), g["statistics"].get("test accuracy")
        if m.get("encoder") != "gpt" or acc is None or acc["ci95"][0] is None:
            continue
        x = m["transfer_layers"] if m.get("pretrained") else -1
        key = (g["axes"].get("dataset", "?"), m.get("lm_weight"), m.get("lr"))
        points.setdefault(key, []).append((x, acc.get("estimate", acc["mean"]), *acc["ci95"]))
    if not any(len({x for x, *_ in v}) > 2 for v in points.values()):
        return None  # no transfer curve: fewer than three settings on any line
    fig, ax = subplots(figsize=(5, 3.5))
    for (dataset, lm, lr), pts in sorted(points.items(), key=str):
        x, y, lo, hi = np.array(sorted(pts)).T
        label = f"{dataset}, λ = {lm:g}" + (f", lr {lr:g}" if lr is not None else "")
        ax.errorbar(x, y, yerr=[y - lo, hi - y], marker="o", capsize=3, label=label)
    ax.set_xlabel("pre-trained blocks transferred (-1: no pre-training)")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=8)
    return save_figure(fig, folder / "gpt_transfer.png")


GPT_HEADERS = [
    "dataset",
    "group",
    "model",
    "pre-trained blocks transferred",
    "λ (aux. LM)",
    "lr",
    "test accuracy",
    "std over seeds",
    "95% CI (seeds, instances)",
    "seeds",
]


def _slug(group: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", group)


def seed_variance_figure(group: str, sv: dict, folder: Path) -> str | None:
    """W&P 2019 fig. 3: violins of the median attention JSD by the base's max attention, and
    median attention JSD vs mean output TVD."""
    inst = sv["instances"]
    jsd, tvd, base = (np.array(inst[k], dtype=float) for k in ("median_jsd", "mean_tvd", "base_max_attention"))
    if not np.any(jsd > 0):  # uniform attention: nothing to see
        return None
    fig, (ax, bx) = subplots(1, 2, figsize=(11, 4))
    violins(ax, by_bins(jsd, base), range(len(bin_labels())))
    ax.set_xticks(range(len(bin_labels())), bin_labels())
    ax.set_xlabel("max attention of the base model")
    ax.set_ylabel("median JSD(base, other seeds), nats")
    ax.set_title(f"Seed variance (W&P 2019): {group}", fontsize=9)
    bx.scatter(jsd, tvd, s=6, alpha=0.5)
    bx.set_xlabel("median attention JSD across seeds, nats")
    bx.set_ylabel("mean output TVD across seeds")
    return save_figure(fig, folder / f"seed_variance_{_slug(group)}.png")


def consistent_adversary_figure(agg: dict, folder: Path) -> str | None:
    """W&P 2019 fig. 4: output TVD vs attention JSD of the model-consistent adversary across λ,
    with J&W's per-instance adversary as a marker."""
    groups = {g: v["consistent_adversary"] for g, v in agg["groups"].items() if "consistent_adversary" in v}
    if not groups:
        return None
    fig, ax = subplots(figsize=(9, 4.5))
    for i, (g, ca) in enumerate(groups.items()):
        jw = ca.get("jain_wallace")
        tvd_vs_jsd(
            ax,
            [(r["lambda"], r["jsd_mean"]["mean"], r["tvd_mean"]["mean"]) for r in ca["per_lambda"]],
            (jw["jsd_mean"]["mean"], jw["tvd_mean"]["mean"]) if jw else None,
            g,
            f"C{i}",
            f"{g}: J&W adversary",
        )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    return save_figure(fig, folder / "consistent_adversary.png")


def render_sweep(agg: dict, folder: str | Path) -> Path:
    """Write ``report.md`` and its figures for a sweep's aggregate into ``folder``: the cells,
    then one section per paper (each left out when the sweep has nothing for it)."""
    folder = Path(folder)
    lines = _overview(agg)
    sections = (_models_section, _gpt_section, _jw_section, _ss_section, _methods_section, _wp_section, _ts_section)
    for section in sections:
        lines += section(agg, folder)
    path = folder / "report.md"
    write_text_atomic(path, "\n".join(lines))
    return path


def _overview(agg: dict) -> list[str]:
    cells = agg.get("cells", {})
    done = sum(c["state"] == "done" for c in cells.values())
    lines = [
        "# attnmetrics sweep report",
        "",
        f"{done} of {len(cells)} cells finished; {len(agg['groups'])} groups (cells that differ only in the seed).",
        "",
    ]
    not_done = [[name, c["state"]] for name, c in cells.items() if c["state"] != "done"]
    if not_done:
        lines += [table(not_done, ["cell not finished", "state"]), ""]
    lines += [
        "Estimate: the mean over seeds of each seed's statistic over the test instances; 95% CI: percentile",
        "bootstrap of that estimate resampling the seeds, then the instances (fixed seed), so it holds the",
        "seed-to-seed spread; std (ddof = 1), min and max over the seeds' own numbers. See aggregate.json.",
        "",
    ]
    commits = agg.get("commits")
    if commits:  # the code each cell ran, and whether the cells share their conventions
        distinct = sorted({str(c) for c in commits.values()})
        shown = ", ".join(f"{c} ({sum(str(v) == c for v in commits.values())} cells)" for c in distinct)
        kinds = len(agg.get("run_conventions", []))
        lines += [
            f"Code commits: {shown}. "
            + ("Every cell ran under the same conventions" if kinds == 1 else f"{kinds} sets of conventions")
            + " (aggregate.json `run_conventions`).",
            "",
        ]
    prompted = [name for name, g in agg["groups"].items() if g.get("replicates") == "prompts"]
    if prompted:  # a zero-shot prompted model: nothing trained, its replicates are its prompts
        lines += [
            f"In {', '.join(prompted)}, a zero-shot prompted model's groups, the replicates are the prompts, "
            "not seeds: read 'seeds' there as the prompts (one cell each, its seed fixed), so the intervals "
            "resample the prompts, then the instances.",
            "",
        ]
    return lines


def _models_section(agg: dict, folder: Path) -> list[str]:
    rows, comparisons = _stat_rows(agg, "model"), _comparisons_part(agg)
    if not rows and not comparisons:
        return []
    return ["## Models", "", *([table(rows, STAT_HEADERS), ""] if rows else []), *comparisons]


COMPARISON_HEADERS = ["model A", "model B", "accuracy A", "accuracy B", "A − B", "95% CI (seeds, instances)"]
COMPARISON_HEADERS += ["seeds", "instances", "McNemar p per seed"]


def _comparisons_part(agg: dict) -> list[str]:
    """The config's ``compare`` pairs: accuracy differences paired on seeds and test instances."""
    rows = [
        [
            c["a"],
            c["b"],
            fmt(c["accuracy_a"]),
            fmt(c["accuracy_b"]),
            fmt(c["difference"]["estimate"]),
            _ci(c["difference"]["ci95"]),
            len(c["seeds"]),
            c["instances"],
            ", ".join(fmt(t["pvalue"], 4) for t in c["per_seed"]),
        ]
        for c in agg.get("comparisons", [])
    ]
    left_out = [
        [f"{c['a_grid']} vs {c['b_grid']}", c["a"] or "–", c["b"] or "–", c["reason"]]
        for c in agg.get("comparisons_left_out", [])
    ]
    if not rows and not left_out:
        return []
    lines = [
        "### Paired comparisons",
        "",
        "Test accuracy of model A minus model B on the seeds both have and their common test instances: the",
        "estimate is the mean over seeds of each seed's mean difference; its 95% CI resamples the seeds, then",
        "the instances (one draw for both models, so every instance stays paired); McNemar's exact test per seed.",
        "",
    ]
    if rows:
        lines += [table(rows, COMPARISON_HEADERS), ""]
    if left_out:
        lines += [
            "Left out of the config's comparisons (`[sweep] compare`), and why:",
            "",
            table(left_out, ["compare", "model A", "model B", "left out because"]),
            "",
        ]
    return lines


def _gpt_section(agg: dict, folder: Path) -> list[str]:
    rows = _gpt_rows(agg)
    if not rows:
        return []
    lines = [
        "## GPT-1's ablations (Radford et al. 2018, sec. 5, Figure 2 left)",
        "",
        "Pre-training vs none, the auxiliary language-model loss on (λ = 0.5) vs off, the number of "
        "pre-trained blocks transferred (the embeddings always are), and J&W's BiLSTM on the same splits.",
        "",
        table(rows, GPT_HEADERS),
        "",
    ]
    if name := transfer_figure(agg, folder):
        lines += [f"![accuracy against the blocks transferred]({name})", ""]
    return lines


def _jw_section(agg: dict, folder: Path) -> list[str]:
    rows = _stat_rows(agg, "jw")
    if not rows:
        return []
    return [
        "## Jain & Wallace 2019: do attention and other importance measures agree; do other attentions "
        "give the same output?",
        "",
        table(rows, STAT_HEADERS),
        "",
    ]


def _ss_section(agg: dict, folder: Path) -> list[str]:
    rows = _stat_rows(agg, "ss")
    if not rows:
        return []
    return [
        "## Serrano & Smith 2019: does removing the highest attention flip the decision first?",
        "",
        *(
            [
                'Each ordering\'s flip fraction is over its own rows that flip; the "common rows" ones compare the '
                "orderings paired, on each seed's rows that flip under every ordering (a random order's samples "
                'averaged per row), and "attention − X" is the per-row difference there (below 0: attention\'s '
                "order flips the decision sooner).",
                "",
            ]
            if any("common rows" in r[1] for r in rows)
            else []
        ),
        table(rows, STAT_HEADERS),
        "",
    ]


def _methods_section(agg: dict, folder: Path) -> list[str]:
    """The run's "explanation methods side by side" table per group that has one (aggregate's
    ``methods``), its figure, and the adjacent methods' paired comprehensiveness differences."""
    parts = []
    for g, v in agg["groups"].items():
        if s := v.get("methods"):
            parts += sweep_lines(g, s, len(v["seeds"]))
            title = f"{g}: ERASER ({100 * s['confidence']:g} % CI, seeds then instances)"
            if name := eraser_figure(s, folder / f"methods_{_slug(g)}.png", title):
                parts += [f"![methods {g}]({name})", ""]
    if not parts:
        return []
    return [
        "## The explanation methods side by side",
        "",
        "The run's table of the importance orderings per group, **sorted by the comprehensiveness AOPC estimate, "
        "descending** (the most faithful by ERASER first): τ with leave-one-out, comprehensiveness (higher: more "
        "faithful) and sufficiency (lower: more faithful) AOPC, the flip fraction (lower: more faithful) and the "
        "never-flip share, each measured in every seed on that seed's instances common to every method, as in the "
        "run. Estimate: the mean over seeds of the seeds' table numbers; in brackets its 95 % percentile bootstrap "
        "interval resampling the seeds, then the instances (the methods paired: one draw for all); seeds: those "
        "with a number. Below each table every method against the next in that order: the difference of their "
        "comprehensiveness AOPC per instance and seed, its estimate and the same seeds-then-instances interval.",
        "",
        *parts,
    ]


def _wp_section(agg: dict, folder: Path) -> list[str]:
    wp = []
    if rows := _mcnemar_rows(agg, "attention"):
        wp += [
            "**Learned vs uniform attention** (McNemar's exact test on per-instance correctness, per seed)",
            "",
            table(rows, MCNEMAR_HEADERS),
            "",
        ]
    wp += _seed_paired_part(agg, "attention", SEED_PAIRED)
    wp += _seed_variance_part(agg, folder) + _consistent_adversary_part(agg, folder) + _diagnostic_part(agg)
    if not wp:
        return []
    return [
        "## Wiegreffe & Pinter 2019: is attention necessary, stable across seeds, and hard to replace "
        "while keeping the model consistent?",
        "",
        *wp,
    ]


def _seed_variance_part(agg: dict, folder: Path) -> list[str]:
    sv_rows, figs = [], []
    for g, v in agg["groups"].items():
        if "seed_variance" in v:
            sv = v["seed_variance"]
            sv_rows.append(
                [
                    g,
                    len(v["seeds"]),
                    fmt(sv["median_jsd"]["mean"]),
                    fmt(sv["median_jsd"]["median"]),
                    fmt(sv["median_jsd"]["q3"]),
                    fmt(sv["mean_tvd"]["mean"]),
                    fmt(sv["mean_tvd"]["q3"]),
                ]
            )
            if name := seed_variance_figure(g, sv, folder):
                figs.append(f"![seed variance {g}]({name})")
    if not sv_rows:
        return []
    return [
        "**Seed variance**: per instance, the median JSD between the base (smallest seed) and the other "
        "seeds' attention, and the mean output TVD.",
        "",
        table(sv_rows, ["group", "seeds", "mean median JSD", "median", "q3", "mean output TVD", "q3"]),
        "",
        *(f + "\n" for f in figs),
    ]


def _consistent_adversary_part(agg: dict, folder: Path) -> list[str]:
    ca_rows = [
        [
            g,
            r["lambda"],
            fmt(r["tvd_mean"]["mean"]),
            fmt(r["jsd_mean"]["mean"]),
            fmt(r["accuracy"]["mean"]),
            fmt(r["macro_f1"]["mean"]),
        ]
        for g, v in agg["groups"].items()
        if "consistent_adversary" in v
        for r in v["consistent_adversary"]["per_lambda"]
    ]
    ca_rows += [
        [g, "J&W adversary", fmt(jw["tvd_mean"]["mean"]), fmt(jw["jsd_mean"]["mean"]), "–", "–"]
        for g, v in agg["groups"].items()
        if (jw := v.get("consistent_adversary", {}).get("jain_wallace"))
    ]
    if not ca_rows:
        return []
    lines = [
        "**Model-consistent adversary** (mean over seeds)",
        "",
        table(ca_rows, ["group", "λ", "output TVD", "attention JSD", "accuracy", "macro F1"]),
        "",
    ]
    if name := consistent_adversary_figure(agg, folder):
        lines += [f"![consistent adversary]({name})", ""]
    return lines


def _diagnostic_part(agg: dict) -> list[str]:
    diag_rows = [
        [g, variant, fmt(m["macro_f1"]["mean"]), fmt(m["accuracy"]["mean"])]
        for g, v in agg["groups"].items()
        for variant, m in v.get("diagnostic", {}).items()
        if variant != "paired"
    ]
    if not diag_rows:
        return []
    paired_rows = [
        [
            g,
            pair,
            *(f"{fmt(d[m]['mean'])} {_ci(d[m]['t95'])}" for m in ("macro_f1", "accuracy")),
            d["accuracy"]["seeds"],
        ]
        for g, v in agg["groups"].items()
        for pair, d in v.get("diagnostic", {}).get("paired", {}).items()
    ]
    lines = [
        "**Diagnostic MLP** with imposed attention (mean over seeds)",
        "",
        table(diag_rows, ["group", "attention imposed", "macro F1", "accuracy"]),
        "",
    ]
    if paired_rows:
        lines += [
            "Each imposed attention against the base model's, paired by seed (the mean of the per-seed "
            "differences; in brackets its 95 % t interval over the seeds): W&P (Table 4) find the base model's "
            "attention the most useful, so their differences are below 0.",
            "",
            table(paired_rows, ["group", "difference", "macro F1", "accuracy", "seeds"]),
            "",
        ]
    return lines


def _seed_paired_part(agg: dict, axis: str, statistics: tuple[str, ...]) -> list[str]:
    """The groups against their baseline on ``axis``, paired by seed (aggregate's ``seed_paired``)."""
    rows = [
        [r["group"], r["baseline"], r["statistic"], fmt(r["mean"]), _ci(r["t95"]), r["seeds"]]
        for r in agg.get("seed_paired", [])
        if r["axis"] == axis and r["statistic"] in statistics
    ]
    if not rows:
        return []
    return [
        "Paired by seed: the mean of the per-seed differences (group − baseline) and its 95 % t interval over "
        "the seeds, the seed-level interval, wider than an instance bootstrap when the seeds disagree.",
        "",
        table(rows, ["group", "baseline", "statistic", "difference", "95% t interval", "seeds"]),
        "",
    ]


#: the statistics the sweep report pairs by seed against a baseline
SEED_PAIRED = (
    "test accuracy",
    "permutation median TVD",
    "adversarial max JSD (mean)",
    "single-token τ",
    "τ attention vs gradient",
    "τ attention vs loo",
)


def _ts_section(agg: dict, folder: Path) -> list[str]:
    ts = []
    reg_rows = []
    for g, v in agg["groups"].items():
        if "regulariser" in v["axes"]:
            s = v["statistics"]
            mean = lambda k: fmt(s[k]["mean"]) if k in s else "–"  # noqa: E731
            reg_rows.append(
                [
                    g,
                    v["axes"]["regulariser"],
                    mean("test accuracy"),
                    mean("permutation median TVD"),
                    mean("adversarial max JSD (mean)"),
                    mean("single-token τ"),
                ]
            )
    if reg_rows:
        ts += [
            table(
                reg_rows,
                ["group", "regulariser", "accuracy", "permutation median TVD", "adversarial max JSD", "single-token τ"],
            ),
            "",
        ]
    if rows := _mcnemar_rows(agg, "regulariser"):
        ts += ["Each regulariser vs none (McNemar, per seed)", "", table(rows, MCNEMAR_HEADERS), ""]
    ts += _seed_paired_part(agg, "regulariser", SEED_PAIRED)
    if rows := _stat_rows(agg, "ts"):
        ts += [table(rows, STAT_HEADERS), ""]
    if not ts:
        return []
    return [
        "## Tutek & Šnajder 2020: do regularisers that tie hidden states to their tokens make attention faithful?",
        "",
        *ts,
    ]
