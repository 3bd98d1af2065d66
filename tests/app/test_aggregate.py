"""Sweep statistics against independent references: a plain numpy bootstrap loop, sklearn's F1,
scipy's Jensen-Shannon distance, and McNemar counts taken by hand."""

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon
from sklearn.metrics import f1_score

from attnmetrics.app.aggregate import aggregate_group, paired_tests
from attnmetrics.app.sweep import Cell
from attnmetrics.stats import bootstrap_ci, macro_f1, seed_instance_ci, seed_variance


def _loop_ci(x, statistic, resamples=20000, seed=1):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(resamples, len(x)))
    values = [statistic(x[i]) for i in idx]
    return np.percentile(values, [2.5, 97.5])


@pytest.mark.parametrize("statistic", [np.mean, np.median])
def test_bootstrap_matches_a_plain_resampling_loop(statistic):
    x = np.random.default_rng(0).gamma(2.0, 0.1, size=150)
    lo, hi = bootstrap_ci(x, lambda v, axis=-1: statistic(v, axis=axis))
    ref = _loop_ci(x, statistic)
    assert lo < statistic(x) < hi
    np.testing.assert_allclose([lo, hi], ref, atol=0.15 * (ref[1] - ref[0]))


def test_bootstrap_exact_cases():
    assert bootstrap_ci(np.full(40, 0.3), np.mean) == pytest.approx((0.3, 0.3))
    assert all(np.isnan(bootstrap_ci(np.array([1.0]), np.mean)))
    x = np.random.default_rng(3).normal(size=50)
    assert bootstrap_ci(x, np.mean) == bootstrap_ci(x, np.mean)  # fixed seed: reproducible


def test_bootstrap_in_batches_gives_scipys_all_at_once_intervals():
    """bootstrap_ci and bootstrap_ci_rows evaluate scipy's resamples 100 at a time (bounded
    memory): the same draws, so the very intervals of scipy's one call over all resamples;
    the rows' intervals are each row's own (paired draws: one call per row, same seed)."""
    from scipy.stats import bootstrap

    from attnmetrics.stats import bootstrap_ci_rows

    rows = np.random.default_rng(5).gamma(2.0, 0.1, size=(3, 257))

    def scipy_ci(x):
        r = bootstrap(
            (x,), np.mean, n_resamples=9999, vectorized=True, axis=-1, method="percentile", rng=np.random.default_rng(0)
        )
        return float(r.confidence_interval.low), float(r.confidence_interval.high)

    assert bootstrap_ci(rows[0], np.mean) == scipy_ci(rows[0])
    # the same draws; the rows' means summed in another order: equal to rounding
    np.testing.assert_allclose(bootstrap_ci_rows(rows, np.mean), [scipy_ci(r) for r in rows], rtol=1e-13, atol=0)


def test_macro_f1_matches_sklearn():
    rng = np.random.default_rng(1)
    for classes in (2, 3, 5):
        y, z = rng.integers(0, classes, 80), rng.integers(0, classes, 80)
        z[z == classes - 1] = 0  # a class never predicted
        ref = f1_score(y, z, average="macro", labels=range(classes), zero_division=0)
        assert macro_f1(y, z, classes) == pytest.approx(ref)
    y, z = rng.integers(0, 3, (4, 30)), rng.integers(0, 3, (4, 30))  # vectorised over leading axes
    np.testing.assert_allclose(
        macro_f1(y, z, 3), [f1_score(a, b, average="macro", labels=range(3), zero_division=0) for a, b in zip(y, z)]
    )


def _distributions(rng, seeds, n, lengths):
    att = np.zeros((seeds, n, lengths.max()))
    for s in range(seeds):
        for i, L in enumerate(lengths):
            w = rng.random(L) ** 3
            att[s, i, :L] = w / w.sum()
    return att


