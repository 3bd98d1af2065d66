"""The methods table (app/battery/methods.py, issue 28) and ``--importances``: every number of the
table recomputed here from per-instance values by plain loops, the rows' order, the intervals,
when the section is written, and the flag's parsing and errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from attnmetrics.app.battery import collect, registry, summarise
from attnmetrics.app.battery.methods import method_table, section
from attnmetrics.app.config import RunConfig
from attnmetrics.app.parser import build_parser
from attnmetrics.app.report import render
from attnmetrics.attributions import METHODS as ATTRIBUTIONS
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from tests.toy import toy_batch

#: the methods whose flip search runs in their own order (not gradient: S&S's gradient order is
#: another score; not leave-one-out: never a flip order)
FLIP_ORDERS = {
    "attention", "rollout", "value_norm", "globenc", "alti", "value_zeroing", "chefer", "decompx",
    "attention_flow", "ig", "alti_logit", "attnlrp", "input_x_gradient",
}  # fmt: skip


def plain_table(kendall: dict, eraser: dict, flip: dict, lengths: list[int]) -> dict:
    """The table's means recomputed with loops over instances from results.json-like per-instance
    lists: ``kendall["A vs B"]``, ``eraser[name][metric]``, ``flip[name]["fraction"/"removed"]``."""
    n = len(lengths)
    methods = {"attention"}
    for pair in kendall:
        methods |= set(pair.split(" vs "))
    methods |= set(eraser) - {"random"}
    out = {m: {} for m in methods}

    def finite(v):
        return v is not None and math.isfinite(v)

    tau = {}
    for m in methods:
        for pair in (f"{m} vs loo", f"loo vs {m}"):
            if pair in kendall:
                tau[m] = kendall[pair]
    rows = [i for i in range(n) if all(finite(t[i]) for t in tau.values())]
    for m, t in tau.items():
        out[m]["tau_loo"] = sum(t[i] for i in rows) / len(rows) if rows else math.nan
    rows = [i for i in range(n) if all(finite(e[k][i]) for e in eraser.values() for k in e)]
    for m in eraser:
        for metric in ("comprehensiveness", "sufficiency"):
            out.setdefault(m, {})[metric] = sum(eraser[m][metric][i] for i in rows) / len(rows)
    flips = [m for m in methods if m in FLIP_ORDERS and m in flip]
    rows = [i for i in range(n) if lengths[i] > 1 and all(finite(flip[m]["fraction"][i]) for m in flips)]
    eligible = [i for i in range(n) if lengths[i] > 1]
    for m in flips:
        out[m]["flip_fraction"] = sum(flip[m]["fraction"][i] for i in rows) / len(rows) if rows else math.nan
        out[m]["never_flips"] = sum(flip[m]["removed"][i] <= 0 for i in eligible) / len(eligible)
    return out


def check_against(table: dict, plain: dict) -> None:
    """Every cell of ``table`` equals the plain recomputation, its interval holds it, and every
    cell the recomputation has is in the table (and no other)."""
    rows = {r["method"]: r for r in table["methods"]}
    assert set(rows) == set(plain) - {"random"}
    for m, r in rows.items():
        for column in ("tau_loo", "comprehensiveness", "sufficiency", "flip_fraction", "never_flips"):
            if column not in plain[m]:
                assert r[column] is None, (m, column)
                continue
            cell = r[column]
            if math.isnan(plain[m][column]):
                assert cell["mean"] is None or math.isnan(cell["mean"])  # results.json: null
                continue
            assert cell["mean"] == pytest.approx(plain[m][column], abs=1e-12), (m, column)
            low, high = cell["ci95"]
            if table["rows"][column] < 2:  # no interval from one instance
                assert low is None or math.isnan(low), (m, column, cell)
            else:
                assert low <= cell["mean"] <= high, (m, column, cell)
    for metric in ("comprehensiveness", "sufficiency"):
        assert table["baseline"]["random"][metric]["mean"] == pytest.approx(plain["random"][metric], abs=1e-12)
    c = [r["comprehensiveness"]["mean"] for r in table["methods"] if r["comprehensiveness"]]
    assert c == sorted(c, reverse=True)  # sorted by comprehensiveness, descending


def synthetic(n=40, seed=0):
    """Per-instance values as collect keeps them (NaN where undefined), with known structure:
    τ NaN on a few rows, rows of one token, rows that never flip (removed -1, fraction NaN)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, n)
    names = ["attention", "gradient", "loo", "rollout", "alti"]
    x = {"lengths": lengths}
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            tau = rng.uniform(-1, 1, n)
            tau[rng.random(n) < 0.1] = np.nan
            x[f"kendall/{names[a]} vs {names[b]}/tau"] = tau
    for shift, name in enumerate([*names, "random"]):
        for metric in ("comprehensiveness", "sufficiency"):
            v = rng.normal(0.1 * shift, 0.2, n)
            v[:2] = np.nan  # rows without real tokens: NaN under every ordering
            x[f"eraser/{name}/{metric}/aopc"] = v
    for name in ["attention", "random", "gradient", "rollout", "alti"]:
        removed = np.where(rng.random(n) < 0.3, -1, rng.integers(1, 12, n))
        removed[lengths < 2] = -1
        fraction = np.where(removed > 0, removed / lengths, np.nan)
        x[f"flip/{name}/removed"], x[f"flip/{name}/fraction"] = removed[:, None], fraction[:, None]
    return x


