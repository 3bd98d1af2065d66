"""The explanation methods side by side (issue 28): one row per importance ordering the run
computed (attention, gradient, leave-one-out, rollout, integrated gradients, gradient x input and
the attention-derived attributions, where present), each with its Kendall τ with leave-one-out,
ERASER's comprehensiveness and sufficiency AOPC, S&S's flip fraction and never-flip share, every
cell a mean over the same instances for all methods with a bootstrap interval over them.

A section of the report built from the other experiments' per-instance values (no step of its own);
it is written when the run has at least two methods. In a sweep its cells are rows of the aggregate
(:func:`statistics`) and each group with them has the table over seeds (:func:`sweep_table`,
:func:`sweep_lines`), with its intervals resampling seeds, then instances."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from attnmetrics.app.battery.flip import common_rows
from attnmetrics.app.battery.registry import Context, Experiment, importances
from attnmetrics.app.figures import BASELINE_STYLE, point_styles, save_figure, subplots
from attnmetrics.app.markdown import fmt, table
from attnmetrics.app.summaries import as_floats, nanmean
from attnmetrics.stats import bootstrap_ci_rows, seed_instance_ci

#: the table's columns: results key -> header
COLUMNS = {
    "tau_loo": "τ with leave-one-out",
    "comprehensiveness": "comprehensiveness AOPC",
    "sufficiency": "sufficiency AOPC",
    "flip_fraction": "flip fraction",
    "never_flips": "never flips",
}
#: the interval's confidence level
CONFIDENCE = 0.95
#: the ordering ERASER compares with, shown below the methods (its ERASER columns only)
BASELINE = "random"


def method_names(x: dict[str, Any]) -> list[str]:
    """The importance orderings among ``x``'s keys (attention and every importance the run
    computed: the Kendall pairs' members and ERASER's orderings, the random baseline left out),
    attention first, then in the registry's order."""
    found = {n for k in x if k.startswith("kendall/") for n in k.split("/")[1].split(" vs ")}
    found |= {k.split("/")[1] for k in x if k.startswith("eraser/")}
    found.discard(BASELINE)
    order = ["attention", *(i.name for i in importances())]
    return [n for n in order if n in found] + sorted(found - set(order))


def _flips_in_its_order(name: str) -> bool:
    """Whether the flip search's ``flip/NAME`` is this method's own order: attention's, and each
    importance's that is a flip order (not leave-one-out, never one; not the gradient, whose
    "gradient" flip order is S&S's gradient with respect to attention, another score)."""
    return name == "attention" or any(i.name == name and i.flip_order for i in importances())


def _tau_key(x: dict, name: str) -> str | None:
    for key in (f"kendall/{name} vs loo/tau", f"kendall/loo vs {name}/tau"):
        if key in x:
            return key
    return None


def _columns(x: dict, names: list[str], lengths: np.ndarray) -> dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Each column's common instances and each method's per-instance values there: ``{column:
    (common [N] bool, {method: [N] float, NaN off the common instances})}``; a column no method
    has is absent, and so is a method without the column. The run's table (:func:`method_table`)
    and a sweep's rows (:func:`statistics`) both read it."""
    n = len(lengths)
    out: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}

    def on(column: str, common: np.ndarray, values: dict[str, np.ndarray]) -> None:
        if values:
            out[column] = (common, {k: np.where(common, v, math.nan) for k, v in values.items()})

    tau = {m: np.asarray(x[k], dtype=float) for m in names if (k := _tau_key(x, m))}
    if tau:
        on("tau_loo", np.all([np.isfinite(v) for v in tau.values()], axis=0), tau)
    eraser = {
        (m, metric): np.asarray(x[f"eraser/{m}/{metric}/aopc"], dtype=float)
        for m in [*names, BASELINE]
        for metric in ("comprehensiveness", "sufficiency")
        if f"eraser/{m}/{metric}/aopc" in x
    }
    if eraser:  # both metrics of every ordering on the same rows (those with real tokens)
        common = np.all([np.isfinite(v) for v in eraser.values()], axis=0)
        for metric in ("comprehensiveness", "sufficiency"):
            on(metric, common, {m: v for (m, c), v in eraser.items() if c == metric})
    flipped = [m for m in names if _flips_in_its_order(m) and f"flip/{m}/fraction" in x]
    if flipped:
        common, means = common_rows({m: x[f"flip/{m}/fraction"] for m in flipped}, lengths)
        full = {m: np.full(n, math.nan) for m in flipped}
        for m in flipped:
            full[m][common] = means[m]
        on("flip_fraction", common, full)
        eligible = np.asarray(lengths) > 1  # S&S: a row of one token cannot flip
        removed = {m: np.asarray(x[f"flip/{m}/removed"], dtype=float).reshape(n, -1)[:, 0] for m in flipped}
        on("never_flips", eligible, {m: (~(r > 0)).astype(float) for m, r in removed.items()})
    return out