@pytest.mark.parametrize("classes", [1, 3])
def test_seed_variance_matches_a_loop_over_instances(classes):
    rng = np.random.default_rng(2)
    seeds, n = 4, 25
    lengths = rng.integers(1, 9, n)
    att = _distributions(rng, seeds, n, lengths)
    logits = rng.normal(size=(seeds, n, classes))
    sv = seed_variance(att, logits)
    for i, L in enumerate(lengths):
        jsds = [jensenshannon(att[0, i, :L], att[s, i, :L]) ** 2 for s in range(1, seeds)]  # its square root
        if classes == 1:
            p = [np.array([1 - 1 / (1 + np.exp(-z)), 1 / (1 + np.exp(-z))]) for z in logits[:, i, 0]]
        else:
            p = [np.exp(z) / np.exp(z).sum() for z in logits[:, i]]
        tvds = [0.5 * np.abs(p[0] - p[s]).sum() for s in range(1, seeds)]
        assert sv.median_jsd[i] == pytest.approx(np.median(jsds), abs=1e-9)
        assert sv.mean_tvd[i] == pytest.approx(np.mean(tvds), abs=1e-9)
    with pytest.raises(ValueError, match="S >= 2"):
        seed_variance(att[:1], logits[:1])


def _cell(attention, seed, grid="g"):
    return Cell(grid, {"dataset": "sst", "encoder": "lstm", "attention": attention, "seed": seed}, ())


def _predictions(correct, labels):
    # one sigmoid output: logit > 0 decides class 1
    decision = np.where(correct, labels, 1 - labels)
    return {
        "logits": np.where(decision == 1, 1.0, -1.0)[:, None].astype(np.float32),
        "labels": labels,
        "lengths": np.full(len(labels), 5),
        "attention": np.full((len(labels), 5), 0.2, np.float32),
    }


def test_mcnemar_pairs_learned_with_uniform_of_the_same_seed():
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, 60)
    right = {(a, s): rng.random(60) < 0.7 for a in ("tanh", "uniform") for s in (0, 1)}
    cells = [(_cell(a, s), {}, _predictions(right[a, s], labels)) for a, s in right]
    other = _predictions(right["tanh", 0], labels[::-1].copy())  # other instances: never paired
    cells.append((_cell("tanh", 0, grid="h"), {}, other))
    cells.append((_cell("uniform", 0, grid="h"), {}, _predictions(right["uniform", 0], labels)))
    tests = paired_tests(cells)
    assert {(t["grid"], t["seed"]) for t in tests} == {("g", 0), ("g", 1)}
    for t in tests:
        learned, uniform = right["tanh", t["seed"]], right["uniform", t["seed"]]
        assert t["b01"] == int(np.sum(uniform & ~learned)) and t["b10"] == int(np.sum(learned & ~uniform))
        assert t["accuracy"] == pytest.approx(learned.mean()) and t["baseline"] == "g/sst-lstm-uniform"
        assert 0 < t["pvalue"] <= 1


def _loop_seed_instance_ci(values, statistic, resamples, seed=0):
    """The two-level bootstrap as its description says, one resample at a time, drawing from the
    generator in seed_instance_ci's order (one chunk): each resample's seeds, then its instances."""
    rng = np.random.default_rng(seed)
    seeds, n = values.shape
    seed_draws = rng.integers(seeds, size=(resamples, seeds)) if seeds > 1 else np.zeros((resamples, 1), int)
    instance_draws = rng.integers(n, size=(resamples, n))
    estimates = []
    for chosen, instances in zip(seed_draws, instance_draws):
        per_seed = [statistic(values[s][instances]) for s in chosen]
        per_seed = [v for v in per_seed if np.isfinite(v)]
        if per_seed:
            estimates.append(np.mean(per_seed))
    estimate = np.mean([v for v in (statistic(row) for row in values) if np.isfinite(v)])
    return estimate, *np.quantile(estimates, [0.025, 0.975])


@pytest.mark.parametrize("statistic", [np.nanmean, np.nanmedian])
@pytest.mark.parametrize("seeds", [1, 3])
def test_seed_instance_ci_matches_a_plain_two_level_loop(statistic, seeds):
    values = np.random.default_rng(seeds).gamma(2.0, 0.1, size=(seeds, 60)) + np.arange(seeds)[:, None] * 0.05
    values[0, :4] = np.nan  # undefined instances of one seed
    got = seed_instance_ci(values, lambda v, axis=-1: statistic(v, axis=axis), n_resamples=500, chunk=500)
    ref = _loop_seed_instance_ci(values, statistic, 500)
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert got.low <= got.estimate <= got.high