def as_instances(x: dict) -> tuple[dict, dict, dict, list]:
    """``collect``'s arrays as results.json's per-instance lists (NaN as None)."""

    def listed(v):
        return [None if isinstance(a, float) and math.isnan(a) else a for a in np.asarray(v).reshape(-1).tolist()]

    kendall = {k.split("/")[1]: listed(v) for k, v in x.items() if k.startswith("kendall/") and k.endswith("/tau")}
    eraser: dict = {}
    for k, v in x.items():
        if k.startswith("eraser/") and k.endswith("/aopc"):
            eraser.setdefault(k.split("/")[1], {})[k.split("/")[2]] = listed(v)
    flip: dict = {}
    for k, v in x.items():
        if k.startswith("flip/"):
            flip.setdefault(k.split("/")[1], {})[k.split("/")[2]] = listed(v)
    return kendall, eraser, flip, np.asarray(x["lengths"]).tolist()


def test_the_table_is_the_plain_recomputation_sorted_with_intervals_around_it():
    x = synthetic()
    table = method_table(x, x["lengths"])
    check_against(table, plain_table(*as_instances(x)))
    order = [r["method"] for r in table["methods"]]
    assert order == ["alti", "rollout", "loo", "gradient", "attention"]  # the synthetic AOPCs rise by 0.1 per name
    rows = {r["method"]: r for r in table["methods"]}
    assert rows["loo"]["tau_loo"] is None and rows["loo"]["flip_fraction"] is None
    assert rows["gradient"]["flip_fraction"] is None  # S&S's gradient order is not this row's score
    # paired: every method's τ on the same instances, those where no τ with leave-one-out is NaN
    defined = np.all([np.isfinite(x[k]) for k in x if k.endswith("loo/tau") or "kendall/loo vs" in k], axis=0)
    assert table["rows"]["tau_loo"] == defined.sum() < len(defined)
    assert table["rows"]["never_flips"] == (x["lengths"] > 1).sum()


def test_a_method_without_eraser_values_sorts_last_and_the_interval_widens_with_fewer_instances():
    x = synthetic()
    for metric in ("comprehensiveness", "sufficiency"):
        del x[f"eraser/alti/{metric}/aopc"]
    table = method_table(x, x["lengths"])
    assert table["methods"][-1]["method"] == "alti" and table["methods"][-1]["comprehensiveness"] is None
    small = method_table({k: v[:10] for k, v in x.items()}, x["lengths"][:10])

    def width(t):
        return np.diff(t["methods"][0]["comprehensiveness"]["ci95"])[0]

    assert width(small) > width(table) > 0