def _cells(column: dict[str, np.ndarray]) -> dict[str, dict]:
    """Each method's mean of one column and its bootstrap interval; the methods share the
    column's instances, so one call resamples them all with the same draws."""
    names = list(column)
    if not names:
        return {}
    values = np.stack([np.asarray(column[m], dtype=float) for m in names])
    intervals = bootstrap_ci_rows(values, np.mean, confidence=CONFIDENCE)
    means = values.mean(1) if values.shape[1] else np.full(len(names), math.nan)
    return {m: {"mean": float(mean), "ci95": list(ci)} for m, mean, ci in zip(names, means, intervals)}


def _finite(cell: dict | None) -> bool:
    """Whether a cell has a number (results.json writes NaN as null)."""
    return cell is not None and cell["mean"] is not None and math.isfinite(cell["mean"])


def _sort_key(row: dict) -> float:
    return -row["comprehensiveness"]["mean"] if _finite(row["comprehensiveness"]) else math.inf


def method_table(x: dict[str, Any], lengths: np.ndarray) -> dict | None:
    """The table from the battery's per-instance values ``x`` (``collect``'s keys: "kendall/A vs
    B/tau", "eraser/NAME/METRIC/aopc", "flip/NAME/fraction" and "/removed"; ``lengths`` ``[N]``
    real tokens), or None with fewer than two methods.

    Each column is a mean over its common instances (the same for every method that has the
    column): τ with leave-one-out where τ-b is defined for every method; ERASER's AOPCs where
    every ordering (the random baseline included) has a value; the flip fraction over the rows of
    >= 2 tokens whose fraction is finite in every method's order (``flip.common_rows``); the
    never-flip share over the rows of >= 2 tokens. Each with a 95% percentile bootstrap interval
    resampling those instances with the same draws for every method (:func:`attnmetrics.stats.bootstrap_ci_rows`). ``methods``: one row
    per method, sorted by comprehensiveness AOPC, descending (methods without it last)."""
    names = method_names(x)
    if len(names) < 2:
        return None
    columns = _columns(x, names, np.asarray(lengths))
    rows = {c: int(common.sum()) for c, (common, _) in columns.items()}
    cells = {c: _cells({m: v[common] for m, v in per.items()}) for c, (common, per) in columns.items()}
    methods = [{"method": m, **{c: cells.get(c, {}).get(m) for c in COLUMNS}} for m in names]
    methods.sort(key=_sort_key)  # stable: ties keep the registry's order
    baseline = {m: cells.get(m, {}).get(BASELINE) for m in ("comprehensiveness", "sufficiency")}
    return {
        "sorted_by": "comprehensiveness AOPC, descending",
        "confidence": CONFIDENCE,
        "rows": rows,
        "methods": methods,
        "baseline": {BASELINE: baseline} if baseline["comprehensiveness"] else {},
    }


def summarise(x: dict, c: Context):
    done = method_table(x, c.lengths)
    if done is None:
        return None
    done["never_flipped"] = "nan" if math.isnan(c.config.never_flipped) else "one"
    return done, {}  # every per-instance value is the other experiments'


