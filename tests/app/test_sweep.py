"""`attnmetrics sweep`: config parsing and grid expansion, the data folders checked before any
cell starts, and an interrupted sweep resumed on the SST-format sample the tests write."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from attnmetrics.app.cli import main
from attnmetrics.app.parser import build_parser
from attnmetrics.app.sweep import load_config
from tests.inputs import ROOT, SST_SAMPLE


def _config(tmp_path, text, name="sweep.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


GRID = """
[sweep]
out = "out"
jobs = 2
data_dirs = { sst = "data/sst" }
[defaults]
epochs = 3
threads = 1
[[grid]]
name = "g"
datasets = ["sst", "mr"]
encoders = ["lstm", "average"]
seeds = [0, 1, 2]
epochs = 1
skip = ["adversarial", "loo"]
limit = 160
"""


def test_grid_expands_to_the_product_of_its_axes(tmp_path):
    sweep = load_config(_config(tmp_path, GRID))
    assert sweep.out == tmp_path / "out" and sweep.jobs == 2 and len(sweep.cells) == 12
    c = sweep.cells[0]
    assert c.name == "sst-lstm-tanh-s0" and c.group == "g/sst-lstm-tanh"  # attention: run's default
    assert list(c.flags) == [
        "--dataset",
        "sst",
        "--encoder",
        "lstm",
        "--attention",
        "tanh",
        "--seed",
        "0",
        "--data-dir",
        str(tmp_path / "data" / "sst"),
        "--epochs",
        "1",
        "--threads",
        "1",
        "--skip",
        "adversarial",
        "loo",
        "--limit",
        "160",
    ]  # the grid's epochs win
    assert "--data-dir" not in sweep.cells[-1].flags and sweep.cells[-1].name == "mr-average-tanh-s2"
    # every cell's flags are a valid `attnmetrics run` command line
    for cell in sweep.cells:
        build_parser().parse_args(["run", *cell.flags])
    assert load_config(_config(tmp_path, GRID), out=Path("elsewhere"), jobs=1).jobs == 1


def test_booleans_and_bbc_pairs(tmp_path):
    text = '[[grid]]\nname = "b"\ndatasets = ["bbc:sports-business"]\nno_progress_unused = 1\n'
    with pytest.raises(ValueError, match="no_progress_unused"):
        load_config(_config(tmp_path, text))
    sweep = load_config(
        _config(tmp_path, '[[grid]]\nname = "b"\ndatasets = ["bbc:sports-business"]\nembeddings = "random"\n')
    )
    assert sweep.cells[0].name == "bbc_sports-business-lstm-tanh-s0"


@pytest.mark.parametrize(
    "body, key",
    [
        ('datasets = ["sst"]\nepoch = 3', "epoch"),  # not a run option
        ("datasets = []", "datasets"),  # empty axis
        ('datasets = ["sst"]\nseeds = []', "seeds"),
        ('datasets = ["sst"]\nencoders = ["transformer"]', "encoders"),
        ('datasets = ["sst"]\nseeds = ["a"]', "seeds"),
        ('datasets = ["sst"]\nseed = 3', "seed"),  # the axis is "seeds"
        ('datasets = ["sst"]\nout = "x"', "out"),  # set by the sweep
        ('datasets = ["sst"]\nskip = []', "skip"),
        ('encoders = ["lstm"]', "datasets"),  # missing axis
    ],
)
def test_config_errors_name_the_key(tmp_path, body, key):
    with pytest.raises(ValueError, match=f"'{key}'"):
        load_config(_config(tmp_path, f'[[grid]]\nname = "g"\n{body}\n'))


def test_config_errors_in_sections(tmp_path):
    with pytest.raises(ValueError, match="duplicate grid name"):
        load_config(_config(tmp_path, '[[grid]]\nname = "g"\ndatasets = ["sst"]\n' * 2))
    with pytest.raises(ValueError, match="unknown sections"):
        load_config(_config(tmp_path, '[grids]\nname = "g"\n'))
    for clash in ("status.json", "report.md", ".hidden", "heads.png"):  # the sweep's own files
        with pytest.raises(ValueError, match=f"'{re.escape(clash)}': 'name' is a file the sweep writes"):
            load_config(_config(tmp_path, f'[[grid]]\nname = "{clash}"\ndatasets = ["sst"]\n'))
    with pytest.raises(ValueError, match="jobs"):
        load_config(_config(tmp_path, '[sweep]\njobs = 0\n[[grid]]\nname = "g"\ndatasets = ["sst"]\n'))
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(_config(tmp_path, "[[grid]\n"))


@pytest.mark.parametrize(
    "body, words",
    [
        ('datasets = ["sst"]\nepochs = 0', "'epochs': invalid value '0'"),  # once found only when the cell ran
        ('datasets = ["sst"]\nepochs = "many"', "'epochs': invalid value 'many'"),
        ('datasets = ["sst"]\nlr = true', "'lr' takes a value"),
        ('datasets = ["sst"]\norders = ["attention", "alphabetical"]', "'alphabetical' is not one of"),
    ],
)
def test_flag_values_are_checked_when_the_config_loads(tmp_path, body, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        load_config(_config(tmp_path, f'[[grid]]\nname = "g"\n{body}\n'))


@pytest.mark.parametrize(
    "text, words",
    [
        ('[sweep]\ndata_dirs = "x"\n[[grid]]\nname = "g"\ndatasets = ["sst"]\n', "data_dirs must be a table"),
        ('defaults = 5\n[[grid]]\nname = "g"\ndatasets = ["sst"]\n', "defaults must be a table"),
        ("grid = [1, 2]\n", "[[grid]] #1: must be a table"),
        ('[[grid]]\nname = ".."\ndatasets = ["sst"]\n', "'name' must be a folder name"),  # would write outside
    ],
)
def test_malformed_sections_are_named_not_tracebacks(tmp_path, text, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        load_config(_config(tmp_path, text))


def test_a_folder_as_config_is_named(tmp_path):
    with pytest.raises(ValueError, match="is a folder"):
        load_config(tmp_path)


def test_shipped_configs_parse():
    sweep = load_config(ROOT / "configs" / "sweep.toml")
    assert len([c for c in sweep.cells if c.grid == "wp"]) == 2 * 2 * 2 * 3
    assert {c.grid for c in sweep.cells} == {"wp", "adversary", "tutek"}
    assert len(load_config(ROOT / "configs" / "seed-variance.toml").cells) == 8  # W&P's 8 seeds


TINY = f"""
[sweep]
data_dirs = {{ sst = "{SST_SAMPLE}" }}
[defaults]
limit = 60
epochs = 1
embeddings = "random"
embed_dim = 16
hidden_size = 8
skip = ["adversarial", "loo"]
permutations = 10
threads = 1
[[grid]]
name = "g"
datasets = ["sst"]
seeds = [0, 1]
"""


def outside(group: dict) -> list[str]:
    """The aggregate group's rows (the methods table's and its paired differences included)
    whose estimate lies outside its own interval (issue 29: the interval bootstraps that estimate)."""
    rows = [(name, st["estimate"], st["ci95"]) for name, st in group["statistics"].items()]
    rows += [
        (f"{p['a']} - {p['b']}", p["mean"], p["ci95"])
        for p in group.get("methods", {}).get("paired", {}).get("pairs", [])
    ]
    return [name for name, est, (lo, hi) in rows if lo is not None and np.isfinite(lo) and not lo <= est <= hi]


def _recorded_done(out, cell: str) -> bool:
    try:
        return json.loads((out / "status.json").read_text())["cells"][cell]["state"] == "done"
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return False


def test_interrupted_sweep_resumes_without_redoing_finished_cells(tmp_path, capsys):
    config, out = _config(tmp_path, TINY), tmp_path / "sweep"
    first = out / "g" / "sst-lstm-tanh-s0" / "results.json"
    cmd = [sys.executable, "-m", "attnmetrics", "sweep", str(config), "--out", str(out), "--jobs", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not _recorded_done(out, "g/sst-lstm-tanh-s0") and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)  # results.json, then the sweep records the cell once its process exits
    assert first.is_file(), proc.stderr.read() if proc.poll() is not None else "first cell never finished"
    time.sleep(2)  # the second cell is under way
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    assert "interrupted" in proc.stderr.read()
    status = json.loads((out / "status.json").read_text())["cells"]
    assert status["g/sst-lstm-tanh-s0"]["state"] == "done"
    assert status["g/sst-lstm-tanh-s1"]["state"] in ("interrupted", "running")
    assert not (out / "g" / "sst-lstm-tanh-s1").exists()
    # a staging folder as an interrupted run leaves it (if the kill came too early to leave one)
    (out / "g" / ".sst-lstm-tanh-s1.partial-test").mkdir(exist_ok=True)
    before = os.stat(first)

    assert main(["sweep", str(config), "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "skip g/sst-lstm-tanh-s0: done" in err
    after = os.stat(first)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not redone
    assert (out / "g" / "sst-lstm-tanh-s1" / "results.json").is_file()
    assert not list((out / "g").glob(".*partial*"))
    assert (out / "g" / "sst-lstm-tanh-s1.log").read_text().count("=== ") >= 1
    assert (out / "sweep.toml").read_text() == TINY
    agg = json.loads((out / "aggregate.json").read_text())
    group = agg["groups"]["g/sst-lstm-tanh"]
    assert group["seeds"] == [0, 1] and "seed_variance" in group
    assert group["statistics"]["test accuracy"]["seeds"] == 2
    # issue 29: every row's estimate lies inside its own interval (the interval bootstraps that estimate)
    assert not outside(group) and sum(np.isfinite(st["ci95"][0]) for st in group["statistics"].values()) > 10
    assert any(name.startswith("methods/attention/") for name in group["statistics"])  # the methods rows too
    report = (out / "report.md").read_text()
    assert "Jain & Wallace" in report and "Seed variance" in report
    # one table of every cell's instances; docs/usage.md's pandas query gives the report's per-seed τ
    pd = pytest.importorskip("pandas")
    t = pd.read_parquet(out / "instances.parquet")
    assert set(t.cell) == {"g/sst-lstm-tanh-s0", "g/sst-lstm-tanh-s1"} and {"dataset", "encoder", "seed"} <= set(t)
    tau = t[t.statistic == "attention vs gradient/tau"].groupby(["group", "seed"]).value.mean()
    per_seed = group["statistics"]["τ attention vs gradient"]["per_seed"]
    assert [tau[("g/sst-lstm-tanh", s)] for s in (0, 1)] == pytest.approx([per_seed["0"], per_seed["1"]], rel=1e-12)
    assert "Each regulariser vs none" not in report  # no regulariser axis: no T&Š comparison

    # --report-only re-aggregates; a changed config refuses to reuse stale cells unless --overwrite
    (out / "report.md").unlink()
    assert main(["sweep", str(config), "--out", str(out), "--report-only"]) == 0 and (out / "report.md").is_file()
    changed = _config(tmp_path, TINY.replace("epochs = 1", "epochs = 2"), "changed.toml")
    assert main(["sweep", str(changed), "--out", str(out), "--no-progress"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert os.stat(first).st_mtime_ns == before.st_mtime_ns
    assert main(["sweep", str(changed), "--out", str(out), "--dry-run"]) == 0
    listed = capsys.readouterr().out
    assert listed.count("stale\t") == 2 and "done\t" not in listed  # what the sweep would refuse
    kept = out / "g" / ".sst-lstm-tanh-s1.battery"  # a --resumable run's finished blocks
    kept.mkdir()
    (kept / f"block-{0:09d}.npz").write_bytes(b"")
    assert main(["sweep", str(changed), "--out", str(out), "--dry-run"]) == 0
    assert "stale (1 battery blocks kept)\tg/sst-lstm-tanh-s1" in capsys.readouterr().out
    shutil.rmtree(kept)

    # damaged files are named in one line each; one bad cell leaves the report of the others
    (out / "status.json").write_text('{"cells": ')
    s1 = out / "g" / "sst-lstm-tanh-s1"
    (s1 / "predictions.npz").write_bytes((s1 / "predictions.npz").read_bytes()[:100])
    assert main(["sweep", str(config), "--out", str(out), "--report-only"]) == 0
    err = capsys.readouterr().err
    assert f"{out / 'status.json'} is unreadable" in err and f"{s1 / 'predictions.npz'} is unreadable" in err
    (s1 / "results.json").write_text('{"config": ')
    assert main(["sweep", str(config), "--out", str(out), "--report-only"]) == 0
    err = capsys.readouterr().err
    assert f"cell g/sst-lstm-tanh-s1 left out of the report: {s1 / 'results.json'} is not readable JSON" in err
    assert json.loads((out / "aggregate.json").read_text())["cells"]["g/sst-lstm-tanh-s1"]["state"] == "unreadable"
    assert main(["sweep", str(config), "--out", str(out), "--no-progress"]) == 2  # never silently redone
    assert "pass --overwrite to rerun the cell" in capsys.readouterr().err


def test_cells_as_cluster_jobs_through_submitit(tmp_path, capsys):
    """--executor submitit-local: the slurm path (a submitit job per cell) on this machine; the
    same folders, status, resume and report as the local executor."""
    pytest.importorskip("submitit")
    config, out = _config(tmp_path, TINY), tmp_path / "sweep"
    argv = ["sweep", str(config), "--out", str(out), "--executor", "submitit-local", "--jobs", "2", "--no-progress"]
    assert main(argv) == 0
    status = json.loads((out / "status.json").read_text())["cells"]
    for cell in ("g/sst-lstm-tanh-s0", "g/sst-lstm-tanh-s1"):
        assert status[cell]["state"] == "done" and status[cell]["job_id"], status[cell]
        assert (out / cell / "results.json").is_file()
    assert (out / ".submitit").is_dir() and (out / "report.md").is_file()
    assert "=== " in (out / "g" / "sst-lstm-tanh-s0.log").read_text()
    # resumed: nothing is submitted again
    assert main(argv) == 0
    assert capsys.readouterr().err.count(": done (results.json present)") == 2


def test_executor_and_slurm_settings_are_checked(tmp_path):
    base = TINY.replace(
        "[defaults]", 'executor = "slurm"\nslurm = { partition = "gpu", time_min = 30, gpus = 1 }\n[defaults]'
    )
    sweep = load_config(_config(tmp_path, base))
    assert sweep.executor == "slurm" and sweep.slurm == {"partition": "gpu", "time_min": 30, "gpus": 1}
    sweep = load_config(_config(tmp_path, base), executor="local", slurm={"time_min": 5})
    assert sweep.executor == "local" and sweep.slurm["time_min"] == 5
    with pytest.raises(ValueError, match="executor must be one of"):
        load_config(_config(tmp_path, TINY.replace("[defaults]", 'executor = "sge"\n[defaults]')))
    with pytest.raises(ValueError, match=r"\[sweep.slurm\]: bad keys or values \{'gpus': '1'\}"):
        load_config(_config(tmp_path, TINY.replace("[defaults]", 'slurm = { gpus = "1" }\n[defaults]')))


def test_missing_data_folders_fail_before_any_cell_naming_them(tmp_path, capsys):
    bare = _config(tmp_path, TINY.replace(f'data_dirs = {{ sst = "{SST_SAMPLE}" }}', ""), "bare.toml")
    out = tmp_path / "sweep"
    for extra in ([], ["--dry-run"]):
        assert main(["sweep", str(bare), "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert "dataset 'sst' (2 cells) needs its folder: pass --data-dir sst=FOLDER" in err
    nowhere = tmp_path / "no-such-folder"
    assert main(["sweep", str(bare), "--out", str(out), "--data-dir", f"sst={nowhere}"]) == 2
    assert f"data folder {nowhere} does not exist" in capsys.readouterr().err
    half = tmp_path / "half"
    half.mkdir()
    (half / "train.txt").write_text((SST_SAMPLE / "train.txt").read_text())
    assert main(["sweep", str(bare), "--out", str(out), "--data-dir", f"sst={half}"]) == 2
    assert f"data folder {half} lacks dev.txt, test.txt" in capsys.readouterr().err
    assert not out.exists()  # refused before the sweep folder was made
    # --data-dir fills in (and overrides) the config's folder; a listing then shows it in every cell
    assert main(["sweep", str(bare), "--out", str(out), "--data-dir", f"sst={SST_SAMPLE}", "--dry-run"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2 and all(f"--data-dir {SST_SAMPLE}" in line for line in listed)
    with pytest.raises(SystemExit):
        main(["sweep", str(bare), "--data-dir", "sst"])
    assert "must be DATASET=FOLDER" in capsys.readouterr().err


def test_a_cell_the_run_would_refuse_fails_the_sweep_before_any_cell(tmp_path, capsys):
    # a GPT-1 flag on the default encoder: the run refuses it, so the sweep does before starting
    bad = _config(tmp_path, TINY.replace("threads = 1", "threads = 1\nlm_weight = 0.5"), "bad.toml")
    out = tmp_path / "sweep"
    assert main(["sweep", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cell g/" in err and "--lm-weight applies to --encoder gpt only" in err
    assert not out.exists()


def test_shipped_configs_name_no_folder_outside_the_repository():
    for config in sorted((ROOT / "configs").glob("*.toml")):
        sweep = load_config(config)
        assert sweep.data_dirs == {}, config
        assert sweep.out.is_relative_to(ROOT), config


def test_a_rerun_leaves_the_staging_folder_of_a_cell_still_running(tmp_path):
    """A killed sweep leaves its cells running (each in its own session): a re-run must not remove
    a live cell's staging folder, only those of dead runs."""
    from attnmetrics.app.sweep.runner import clean_partial
    from tests.app.test_io import CLAIM_AND_WAIT

    sweep = load_config(_config(tmp_path, TINY))
    cell, dead = sweep.cells
    folder = cell.folder(sweep.out)
    folder.parent.mkdir(parents=True)
    (folder.parent / f".{dead.name}.partial-killed").mkdir()  # a dead run's leftovers go
    proc = subprocess.Popen(
        [sys.executable, "-c", CLAIM_AND_WAIT, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout.readline().strip() == "claimed"
        live = sorted(folder.parent.glob(f".{cell.name}.partial-*"))
        assert len(live) == 1
        removed, running = clean_partial(cell, sweep.out)
        assert running and removed == [] and sorted(folder.parent.glob(f".{cell.name}.partial-*")) == live
        removed, running = clean_partial(dead, sweep.out)
        assert not running and len(removed) == 1 and "partial-killed" in removed[0]
        assert not list(folder.parent.glob(f".{dead.name}.partial-*"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    removed, running = clean_partial(cell, sweep.out)  # dead now: its staging and claim go
    assert not running and not list(folder.parent.glob(f".{cell.name}.partial-*")) and not folder.exists()


def test_sweep_writes_only_into_a_folder_of_its_own(tmp_path, capsys):
    config = _config(tmp_path, TINY)
    run = tmp_path / "run"  # a run folder: its report.md and instances.parquet are the run's
    run.mkdir()
    (run / "results.json").write_text("{}")
    (run / "report.md").write_text("the run's report")
    for extra in (["--report-only"], ["--report-only", "--overwrite"], ["--no-progress"]):
        assert main(["sweep", str(config), "--out", str(run), *extra]) == 2
        err = capsys.readouterr().err
        assert f"--out {run} is a run folder" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in run.iterdir()) == ["report.md", "results.json"]
    assert (run / "report.md").read_text() == "the run's report"
    mine = tmp_path / "mine"  # a user's folder
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    (mine / "sweep.toml").write_text("# my own config")
    for extra in (["--report-only"], ["--no-progress"]):
        assert main(["sweep", str(config), "--out", str(mine), *extra]) == 2
        err = capsys.readouterr().err
        assert f"--out {mine} is not a sweep folder" in err and "--overwrite" in err
    assert sorted(p.name for p in mine.iterdir()) == ["report.md", "sweep.toml"]
    assert (mine / "report.md").read_text() == "my notes" and (mine / "sweep.toml").read_text() == "# my own config"
    # the sweep's own folder (new, then as it left it) and, with --overwrite, the user's folder
    own = tmp_path / "own"
    for _ in range(2):
        assert main(["sweep", str(config), "--out", str(own), "--report-only"]) == 0
    assert (own / "report.md").is_file()
    assert main(["sweep", str(config), "--out", str(mine), "--report-only", "--overwrite"]) == 0
    assert (mine / "aggregate.json").is_file()


def test_a_sweep_into_an_unwritable_folder_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    # issue 31, unclear errors: an OSError traceback (read-only file system, no permission)
    from tests.inputs import unwritable_folder

    config = _config(tmp_path, TINY)
    parent = (tmp_path / "locked").resolve()
    (parent / "old").mkdir(parents=True)  # an existing sweep folder in it, and a new one
    (parent / "old" / "status.json").write_text("{}")
    unwritable_folder(parent, monkeypatch)
    unwritable_folder(parent / "old", monkeypatch)
    for out in (parent / "new", parent / "old"):
        for extra in (["--report-only"], ["--no-progress"]):
            assert main(["sweep", str(config), "--out", str(out), *extra]) == 2
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1, err
            assert f"--out {out} cannot be written (Permission denied: {out}" in err, err


def test_a_transformer_sweep_reports_the_methods_table_over_seeds(tmp_path):
    """Issues 28, 29: two seeds of a tiny BERT with --importances; the aggregate has every method's
    row of the run's table in both seeds, its estimate the mean over seeds of the seeds' tables
    (recomputed here by loops from the cells' per-instance values), and the report the section."""
    pytest.importorskip("transformers")
    from attnmetrics.app.battery.methods import COLUMNS
    from tests.app.test_hf_run import tiny_bert
    from tests.app.test_methods import plain_table

    checkpoint = tiny_bert(tmp_path / "bert", initializer_range=0.1)  # see test_hf_run: the orderings differ
    text = f"""
[sweep]
data_dirs = {{ sst = "{SST_SAMPLE}" }}
[defaults]
threads = 1
[[grid]]
name = "m"
datasets = ["sst"]
seeds = [0, 1]
model = "hf:{checkpoint}"
epochs = 1
limit = 40
importances = ["alti", "value_norm"]
skip = ["permutation", "adversarial", "single_removal", "single_token"]
examples = 0
"""
    config, out = _config(tmp_path, text), tmp_path / "sweep"
    assert main(["sweep", str(config), "--out", str(out), "--jobs", "1", "--no-progress"]) == 0
    agg = json.loads((out / "aggregate.json").read_text())
    ((name, group),) = agg["groups"].items()
    assert group["seeds"] == [0, 1] and not outside(group)
    stats = group["statistics"]
    plains = []
    for seed in (0, 1):
        (cell,) = (out / "m").glob(f"*-s{seed}")
        results = json.loads((cell / "results.json").read_text())
        inst = results["instances"]
        eraser = {k: {m: w["aopc"] for m, w in v.items()} for k, v in inst["eraser"].items()}
        plain = plain_table({k: v["tau"] for k, v in inst["kendall"].items()}, eraser, inst["flip"], inst["lengths"])
        plains.append(plain)
        assert {"attention", "gradient", "loo", "rollout", "alti", "value_norm"} <= set(plain)
        for method, columns in plain.items():  # every method's every column, in each seed
            for column, value in columns.items():
                row = stats[f"methods/{method}/{COLUMNS[column]}"]
                assert row["seeds"] == 2 and row["per_seed"][str(seed)] == pytest.approx(value, abs=1e-12)
    # the estimate: the mean over seeds of each seed's mean over its common instances (loops, not the code)
    for method, column in (("alti", "comprehensiveness"), ("value_norm", "sufficiency"), ("rollout", "tau_loo")):
        row = stats[f"methods/{method}/{COLUMNS[column]}"]
        assert row["estimate"] == pytest.approx(np.mean([p[method][column] for p in plains]), abs=1e-12)
        assert row["ci95"][0] <= row["estimate"] <= row["ci95"][1]
    order = [r["method"] for r in group["methods"]["methods"]]
    assert set(order) == set(plains[0]) - {"random"}
    report = (out / "report.md").read_text()
    part = report.split("## The explanation methods side by side")[1].split("\n## ")[0]
    assert f"**{name}** (2 seeds)" in part and "Intervals that exclude 0:" in part
    rows = [line.split("|")[1].strip() for line in part.splitlines() if line.startswith("| ")]
    assert rows[1 : len(order) + 1] == order
    assert (out / f"methods_{name.replace('/', '_')}.png").stat().st_size > 0


def test_config_compare_pairs_two_grids_of_the_config(tmp_path):
    grids = '[[grid]]\nname = "g"\ndatasets = ["sst"]\n[[grid]]\nname = "h"\ndatasets = ["sst"]\n'
    sweep = load_config(_config(tmp_path, '[sweep]\ncompare = [["g", "h"]]\n' + grids))
    assert sweep.compare == [("g", "h")]
    assert load_config(_config(tmp_path, grids)).compare == []
    for compare, words in (
        ('[["g", "x"]]', r"compare names grids \['x'\] that the config has not"),
        ('[["g", "g"]]', "pairs a grid with itself"),
        ('[["g"]]', r'compare takes pairs \["grid A", "grid B"\]'),
        ('"g"', "compare must be a list"),
    ):
        with pytest.raises(ValueError, match=words):
            load_config(_config(tmp_path, f"[sweep]\ncompare = {compare}\n" + grids))


def test_config_compare_refuses_a_pair_listed_twice_naming_it(tmp_path, capsys):
    """The same pair twice, or both ways round (the same comparison, its sign flipped), is refused in
    one line naming the pairs, by load_config and by the command (no traceback)."""
    from attnmetrics.app.cli import main

    grids = "".join(f'[[grid]]\nname = "{g}"\ndatasets = ["sst"]\n' for g in "ghk")
    for compare, named in (
        ('[["g", "h"], ["g", "k"], ["g", "h"]]', "['g', 'h'] and ['g', 'h']"),
        ('[["g", "h"], ["h", "g"]]', "['g', 'h'] and ['h', 'g']"),
    ):
        with pytest.raises(ValueError, match="compare lists the same pair of grids twice") as e:
            load_config(_config(tmp_path, f"[sweep]\ncompare = {compare}\n" + grids))
        assert named in str(e.value) and "\n" not in str(e.value)
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "['g', 'h'] and ['h', 'g']" in err and "Traceback" not in err
    load_config(_config(tmp_path, '[sweep]\ncompare = [["g", "h"], ["g", "k"], ["h", "k"]]\n' + grids))  # distinct