def test_the_section_needs_two_methods():
    x = synthetic()
    only_attention = {k: v for k, v in x.items() if k.startswith(("eraser/attention/", "eraser/random/", "flip/"))}
    assert method_table(only_attention, x["lengths"]) is None
    two = {k: v for k, v in x.items() if k.startswith(("eraser/attention/", "eraser/rollout/", "eraser/random/"))}
    table = method_table(two, x["lengths"])
    assert [r["method"] for r in table["methods"]] == ["rollout", "attention"]
    lines = section({"methods": {**table, "never_flipped": "nan"}})
    assert lines[0] == "## The explanation methods side by side"
    assert "sorted by comprehensiveness AOPC, descending" in lines[2]
    rows = [line for line in "\n".join(lines).splitlines() if line.startswith("| ")][1:]  # after the header
    assert [r.split("|")[1].strip() for r in rows] == ["rollout", "attention", "random (baseline)"]


@pytest.fixture(scope="module")
def toy_model():
    torch.manual_seed(0)
    return EncoderAttentionClassifier(ModelConfig(30, embed_dim=8, hidden_size=6)).eval()


def test_the_battery_writes_the_section_with_two_methods_and_not_with_one(toy_model, tmp_path):
    tokens, lengths = toy_batch(rows=6)
    chosen = dict(orders=["attention", "random"], progress=False)
    both = collect(toy_model, [(0, tokens, lengths)], experiments=["flip", "kendall", "loo", "eraser"], **chosen)
    summary, instances = summarise(*both, ("neg", "pos"), experiments=["flip", "kendall", "loo", "eraser"])
    assert {r["method"] for r in summary["methods"]["methods"]} == {"attention", "gradient", "loo"}
    assert "methods" not in instances  # its values are the other experiments'
    kendall = {k: v["tau"] for k, v in instances["kendall"].items()}
    eraser = {k: {m: w["aopc"] for m, w in v.items()} for k, v in instances["eraser"].items()}
    check_against(summary["methods"], plain_table(kendall, eraser, instances["flip"], instances["lengths"]))
    # without Kendall's step no importance is computed: attention alone, no table
    alone = collect(toy_model, [(0, tokens, lengths)], experiments=["flip", "eraser"], **chosen)
    assert "methods" not in summarise(*alone, ("neg", "pos"), experiments=["flip", "eraser"])[0]


# --importances


def parsed(*argv: str) -> RunConfig:
    return RunConfig.from_namespace(build_parser().parse_args(["run", "--dataset", "sst", *argv]))


def test_importances_turns_on_the_named_ones_and_the_default_none():
    default = parsed().importance_options
    assert not any(default.values()) and default["integrated_gradients"] == 0
    config = parsed("--importances", "alti", "integrated_gradients")
    on = {k for k, v in config.importance_options.items() if v}
    assert on == {"alti", "integrated_gradients"} and config.importance_options["integrated_gradients"] == 50
    assert config.to_dict()["alti"] is True and config.to_dict()["importances"] == ["alti", "integrated_gradients"]
    # a flag of its own wins, and the individual flags keep working alone
    assert parsed("--importances", "all", "--integrated-gradients", "7").importance_options["integrated_gradients"] == 7
    assert {k for k, v in parsed("--globenc", "--value-zeroing").importance_options.items() if v} == {
        "globenc",
        "value_zeroing",
    }


def test_importances_all_is_every_optional_one_installed_and_those_that_apply_to_the_model(monkeypatch, toy_model):
    everything = parsed("--importances", "all").importance_options
    assert set(everything) == set(registry.optional_names())
    installed = {k for k, v in everything.items() if v}
    captum = registry.importlib.util.find_spec("captum") is not None
    assert installed == set(registry.optional_names()) - (
        set() if captum else {"integrated_gradients", "input_x_gradient"}
    )
    if captum:
        assert registry.left_out_of_all(("all",)) == []
    # the attention-derived attributions need a transformer (attention flow any, the rest BERT-like or our GPT
    # with its extract read-out): not a BiLSTM
    settings = registry.Settings((), everything)
    names = {i.name for i in registry.chosen(toy_model, settings)}
    assert not names & set(ATTRIBUTIONS)
    assert {i.name for i in registry.chosen(None, settings)} >= set(ATTRIBUTIONS)
    # without Captum "all" leaves its two out and says so; naming one of them is the missing package's error
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name, *a: None)
    without = {k for k, v in parsed("--importances", "all").importance_options.items() if v}
    assert without == {
        "value_norm", "globenc", "alti", "value_zeroing", "chefer", "decompx", "attention_flow", "alti_logit",
        "attnlrp",
    }  # fmt: skip
    assert registry.left_out_of_all(("all",)) == [
        "integrated_gradients (needs Captum: pip install captum)",
        "input_x_gradient (needs Captum: pip install captum)",
    ]
    assert registry.left_out_of_all(("alti",)) == []
    named = registry.Settings((), parsed("--importances", "input_x_gradient").importance_options)
    assert registry.missing_package(named) == "--input-x-gradient needs Captum: pip install captum"