def battery_values(inst: dict) -> dict[str, np.ndarray]:
    """results.json's per-instance lists (``instances``) as :func:`collect`'s arrays under the keys
    :func:`method_table` reads ("kendall/A vs B/tau", "eraser/NAME/METRIC/aopc", "flip/NAME/
    fraction" and "/removed", ``[N]`` or ``[N, samples]``; null as NaN); a list that is not the
    instances' length (or a multiple of it, for the flip search's samples) is left out."""
    n = len(inst.get("lengths", []))
    x: dict[str, np.ndarray] = {}
    for pair, v in inst.get("kendall", {}).items():
        if len(v.get("tau", ())) == n:
            x[f"kendall/{pair}/tau"] = as_floats(v["tau"])
    for name, metrics in inst.get("eraser", {}).items():
        for metric, v in metrics.items():
            if len(v.get("aopc", ())) == n:
                x[f"eraser/{name}/{metric}/aopc"] = as_floats(v["aopc"])
    for name, v in inst.get("flip", {}).items():
        f, r = v.get("fraction", ()), v.get("removed", ())
        if n and len(f) == len(r) and len(f) and len(f) % n == 0:  # sample after sample (flip.summarise)
            x[f"flip/{name}/fraction"] = as_floats(f).reshape(-1, n).T
            x[f"flip/{name}/removed"] = as_floats(r).reshape(-1, n).T
    return x


def statistic_name(method: str, column: str) -> str:
    """A sweep aggregate's row of one cell of the table: "methods/alti/comprehensiveness AOPC"."""
    return f"methods/{method}/{COLUMNS[column]}"


def statistics(results: dict, inst: dict, ok) -> dict:
    """The table's cells as rows of a sweep's aggregate (:func:`statistic_name`, the random
    baseline's ERASER columns under "methods/random/..."): each method's per-instance values on
    the column's common instances of this cell (NaN elsewhere; the same instances as the run's
    table, :func:`_columns`), so that the NaN-aware mean of a seed is its table's number and the
    aggregate's estimate the mean of those over seeds."""
    x = battery_values(inst)
    lengths = np.asarray(inst.get("lengths", []))
    names = method_names(x)
    if len(names) < 2:
        return {}
    table = results.get("methods") or {}
    reported = {r["method"]: r for r in table.get("methods", [])}
    reported.update(table.get("baseline", {}))  # {"random": its ERASER cells}
    out = {}
    for column, (_, per) in _columns(x, names, lengths).items():
        for method, values in per.items():
            cell = reported.get(method, {}).get(column)
            number = cell["mean"] if cell else nanmean(values)
            out[statistic_name(method, column)] = ("methods", number, values, nanmean)
    return out


def sweep_table(statistics: dict[str, dict], values: dict[str, np.ndarray]) -> dict | None:
    """A sweep group's table, in the run's table's layout (each cell's "mean" the aggregate's
    estimate over seeds and instances, "ci95" its interval, "seeds" the seeds with a number), from
    the group's aggregate ``statistics`` and their per-instance ``values`` (``[seeds, N]`` by
    name); None without two methods. ``paired``: each method against the next in the order
    (comprehensiveness AOPC, descending), the difference of their comprehensiveness AOPC per
    instance and seed, its estimate (the mean over seeds of each seed's mean over its common
    instances) and the interval resampling seeds, then instances (:func:`attnmetrics.stats.seed_instance_ci`)."""
    found: dict[str, dict[str, dict]] = {}
    for column in COLUMNS:
        for name, s in statistics.items():
            prefix, _, header = name.rpartition("/")
            if name.startswith("methods/") and header == COLUMNS[column]:
                cell = {"mean": s["estimate"], "ci95": list(s["ci95"]), "seeds": s["seeds"]}
                found.setdefault(prefix.removeprefix("methods/"), {})[column] = cell
    baseline = found.pop(BASELINE, None)
    order = ["attention", *(i.name for i in importances())]
    names = [n for n in order if n in found] + sorted(set(found) - set(order))
    if len(names) < 2:
        return None
    methods = [{"method": m, **{c: found[m].get(c) for c in COLUMNS}} for m in names]
    methods.sort(key=_sort_key)  # stable: ties keep the registry's order
    ranked = [r["method"] for r in methods if _finite(r["comprehensiveness"])]
    paired = []
    for a, b in zip(ranked, ranked[1:]):
        key_a, key_b = statistic_name(a, "comprehensiveness"), statistic_name(b, "comprehensiveness")
        if key_a in values and key_b in values:
            ci = seed_instance_ci(values[key_a] - values[key_b], nanmean, confidence=CONFIDENCE)
            excludes = bool(math.isfinite(ci.low) and (ci.low > 0 or ci.high < 0))
            paired.append({"a": a, "b": b, "mean": ci.estimate, "ci95": [ci.low, ci.high], "excludes_zero": excludes})
    comp = {c: (baseline or {}).get(c) for c in ("comprehensiveness", "sufficiency")}
    return {
        "sorted_by": "comprehensiveness AOPC estimate, descending",
        "confidence": CONFIDENCE,
        "methods": methods,
        "baseline": {BASELINE: comp} if comp["comprehensiveness"] else {},
        "paired": {"column": "comprehensiveness", "pairs": paired},
    }


