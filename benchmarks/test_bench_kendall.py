"""kendall_tau against the per-row scipy.stats.kendalltau loop that J&W's code runs (docs/speed.md).

Each case is one benchmark group holding both, on the same inputs, so pytest-benchmark's
table shows the ratio in its "(x)" factors; the kernel's entry also records
``extra_info["ratio"]`` (scipy-loop median / kernel median) for ``--benchmark-json``.

    python -m pytest benchmarks/test_bench_kendall.py --benchmark-only

With a GPU (and attnmetrics' CUDA build) the kernel also runs on ``cuda`` against the same
scipy loop (which runs on the CPU, as J&W's code did).
"""

import os

import numpy as np
import pytest
import torch

from attnmetrics import kendall_tau
from attnmetrics.testing.reference import kendall_tau_reference
from benchmarks.measure import skip_without

# Row counts and lengths of J&W's test sets: SST (1,821 sentences) and IMDB (reviews
# capped at 400 tokens). Uniform lengths stand in for the real distributions.
CASES = {
    "sst": dict(batch=1821, low=10, high=55),
    "imdb": dict(batch=1000, low=10, high=400),
    # long documents (issue: L = 4,096), where the GPU takes a block per row
    "long": dict(batch=256, low=2048, high=4096),
}

_inputs: dict = {}
_scipy_median: dict = {}


def inputs(case):
    """Attention (softmax over the valid prefix) and a gradient-like importance, float32."""
    if case not in _inputs:
        spec = CASES[case]
        rng = np.random.default_rng(0)
        lengths = torch.from_numpy(rng.integers(spec["low"], spec["high"] + 1, spec["batch"]))
        logits = torch.from_numpy(rng.standard_normal((spec["batch"], spec["high"]))).float()
        mask = torch.arange(spec["high"]) < lengths[:, None]
        attention = torch.softmax(logits.masked_fill(~mask, -torch.inf), dim=1)
        importance = torch.from_numpy(np.abs(rng.standard_normal((spec["batch"], spec["high"])))).float()
        _inputs[case] = (attention, importance * mask, lengths)
    return _inputs[case]


def _record(benchmark, case):
    x, _, lengths = inputs(case)
    benchmark.extra_info.update(
        case=case,
        rows=x.shape[0],
        mean_length=float(lengths.double().mean()),
        threads=torch.get_num_threads(),
        load_average=os.getloadavg()[0],  # other work on the machine skews the wall-clock times
    )


@pytest.mark.parametrize("case", list(CASES))
def test_scipy_loop(benchmark, case):
    benchmark.group = f"kendall_tau {case}"
    _record(benchmark, case)
    benchmark.pedantic(kendall_tau_reference, args=inputs(case), rounds=3, iterations=1)
    if benchmark.stats is not None:
        _scipy_median[case] = benchmark.stats.stats.median


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel(benchmark, case, device):
    skip_without(device)
    benchmark.group = f"kendall_tau {case}"
    _record(benchmark, case)
    benchmark.extra_info.update(device=device)
    args = tuple(t.to(device) for t in inputs(case))

    def run():
        out = kendall_tau(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    result = benchmark(run)
    want = kendall_tau_reference(*inputs(case))
    torch.testing.assert_close(result.tau.cpu(), want[0], rtol=1e-6, atol=1e-7, equal_nan=True)
    if benchmark.stats is not None and case in _scipy_median:
        kernel = benchmark.stats.stats.median
        benchmark.extra_info.update(
            scipy_loop_s=_scipy_median[case], kernel_s=kernel, ratio=_scipy_median[case] / kernel
        )
