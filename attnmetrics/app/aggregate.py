"""Aggregate a sweep's finished cells into ``aggregate.json`` (every number) and ``report.md``.

Statistical choices (also written into aggregate.json "conventions"):

- Groups: cells that differ only in the seed (same grid, dataset, encoder, attention, regulariser).
- Spread over seeds: for each statistic, each seed's own summary number (as in its results.json);
  their mean, sample std (ddof = 1; NaN for one seed), min and max.
- Estimate and 95% CI over seeds and instances (attnmetrics.stats.seed_instance_ci): the estimate
  is the mean over seeds of each seed's statistic over its instances (the mean, or the median for
  the permutation median TVD; NaN-aware: undefined instances left out), and the interval a
  percentile bootstrap of that same estimate (9999 resamples, fixed seed 0) resampling the seeds,
  then the instances (one draw for all seeds: they decide the same instances). It covers both the
  seed-to-seed spread and the test-set sampling; with one seed, the instances alone. Macro F1:
  labels and every seed's predictions resampled together.
- McNemar's exact test (attnmetrics.stats.mcnemar) on per-instance correctness, per seed, for
  every pair of cells that differ only in attention (learned vs ``uniform``, W&P) or regulariser
  (each vs ``none``, T&Š); b01 = instances only the baseline gets right, b10 = only the other.
- The explanation methods side by side (issue 28; attnmetrics.app.battery.methods.sweep_table): the
  run's table's cells as rows "methods/METHOD/COLUMN", each seed's per-instance values on that
  seed's instances common to every method (as the run's table), so the estimate is the mean over
  seeds of the seeds' table numbers and the interval resamples seeds, then instances; sorted by the
  comprehensiveness AOPC estimate, and each method against the next in that order: the paired
  difference of their comprehensiveness AOPC per instance, with the same seeds-then-instances interval.
- Seed variance (W&P 2019, sec. 3.3) from predictions.npz: base = the group's smallest seed; per
  instance the median over the other seeds of JSD(base attention, seed attention) and the mean TVD
  between the output distributions (attnmetrics.stats.seed_variance).
"""

from __future__ import annotations

import math
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.stats
import torch

from attnmetrics.app.battery import experiments
from attnmetrics.app.battery.methods import sweep_table as sweep_methods
from attnmetrics.app.io import read_results, read_status, write_json_atomic, write_parquet_atomic
from attnmetrics.app.summaries import as_floats, by_max_attention, get, nanmean, stats
from attnmetrics.app.table import sweep_table
from attnmetrics.outputs import decision
from attnmetrics.stats import macro_f1, mcnemar, seed_instance_ci, seed_variance

CONVENTIONS = {
    "groups": "cells differing only in the seed",
    "spread": "per-seed summary numbers: mean, sample std (ddof=1), min, max",
    "estimate": "mean over seeds of each seed's statistic over its instances (NaN-aware)",
    "ci": "95% percentile bootstrap of the estimate resampling seeds, then instances (one draw for all seeds), "
    "9999 resamples, seed 0; one seed: instances only",
    "mcnemar": "exact, per seed, on per-instance correctness; b01 = only the baseline right, b10 = only the other",
    "methods": "the run's methods table per group: each cell the mean over seeds of the seed's mean over the "
    "instances common to every method (as in the run), CI resampling seeds then instances; rows by comprehensiveness "
    "AOPC estimate, descending; adjacent methods' paired comprehensiveness difference (per instance and seed) with "
    "the same interval",
    "seed_paired": "groups differing only in one baseline axis (regulariser vs none, attention vs uniform) and "
    "the diagnostic MLP's variants vs the base model's attention: per-seed differences of each seed's own number, "
    "their mean and 95% t interval (mean ± t(0.975, n-1)·s/√n over the common seeds)",
    "seed_variance": "base = smallest seed; per instance median JSD(base, seed attention) over the other seeds "
    "(nats) and mean TVD of output distributions",
}
#: paired comparisons: axis -> the baseline value the others are tested against
BASELINES = {"attention": "uniform", "regulariser": "none"}


