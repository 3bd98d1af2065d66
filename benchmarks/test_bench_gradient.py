"""J&W's gradient importance (sec. 4.1): ours against a backward pass per class through packed
sequences (this library before the seventh session), same model, same inputs, one run.

Run: python -m pytest benchmarks/test_bench_gradient.py --benchmark-only -q
Model and inputs: J&W's BiLSTM + additive attention with random weights (``jw_inputs.py``,
embedding 300, one sigmoid output: two classes (1 - p, p)) on SST-like rows (1,821 rows of 10–55
real tokens); CI's smoke run takes 20 rows.

The definition sums |grad p_c . x| over the classes c; the reference takes one backward pass per
class as it reads, through the BiLSTM over packed sequences. Ours: with two classes p_1 = 1 - p_0,
so the two terms are equal and one pass does; and with gradients enabled the encoder runs the
padded batch (``models/classifier.py: padded_runs``: two fused LSTM calls instead of packing's graph
of a step at a time). The values are checked equal first; ``extra_info["speedup"]`` is the
reference's time over ours.
"""

from __future__ import annotations

import os

import torch

from attnmetrics import gradient_importance
from attnmetrics.importance import _normalised
from attnmetrics.models import classifier
from attnmetrics.outputs import output_distribution
from attnmetrics.protocol import eval_mode
from benchmarks.jw_inputs import CASES, make_batch, make_model
from benchmarks.measure import median_seconds, timed


def per_class(model, tokens, lengths):
    """The definition as written: a backward pass per class, attention detached."""
    with eval_mode(model):
        embedded = model.embed(tokens).detach().requires_grad_(True)
        with torch.enable_grad():
            hidden = model.encode(embedded, lengths)
            attention = model.attend(hidden, lengths).detach()
            probs = output_distribution(model.decoder(torch.einsum("bt,bth->bh", attention, hidden)))
            score = torch.zeros(embedded.shape[:2], dtype=embedded.dtype)
            for c in range(probs.shape[1]):
                (grad,) = torch.autograd.grad(probs[:, c].sum(), embedded, retain_graph=c + 1 < probs.shape[1])
                score += (grad * embedded).sum(-1).abs()
    return _normalised(score.detach(), lengths, model, "gradient importance", "gradients")


def test_gradient_importance_against_a_backward_per_class(benchmark, monkeypatch):
    small = benchmark.disabled  # CI's smoke run
    rows, low, high = CASES["sst"]
    tokens, lengths = make_batch(20 if small else rows, low, high)
    model = make_model(embed_dim=300)

    def ours():
        return gradient_importance(model, tokens, lengths)

    with monkeypatch.context() as packed:
        packed.setattr(classifier, "padded_runs", lambda device: False)
        want, reference_s = timed(lambda: per_class(model, tokens, lengths))
    torch.testing.assert_close(ours(), want, rtol=0, atol=1e-6)
    benchmark.group = "gradient importance"
    benchmark.pedantic(ours, rounds=1 if small else 3, iterations=1)
    ours_s = median_seconds(benchmark, ours)
    benchmark.extra_info.update(
        rows=len(lengths),
        ours_s=ours_s,
        per_class_s=reference_s,
        speedup=reference_s / ours_s,
        threads=torch.get_num_threads(),
        load_average_after=os.getloadavg()[0],
    )