def _fmt_cell(cell: dict | None) -> str:
    if not _finite(cell):
        return "–"
    low, high = cell["ci95"]
    return f"{fmt(cell['mean'])} [{fmt(low)}, {fmt(high)}]"


def section(results: dict) -> list[str]:
    s = results["methods"]
    rows = [[r["method"], *(_fmt_cell(r[c]) for c in COLUMNS)] for r in s["methods"]]
    for name, b in s.get("baseline", {}).items():
        rows.append(
            [f"{name} (baseline)", "–", _fmt_cell(b["comprehensiveness"]), _fmt_cell(b["sufficiency"]), "–", "–"]
        )
    n = s["rows"]
    counted = "rows of ≥ 2 tokens whose fraction is defined under every method's order (those that flip"
    counted += ", and those that never do, at 1.0)" if s.get("never_flipped") == "one" else ")"
    level = f"{100 * s['confidence']:g} %"
    return [
        "## The explanation methods side by side",
        "",
        "One row per importance ordering of the run, **sorted by comprehensiveness AOPC, descending** (the most "
        "faithful by ERASER first). Each cell is a mean over instances and, in brackets, its "
        f"{level} percentile bootstrap interval, resampling those instances (9,999 resamples, seed 0). Within a "
        "column every method is measured on the same instances (paired): τ with leave-one-out (Kendall τ-b, the "
        f"mean as in the Kendall section) on the {n.get('tau_loo', 0)} instances where it is defined for every "
        "method; comprehensiveness (higher: more faithful) and sufficiency (lower: more faithful) AOPC on the "
        f"{n.get('comprehensiveness', 0)} instances with real tokens; the flip fraction (S&S's flip search in the "
        "method's order, the share of the tokens removed before the decision changes; lower: more faithful) on "
        f"the {n.get('flip_fraction', 0)} {counted}; never flips, the share of the {n.get('never_flips', 0)} "
        "rows of ≥ 2 tokens that never flip in the method's order. Leave-one-out is never a flip order (S&S), "
        "and the flip search's gradient order is S&S's gradient with respect to attention, not the gradient × "
        "input of the gradient row, so neither row has flip columns; the random ordering, ERASER's baseline, "
        "has its ERASER columns only.",
        "",
        table(rows, ["method", *(f"{h} [{level} CI]" for h in COLUMNS.values())]),
        "",
    ]


def figure(results: dict, folder: Path) -> str | None:
    """Comprehensiveness against sufficiency AOPC, one point per method with its bootstrap
    intervals as error bars (the random baseline grey): faithful is to the lower right."""
    s = results.get("methods")
    if not s:
        return None
    title = f"The methods, ERASER ({100 * s['confidence']:g} % bootstrap intervals)"
    return eraser_figure(s, folder / "methods.png", title)