def cell_statistics(
    results: dict, predictions: dict | None
) -> dict[str, tuple[str, float, np.ndarray | None, Callable]]:
    """Every battery statistic a cell has: name -> (paper section, the cell's summary number,
    per-instance values [N] or None, the statistic over instances). Rows that an experiment
    leaves undefined (fewer than 2 tokens) are NaN."""
    inst = results.get("instances", {})
    lengths = np.asarray(inst.get("lengths", []))
    ok = lambda v: np.where(lengths > 1, as_floats(v), np.nan)  # noqa: E731
    out = {}
    if "test" in results:
        correct = None
        if predictions is not None:
            correct = _correct(predictions).astype(float)
        out["test accuracy"] = ("model", results["test"]["accuracy"], correct, nanmean)
        out["test macro F1"] = ("model", results["test"]["macro_f1"], None, None)
    for experiment in experiments():
        if experiment.statistics:
            out.update(experiment.statistics(results, inst, ok))
    return out


def _decision(logits: np.ndarray) -> np.ndarray:
    return decision(torch.from_numpy(logits)).numpy()


def _spread(values: list[float | None]) -> dict:
    v = as_floats(values)
    v = v[np.isfinite(v)]
    if not v.size:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "seeds": 0}
    return {
        "mean": float(v.mean()),
        "std": float(v.std(ddof=1)) if v.size > 1 else math.nan,
        "min": float(v.min()),
        "max": float(v.max()),
        "seeds": int(v.size),
    }


def _correct(p: dict) -> np.ndarray:
    """[N] bool: the run's decision on each test instance equals its label."""
    return _decision(p["logits"]) == p["labels"]


def _setting(cell) -> dict:
    """A cell's axes but the seed, as text: what its group shares with a group of another grid."""
    return {k: str(v) for k, v in cell.axes.items() if k not in ("seed", "prompt")}


def _same_arrays(preds: list[dict], *keys: str) -> bool:
    """Whether every predictions dict holds the first's arrays under ``keys``."""
    return all(np.array_equal(p[k], preds[0][k]) for p in preds for k in keys)


def aggregate_group(members: list[tuple[int, dict, dict | None]]) -> dict:
    """One group's numbers from its (seed, results, predictions or None), sorted by seed."""
    members = sorted(members, key=lambda m: m[0])
    per_cell = [cell_statistics(r, p) for _, r, p in members]
    seeds = [s for s, _, _ in members]
    preds = [p for _, _, p in members]
    # the same test instances: the labels (a prompted group's prompts tokenise the same texts to other lengths);
    # the same tokens too, for comparing attention across the seeds
    same_instances = all(p is not None for p in preds) and _same_arrays(preds, "labels")
    have_preds = same_instances and _same_arrays(preds, "lengths")
    out: dict = {"seeds": seeds, "statistics": {}}
    stacked: dict[str, np.ndarray] = {}  # [seeds, N] per-instance values, by name
    for name in per_cell[0]:
        if not all(name in c for c in per_cell):
            continue
        section, _, _, reducer = per_cell[0][name]
        entry = {
            "section": section,
            "per_seed": dict(zip(map(str, seeds), (c[name][1] for c in per_cell))),
            **_spread([c[name][1] for c in per_cell]),
        }
        values = [c[name][2] for c in per_cell]
        ci = None
        if name == "test macro F1" and same_instances:
            labels = preds[0]["labels"]
            predicted = np.stack([_decision(p["logits"]) for p in preds])
            k = max(2, preds[0]["logits"].shape[1])
            ci = seed_instance_ci((labels, predicted), lambda y, z, axis=-1: macro_f1(y, z, k, axis))
            entry["instances"] = len(labels)
        elif reducer is not None and all(v is not None for v in values) and len({len(v) for v in values}) == 1:
            x = stacked[name] = np.stack(values)
            ci = seed_instance_ci(x, reducer)
            entry["instances"] = int(np.isfinite(x).any(0).sum())
        # the estimate is the statistic its interval bootstraps (seeds, then instances, resampled)
        entry["estimate"] = ci.estimate if ci else math.nan
        lo, hi = (ci.low, ci.high) if ci else (math.nan, math.nan)
        entry["ci95"] = [lo, hi]
        out["statistics"][name] = entry
    if methods := sweep_methods(out["statistics"], stacked):
        out["methods"] = methods
    if len(members) > 1 and have_preds:
        out["seed_variance"] = _seed_variance(preds)
    if all("consistent_adversary" in r for _, r, _ in members):
        out["consistent_adversary"] = _consistent_adversary([r["consistent_adversary"] for _, r, _ in members])
    if all("diagnostic" in r for _, r, _ in members):
        out["diagnostic"] = _diagnostic([r["diagnostic"] for _, r, _ in members], seeds)
    return out