def test_seed_instance_ci_holds_the_seed_to_seed_spread():
    # issue 29: one seed stuck far from the others widened nothing when seeds were averaged per instance
    rng = np.random.default_rng(3)
    values = rng.normal(0.0, 0.05, size=(3, 400)) + np.array([[0.8], [0.8], [0.5]])  # one seed stuck
    est, lo, hi = seed_instance_ci(values, np.nanmean)
    averaged = bootstrap_ci(values.mean(0), np.mean)  # the old interval: seeds averaged first
    assert est == pytest.approx(values.mean())
    assert hi - lo > 0.2 > 10 * (averaged[1] - averaged[0])  # resampling seeds: 0.5 and 0.8 both in reach
    assert lo < 0.6 < 0.75 < hi


def test_seed_instance_ci_pairs_labels_with_every_seeds_predictions():
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, 80)
    predicted = np.stack([np.where(rng.random(80) < 0.8, labels, 1 - labels) for _ in range(2)])
    ci = seed_instance_ci((labels, predicted), lambda y, z, axis=-1: macro_f1(y, z, 2, axis), n_resamples=999)
    per_seed = [macro_f1(labels, p, 2) for p in predicted]
    assert ci.estimate == pytest.approx(np.mean(per_seed)) and ci.low <= ci.estimate <= ci.high


def test_group_spread_over_seeds_and_ci_over_seeds_and_instances():
    rng = np.random.default_rng(5)
    n, members = 40, []
    per_instance = rng.random((3, n))
    per_instance[:, 0] = np.nan  # undefined everywhere: left out
    per_instance[1, 1] = np.nan  # undefined in one seed: mean of the others
    for s in range(3):
        tvd = per_instance[s]
        results = {
            "test": {"accuracy": 0.5 + s / 10, "macro_f1": 0.4},
            "permutation": {"overall": {"median": float(np.nanmedian(tvd))}},
            "instances": {"lengths": [5] * n, "permutation": {"median_tvd": [None if np.isnan(v) else v for v in tvd]}},
        }
        members.append((s, results, None))
    g = aggregate_group(members)
    acc = g["statistics"]["test accuracy"]
    assert (
        acc["mean"] == pytest.approx(0.6)
        and acc["std"] == pytest.approx(0.1)
        and (acc["min"], acc["max"]) == (0.5, 0.7)
    )
    perm = g["statistics"]["permutation median TVD"]
    assert perm["instances"] == n - 1
    # the estimate is the statistic the interval bootstraps: the mean of the seeds' medians
    assert perm["estimate"] == pytest.approx(perm["mean"]) and perm["ci95"][0] <= perm["estimate"] <= perm["ci95"][1]
    ref = _loop_seed_instance_ci(per_instance, np.nanmedian, 9999)
    np.testing.assert_allclose([perm["estimate"], *perm["ci95"]], ref, atol=0.03)
    assert "seed_variance" not in g  # no predictions.npz


