"""The SST battery over 1 and 2 torchrun ranks (one thread each): how the sharded `evaluate`
scales on this machine.

One J&W BiLSTM is trained once (`attnmetrics train`, the real SST), then `torchrun
--nproc-per-node N -m attnmetrics evaluate` runs the whole battery (J&W's 100 permutations and
500 adversarial steps) on its test split for each N, in one run. ``extra_info`` holds, per N, the
command's wall time and the battery's (``results.json`` ``wall_time_s.experiments``, which leaves
out starting the processes and loading the data), and the speedup of 2 ranks over 1. The two run
folders are checked equal first (every number). Under ``CI`` (the smoke run) the split is cut to
300 rows and the battery shortened. Not a pass/fail test: the numbers go in docs/speed.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from attnmetrics.app.cli import main
from tests.inputs import ROOT, SST_DIR

pytestmark = pytest.mark.sst

SMOKE = ["--limit", "300", "--permutations", "10", "--adversarial-steps", "10"] if os.environ.get("CI") else []
TIMES: dict[int, tuple[float, float]] = {}


@pytest.fixture(scope="module")
def model_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks") / "model"
    epochs = ["--epochs", "1"] if SMOKE else []
    flags = ["--dataset", "sst", "--data-dir", str(SST_DIR), "--threads", "1", "--no-progress", *epochs, *SMOKE[:2]]
    assert main(["train", *flags, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    return tmp_path_factory.mktemp("evals")


def evaluate(model_run, out, ranks: int) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd += ["-m", "attnmetrics", "evaluate", str(model_run), "--out", str(out), "--threads", "1", "--no-progress"]
    start = time.perf_counter()
    subprocess.run(
        [*cmd, *SMOKE], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}, check=True
    )
    return time.perf_counter() - start


@pytest.mark.parametrize("ranks", [1, 2])
def test_battery_over_ranks(benchmark, model_run, evals, ranks):
    out = evals / f"eval-{ranks}"
    wall = benchmark.pedantic(evaluate, args=(model_run, out, ranks), rounds=1, iterations=1)
    results = json.loads((out / "results.json").read_text())
    TIMES[ranks] = (wall, results["wall_time_s"]["experiments"])
    benchmark.extra_info.update(
        ranks=ranks,
        instances=results["data"]["sizes"]["test"],
        command_s=round(wall, 2),
        battery_s=round(TIMES[ranks][1], 2),
        per_rank_s=results["wall_time_s"].get("per_rank"),
    )
    if ranks == 2 and 1 in TIMES:
        benchmark.extra_info["speedup_command"] = round(TIMES[1][0] / wall, 2)
        benchmark.extra_info["speedup_battery"] = round(TIMES[1][1] / TIMES[2][1], 2)
        one = json.loads((evals / "eval-1" / "results.json").read_text())
        for key in ("flip", "kendall", "permutation", "adversarial", "single_removal"):
            assert json.dumps(one.get(key)) == json.dumps(results.get(key)), key