def _seed_variance(preds: list[dict]) -> dict:
    T = max(p["attention"].shape[1] for p in preds)
    att = np.stack([np.pad(p["attention"], ((0, 0), (0, T - p["attention"].shape[1]))) for p in preds])
    sv = seed_variance(att, np.stack([p["logits"] for p in preds]))
    base_max = att[0].max(1)
    return {
        "base_seed_index": 0,
        "median_jsd": stats(sv.median_jsd),
        "mean_tvd": stats(sv.mean_tvd),
        "median_jsd_by_max_attention": by_max_attention(sv.median_jsd, base_max),
        "instances": {
            "median_jsd": sv.median_jsd.tolist(),
            "mean_tvd": sv.mean_tvd.tolist(),
            "base_max_attention": base_max.tolist(),
        },
    }


def _consistent_adversary(per_seed: list[dict]) -> dict:
    by_lambda: dict[float, list[dict]] = {}
    for r in per_seed:
        for row in r.get("per_lambda", []):
            by_lambda.setdefault(row["lambda"], []).append(row)
    out = {
        "per_lambda": [
            {
                "lambda": lam,
                **{k: _spread([row.get(k) for row in rows]) for k in ("tvd_mean", "jsd_mean", "accuracy", "macro_f1")},
            }
            for lam, rows in sorted(by_lambda.items())
        ]
    }
    jw = [r["jain_wallace"] for r in per_seed if "jain_wallace" in r]
    if jw:
        out["jain_wallace"] = {k: _spread([j.get(k) for j in jw]) for k in ("tvd_mean", "jsd_mean")}
    return out