def test_gpt_ablation_table_names_each_groups_setting(tmp_path):
    from attnmetrics.app.aggregate import model_setting
    from attnmetrics.app.sweep_report import render_sweep

    def results(pretrained, lm_weight, encoder="gpt"):
        model = {"encoder": encoder, "gpt": {"n_layer": 4}, "lm_weight": lm_weight} if encoder == "gpt" else {}
        model["encoder"] = encoder
        pre = {"transfer_layers": pretrained, "step": 1500} if pretrained is not None else None
        return {"model": model, "pretrained": pre, "training": {"config": {"lr": 6.25e-5}}}

    def group(grid, setting, accuracy):
        stat = {"section": "model", "mean": accuracy, "std": 0.01, "min": accuracy, "max": accuracy, "seeds": 3}
        return {"grid": grid, "axes": {"dataset": "sst"}, "model": setting, "seeds": [0, 1, 2],
                "statistics": {"test accuracy": {**stat, "ci95": [accuracy - 0.02, accuracy + 0.02]}}}  # fmt: skip

    assert model_setting(results(None, 0.5, "lstm")) == {"encoder": "lstm"}
    agg = {
        "groups": {
            "transfer-2/sst-gpt-tanh": group("transfer-2", model_setting(results(2, 0.5)), 0.8),
            "scratch/sst-gpt-tanh": group("scratch", model_setting(results(None, 0.0)), 0.6),
            "transfer-0/sst-gpt-tanh": group("transfer-0", model_setting(results(0, 0.5)), 0.7),
            "bilstm/sst-lstm-tanh": group("bilstm", model_setting(results(None, 0.5, "lstm")), 0.81),
        },
        "paired_tests": [],
        "cells": {},
    }
    report = render_sweep(agg, tmp_path).read_text()
    section = report.split("## GPT-1's ablations")[1].split("\n## ")[0]
    rows = {line.split("|")[2].strip(): line for line in section.splitlines() if line.startswith("| sst")}
    assert "2 of 4" in rows["transfer-2/sst-gpt-tanh"] and "0.50" in rows["transfer-2/sst-gpt-tanh"]
    assert "6.25e-05" in rows["transfer-2/sst-gpt-tanh"]
    assert not (tmp_path / "gpt_transfer.png").exists()  # two settings on the λ = 0.5 line: no curve yet
    agg["groups"]["transfer-1/sst-gpt-tanh"] = group("transfer-1", model_setting(results(1, 0.5)), 0.75)
    assert "![accuracy against the blocks transferred](gpt_transfer.png)" in render_sweep(agg, tmp_path).read_text()
    assert "none (from scratch)" in rows["scratch/sst-gpt-tanh"] and "0.00" in rows["scratch/sst-gpt-tanh"]
    assert "lstm (J&W)" in rows["bilstm/sst-lstm-tanh"] and "[0.790, 0.830]" in rows["bilstm/sst-lstm-tanh"]
    # the config's compare pairs, below the models table
    assert "### Paired comparisons" not in render_sweep(agg, tmp_path).read_text()
    agg["comparisons"] = [
        {
            "a": "transfer-2/sst-gpt-tanh",
            "b": "scratch/sst-gpt-tanh",
            "accuracy_a": 0.8,
            "accuracy_b": 0.6,
            "difference": {"estimate": 0.2, "ci95": [0.15, 0.25]},
            "seeds": [0, 1, 2],
            "instances": 1821,
            "per_seed": [{"pvalue": 0.001}, {"pvalue": 0.02}, {"pvalue": 0.5}],
        }  # fmt: skip
    ]
    part = render_sweep(agg, tmp_path).read_text().split("### Paired comparisons")[1].split("\n## ")[0]
    row = "transfer-2/sst-gpt-tanh | scratch/sst-gpt-tanh | 0.800 | 0.600 | 0.200 | [0.150, 0.250] | 3 | 1821 |"
    assert row in " ".join(part.split())
    assert "0.0010, 0.0200, 0.5000" in part


def test_bootstrap_ci_rows_is_bootstrap_ci_of_each_row():
    """One scipy call for M rows over the same instances gives each row the interval that a call
    of its own gives (the same seed draws the same instances), ties and a constant row included."""
    import numpy as np

    from attnmetrics.stats import bootstrap_ci, bootstrap_ci_rows

    rng = np.random.default_rng(3)
    rows = np.stack([rng.random(57), np.round(rng.random(57) * 3), np.full(57, 0.25), rng.normal(size=57)])
    together = bootstrap_ci_rows(rows, np.mean, n_resamples=999)
    for row, got in zip(rows, together):
        np.testing.assert_allclose(got, bootstrap_ci(row, np.mean, n_resamples=999), rtol=1e-12)
    assert all(np.isnan(v).all() for v in bootstrap_ci_rows(rows[:, :1], np.mean))  # one instance


