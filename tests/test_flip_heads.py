"""Multi-head flip search and attention gradient (docs/definitions.md §15): attention
[B, heads, T] and values [B, heads, T, H] against the per-row, per-step reference, which
zeros each removed token in every head, renormalises each head on its own and feeds the
decoder the sum of the heads' contexts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmetrics import attention_gradient, flip_fraction
from attnmetrics.flip import random_scores
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.testing.reference import flip_fraction_reference
from tests.inputs import gen, heads_batch, make_decoder, wrapped

F64 = torch.float64
ORDERS = ("attention", "reverse", "gradient", "attn_grad", "sign_grad_attn")


def assert_same(got, want, dtype):
    assert torch.equal(got.removed, want.removed), (got.removed, want.removed)
    assert torch.equal(got.flipped, want.flipped)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.mass, want.mass, rtol=tol, atol=tol, equal_nan=True)
    torch.testing.assert_close(got.fraction, want.fraction, equal_nan=True)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("order", ORDERS)
def test_equals_reference(kind, classes, order):
    att, values, lengths = heads_batch(b=40, heads=3, t=9, h=5, seed=classes)
    dec = make_decoder(kind, 5, classes)
    got = flip_fraction(att, values, dec, lengths, order=order)
    assert_same(got, flip_fraction_reference(att, values, dec, lengths, order=order), F64)
    assert got.flipped.any() and not got.flipped.all()  # the batch exercises both outcomes


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_float32_and_random_orders(dtype):
    att, values, lengths = heads_batch(b=50, heads=4, t=12, h=6, dtype=dtype, seed=7)
    dec = make_decoder("linear", 6, 2, dtype)
    got = flip_fraction(att, values, dec, lengths, order="random", samples=3, generator=gen(5))
    g = gen(5)
    for s in range(3):
        scores = random_scores(50, 12, g)
        want = flip_fraction_reference(att, values, dec, lengths, order=scores)
        assert torch.equal(got.removed[s], want.removed)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_one_head_equals_the_single_head_call(kind):
    att, values, lengths = heads_batch(b=60, heads=1, t=11, h=4, seed=3)
    dec = make_decoder(kind, 4, 2)
    for order in ("attention", "gradient"):
        multi = flip_fraction(att, values, dec, lengths, order=order)
        single = flip_fraction(att[:, 0], values[:, 0], dec, lengths, order=order)
        assert torch.equal(multi.removed, single.removed)
        torch.testing.assert_close(multi.mass, single.mass, equal_nan=True)
    torch.testing.assert_close(
        attention_gradient(att, values, dec, lengths)[:, 0], attention_gradient(att[:, 0], values[:, 0], dec, lengths)
    )


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_closed_form_equals_general_path_and_chunking(kind):
    att, values, lengths = heads_batch(b=45, heads=3, t=10, h=5, seed=11)
    dec = make_decoder(kind, 5, 2)
    whole = flip_fraction(att, values, dec, lengths)
    general = flip_fraction(att, values, wrapped(dec), lengths)
    assert torch.equal(whole.removed, general.removed)
    tiny = flip_fraction(att, values, dec, lengths, memory_budget=1)  # one row per chunk
    assert torch.equal(whole.removed, tiny.removed)
    torch.testing.assert_close(whole.mass, tiny.mass, equal_nan=True)


def test_ties_short_rows_and_non_contiguous_inputs():
    att, values, lengths = heads_batch(b=20, heads=2, t=6, h=3, seed=4, first=(0, 1, 2, 6))
    mask = (torch.arange(6) < lengths[:, None])[:, None, :]
    uniform = torch.where(mask, 1.0 / lengths.clamp(min=1)[:, None, None].double(), 0.0)
    att = uniform.expand(-1, 2, -1).clone()  # both heads uniform: every score ties
    att[5, 1] = torch.where(mask[5, 0], torch.arange(6.0) + 1, 0.0) / (torch.arange(6.0) + 1)[: int(lengths[5])].sum()
    values_t = values.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not values_t.is_contiguous()
    for kind in ("linear", "mlp"):
        dec = make_decoder(kind, 3, 2)
        got = flip_fraction(att, values_t, dec, lengths)
        assert_same(got, flip_fraction_reference(att, values, dec, lengths), F64)
        assert (got.removed[:2] == -1).all()  # L <= 1 never flips


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 8),
    heads=st.integers(1, 4),
    t=st.integers(1, 8),
    classes=st.integers(1, 3),
    kind=st.sampled_from(["linear", "mlp"]),
    seed=st.integers(0, 10_000),
)
def test_hypothesis_shapes(b, heads, t, classes, kind, seed):
    att, values, lengths = heads_batch(b=b, heads=heads, t=t, h=3, seed=seed)
    dec = make_decoder(kind, 3, classes)
    assert_same(flip_fraction(att, values, dec, lengths), flip_fraction_reference(att, values, dec, lengths), F64)


def test_gradient_is_autograd_through_the_summed_heads():
    """d p_y / d alpha[b, h, t] by autograd on the whole attention tensor at once."""
    att, values, lengths = heads_batch(b=12, heads=3, t=7, h=4, seed=5)
    dec = make_decoder("mlp", 4, 3)
    alpha = att.clone().requires_grad_(True)
    logits = dec(torch.einsum("bht,bhtd->bd", alpha, values))
    y = decision(logits.detach())
    (want,) = torch.autograd.grad(output_distribution(logits).gather(1, y[:, None]).sum(), alpha)
    mask = (torch.arange(7) < lengths[:, None])[:, None, :]
    got = attention_gradient(att, values, dec, lengths)
    torch.testing.assert_close(got, want * mask)
    assert got.shape == (12, 3, 7)


def test_errors_name_row_and_head():
    att, values, lengths = heads_batch(b=4, heads=3, t=5, h=2, seed=6, min_len=2)
    dec = make_decoder("linear", 2, 2)
    bad = att.clone()
    bad[2, 1, 0] += 0.5
    with pytest.raises(ValueError, match=r"row 2, head 1, sums to"):
        flip_fraction(bad, values, dec, lengths)
    nan = values.clone()
    nan[3, 2, 0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or infinite values in row 3, head 2"):
        flip_fraction(att, nan, make_decoder("mlp", 2, 2), lengths)
    with pytest.raises(ValueError, match=r"values must have shape \[B, heads, T, H\] = \[4, 3, 5, H\]"):
        flip_fraction(att, values[:, :2], dec, lengths)
    with pytest.raises(ValueError, match=r"shape \[B, T\] = \[4, 5\] \(one score per token\)"):
        flip_fraction(att, values, dec, lengths, order=att)
    with pytest.raises(ValueError, match="heads >= 1"):
        flip_fraction(att[:, :0], values[:, :0], dec, lengths)