def seed_t_interval(differences) -> dict:
    """The mean of per-seed differences and its 95 % t interval, mean ± t(0.975, n − 1) · s / √n (s
    with ddof 1): the seed-level interval issue 47 sets beside the seeds-then-instances bootstrap,
    wider when the seeds disagree. NaN bounds with fewer than 2 finite differences."""
    d = as_floats(differences)
    d = d[np.isfinite(d)]
    mean = float(d.mean()) if d.size else math.nan
    if d.size < 2:
        return {"mean": mean, "t95": [math.nan, math.nan], "seeds": int(d.size)}
    half = float(scipy.stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return {"mean": mean, "t95": [mean - half, mean + half], "seeds": int(d.size)}


#: the diagnostic MLP's variant the others are compared with, paired by seed (W&P 2019, Table 4)
DIAGNOSTIC_BASELINE = "base"


def _diagnostic(per_seed: list[dict], seeds: list) -> dict:
    """W&P's diagnostic MLPs over seeds: each variant's spread and per-seed numbers, and each variant
    minus the base model's attention, paired by seed (a t interval over the seeds' differences)."""
    variants = dict.fromkeys(v for r in per_seed for v in r)
    out: dict = {}
    for v in variants:
        out[v] = {}
        for m in ("accuracy", "macro_f1"):
            values = [get(r, v, m) for r in per_seed]
            out[v][m] = {**_spread(values), "per_seed": dict(zip(map(str, seeds), values))}
    if DIAGNOSTIC_BASELINE in out:
        base = out[DIAGNOSTIC_BASELINE]
        out["paired"] = {
            f"{v} − {DIAGNOSTIC_BASELINE}": {
                m: seed_t_interval(
                    [_minus(out[v][m]["per_seed"].get(k), base[m]["per_seed"].get(k)) for k in map(str, seeds)]
                )
                for m in ("accuracy", "macro_f1")
            }
            for v in variants
            if v != DIAGNOSTIC_BASELINE
        }
    return out


def _minus(a, b) -> float:
    return math.nan if a is None or b is None else a - b


def seed_paired(groups: dict) -> list[dict]:
    """Every pair of groups of one grid that differ only in one ``BASELINES`` axis (a regulariser
    against none, learned attention against uniform), every statistic both have: the per-seed
    differences group − baseline on their common seeds, their mean and 95 % t interval
    (:func:`seed_t_interval`). Each seed's number is the cell's own (instances as the cell has them)."""
    index = {(g["grid"], tuple(sorted((k, str(v)) for k, v in g["axes"].items()))): name for name, g in groups.items()}
    out = []
    for name, g in groups.items():
        for axis, baseline in BASELINES.items():
            if axis not in g["axes"] or str(g["axes"][axis]) == baseline:
                continue
            key = (g["grid"], tuple(sorted((k, str(baseline if k == axis else v)) for k, v in g["axes"].items())))
            if key not in index:
                continue
            b = groups[index[key]]
            for stat, entry in g["statistics"].items():
                other = b["statistics"].get(stat)
                if other is None:
                    continue
                seeds = sorted(entry["per_seed"].keys() & other["per_seed"].keys(), key=lambda k: (len(k), k))
                diffs = [_minus(entry["per_seed"][k], other["per_seed"][k]) for k in seeds]
                out.append(
                    {
                        "axis": axis,
                        "group": name,
                        "baseline": index[key],
                        "statistic": stat,
                        "per_seed": dict(zip(seeds, diffs)),
                        **seed_t_interval(diffs),
                    }
                )
    return out


def paired_tests(cells: list[tuple[object, dict, dict | None]]) -> list[dict]:
    """McNemar per seed for every pair of cells differing only in one ``BASELINES`` axis."""
    index = {(c.grid, tuple(sorted((k, str(v)) for k, v in c.axes.items()))): (c, r, p) for c, r, p in cells}
    tests = []
    for c, _, p in cells:
        for axis, baseline in BASELINES.items():
            if axis not in c.axes or str(c.axes[axis]) == baseline or p is None:
                continue
            key = (c.grid, tuple(sorted((k, str(baseline if k == axis else v)) for k, v in c.axes.items())))
            if key not in index or index[key][2] is None or not _same_arrays([p, index[key][2]], "labels", "lengths"):
                continue
            b, rb, pb = index[key]
            ok_c, ok_b = _correct(p), _correct(pb)
            m = mcnemar(ok_c, ok_b)  # b01: only the baseline right; b10: only this model
            tests.append(
                {
                    "axis": axis,
                    "grid": c.grid,
                    "group": c.group,
                    "baseline": b.group,
                    "seed": c.axes["seed"],
                    "accuracy": float(ok_c.mean()),
                    "baseline_accuracy": float(ok_b.mean()),
                    "b01": m.b01,
                    "b10": m.b10,
                    "pvalue": m.pvalue,
                    "instances": int(ok_c.size),
                }
            )
    return tests


def group_comparisons(
    cells: list[tuple[object, dict, dict | None]], pairs: list[tuple[str, str]]
) -> tuple[list[dict], list[dict]]:
    """Test accuracy of grid A's models minus grid B's, paired, for each ``(A, B)`` in ``pairs``
    (the config's ``[sweep] compare``) and each pair of their groups that differ only in the grid
    (equal axes but the seed; else, per dataset, the grids' one group each on it). Returns the
    comparisons and those left out (``a_grid``, ``b_grid``, groups ``a`` and ``b`` or None, and
    ``reason``, in words): a grid without finished cells, a group without a counterpart in the
    other grid, two groups without a common seed with predictions or tested on different instances.

    On the seeds both groups have and their common test instances (the comparison is left out
    where the groups were tested on different instances: another data set, split or labels; the
    models' tokenisers may differ, so the rows' token counts need not match): per seed s and instance i the
    difference ``d[s, i] = correct_A[s, i] - correct_B[s, i]``; the estimate is the mean over
    seeds of each seed's mean difference, its 95 % percentile interval resamples the seeds, then
    the instances (:func:`attnmetrics.stats.seed_instance_ci`, one draw of instances for both
    models, so the pairing is kept); besides, McNemar's exact test per seed."""
    by_grid: dict[str, dict[str, list]] = {}
    for c, r, p in cells:
        by_grid.setdefault(c.grid, {}).setdefault(c.group, []).append((c, r, p))
    out, left_out = [], []
    for a, b in pairs:
        groups_a, groups_b = by_grid.get(a, {}), by_grid.get(b, {})
        pair = {"a_grid": a, "b_grid": b}
        if not groups_a or not groups_b:
            empty = " and ".join(repr(g) for g, groups in ((a, groups_a), (b, groups_b)) if not groups)
            left_out.append({**pair, "a": None, "b": None, "reason": f"grid {empty} has no finished cell"})
            continue
        matched = set()
        for name_a, members_a in groups_a.items():
            axes = _setting(members_a[0][0])
            same = [g for g, m in groups_b.items() if _setting(m[0][0]) == axes]
            if not same:  # one group each on this dataset: those two
                on_a = [g for g, m in groups_a.items() if m[0][0].axes["dataset"] == axes["dataset"]]
                on_b = [g for g, m in groups_b.items() if m[0][0].axes["dataset"] == axes["dataset"]]
                same = on_b if len(on_a) == len(on_b) == 1 else []
            if not same:
                reason = (
                    f"no group of grid {b!r} has its axes, nor is there one group of each grid on {axes['dataset']}"
                )
                left_out.append({**pair, "a": name_a, "b": None, "reason": reason})
            for name_b in same:
                matched.add(name_b)
                entry = _compare_groups(name_a, members_a, name_b, groups_b[name_b])
                if isinstance(entry, str):
                    left_out.append({**pair, "a": name_a, "b": name_b, "reason": entry})
                else:
                    out.append({**pair, "dataset": axes["dataset"], **entry})
        for name_b in (g for g in groups_b if g not in matched):
            reason = f"no group of grid {a!r} has its axes, nor is there one group of each grid on its dataset"
            left_out.append({**pair, "a": None, "b": name_b, "reason": reason})
    return out, left_out


def _compare_groups(name_a: str, members_a: list, name_b: str, members_b: list) -> dict | str:
    """:func:`group_comparisons`' entry for two groups' (cell, predictions), or why there is none:
    no common seed with predictions, or other test instances."""
    runs_a = {c.axes["seed"]: (r, p) for c, r, p in members_a if p is not None}
    runs_b = {c.axes["seed"]: (r, p) for c, r, p in members_b if p is not None}
    seeds = sorted(set(runs_a) & set(runs_b))
    if not seeds:

        def has(name: str, members: list, runs: dict) -> str:
            lacking = sorted(c.axes["seed"] for c, _, p in members if p is None)
            return f"{name} seeds {sorted(runs)}" + (f" (and {lacking} without predictions.npz)" if lacking else "")

        return f"no common seed with predictions.npz: {has('A', members_a, runs_a)}, {has('B', members_b, runs_b)}"
    if other := _test_set_difference([runs_a[s] for s in seeds] + [runs_b[s] for s in seeds]):
        return f"tested on different instances: {other}"
    right_a = np.stack([_correct(runs_a[s][1]) for s in seeds])
    right_b = np.stack([_correct(runs_b[s][1]) for s in seeds])
    ci = seed_instance_ci(right_a.astype(np.float64) - right_b, np.mean)
    per_seed = []
    for s, x, y in zip(seeds, right_a, right_b):
        m = mcnemar(x, y)  # b01: only B right; b10: only A right
        per_seed.append(
            {"seed": s, "accuracy_a": float(x.mean()), "accuracy_b": float(y.mean()), "b01": m.b01, "b10": m.b10}
            | {"pvalue": m.pvalue}
        )
    return {
        "a": name_a,
        "b": name_b,
        "seeds": seeds,
        "instances": int(right_a.shape[1]),
        "accuracy_a": float(right_a.mean()),
        "accuracy_b": float(right_b.mean()),
        "difference": {"estimate": ci.estimate, "ci95": [ci.low, ci.high]},
        "per_seed": per_seed,
    }


def _test_set_difference(runs: list[tuple[dict, dict]]) -> str | None:
    """How runs ``(results, predictions)`` differ in the instances they were tested on, in words
    (None: the same): the data set, the split sizes, the split seed, or the labels (their order)."""
    parts = {
        "data set": lambda r, _: r.get("data", {}).get("name"),
        "split sizes": lambda r, _: str(r.get("data", {}).get("sizes")),
        "split seed": lambda r, _: r.get("split_seed"),
    }
    for what, of in parts.items():
        values = list(dict.fromkeys(of(*run) for run in runs))
        if len(values) > 1:
            return f"{what} {' vs '.join(map(str, values))}"
    if not _same_arrays([p for _, p in runs], "labels"):
        return "other labels (or another order) on the test split"
    return None


def comparison_left_out(c: dict) -> str:
    """A left-out entry of :func:`group_comparisons` as one line: the pair, the groups and why."""
    groups = f": {c['a'] or '–'} vs {c['b'] or '–'}" if c["a"] or c["b"] else ""
    return f"[sweep] compare {c['a_grid']} vs {c['b_grid']}{groups} left out: {c['reason']}"


def load_cell(folder: Path) -> tuple[dict, dict | None]:
    """results.json and predictions.npz (None if absent, or unreadable: said in one line) of a
    finished cell.

    Raises:
        ValueError: its results.json is unreadable or not a run's (naming the file).
    """
    results = read_results(folder / "results.json")
    predictions = None
    path = folder / "predictions.npz"
    if path.is_file():
        try:
            with np.load(path) as f:
                predictions = {k: f[k] for k in f.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            print(f"attnmetrics sweep: {path} is unreadable ({e}); its seed variance is left out", file=sys.stderr)
    return results, predictions


def model_setting(results: dict) -> dict:
    """What a group's model is beyond the grid's axes: its encoder and, for GPT-1 (Radford et al.
    2018, sec. 5 ablations), whether it was pre-trained, how many blocks were transferred, the
    pre-training steps, λ of the auxiliary LM loss and the fine-tuning learning rate."""
    model = results.get("model", {})
    if model.get("encoder") != "gpt":
        return {"encoder": model.get("encoder")}
    pre = results.get("pretrained")
    return {
        "encoder": "gpt",
        "pretrained": pre is not None,
        "transfer_layers": pre.get("transfer_layers") if pre else None,
        "pretraining_steps": pre.get("step") if pre else None,
        "n_layer": model.get("gpt", {}).get("n_layer"),
        "lm_weight": model.get("lm_weight"),
        "lr": results.get("training", {}).get("config", {}).get("lr"),
    }


def _distinct_conventions(cells) -> list[dict]:
    """The cells' results.json ``conventions``, each distinct one once with the cells that used it (a
    cell without them listed under ``{"unknown": ...}``), so the aggregate says how every number was computed."""
    seen: list[dict] = []
    for c, r, _ in cells:
        conventions = r.get("conventions") or {"unknown": "not recorded by the attnmetrics that wrote this run"}
        for entry in seen:
            if entry["conventions"] == conventions:
                entry["cells"].append(c.name)
                break
        else:
            seen.append({"cells": [c.name], "conventions": conventions})
    return seen


def aggregate(cells: list[tuple[object, dict, dict | None]], compare: list[tuple[str, str]] = ()) -> dict:
    """The aggregate of finished cells ``(Cell, results, predictions)`` (JSON-ready); ``compare``:
    the pairs of grids whose models :func:`group_comparisons` compares."""
    groups: dict[str, list] = {}
    for c, r, p in cells:
        groups.setdefault(c.group, []).append((c, r, p))
    out = {
        "conventions": CONVENTIONS,
        # each cell's code commit (results.json versions.commit; "unknown" for a run from before it was recorded)
        "commits": {c.name: r.get("versions", {}).get("commit", "unknown") for c, r, _ in cells},
        # each cell's run conventions (single-removal draw, TVD scale, ERASER rounding, ...), once per distinct text
        "run_conventions": _distinct_conventions(cells),
        "groups": {},
        "paired_tests": paired_tests(cells),
    }
    if compare:
        out["comparisons"], out["comparisons_left_out"] = group_comparisons(cells, list(compare))
    for name, members in groups.items():
        c0 = members[0][0]
        out["groups"][name] = {
            "grid": c0.grid,
            "axes": {k: v for k, v in c0.axes.items() if k != "seed" and k != "prompt"},
            "model": model_setting(members[0][1]),
            # a prompted model's replicates are its prompts (in "seeds"; "replicates" names them)
            **({"replicates": "prompts"} if "prompt" in c0.axes else {}),
            **aggregate_group([(c.replicate, r, p) for c, r, p in members]),
        }
    out["seed_paired"] = seed_paired(out["groups"])
    return out


def aggregate_sweep(sweep) -> Path:
    """Aggregate a sweep's finished cells; writes OUT/aggregate.json, OUT/report.md and the figures."""
    from attnmetrics.app.sweep_report import render_sweep

    out = sweep.out
    cells, unreadable = [], {}
    for c in sweep.cells:
        if c.is_done(out):
            try:
                cells.append((c, *load_cell(c.folder(out))))
            except ValueError as e:  # one bad cell leaves the report of the others
                unreadable[c] = str(e)
                print(f"attnmetrics sweep: cell {c.grid}/{c.name} left out of the report: {e}", file=sys.stderr)
    status = read_status(out / "status.json")["cells"]
    agg = aggregate(cells, sweep.compare)
    agg["cells"] = {
        f"{c.grid}/{c.name}": {
            "state": "unreadable"
            if c in unreadable
            else "done"
            if c.is_done(out)
            else status.get(f"{c.grid}/{c.name}", {}).get("state", "not run"),
            "group": c.group,
            "seed": c.axes["seed"],
            **({"prompt": c.axes["prompt"]} if "prompt" in c.axes else {}),
        }
        for c in sweep.cells
    }
    out.mkdir(parents=True, exist_ok=True)
    table = sweep_table((f"{c.grid}/{c.name}", c.grid, c.group, {**c.axes, **model_setting(r)}, r) for c, r, _ in cells)
    write_parquet_atomic(out / "instances.parquet", table)
    for c in agg.get("comparisons_left_out", []):
        print(f"attnmetrics sweep: {comparison_left_out(c)}", file=sys.stderr)
    write_json_atomic(out / "aggregate.json", agg)
    return render_sweep(agg, out)