def test_an_unknown_importance_is_refused_naming_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        parsed("--importances", "alti", "lime")
    err = capsys.readouterr().err
    assert "invalid choice: 'lime'" in err
    for name in ("all", *registry.optional_names()):
        assert f"'{name}'" in err
    with pytest.raises(ValueError, match=r"unknown importance 'lime' for --importances; choose from all, value_norm"):
        registry.with_importances(["lime"], {})


def test_the_report_renders_the_section_and_its_figure(tmp_path):
    x = synthetic()
    table = {**method_table(x, x["lengths"]), "never_flipped": "nan"}
    table["methods"][0]["flip_fraction"] = {"mean": None, "ci95": [None, None]}  # results.json's NaN
    results = {"config": {"dataset": "sst"}, "data": {"name": "sst", "sizes": {}, "classes": []}, "methods": table}
    results["data"]["sizes"] = {"train": 1, "dev": 1, "test": 1}
    text = render(json.loads(json.dumps(results)), tmp_path).read_text()
    assert "## The explanation methods side by side" in text and "![comprehensiveness vs sufficiency" in text
    assert (tmp_path / "methods.png").stat().st_size > 0
    first = next(line for line in text.splitlines() if line.startswith(f"| {table['methods'][0]['method']} "))
    assert first.split("|")[5].strip() == "–"
    del results["methods"]
    assert "side by side" not in render(results, tmp_path).read_text()


@pytest.mark.parametrize("methods", [13, 25])
def test_the_methods_figure_gives_each_method_a_style_of_its_own_past_ten(tmp_path, monkeypatch, methods):
    """methods.png: every method's point (and legend entry) a colour of its own (up to 18; and a
    marker of its own for each nine colours beyond), none the random baseline's grey cross."""
    from matplotlib.colors import to_hex

    from attnmetrics.app.battery import methods as module

    drawn = []
    monkeypatch.setattr(module, "save_figure", lambda fig, path: drawn.append(fig) or path.name)

    def cell(mean):
        return {"mean": mean, "ci95": [mean - 0.01, mean + 0.01]}

    rows = [
        {"method": f"m{k}", "comprehensiveness": cell(k / 30), "sufficiency": cell(0.5 - k / 60)}
        for k in range(methods)
    ]
    s = {"methods": rows, "baseline": {"random": {"comprehensiveness": cell(0.1), "sufficiency": cell(0.4)}}}
    assert module.eraser_figure(s, tmp_path / "methods.png", "title") == "methods.png"
    (ax,) = drawn[0].axes
    points = {c.get_label(): c.lines[0] for c in ax.containers}  # each errorbar's point
    assert list(points) == [f"m{k}" for k in range(methods)] + ["random (baseline)"]
    styles = [(to_hex(line.get_color()), line.get_marker()) for line in points.values()]
    assert len(set(styles)) == methods + 1
    colours = [colour for colour, _ in styles[:methods]]
    assert len(set(colours)) == min(methods, 18)
    assert styles[-1] == (to_hex("grey"), "x") and all(m != "x" for _, m in styles[:-1])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(points)


# a sweep's table (issues 28, 29): the cells' per-instance values over seeds


def seed_results(seed: int, n: int = 40) -> tuple[dict, dict]:
    """A results.json as a run writes it (null for NaN) from :func:`synthetic`'s values of one
    seed, and :func:`plain_table` of those values (the loops' numbers, independent of the code)."""
    x = synthetic(n=n, seed=seed)
    kendall, eraser, flip, lengths = as_instances(x)
    inst = {
        "lengths": lengths,
        "kendall": {pair: {"tau": tau} for pair, tau in kendall.items()},
        "eraser": {name: {metric: {"aopc": v} for metric, v in m.items()} for name, m in eraser.items()},
        "flip": flip,
    }
    results = {"instances": inst, "methods": method_table(x, x["lengths"])}
    return json.loads(json.dumps(results).replace("NaN", "null")), plain_table(kendall, eraser, flip, lengths)