def test_group_comparisons_pair_seeds_and_instances_like_a_plain_loop():
    """[sweep] compare: grid A's accuracy minus grid B's on their common seeds and instances; the
    estimate and interval as the two-level loop gives them on the per-instance differences, the
    McNemar counts by hand; groups matched by their axes (here: the same dataset, other encoders,
    one group each), and no comparison over other instances."""
    from attnmetrics.app.aggregate import group_comparisons

    rng = np.random.default_rng(7)
    labels = rng.integers(0, 2, 80)
    right = {(g, s): rng.random(80) < (0.8 if g == "a" else 0.6) for g in ("a", "b") for s in (0, 1, 2)}
    right.pop(("b", 2))  # B lacks seed 2: seeds 0 and 1 are compared
    cells = []
    test_set = {"data": {"name": "sst", "sizes": {"test": 80}}, "split_seed": 0}
    for (g, s), r in right.items():
        cell = Cell(g, {"dataset": "sst", "encoder": "gpt" if g == "a" else "lstm", "attention": "tanh", "seed": s}, ())
        predictions = _predictions(r, labels)
        if g == "b":  # another tokeniser: other token counts, the same sentences
            predictions["lengths"] = predictions["lengths"] + 3
        cells.append((cell, test_set, predictions))
    other = Cell("c", {"dataset": "sst", "encoder": "lstm", "attention": "tanh", "seed": 0}, ())
    cells.append((other, test_set, _predictions(right["b", 0], labels[::-1].copy())))  # other instances
    split = Cell("d", {"dataset": "sst", "encoder": "lstm", "attention": "tanh", "seed": 0}, ())
    cells.append((split, {**test_set, "split_seed": 1}, _predictions(right["b", 0], labels)))  # another split
    (got,), left_out = group_comparisons(cells, [("a", "b")])
    assert left_out == []
    assert (got["a"], got["b"], got["seeds"], got["instances"]) == ("a/sst-gpt-tanh", "b/sst-lstm-tanh", [0, 1], 80)
    diff = np.stack([right["a", s].astype(float) - right["b", s] for s in (0, 1)])
    estimate, low, high = _loop_seed_instance_ci(diff, np.mean, 9999)
    assert got["difference"]["estimate"] == pytest.approx(estimate)
    assert got["difference"]["ci95"] == pytest.approx([low, high])
    assert got["accuracy_a"] == pytest.approx(np.mean([right["a", s].mean() for s in (0, 1)]))
    for t in got["per_seed"]:
        a, b = right["a", t["seed"]], right["b", t["seed"]]
        assert (t["b01"], t["b10"]) == (int(np.sum(b & ~a)), int(np.sum(a & ~b)))
    for other, why in (("c", "other labels (or another order) on the test split"), ("d", "split seed 0 vs 1")):
        why = f"tested on different instances: {why}"
        assert group_comparisons(cells, [("a", other)]) == (
            [],
            [{"a_grid": "a", "b_grid": other, "a": "a/sst-gpt-tanh", "b": f"{other}/sst-lstm-tanh", "reason": why}],
        )


def _left_out_cells(labels, tmp_path=None):
    """Grids a, b, c, d, e: b shares no seed with a; c has a's seed but no predictions.npz; d was tested
    on another data set; e has two groups on sst (a's group matches neither); f has no finished cell.
    With ``tmp_path``: also written as run folders (results.json, predictions.npz) of a sweep there."""
    from attnmetrics.app.io import write_json_atomic, write_npz_atomic
    from attnmetrics.app.sweep.config import Sweep

    right = labels > -1
    runs = [("a", "lstm", 0, "sst", True), ("b", "lstm", 1, "sst", True), ("c", "lstm", 0, "sst", False)]
    runs += [("d", "lstm", 0, "imdb", True), ("e", "cnn", 0, "sst", True), ("e", "gru", 0, "sst", True)]
    cells = []
    for grid, encoder, seed, dataset, predicted in runs:
        cell = Cell(grid, {"dataset": "sst", "encoder": encoder, "attention": "tanh", "seed": seed}, ())
        results = {"command": "run", "config": {}, "data": {"name": dataset, "sizes": {"test": len(labels)}}}
        results |= {"split_seed": 0, "test": {"accuracy": 1.0, "macro_f1": 1.0}}
        predictions = _predictions(right, labels) if predicted else None
        cells.append((cell, results, predictions))
        if tmp_path is not None:
            folder = cell.folder(tmp_path)
            folder.mkdir(parents=True)
            if predicted:
                write_npz_atomic(folder / "predictions.npz", **predictions)
            write_json_atomic(folder / "results.json", results)
    compare = [("a", g) for g in "bcdef"]
    sweep = Sweep(tmp_path, 1, [c for c, _, _ in cells] + [Cell("f", {**cells[0][0].axes}, ())], "", compare=compare)
    return cells, sweep


