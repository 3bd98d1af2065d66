"""torchrun on the CPU (gloo): the sharded battery writes the run folder one process writes, every
number; data-parallel training reaches its weights; a failing rank fails the command and leaves no
run folder; the shares are a partition."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnmetrics.app.cli import main
from attnmetrics.app.distributed import World, share
from tests.inputs import FAST_BATTERY, QUICK_SST, ROOT

#: what differs between two runs of the same battery: times, the command line, the ranks
RUN_ONLY = {"wall_time_s", "config", "distributed", "machine"}
EVALUATE = ["--limit", "700", "--threads", "1", "--no-progress", *FAST_BATTERY]


@pytest.fixture(scope="module")
def model_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "model"
    assert main(["train", *QUICK_SST, "--out", str(out)]) == 0
    return out


def torchrun(module: str, *args, ranks: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node ranks -m module args`` from the checkout, one
    thread per rank; a rank that crashes prints its Python stack (faulthandler)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    return subprocess.run([*cmd, "-m", module, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True)


def same(a, b, path="") -> list[str]:
    """Paths where two results.json values differ (NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = (set(a) | set(b)) - (RUN_ONLY if not path else set())
        return [d for k in sorted(keys) for d in same(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [path]


def test_two_ranks_write_the_run_folder_one_process_writes(model_run, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["evaluate", str(model_run), "--out", str(one), *EVALUATE]) == 0
    proc = torchrun("attnmetrics", "evaluate", model_run, "--out", two, *EVALUATE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (json.loads((d / "results.json").read_text()) for d in (one, two))
    assert b["distributed"]["ranks"] == 2 and sum(b["distributed"]["instances"]) == 700
    assert min(b["distributed"]["instances"]) > 0  # both ranks had a share
    assert {"flip", "kendall", "permutation", "adversarial", "single_removal"} <= set(a)
    assert same(a, b) == []
    pd.testing.assert_frame_equal(
        pd.read_parquet(one / "instances.parquet"), pd.read_parquet(two / "instances.parquet")
    )
    assert {p.name for p in one.iterdir()} == {p.name for p in two.iterdir()}


def test_a_failing_rank_fails_the_command_and_leaves_no_run_folder(model_run, tmp_path):
    out = tmp_path / "eval"
    proc = torchrun("tests.app.failing_rank", "evaluate", model_run, "--out", out, *EVALUATE)
    assert proc.returncode != 0
    assert "injected failure in rank 1's battery" in proc.stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no staging folder either


def test_run_trains_data_parallel_to_the_one_process_weights(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["run", *QUICK_SST, *FAST_BATTERY, "--out", str(one)]) == 0
    proc = torchrun("attnmetrics", "run", *QUICK_SST, *FAST_BATTERY, "--out", two)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (torch.load(d / "model" / "model.pt") for d in (one, two))
    assert a.keys() == b.keys()
    for name in a:  # each step's gradient is the batch mean's, summed over ranks in another order
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (one, two))
    assert rb["distributed"]["ranks"] == 2
    assert ra["test"]["accuracy"] == rb["test"]["accuracy"]
    assert rb["training"]["history"][0]["train_loss"] == pytest.approx(ra["training"]["history"][0]["train_loss"])


def test_pretraining_runs_data_parallel_to_the_one_process_weights(tmp_path):
    from tests.app.test_pretrain import TINY

    one, two = tmp_path / "one", tmp_path / "two"
    flags = ["--steps", "3", *TINY, "--dropout", "0"]  # dropout masks would differ between the splits
    assert main(["pretrain", "--out", str(one), *flags]) == 0
    proc = torchrun("attnmetrics", "pretrain", "--out", two, *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    latest = (one / "latest").read_text().strip()
    assert (two / "latest").read_text().strip() == latest
    assert (one / "train.tokens").read_bytes() == (two / "train.tokens").read_bytes()
    a, b = (torch.load(d / latest / "model.pt") for d in (one, two))
    for name in a:  # the same windows per step, split over the ranks, the gradient summed back
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)
    ha, hb = (json.loads((d / latest / "model.json").read_text())["history"] for d in (one, two))
    assert hb[-1]["val_loss"] == pytest.approx(ha[-1]["val_loss"], abs=1e-4)
    assert not [p.name for p in two.iterdir() if p.name.startswith(".")]


def test_wiegreffe_pinter_models_are_not_sharded(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # as torchrun sets it
    assert main(["run", *QUICK_SST, "--diagnostic", "--out", str(tmp_path / "r")]) == 2
    assert "--consistent-adversary and --diagnostic are not sharded" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@given(
    costs=st.lists(st.floats(0, 1e4, allow_nan=False), max_size=40),
    size=st.integers(1, 5),
)
def test_shares_partition_the_batches_in_order_and_balance_them(costs, size):
    items = list(range(len(costs)))
    shares = [share(items, costs, World(r, size)) for r in range(size)]
    assert sorted(i for s in shares for i in s) == items
    assert all(s == sorted(s) for s in shares)
    loads = [sum(costs[i] for i in s) for s in shares]
    # LPT: no rank carries more than the least loaded one plus one item
    assert max(loads) <= min(loads) + max(costs, default=0) + 1e-6
    assert shares == [share(items, costs, World(r, size)) for r in range(size)]  # deterministic


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stray_world_size_without_torchrun_is_refused_at_once(tmp_path):
    # WORLD_SIZE/RANK/MASTER_* left by a batch script, no torchrun: joining would wait 60 min
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    env.update(WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    cmd = [sys.executable, "-m", "attnmetrics", "evaluate", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("a stray WORLD_SIZE made the command wait for ranks that never come")
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "WORLD_SIZE=2" in line and "RANK=0" in line and "torchrun" in line
    assert not (tmp_path / "o").exists()


def test_a_rendezvous_that_does_not_come_fails_in_seconds_with_the_address(monkeypatch):
    from attnmetrics.app.distributed import start

    port = _free_port()
    for k, v in dict(
        WORLD_SIZE="2", RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="x"
    ).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(RuntimeError, match=rf"127\.0\.0\.1:{port} within 2 s"):
        start(World(1, 2, 0), "cpu", rendezvous_s=2)