def test_a_sweep_groups_table_is_the_mean_over_seeds_of_the_seeds_tables_with_paired_differences(tmp_path):
    from attnmetrics.app.aggregate import aggregate_group
    from attnmetrics.app.battery.methods import COLUMNS
    from attnmetrics.app.sweep_report import render_sweep
    from tests.app.test_aggregate import _loop_seed_instance_ci

    seeds = (0, 1, 2)
    cells = [seed_results(s) for s in seeds]
    group = aggregate_group([(s, results, None) for s, (results, _) in zip(seeds, cells)])
    stats = group["statistics"]
    plains = [plain for _, plain in cells]
    expected = {f"methods/{m}/{COLUMNS[c]}": (m, c) for m, columns in plains[0].items() for c in columns}
    assert {k for k in stats if k.startswith("methods/")} == set(expected)
    for name, (m, c) in expected.items():
        s = stats[name]
        per_seed = [plain[m][c] for plain in plains]  # each seed's mean over its own common instances
        assert s["section"] == "methods" and s["seeds"] == 3
        assert [s["per_seed"][str(k)] for k in seeds] == pytest.approx(per_seed, abs=1e-12), name
        assert s["estimate"] == pytest.approx(np.mean(per_seed), abs=1e-12), name
        assert s["ci95"][0] <= s["estimate"] <= s["ci95"][1], name
    table = group["methods"]
    order = [r["method"] for r in table["methods"]]
    estimates = [r["comprehensiveness"]["mean"] for r in table["methods"]]
    assert estimates == sorted(estimates, reverse=True) and len(order) == 5
    assert table["baseline"]["random"]["sufficiency"]["mean"] == pytest.approx(
        np.mean([p["random"]["sufficiency"] for p in plains])
    )
    # adjacent methods' paired comprehensiveness difference: per instance on each seed's ERASER
    # rows (those where every ordering has both AOPCs), by loops; its interval by a plain
    # two-level resampling loop (seeds, then instances)
    pairs = table["paired"]["pairs"]
    assert [(p["a"], p["b"]) for p in pairs] == list(zip(order, order[1:]))
    for p in pairs:
        diff = np.full((3, 40), np.nan)
        for k, (results, _) in enumerate(cells):
            eraser = results["instances"]["eraser"]
            rows = [i for i in range(40) if all(v["aopc"][i] is not None for e in eraser.values() for v in e.values())]
            for i in rows:
                a, b = (eraser[m]["comprehensiveness"]["aopc"][i] for m in (p["a"], p["b"]))
                diff[k, i] = a - b
        estimate, low, high = _loop_seed_instance_ci(diff, np.nanmean, 9999)
        comp = {r["method"]: r["comprehensiveness"]["mean"] for r in table["methods"]}
        assert p["mean"] == pytest.approx(estimate, abs=1e-12) == pytest.approx(comp[p["a"]] - comp[p["b"]])
        np.testing.assert_allclose(p["ci95"], [low, high], atol=0.05 * (high - low))
        assert p["excludes_zero"] == (low > 0 or high < 0)
    # the report's section: the table in that order, the pairs, the figure
    agg = {"groups": {"g/sst-hf": {**group, "grid": "g", "axes": {}, "model": {}}}, "paired_tests": [], "cells": {}}
    report = render_sweep(agg, tmp_path).read_text()
    part = report.split("## The explanation methods side by side")[1].split("\n## ")[0]
    rows = [line.split("|")[1].strip() for line in part.splitlines() if line.startswith("| ")]
    assert rows[1 : 1 + len(order) + 1] == [*order, "random (baseline)"]
    assert "**g/sst-hf** (3 seeds)" in part and f"| {order[0]} − {order[1]} " in part
    assert "Intervals that exclude 0:" in part and (tmp_path / "methods_g_sst-hf.png").stat().st_size > 0
