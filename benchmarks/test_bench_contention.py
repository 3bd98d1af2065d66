"""Training under contention: what one other CPU-bound process on the machine costs a training
step of J&W's BiLSTM, with one torch thread and with two (torch's default on 2 cores).

With two threads, OpenMP's worker spins at every parallel region waiting for the thread that the
other process has pushed off its core, so each step waits out scheduler time slices; one thread
never waits for another. The command line's default (``--threads 1``) follows from this.

Each case times ``STEPS`` steps (forward, backward, Adam; batch 32 of SST-like rows) on a quiet
machine and with a busy-looping second process, in one run; ``extra_info`` holds both medians and
their ratio (the slowdown). Not a pass/fail test: the numbers go in docs/speed.md.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.training import loss_fn
from benchmarks.measure import median_seconds

STEPS = 5


def make_step(seed=0):
    torch.manual_seed(seed)
    model = EncoderAttentionClassifier(ModelConfig(vocab_size=16_000, embed_dim=300, hidden_size=128))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=True)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(12, 42, (32,), generator=g)
    tokens = torch.randint(4, 16_000, (32, int(lengths.max())), generator=g)
    tokens[torch.arange(tokens.shape[1]) >= lengths[:, None]] = 0
    labels = torch.randint(0, 2, (32,), generator=g)

    def steps():
        for _ in range(STEPS):
            optimizer.zero_grad()
            logits, _ = model(tokens, lengths)
            loss_fn(logits, labels).backward()
            optimizer.step()

    return steps


def timed(fn, repeats=3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@pytest.mark.parametrize("threads", [1, 2])
def test_training_step_with_a_second_process(benchmark, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        steps = make_step()
        steps()  # warm-up: oneDNN primitives, allocator
        quiet = timed(steps)
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)  # the hog is running
            benchmark.group = "training step under contention"
            benchmark.pedantic(steps, rounds=3, iterations=1)
            loaded = median_seconds(benchmark, steps)
        finally:
            hog.kill()
            hog.wait()
    finally:
        torch.set_num_threads(before)
    benchmark.extra_info.update(threads=threads, steps=STEPS, quiet_s=quiet, loaded_s=loaded, slowdown=loaded / quiet)
