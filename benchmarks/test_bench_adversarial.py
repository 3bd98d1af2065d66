"""Adversarial attention (J&W 2019, sec. 4.3): the batched search against the per-instance loop,
same inputs, one run.

Run: python -m pytest benchmarks/test_bench_adversarial.py --benchmark-only -q
The per-instance loop (:func:`adversarial_attention_reference`: K candidates of one instance,
one Adam, the decoder on K contexts per step) is timed once per case; the batched median
over its rounds is compared with it, and the ratio goes in ``extra_info["speedup"]``.
Both run ``STEPS`` = 100 Adam steps instead of J&W's 500 to keep the loop under a minute;
per-step costs are what the ratio compares, so it carries over to 500 steps.
Both run on one thread: on a shared, oversubscribed machine a kernel that opens the
OpenMP pool on a tiny input (softmax) can wait milliseconds for a descheduled thread,
which would slow the per-instance loop far more than the batched search.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from attnmetrics.adversarial import _row_bytes, adversarial_attention
from attnmetrics.testing.reference import adversarial_attention_reference
from benchmarks.measure import median_seconds, peak_extra_mib
from tests.inputs import bench_decoder, ragged_batch

STEPS = 100
# (batch, min length, max length, hidden, classes): SST-like sentences, J&W's sigmoid output
SST = (64, 10, 55, 256, 1)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def describe(result, lengths):
    found = result.max_jsd > 0
    return {
        "rows": int(lengths.shape[0]),
        "mean_length": float(lengths.double().mean()),
        "steps": STEPS,
        "adversary_found_share": float(found.double().mean()),
        "max_jsd_mean": float(result.max_jsd.double().mean()),
        "output_tvd_max": float(result.output_tvd.max()),
    }


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_adversarial_vs_per_instance(benchmark, kind):
    batch, lo, hi, hidden, classes = SST
    attention, values, lengths = ragged_batch(batch, lo, hi, hidden, shared_direction=0)
    decoder = bench_decoder(kind, hidden, classes)
    benchmark.group = "adversarial-sst"

    def fresh():  # the same initial noise every round
        kwargs = {"steps": STEPS, "generator": torch.Generator().manual_seed(0)}
        return (attention, values, decoder, lengths), kwargs

    result = benchmark.pedantic(adversarial_attention, setup=fresh, rounds=3, iterations=1, warmup_rounds=1)
    start = time.perf_counter()
    loop = adversarial_attention_reference(
        attention, values, decoder, lengths, steps=STEPS, generator=torch.Generator().manual_seed(0)
    )
    loop_s = time.perf_counter() - start
    batched_s = median_seconds(benchmark, lambda: adversarial_attention(*fresh()[0], **fresh()[1]))
    # float32 trajectories of the two differ by rounding only
    agree = float(((result.max_jsd - loop.max_jsd).abs() < 1e-3).double().mean())
    benchmark.extra_info.update(
        describe(result, lengths),
        decoder=kind,
        threads=torch.get_num_threads(),
        batched_median_s=batched_s,
        per_instance_s=loop_s,
        speedup=loop_s / batched_s,
        agreement_with_per_instance=agree,
    )
    assert agree >= 0.95


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_adversarial_large_bounded_memory(benchmark, kind):
    # 20k rows, 3 steps: all rows in one chunk would need one_chunk_estimate_mib of working
    # memory; the budget caps each chunk's. Held for the whole batch on top: the initial
    # noise [B, K, T] (noise_mib), the projected values and the results.
    attention, values, lengths = ragged_batch(20_000, 10, 40, 64, seed=1, shared_direction=0)
    decoder = bench_decoder(kind, values.shape[2], 2)
    budget = 16 * 2**20
    kwargs = {"steps": 3, "memory_budget": budget}
    benchmark.group = "adversarial-large"
    # a small warm-up call first: one-off allocations (thread pools, arenas) are not the search's
    adversarial_attention(attention[:100], values[:100], decoder, lengths[:100], **kwargs)
    peak = peak_extra_mib(lambda: adversarial_attention(attention, values, decoder, lengths, **kwargs))
    result = benchmark.pedantic(
        adversarial_attention, args=(attention, values, decoder, lengths), kwargs=kwargs, rounds=1, iterations=1
    )
    width, k = values.shape[1], 5
    out_width = 2 if kind == "linear" else 2 * values.shape[2]
    one_chunk = 20_000 * _row_bytes(width, k, k * (k - 1) // 2, out_width, 4)
    benchmark.extra_info.update(
        describe(result, lengths),
        steps=3,
        decoder=kind,
        threads=torch.get_num_threads(),
        memory_budget_mib=budget / 2**20,
        noise_mib=20_000 * k * width * 4 / 2**20,
        one_chunk_estimate_mib=one_chunk / 2**20,
        peak_extra_rss_mib=peak,
    )


def test_adversarial_on_a_transformer(benchmark):
    """J&W's adversary on a transformer's own attention (docs/definitions.md §15): a random
    all-MiniLM-L6-v2-shaped BERT classifier (6 layers, d = 384, 12 heads, FFN 1,536, two classes;
    CPU, float32, offline) through our adapter, 64 SST-like rows of random WordPiece ids, each of
    ``STEPS`` steps running the last layer's remainder for 5 candidates. The values factored
    (``TestedAttention.factored``: each head's own vectors mixed, then projected) against the
    dense values ``[B, heads, T, d]`` the search mixed before, results checked equal first; the
    factored time beside its multiply-add floor: per step and candidate, the forward and the
    backward to its input of the mixing (T d), the output projection (d²), the feed-forward
    (2 d d_ff), the pooler (d²) and the classifier (d C), each row at its own length."""
    from benchmarks.measure import MINILM_BERT, floor_info, random_bert, rounds_beside_rate, timed
    from benchmarks.test_bench_attributions import inputs

    small = benchmark.disabled  # CI's smoke run: a 2-layer d = 32 model and two short rows
    model, config, description = random_bert(MINILM_BERT, small)
    tokens, lengths = inputs("sst", small)
    own = model.tested_attention(tokens, lengths)
    benchmark.group = "adversarial-transformer"

    def search(values):
        generator = torch.Generator().manual_seed(0)
        return adversarial_attention(own.attention, values, own.decoder, own.lengths, steps=STEPS, generator=generator)

    dense, dense_s = timed(lambda: search(own.values))
    result, factored_s, rates = rounds_beside_rate(benchmark, search, args=(own.factored,))
    # float32: the two sum the same terms in another order; the same rows found, JSDs to rounding
    torch.testing.assert_close(result.max_jsd, dense.max_jsd, rtol=0, atol=2e-3)
    d, f, c = config.hidden_size, config.intermediate_size, config.num_labels
    per_candidate = [n * d + d * d + 2 * d * f + d * d + d * c for n in own.lengths.tolist()]
    macs = STEPS * 5 * 2 * sum(per_candidate)
    benchmark.extra_info.update(
        describe(result, own.lengths),
        model=description,
        threads=torch.get_num_threads(),
        dense_values_s=dense_s,
        factored_values_s=factored_s,
        factored_speedup=dense_s / factored_s,
        **floor_info(macs, factored_s, rates),
        load_average_after=os.getloadavg()[0],
    )
