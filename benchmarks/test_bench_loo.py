"""Leave-one-out (J&W 2019, sec. 4.1): ``leave_one_out`` against J&W's loop, same inputs, one run.

Run: python -m pytest benchmarks/test_bench_loo.py --benchmark-only -q
Model: J&W's BiLSTM + additive attention (``attnmetrics.models.classifier``) with random
weights, embedding 50 (GloVe-50 sized; J&W used 300), hidden 128 per direction, one
sigmoid output. J&W's loop (:func:`attnmetrics.testing.reference.leave_one_out_jw`) runs one
forward over the whole batch per deleted position; their code ran it on length-sorted
batches of 32 rows, which is timed too for the SST-like case (``batch_size=32``).
Each approach runs once per case (they take seconds to minutes on 2 cores), ours from a
cold start (oneDNN builds a primitive for each new call shape, about 0.2 s in all on 2
cores); the ratio is in ``extra_info["speedup"]``. The SST-like case has SST's 1,821 test
sentences (docs/speed.md); the IMDB-like case B = 100 rather than 1,000, to keep the run to a
few minutes (about 4 on one thread; J&W's loop takes nine tenths of it).

Both sides are bound by the BiLSTM itself. J&W's loop re-encodes every shortened row from
scratch (and runs rows too short for the deleted position along); ours asks the model for
``deletion_logits``, which reuses what a deletion leaves unchanged: the forward states before the
token and the backward states after it, so each deletion runs one direction over the part it
changed (in fused oneDNN calls of runs of about one length), and the attention projection and
the decoder are applied to each state once. On a
2-core machine shared with other jobs, two OpenMP threads contend badly (small calls suffer
most); ``OMP_NUM_THREADS=1`` gives steadier numbers. ``extra_info`` records the threads and the load average.

With a GPU (and attnmetrics' CUDA build) ``leave_one_out`` also runs on ``cuda`` (model
and tokens there), against its CPU run on the same inputs (``extra_info["speedup_vs_cpu"]``).
"""

from __future__ import annotations

import os

import pytest
import torch

from attnmetrics import leave_one_out
from attnmetrics.testing.reference import leave_one_out_jw
from benchmarks.jw_inputs import CASES, make_batch, make_model
from benchmarks.measure import median_seconds, skip_without, timed


@pytest.mark.parametrize("case", list(CASES))
def test_leave_one_out_vs_jw_loop(benchmark, case):
    model = make_model()
    batch, lo, hi = CASES[case]
    if benchmark.disabled:  # CI's smoke run: the same code paths on a fraction of the work
        batch, hi = min(batch, 16), min(hi, lo + 20)
    tokens, lengths = make_batch(batch, lo, hi)
    load_before = os.getloadavg()[0]
    benchmark.group = f"loo-{case}"
    result = benchmark.pedantic(leave_one_out, args=(model, tokens, lengths), rounds=1, iterations=1)
    ours_s = median_seconds(benchmark, lambda: leave_one_out(model, tokens, lengths))
    jw, jw_s = timed(lambda: leave_one_out_jw(model, tokens, lengths))
    info = dict(
        rows=int(lengths.shape[0]),
        mean_length=float(lengths.double().mean()),
        sequences=int((lengths - 2).sum()),
        threads=torch.get_num_threads(),
        load_average_before=load_before,
        leave_one_out_s=ours_s,
        jw_loop_s=jw_s,
        speedup=jw_s / ours_s,
        max_abs_diff_vs_jw=float((result - jw).abs().max()),
    )
    if case == "sst":
        jw32, jw32_s = timed(lambda: leave_one_out_jw(model, tokens, lengths, batch_size=32))
        info.update(
            jw_loop_bsize32_s=jw32_s,
            speedup_vs_bsize32=jw32_s / ours_s,
            max_abs_diff_vs_bsize32=float((result - jw32).abs().max()),
        )
    info["load_average_after"] = os.getloadavg()[0]
    benchmark.extra_info.update(info)
    # float32 BiLSTM: batch composition moves the last bits only
    torch.testing.assert_close(result, jw, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_leave_one_out_cuda(benchmark, case):
    skip_without("cuda")
    model = make_model()
    batch, lo, hi = CASES[case]
    tokens, lengths = make_batch(batch, lo, hi)
    gpu_model, gpu_tokens, gpu_lengths = make_model().cuda(), tokens.cuda(), lengths.cuda()
    benchmark.group = f"loo-{case}"

    def run():
        out = leave_one_out(gpu_model, gpu_tokens, gpu_lengths)
        torch.cuda.synchronize()
        return out

    result = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    cpu, cpu_s = timed(lambda: leave_one_out(model, tokens, lengths))
    cuda_s = median_seconds(benchmark, run)
    benchmark.extra_info.update(
        rows=int(lengths.shape[0]),
        sequences=int((lengths - 2).sum()),
        device="cuda",
        leave_one_out_cuda_s=cuda_s,
        leave_one_out_cpu_s=cpu_s,
        speedup_vs_cpu=cpu_s / cuda_s,
        max_abs_diff_vs_cpu=float((result.cpu() - cpu).abs().max()),
    )
    # cuDNN's LSTM rounds differently from the CPU's
    torch.testing.assert_close(result.cpu(), cpu, rtol=1e-3, atol=1e-4)
