"""Flip search (S&S 2019): the kernels against S&S's sequential search, same inputs, one run.

Run: python -m pytest benchmarks/test_bench_flip.py --benchmark-only -q
The sequential search is timed once per case (it takes seconds); the kernel's median over
its rounds is compared with it, and the ratio goes in ``extra_info["speedup"]``; so is the
time to read the inputs once (``extra_info["times_reading_inputs_once"]``), the floor for a
search that must see every value.
With a GPU (and attnmetrics' CUDA build) both also run on ``cuda`` (S&S's code ran its
sequential search on the GPU); the large case then records the peak device memory.
"""

from __future__ import annotations

import time

import pytest
import torch

from attnmetrics.flip import flip_fraction
from attnmetrics.testing.reference import flip_search_sequential
from benchmarks.measure import median_seconds, peak_extra_mib, skip_without, synchronised, timed
from tests.inputs import bench_decoder, ragged_batch

# (batch, min length, max length, hidden)
CASES = {
    "sst": (1821, 10, 55, 256),  # SST-like: test-set size, sentence lengths
    "imdb": (1000, 20, 400, 256),  # IMDB-like: long reviews
}


def describe(result, lengths):
    flipped = result.flipped
    return {
        "rows": int(lengths.shape[0]),
        "mean_length": float(lengths.double().mean()),
        "flipped_share": float(flipped.double().mean()),
        "removed_p10_p50_p90": torch.quantile(
            result.removed[flipped].double(),
            torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64, device=flipped.device),
        ).tolist(),
    }


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("case", list(CASES))
def test_flip_fraction_vs_sequential(benchmark, case, kind, device):
    skip_without(device)
    attention, values, lengths = (t.to(device) for t in ragged_batch(*CASES[case]))
    decoder = bench_decoder(kind, values.shape[2]).to(device)
    benchmark.group = f"flip-{case}" + ("" if device == "cpu" else f" {device}")
    result = benchmark.pedantic(
        synchronised(flip_fraction, device),
        args=(attention, values, decoder, lengths, "attention"),
        rounds=5,
        iterations=1,
        warmup_rounds=1,
    )
    start = time.perf_counter()
    sequential = synchronised(flip_search_sequential, device)(attention, values, decoder, lengths, attention)
    sequential_s = time.perf_counter() - start
    agree = float((sequential.removed == result.removed).double().mean())
    benchmark.extra_info.update(
        describe(result, lengths),
        decoder=kind,
        device=device,
        threads=torch.get_num_threads(),
        sequential_s=sequential_s,
        agreement_with_sequential=agree,
    )
    kernel_s = median_seconds(benchmark, lambda: flip_fraction(attention, values, decoder, lengths, "attention"))
    # the floor: reading the inputs once (attention and every value, padding included), best of 5
    read_s = min(timed(synchronised(lambda: (attention.sum(), values.sum()), device))[1] for _ in range(5))
    benchmark.extra_info.update(
        kernel_median_s=kernel_s,
        speedup=sequential_s / kernel_s,
        read_inputs_once_s=read_s,
        times_reading_inputs_once=kernel_s / read_s,
    )
    # float32 inputs: a row may sit within rounding of a tie at some step
    assert agree >= 0.99


def _peak_extra_device_mib(fn):
    """Peak device memory allocated above the current level while fn runs, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_flip_fraction_large_bounded_memory(benchmark, kind, device):
    skip_without(device)
    # 100k rows of ~30 items: every context at once would take sum(L) * H * 4 bytes
    attention, values, lengths = (t.to(device) for t in ragged_batch(100_000, 20, 40, 64, seed=1))
    decoder = bench_decoder(kind, values.shape[2]).to(device)
    budget = 64 * 2**20
    benchmark.group = "flip-large" + ("" if device == "cpu" else f" {device}")
    run = synchronised(flip_fraction, device)
    measure = _peak_extra_device_mib if device == "cuda" else peak_extra_mib
    peak = measure(lambda: run(attention, values, decoder, lengths, memory_budget=budget))
    result = benchmark.pedantic(
        run,
        args=(attention, values, decoder, lengths),
        kwargs={"memory_budget": budget},
        rounds=3,
        iterations=1,
    )
    benchmark.extra_info.update(
        describe(result, lengths),
        decoder=kind,
        device=device,
        threads=torch.get_num_threads(),
        memory_budget_mib=budget / 2**20,
        values_mib=values.numel() * values.element_size() / 2**20,
        all_contexts_mib=int(lengths.sum()) * values.shape[2] * values.element_size() / 2**20,
        **{"peak_extra_device_mib" if device == "cuda" else "peak_extra_rss_mib": peak},
    )
