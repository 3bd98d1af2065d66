"""Permutation test (J&W 2019, sec. 4.2): the kernels against J&W's loop, same inputs, one run.

Run: python -m pytest benchmarks/test_bench_permutation.py --benchmark-only -q
J&W's loop (one decoder pass over the whole batch per permutation, the same permutations:
``permutation_test_reference``) is timed once per case; the kernel's median over its
rounds is compared with it, and the ratio goes in ``extra_info["speedup"]``.
With a GPU (and attnmetrics' CUDA build) the kernel also runs on ``cuda`` on the same
inputs, against its own CPU run (``extra_info["speedup_vs_cpu"]``).
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from attnmetrics.permutation import draw_seed, permutation_test
from attnmetrics.testing.reference import permutation_test_reference
from benchmarks.measure import median_seconds, peak_extra_mib, skip_without
from tests.inputs import bench_decoder, ragged_batch

PERMUTATIONS = 100  # J&W

# (batch, min length, max length, hidden)
CASES = {
    "sst": (1821, 10, 55, 256),  # SST-like: test-set size, sentence lengths
    "imdb": (1000, 20, 400, 256),  # IMDB-like: long reviews
}


def describe(result, lengths):
    return {
        "rows": int(lengths.shape[0]),
        "mean_length": float(lengths.double().mean()),
        "permutations": PERMUTATIONS,
        "median_tvd_p10_p50_p90": torch.quantile(
            result.median_tvd.double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
        ).tolist(),
        "threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],
    }


@pytest.mark.parametrize("kind,case", [("linear", "sst"), ("linear", "imdb"), ("mlp", "sst")])
def test_permutation_test_vs_jw_loop(benchmark, kind, case):
    attention, values, lengths = ragged_batch(*CASES[case])
    decoder = bench_decoder(kind, values.shape[2])
    benchmark.group = f"permutation-{case}"

    def kernel():
        return permutation_test(
            attention, values, decoder, lengths, permutations=PERMUTATIONS, generator=torch.Generator().manual_seed(0)
        )

    result = benchmark.pedantic(kernel, rounds=5 if kind == "linear" else 3, iterations=1, warmup_rounds=1)
    seed = draw_seed(torch.Generator().manual_seed(0))
    start = time.perf_counter()
    median, _ = permutation_test_reference(attention, values, decoder, lengths, PERMUTATIONS, seed)
    loop_s = time.perf_counter() - start
    kernel_s = median_seconds(benchmark, kernel)
    err = float((median.double() - result.median_tvd.double()).abs().max())
    benchmark.extra_info.update(
        describe(result, lengths),
        decoder=kind,
        kernel_median_s=kernel_s,
        jw_loop_s=loop_s,
        speedup=loop_s / kernel_s,
        max_abs_diff_vs_loop=err,
    )
    assert err < 1e-4  # float32: the same statistic up to rounding


def test_permutation_test_large_bounded_memory(benchmark):
    # 100k rows of ~30 items, linear decoder: the projection is built in budget-sized chunks
    attention, values, lengths = ragged_batch(100_000, 20, 40, 64, seed=1)
    decoder = bench_decoder("linear", values.shape[2])
    budget = 64 * 2**20
    benchmark.group = "permutation-large"

    def kernel():
        return permutation_test(
            attention,
            values,
            decoder,
            lengths,
            permutations=PERMUTATIONS,
            memory_budget=budget,
            generator=torch.Generator().manual_seed(0),
        )

    peak = peak_extra_mib(kernel)
    result = benchmark.pedantic(kernel, rounds=2, iterations=1)
    benchmark.extra_info.update(
        describe(result, lengths),
        decoder="linear",
        memory_budget_mib=budget / 2**20,
        values_mib=values.numel() * values.element_size() / 2**20,
        peak_extra_rss_mib=peak,
    )


@pytest.mark.parametrize("kind,case", [("linear", "sst"), ("linear", "imdb"), ("mlp", "sst")])
def test_permutation_test_cuda(benchmark, kind, case):
    skip_without("cuda")
    attention, values, lengths = ragged_batch(*CASES[case])
    decoder = bench_decoder(kind, values.shape[2])
    args = (attention.cuda(), values.cuda(), bench_decoder(kind, values.shape[2]).cuda(), lengths.cuda())
    benchmark.group = f"permutation-{case}"

    def kernel():
        out = permutation_test(*args, permutations=PERMUTATIONS, generator=torch.Generator().manual_seed(0))
        torch.cuda.synchronize()
        return out

    result = benchmark.pedantic(kernel, rounds=5, iterations=1, warmup_rounds=1)
    start = time.perf_counter()
    cpu = permutation_test(
        attention, values, decoder, lengths, permutations=PERMUTATIONS, generator=torch.Generator().manual_seed(0)
    )
    cpu_s = time.perf_counter() - start
    kernel_s = median_seconds(benchmark, kernel)
    err = float((cpu.median_tvd.double() - result.median_tvd.cpu().double()).abs().max())
    benchmark.extra_info.update(
        describe(cpu, lengths),
        decoder=kind,
        device="cuda",
        cuda_median_s=kernel_s,
        cpu_s=cpu_s,
        speedup_vs_cpu=cpu_s / kernel_s,
        max_abs_diff_vs_cpu=err,
    )
    assert err < 1e-4  # the same permutations; float32 rounding only