#: why each of _left_out_cells' comparisons is left out
LEFT_OUT = [
    ("a/sst-lstm-tanh", "b/sst-lstm-tanh", "no common seed with predictions.npz: A seeds [0], B seeds [1]"),
    ("a/sst-lstm-tanh", "c/sst-lstm-tanh", "no common seed with predictions.npz: A seeds [0], B seeds [] (and [0] without predictions.npz)"),
    ("a/sst-lstm-tanh", "d/sst-lstm-tanh", "tested on different instances: data set sst vs imdb"),
    ("a/sst-lstm-tanh", None, "no group of grid 'e' has its axes, nor is there one group of each grid on sst"),
    (None, "e/sst-cnn-tanh", "no group of grid 'a' has its axes, nor is there one group of each grid on its dataset"),
    (None, "e/sst-gru-tanh", "no group of grid 'a' has its axes, nor is there one group of each grid on its dataset"),
    (None, None, "grid 'f' has no finished cell"),
]  # fmt: skip


def test_group_comparisons_name_each_pair_left_out_and_why():
    """[sweep] compare: no comparison vanishes without a word; each left out is named with its reason."""
    from attnmetrics.app.aggregate import group_comparisons

    cells, sweep = _left_out_cells(np.arange(12) % 2)
    compared, left_out = group_comparisons(cells, sweep.compare)
    assert compared == []
    got = sorted(((c["a"], c["b"], c["reason"]) for c in left_out), key=str)
    assert got == sorted(LEFT_OUT, key=str)
    assert {(c["a_grid"], c["b_grid"]) for c in left_out} == set(sweep.compare)


def test_a_sweep_names_its_comparisons_left_out_in_aggregate_json_the_report_and_on_stderr(tmp_path, capsys):
    import json

    from attnmetrics.app.aggregate import aggregate_sweep

    _, sweep = _left_out_cells(np.arange(12) % 2, tmp_path)
    report = aggregate_sweep(sweep).read_text()
    agg = json.loads((tmp_path / "aggregate.json").read_text())
    assert agg["comparisons"] == []
    assert sorted(((c["a"], c["b"], c["reason"]) for c in agg["comparisons_left_out"]), key=str) == sorted(
        LEFT_OUT, key=str
    )
    part = " ".join(report.split("### Paired comparisons")[1].split("\n## ")[0].split())
    assert "Left out of the config's comparisons (`[sweep] compare`), and why:" in part
    assert (
        "| a vs d | a/sst-lstm-tanh | d/sst-lstm-tanh | tested on different instances: data set sst vs imdb |" in part
    )
    assert "| a vs f | – | – | grid 'f' has no finished cell |" in part
    err = capsys.readouterr().err.splitlines()
    assert "attnmetrics sweep: [sweep] compare a vs f left out: grid 'f' has no finished cell" in err
    assert (
        "attnmetrics sweep: [sweep] compare a vs b: a/sst-lstm-tanh vs b/sst-lstm-tanh left out: "
        "no common seed with predictions.npz: A seeds [0], B seeds [1]"
    ) in err
    assert sum("left out" in line for line in err) == 7


def test_the_aggregate_records_each_cells_commit_and_conventions():
    from attnmetrics.app.aggregate import aggregate

    ours = {"single_removal": "random: uniform among the non-top tokens", "eraser": "k = ceil(f L)"}
    cells = []
    for seed, (commit, conventions) in enumerate([("a" * 40, ours), ("b" * 40 + "+dirty", ours), (None, None)]):
        results = {"test": {"accuracy": 0.5, "macro_f1": 0.5}, "instances": {"lengths": [3, 4]}}
        if commit is not None:
            results["versions"] = {"commit": commit}
            results["conventions"] = conventions
        cells.append((_cell("tanh", seed), results, None))
    out = aggregate(cells)
    names = [c.name for c, _, _ in cells]
    assert out["commits"] == {names[0]: "a" * 40, names[1]: "b" * 40 + "+dirty", names[2]: "unknown"}
    assert out["run_conventions"] == [
        {"cells": names[:2], "conventions": ours},
        {"cells": names[2:], "conventions": {"unknown": "not recorded by the attnmetrics that wrote this run"}},
    ]


