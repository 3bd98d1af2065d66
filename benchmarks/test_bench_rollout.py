"""attention_rollout against the two ways users compute it today, same inputs, one run
(docs/speed.md):

- the torch matmul chain over the padded batch (head mean, residual, row renormalisation,
  one batched matmul per layer: what Inseq-style code and most notebooks do);
- Abnar & Zuidema's own approach, one example at a time
  (:func:`attnmetrics.testing.reference.attention_rollout_reference`).

    python -m pytest benchmarks/test_bench_rollout.py --benchmark-only

Inputs are MiniLM-sized (6 layers, 12 heads), float32, with attention rows that sum to 1 over
each row's valid keys and zeros elsewhere, so the padded chain gives the same valid blocks
(checked). The kernel reads only each row's L x L blocks and fuses the head mean into the
mixing; the chain reads and multiplies the padded T x T matrices. ``extra_info`` holds the
ratios (``ratio_vs_chain``, ``ratio_vs_loop``), the threads and the load average.
"""

import os

import numpy as np
import pytest
import torch

from attnmetrics import attention_rollout
from attnmetrics.testing.reference import attention_rollout_reference
from benchmarks.measure import median_seconds, skip_without

LAYERS, HEADS = 6, 12
# (rows, shortest, longest): SST-like sentences with [CLS] and [SEP]; IMDB-like reviews.
# Rows are fewer than the test sets' to keep the input (B x 72 x T^2 floats) near 200 MB.
CASES = {"sst": (256, 12, 57), "imdb": (8, 22, 258)}

_inputs: dict = {}
_medians: dict = {}


def inputs(case, small=False):
    key = (case, small)
    if key not in _inputs:
        batch, low, high = CASES[case]
        if small:
            batch, high = min(batch, 8), min(high, low + 8)
        rng = np.random.default_rng(0)
        lengths = torch.from_numpy(rng.integers(low, high + 1, batch))
        width = int(lengths.max())
        valid = torch.arange(width) < lengths[:, None]
        block = (valid[:, :, None] & valid[:, None, :])[:, None, None]
        scores = torch.from_numpy(rng.standard_normal((batch, LAYERS, HEADS, width, width)).astype(np.float32))
        att = scores.masked_fill(~block, -torch.inf).softmax(-1).nan_to_num(0.0)
        _inputs[key] = (att, lengths)
    return _inputs[key]


def torch_chain(attentions, residual=0.5):
    """The padded batched chain: [B, layers, heads, T, T] -> [B, T, T]."""
    eye = torch.eye(attentions.shape[-1], dtype=attentions.dtype)
    mixed = (1 - residual) * attentions.mean(2) + residual * eye
    mixed = mixed / mixed.sum(-1, keepdim=True)
    rollout = mixed[:, 0]
    for layer in range(1, mixed.shape[1]):
        rollout = torch.bmm(mixed[:, layer], rollout)
    return rollout


def _record(benchmark, case, att):
    benchmark.group = f"attention_rollout {case}"
    benchmark.extra_info.update(
        case=case,
        shape=list(att.shape),
        threads=torch.get_num_threads(),
        load_average=os.getloadavg()[0],
    )


@pytest.mark.parametrize("case", list(CASES))
def test_torch_chain(benchmark, case):
    att, lengths = inputs(case, benchmark.disabled)
    _record(benchmark, case, att)
    got = benchmark.pedantic(torch_chain, args=(att,), rounds=3, iterations=1)
    valid = torch.arange(att.shape[-1]) < lengths[:, None]
    block = valid[:, :, None] & valid[:, None, :]
    torch.testing.assert_close(got * block, attention_rollout(att, lengths), rtol=1e-4, atol=1e-6)
    _medians[(case, "chain")] = median_seconds(benchmark, lambda: torch_chain(att))


@pytest.mark.parametrize("case", list(CASES))
def test_per_example_loop(benchmark, case):
    att, lengths = inputs(case, benchmark.disabled)
    _record(benchmark, case, att)
    benchmark.pedantic(attention_rollout_reference, args=(att, lengths), rounds=1, iterations=1)
    _medians[(case, "loop")] = median_seconds(benchmark, lambda: attention_rollout_reference(att, lengths))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel(benchmark, case, device):
    skip_without(device)
    att, lengths = inputs(case, benchmark.disabled)
    _record(benchmark, case, att)
    benchmark.extra_info.update(device=device)
    args = (att.to(device), lengths.to(device))

    def run():
        out = attention_rollout(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    got = benchmark(run)
    torch.testing.assert_close(got.cpu(), attention_rollout_reference(att, lengths), rtol=1e-4, atol=1e-6)
    kernel = median_seconds(benchmark, run)
    benchmark.extra_info.update(kernel_s=kernel)
    for name in ("chain", "loop"):
        if (case, name) in _medians:
            benchmark.extra_info[f"ratio_vs_{name}"] = _medians[(case, name)] / kernel
