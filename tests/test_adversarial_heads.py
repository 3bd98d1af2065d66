"""Multi-head adversarial attention (docs/definitions.md §15) against the per-instance
reference generalised per head: one candidate distribution per head, JSDs averaged over
heads, the heads' contexts summed."""

from __future__ import annotations

import math

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


def factored_batch(b=12, heads=3, t=7, e=2, h=4, seed=7, dtype=F64, first=(0, 1, 2)):
    """Attention [B, heads, T] and factored values (per_head zero on padding) with their lengths."""
    from attnmetrics.protocol import FactoredValues

    att, per_head, lengths = heads_batch(b=b, heads=heads, t=t, h=e, seed=seed, first=first)
    g = gen(seed + 1)
    per_head = per_head * (torch.arange(t) < lengths[:, None])[:, None, :, None]
    projection = torch.randn(heads, e, h, generator=g, dtype=F64)
    offset = torch.randn(b, heads, h, generator=g, dtype=F64)
    return att.to(dtype), FactoredValues(per_head.to(dtype), projection.to(dtype), offset.to(dtype)), lengths


@pytest.mark.parametrize("kind", ["linear", "mlp", "lambda"])
@pytest.mark.parametrize("classes", [1, 3])
def test_factored_values_equal_the_dense_ones(kind, classes):
    """Each head's vectors mixed, then projected (TestedAttention.factored): the search of the
    dense values ``per_head @ projection + offset``, on ragged rows with empty and one-token rows,
    a non-contiguous per_head, and every decoder path (a linear decoder takes the dense values)."""
    att, fac, lengths = factored_batch(seed=classes)
    fac = fac._replace(per_head=fac.per_head.transpose(2, 3).contiguous().transpose(2, 3))  # other strides
    assert not fac.per_head.is_contiguous()
    dec = make_decoder("mlp" if kind == "mlp" else "linear", 4, classes)
    dec = wrapped(dec) if kind == "lambda" else dec
    opts = FAST | dict(tvd_threshold=0.02)
    got = adversarial_attention(att, fac, dec, lengths, generator=gen(3), **opts)
    want = adversarial_attention(att, fac.dense(lengths), dec, lengths, generator=gen(3), **opts)
    assert_same(got, want, 1e-12)
    assert (got.max_jsd[lengths >= 2] > 0).any()
    # and the per-instance reference on the dense values
    assert_same(got, adversarial_attention_reference(att, fac.dense(lengths), dec, lengths, generator=gen(3), **opts))


def test_factored_values_float32_and_chunking():
    att, fac, lengths = factored_batch(seed=4, dtype=torch.float32)
    dec = make_decoder("mlp", 4, 2, torch.float32)
    whole = adversarial_attention(att, fac, dec, lengths, generator=gen(1), **FAST)
    chunked = adversarial_attention(att, fac, dec, lengths, generator=gen(1), memory_budget=1, **FAST)
    dense = adversarial_attention(att, fac.dense(lengths), dec, lengths, generator=gen(1), **FAST)
    assert_same(whole, chunked, 1e-6)
    assert_same(whole, dense, 1e-5)
    assert all(f.dtype == torch.float32 for f in whole)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda att, f: (att[:, 0], f), "multi-head attention"),
        (lambda att, f: (att, f._replace(per_head=f.per_head[:, :, :-1])), r"values.per_head must have shape"),
        (lambda att, f: (att, f._replace(projection=f.projection[:, :1])), r"values.projection must have shape"),
        (lambda att, f: (att, f._replace(offset=f.offset[:, :, :2])), r"values.offset must have shape \[B, heads, H\]"),
        (lambda att, f: (att, f._replace(offset=f.offset.float())), r"values.offset is torch.float32"),
        (lambda att, f: (att, f._replace(projection=f.projection * math.nan)), "values.projection must be finite"),
        (lambda att, f: (att, f._replace(offset=f.offset.index_fill(0, torch.tensor([5]), math.inf))), "values.offset"),
    ],
)
def test_factored_values_errors_name_the_part(change, message):
    att, fac, lengths = factored_batch()
    att, fac = change(att, fac)
    with pytest.raises(ValueError, match=message):
        adversarial_attention(att, fac, make_decoder("mlp", 4, 2), lengths, generator=gen(0), **FAST)