def test_adversary_shares_per_predicted_class_match_a_plain_count():
    """J&W's histogram as shares (figs. 6-7): per seed, of the rows predicted as each class with a
    defined max JSD (length >= 2), the share whose max JSD reaches 0.3 and 0.5."""
    rng = np.random.default_rng(11)
    n, members, jsds, preds, lengths = 60, [], [], [], rng.integers(1, 6, 60)
    for s in range(3):
        jsd = rng.random(n) * np.log(2)
        jsd[s] = np.nan  # undefined for one row in each seed
        predicted = rng.integers(0, 2, n)
        jsds.append(jsd)
        preds.append(predicted)
        results = {
            "data": {"classes": ["negative", "positive"]},
            "adversarial": {"overall": {"mean": float(np.nanmean(jsd))}},
            "instances": {
                "lengths": lengths.tolist(),
                "predicted": predicted.tolist(),
                "adversarial": {"max_jsd": [None if np.isnan(v) else v for v in jsd]},
            },
        }
        members.append((s, results, None))
    g = aggregate_group(members)["statistics"]
    for c, name in enumerate(["negative", "positive"]):
        for t in (0.3, 0.5):
            entry = g[f"adversarial share max JSD ≥ {t} (predicted {name})"]
            for s in range(3):
                kept = [
                    jsds[s][i] >= t
                    for i in range(n)
                    if preds[s][i] == c and lengths[i] > 1 and not np.isnan(jsds[s][i])
                ]
                assert entry["per_seed"][str(s)] == pytest.approx(sum(kept) / len(kept))
            assert entry["ci95"][0] <= entry["estimate"] <= entry["ci95"][1]


def test_flip_orderings_paired_on_common_rows_match_a_plain_loop():
    """S&S's orderings compared on the same rows: per seed, the rows of >= 2 tokens that flip under
    every ordering (every sample of the random one), attention's fraction minus each other's."""
    rng = np.random.default_rng(3)
    n, samples, members, kept = 50, 2, [], []
    lengths = rng.integers(1, 9, n)
    for s in range(3):
        fr = {k: rng.random((n, samples if k == "random" else 1)) for k in ("attention", "gradient", "random")}
        for v in fr.values():
            v[rng.random(v.shape) < 0.2] = np.nan  # never flips
        kept.append(fr)
        flat = {k: v.T.reshape(-1) for k, v in fr.items()}  # sample after sample, as runs keep them
        results = {
            "flip": {
                k: {"fraction": {"mean": float(np.nanmean(v))}, "never_flipped_rate": 0.2} for k, v in flat.items()
            },
            "instances": {
                "lengths": lengths.tolist(),
                "flip": {
                    k: {"fraction": [None if np.isnan(x) else x for x in v], "removed": [1] * v.size}
                    for k, v in flat.items()
                },
            },
        }
        results["flip"]["paired"] = {}
        members.append((s, results, None))
    g = aggregate_group(members)["statistics"]
    for other in ("gradient", "random"):
        entry = g[f"flip fraction, common rows: attention − {other}"]
        for s, fr in enumerate(kept):
            diffs = []
            for i in range(n):
                if lengths[i] > 1 and all(not np.isnan(x) for v in fr.values() for x in v[i]):
                    diffs.append(fr["attention"][i].mean() - fr[other][i].mean())
            assert entry["per_seed"][str(s)] == pytest.approx(sum(diffs) / len(diffs))
        assert entry["ci95"][0] <= entry["estimate"] <= entry["ci95"][1]
    assert "flip fraction, common rows (random)" in g


def test_seed_t_interval_is_scipys_one_sample_t_confidence_interval():
    from scipy.stats import ttest_1samp

    from attnmetrics.app.aggregate import seed_t_interval

    rng = np.random.default_rng(2)
    for n in (2, 3, 5, 9):
        d = rng.normal(0.01, 0.02, n)
        ref = ttest_1samp(d, 0.0).confidence_interval(0.95)
        got = seed_t_interval(list(d) + [None])  # a seed without a number is left out
        assert got["seeds"] == n and got["mean"] == pytest.approx(d.mean())
        np.testing.assert_allclose(got["t95"], [ref.low, ref.high], rtol=1e-12)
    assert np.isnan(seed_t_interval([0.1])["t95"]).all()


