"""Multi-head adversarial attention (docs/definitions.md §15) against the per-instance
reference generalised per head: one candidate distribution per head, JSDs averaged over
heads, the heads' contexts summed."""

from __future__ import annotations

import pytest
import torch

from attnmetrics import adversarial_attention
from attnmetrics.adversarial import AdversarialResult
from attnmetrics.testing.reference import adversarial_attention_reference
from tests.inputs import gen, heads_batch, make_decoder, wrapped

F64 = torch.float64
FAST = dict(steps=40, candidates=3, lr=0.05)


def assert_same(got, want, tol=1e-10):
    for name in AdversarialResult._fields:
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("kind", ["linear", "mlp", "lambda"])
@pytest.mark.parametrize("classes", [1, 3])
def test_matches_per_instance_reference(kind, classes):
    att, values, lengths = heads_batch(b=10, heads=3, t=7, h=4, seed=classes, first=(0, 1, 2))
    values = values * 2.0  # outputs sensitive enough that the constraint binds on some rows
    dec = make_decoder("mlp" if kind == "mlp" else "linear", 4, classes)
    dec = wrapped(dec) if kind == "lambda" else dec
    opts = FAST | dict(tvd_threshold=0.006)
    got = adversarial_attention(att, values, dec, lengths, generator=gen(3), **opts)
    want = adversarial_attention_reference(att, values, dec, lengths, generator=gen(3), **opts)
    assert_same(got, want)
    assert got.attention.shape == att.shape
    real = lengths >= 2
    assert (got.max_jsd[real] > 0).any()
    # every head of a reported attention is a distribution over the row's prefix
    sums = got.attention.sum(-1)
    torch.testing.assert_close(sums[real], torch.ones_like(sums[real]))


def test_one_head_equals_the_single_head_call():
    att, values, lengths = heads_batch(b=10, heads=1, t=7, h=4, seed=4)
    for kind in ("linear", "mlp"):
        dec = make_decoder(kind, 4, 2)
        multi = adversarial_attention(att, values, dec, lengths, generator=gen(5), **FAST)
        single = adversarial_attention(att[:, 0], values[:, 0], dec, lengths, generator=gen(5), **FAST)
        assert_same(AdversarialResult(multi.max_jsd, multi.attention[:, 0], multi.output_tvd), single, 1e-12)


def test_float32_and_chunking():
    att, values, lengths = heads_batch(b=12, heads=2, t=6, h=3, seed=6, dtype=torch.float32)
    dec = make_decoder("linear", 3, 2, torch.float32)
    whole = adversarial_attention(att, values, dec, lengths, generator=gen(1), **FAST)
    chunked = adversarial_attention(att, values, dec, lengths, generator=gen(1), memory_budget=1, **FAST)
    assert_same(whole, chunked, 1e-6)
    assert all(f.dtype == torch.float32 for f in whole)