def eraser_figure(s: dict, path: Path, title: str) -> str | None:
    """:func:`figure`'s plot of a table in :func:`method_table`'s layout (a run's, or a sweep
    group's from :func:`sweep_table`) into ``path``; None where no method has both AOPCs."""
    points = [(r["method"], r["comprehensiveness"], r["sufficiency"]) for r in s["methods"]]
    points = [p for p in points if _finite(p[1]) and _finite(p[2])]
    points = [(*p, style) for p, style in zip(points, point_styles(len(points)))]  # one colour and marker each
    baseline = [(f"{k} (baseline)", b["comprehensiveness"], b["sufficiency"]) for k, b in s["baseline"].items()]
    points += [(*p, BASELINE_STYLE) for p in baseline if _finite(p[1]) and _finite(p[2])]
    if not points:
        return None
    fig, ax = subplots(figsize=(6.5, 4.5))
    for name, comp, suff, style in points:
        err = [
            [[max(0.0, v["mean"] - v["ci95"][0])], [max(0.0, v["ci95"][1] - v["mean"])]]
            if all(b is not None and math.isfinite(b) for b in v["ci95"])
            else None
            for v in (comp, suff)
        ]
        ax.errorbar(
            comp["mean"], suff["mean"], xerr=err[0], yerr=err[1], linestyle="none", capsize=3, label=name, **style
        )
    ax.set_xlabel("comprehensiveness AOPC (higher: more faithful)")
    ax.set_ylabel("sufficiency AOPC (lower: more faithful)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, path)


def sweep_lines(group: str, s: dict, seeds: int) -> list[str]:
    """A sweep group's table (:func:`sweep_table`) and its paired comparisons, as report lines."""
    level = f"{100 * s['confidence']:g} %"

    def counted(row: dict, columns) -> str:
        n = sorted({row[c]["seeds"] for c in columns if _finite(row.get(c))})
        return "–" if not n else f"{n[0]}" if len(n) == 1 else f"{n[0]}–{n[-1]}"

    rows = [[r["method"], *(_fmt_cell(r[c]) for c in COLUMNS), counted(r, COLUMNS)] for r in s["methods"]]
    for name, b in s.get("baseline", {}).items():
        cells = [_fmt_cell(b["comprehensiveness"]), _fmt_cell(b["sufficiency"])]
        rows.append([f"{name} (baseline)", "–", *cells, "–", "–", counted(b, ("comprehensiveness", "sufficiency"))])
    lines = [
        f"**{group}** ({seeds} seeds)",
        "",
        table(rows, ["method", *(f"{h} [{level} CI]" for h in COLUMNS.values()), "seeds"]),
        "",
    ]
    pairs = s.get("paired", {}).get("pairs", [])
    if pairs:
        prows = [
            [f"{p['a']} − {p['b']}", fmt(p["mean"]), _ci_text(p["ci95"]), "yes" if p["excludes_zero"] else "no"]
            for p in pairs
        ]
        apart = [f"{p['a']} > {p['b']}" for p in pairs if p["excludes_zero"]]
        lines += [
            table(prows, ["comprehensiveness AOPC, adjacent methods", "difference", f"{level} CI", "CI excludes 0"]),
            "",
            f"Intervals that exclude 0: {', '.join(apart) if apart else 'none'}.",
            "",
        ]
    return lines


def _ci_text(ci) -> str:
    low, high = ci
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "–"
    return f"[{fmt(low)}, {fmt(high)}]"


EXPERIMENT = Experiment(
    "methods",
    order=85,
    summarise=summarise,
    section=section,
    figure=figure,
    alt="comprehensiveness vs sufficiency per method",
    skippable=False,
    statistics=statistics,
    conventions=lambda config: {
        "methods": "issue 28's table: each importance ordering's mean tau-b with leave-one-out, ERASER "
        "comprehensiveness and sufficiency AOPC, S&S flip fraction and never-flip share, each column over the "
        "instances every method has a value for (flip fraction: rows of >= 2 tokens finite under every method's "
        "order; never flips: rows of >= 2 tokens), 95% percentile bootstrap CI resampling those instances "
        "(attnmetrics.stats.bootstrap_ci_rows, 9999 resamples, seed 0, the same draws for every method); rows sorted by comprehensiveness AOPC, "
        "descending"
    },
)