def test_seed_paired_pairs_each_regulariser_with_none_of_the_same_seed():
    from attnmetrics.app.aggregate import seed_paired

    def group(reg, per_seed):
        return {
            "grid": "tutek",
            "axes": {"dataset": "sst", "regulariser": reg},
            "statistics": {"test accuracy": {"per_seed": per_seed}},
        }

    groups = {
        "tutek/none": group("none", {"0": 0.80, "1": 0.82, "2": 0.81}),
        "tutek/tying": group("tying", {"0": 0.78, "1": 0.81, "2": 0.77, "3": 0.9}),  # seed 3: no partner
        "other/tying": {**group("tying", {"0": 0.1, "1": 0.2}), "grid": "other"},  # no baseline in its grid
    }
    (row,) = seed_paired(groups)
    assert (row["group"], row["baseline"], row["statistic"]) == ("tutek/tying", "tutek/none", "test accuracy")
    np.testing.assert_allclose(list(row["per_seed"].values()), [-0.02, -0.01, -0.04])
    assert row["seeds"] == 3 and row["t95"][0] < row["mean"] < row["t95"][1]


def test_diagnostic_variants_minus_base_are_paired_by_seed():
    from attnmetrics.app.aggregate import _diagnostic

    per_seed = [
        {"base": {"accuracy": 0.80, "macro_f1": 0.79}, "uniform": {"accuracy": 0.82, "macro_f1": 0.815}},
        {"base": {"accuracy": 0.81, "macro_f1": 0.80}, "uniform": {"accuracy": 0.82, "macro_f1": 0.82}},
        {"base": {"accuracy": 0.79, "macro_f1": 0.78}, "uniform": {"accuracy": 0.83, "macro_f1": 0.825}},
    ]
    d = _diagnostic(per_seed, [0, 1, 2])
    assert d["uniform"]["accuracy"]["per_seed"] == {"0": 0.82, "1": 0.82, "2": 0.83}
    paired = d["paired"]["uniform − base"]["accuracy"]
    assert paired["mean"] == pytest.approx((0.02 + 0.01 + 0.04) / 3) and paired["seeds"] == 3


@pytest.mark.parametrize("seeds", [1, 3, 5])
def test_seed_instance_ci_of_a_mean_by_counts_matches_the_plain_loop_and_the_gathering_path(seeds):
    """``nanmean`` takes the counted path (instances as how often each is drawn, one matrix product):
    the plain two-level loop's interval, and the general path's to rounding, in chunks, with NaNs,
    an instance undefined in every seed and a seed's whole row NaN but one."""
    from attnmetrics.stats import nanmean

    rng = np.random.default_rng(seeds)
    values = rng.gamma(2.0, 0.1, size=(seeds, 70)) + np.arange(seeds)[:, None] * 0.05
    values[:, 3] = np.nan
    values[0, :60] = np.nan
    values = np.asfortranarray(values)  # not C-contiguous
    got = seed_instance_ci(values, nanmean, n_resamples=500, chunk=500)
    np.testing.assert_allclose(got, _loop_seed_instance_ci(values, np.nanmean, 500), rtol=1e-12)
    general = seed_instance_ci(values, lambda v, axis=-1: np.nanmean(v, axis=axis), n_resamples=999, chunk=64)
    np.testing.assert_allclose(seed_instance_ci(values, nanmean, n_resamples=999, chunk=64), general, rtol=1e-12)


def test_a_prompted_groups_macro_f1_interval_pairs_prompts_whose_tokenisations_differ():
    """Three prompts on the same test sentences: the same labels, other token counts (a template ending
    in a space tokenises the text's first word otherwise). Macro F1 still gets its prompts-then-
    instances interval; attention is not compared across them (no seed variance)."""
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, 80)
    members = []
    for s in range(3):
        p = _predictions(rng.random(80) < 0.8, labels)
        p["lengths"] = p["lengths"] + (np.arange(80) % 3 == s)  # this prompt's tokenisation
        results = {"test": {"accuracy": float(_correct_of(p).mean()), "macro_f1": 0.0}, "instances": {}}
        members.append((s, results, p))
    g = aggregate_group(members)
    f1 = g["statistics"]["test macro F1"]
    assert np.isfinite(f1["estimate"]) and f1["ci95"][0] <= f1["estimate"] <= f1["ci95"][1]
    want = np.mean([f1_score(labels, _correct_decision(p), average="macro") for _, _, p in members])
    assert f1["estimate"] == pytest.approx(want)
    assert "seed_variance" not in g


def _correct_decision(p):
    return (p["logits"][:, 0] > 0).astype(int)


def _correct_of(p):
    return _correct_decision(p) == p["labels"]
