"""attention_rollout against the per-row torch loop of Abnar & Zuidema's definition
(reference.attention_rollout_reference), and properties that hold whatever the inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmetrics import attention_rollout
from attnmetrics._ops import ops
from attnmetrics.rollout import layer_matrices
from attnmetrics.testing.reference import attention_rollout_reference

F64 = torch.float64
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), F64: dict(rtol=1e-12, atol=1e-14)}


def attentions(rng, batch, layers, heads, width, lengths=None, dtype=F64, causal=False):
    """Softmax attention rows over each row's valid keys (and, if causal, keys <= query);
    padding filled with garbage that must never be read."""
    scores = torch.from_numpy(rng.standard_normal((batch, layers, heads, width, width)) * 2)
    keys = torch.arange(width)
    block = torch.ones(batch, width, width, dtype=torch.bool)
    if lengths is not None:
        block &= (keys[None, None, :] < lengths[:, None, None]) & (keys[None, :, None] < lengths[:, None, None])
    visible = block & (keys[None, None, :] <= keys[None, :, None]) if causal else block
    att = scores.masked_fill(~visible[:, None, None], -torch.inf).softmax(-1).nan_to_num(0.0)
    return att.masked_fill(~block[:, None, None], 7.0).to(dtype)  # garbage off the valid blocks


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("residual", [0.0, 0.3, 0.5, 1.0])
def test_ragged_batch_equals_reference(dtype, residual):
    rng = np.random.default_rng(0)
    lengths = torch.tensor([9, 1, 0, 4, 9, 7])
    att = attentions(rng, 6, 3, 4, 9, lengths, dtype)
    got = attention_rollout(att, lengths, residual)
    torch.testing.assert_close(got, attention_rollout_reference(att, lengths, residual), **TOL[dtype])
    assert got.dtype == dtype and got.shape == (6, 9, 9)
    off_block = torch.ones(6, 9, 9, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        off_block[b, :n, :n] = False
    assert (got[off_block] == 0).all()


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 5),
    layers=st.integers(1, 4),
    heads=st.integers(1, 3),
    width=st.integers(1, 12),
    residual=st.floats(0.0, 1.0),
    causal=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.float32, F64]),
)
def test_hypothesis_shapes(batch, layers, heads, width, residual, causal, seed, dtype):
    rng = np.random.default_rng(seed)
    lengths = torch.from_numpy(rng.integers(0, width + 1, batch))
    att = attentions(rng, batch, layers, heads, width, lengths, dtype, causal)
    got = attention_rollout(att, lengths, residual)
    torch.testing.assert_close(got, attention_rollout_reference(att, lengths, residual), **TOL[dtype])
    # A product of row-stochastic matrices is row-stochastic.
    sums = got.sum(-1)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(sums[b, :n], torch.ones(n, dtype=dtype), rtol=0, atol=1e-5)


def test_one_layer_without_residual_is_the_renormalised_head_mean():
    rng = np.random.default_rng(1)
    att = attentions(rng, 3, 1, 5, 6)
    want = att[:, 0].double().numpy().mean(1)
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(attention_rollout(att, residual=0.0).numpy(), want, rtol=1e-12)


def test_residual_one_is_the_identity_and_two_layers_multiply():
    rng = np.random.default_rng(2)
    att = attentions(rng, 2, 3, 2, 5)
    assert torch.equal(attention_rollout(att, residual=1.0), torch.eye(5, dtype=F64).expand(2, 5, 5))
    two = att[:, :2]
    m = [0.5 * two[:, layer].mean(1).numpy() + 0.5 * np.eye(5) for layer in range(2)]
    m = [x / x.sum(-1, keepdims=True) for x in m]
    np.testing.assert_allclose(attention_rollout(two).numpy(), m[1] @ m[0], rtol=1e-12)


def test_causal_rollout_stays_causal():
    """Position i of a decoder never draws on tokens after it, through any number of layers."""
    rng = np.random.default_rng(3)
    got = attention_rollout(attentions(rng, 2, 4, 3, 8, causal=True))
    assert (torch.triu(got, diagonal=1) == 0).all()


def test_padding_is_never_read_and_lengths_none_means_full():
    rng = np.random.default_rng(4)
    lengths = torch.tensor([5, 3])
    att = attentions(rng, 2, 2, 2, 5, lengths)
    poisoned = att.clone()
    poisoned[1, :, :, 3:, :] = float("nan")
    poisoned[1, :, :, :, 3:] = float("nan")
    assert torch.equal(attention_rollout(poisoned, lengths), attention_rollout(att, lengths))
    full = torch.tensor([5, 5])
    assert torch.equal(attention_rollout(att[:1]), attention_rollout(att[:1], full[:1]))


def test_row_alone_equals_row_in_batch_and_non_contiguous_input():
    rng = np.random.default_rng(5)
    lengths = torch.tensor([6, 2, 4])
    att = attentions(rng, 3, 2, 3, 6, lengths, torch.float32)
    batch = attention_rollout(att, lengths)
    for b in range(3):
        n = int(lengths[b])
        alone = attention_rollout(att[b : b + 1, :, :, :n, :n].clone())
        assert torch.equal(alone[0], batch[b, :n, :n])
    swapped = att.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not swapped.is_contiguous()
    assert torch.equal(attention_rollout(swapped, lengths), batch)


def test_zero_rows_stay_zero():
    att = torch.zeros(1, 2, 1, 3, 3, dtype=F64)
    att[0, :, 0, 0, 0] = 1.0  # rows 1 and 2 hold no mass at all
    got = attention_rollout(att, residual=0.0)
    assert torch.equal(got[0, 0], torch.tensor([1.0, 0.0, 0.0], dtype=F64))
    assert (got[0, 1:] == 0).all()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda a, n: (a[0], n), r"shape \[B, layers, heads, T, T\]"),
        (lambda a, n: (a[..., :4], n), r"shape \[B, layers, heads, T, T\]"),
        (lambda a, n: (a[:0], None), "empty batch"),
        (lambda a, n: (a[:, :0], n), "layers >= 1 and heads >= 1"),
        (lambda a, n: (a.int(), n), "float32 or float64"),
        (lambda a, n: (a, torch.tensor([5, 6])), r"lengths must lie in \[0, T\] = \[0, 5\], got min 5, max 6"),
        (lambda a, n: (a, torch.tensor([5])), "lengths"),
    ],
)
def test_bad_input_is_named(make, match):
    att = attentions(np.random.default_rng(6), 2, 2, 2, 5)
    args = make(att, torch.tensor([5, 4]))
    with pytest.raises(ValueError, match=match):
        attention_rollout(*args)


def test_bad_values_name_row_layer_and_head():
    att = attentions(np.random.default_rng(7), 3, 2, 2, 4, torch.tensor([4, 2, 4]))
    nan, neg = att.clone(), att.clone()
    nan[2, 1, 0, 1, 1] = float("nan")
    neg[2, 0, 1, 0, 3] = -0.1
    with pytest.raises(
        ValueError, match=r"NaN, infinite or negative values in the valid block of row 2 \(layer 1, head 0\)"
    ):
        attention_rollout(nan)
    with pytest.raises(
        ValueError, match=r"NaN, infinite or negative values in the valid block of row 2 \(layer 0, head 1\)"
    ):
        attention_rollout(neg)
    for residual in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="residual must be a number in"):
            attention_rollout(att, residual=residual)
    with pytest.raises(ValueError, match="requires grad"):
        attention_rollout(att.requires_grad_())


def test_kernel_rejects_what_the_wrapper_would():
    """Nothing reaches the C++ loop unchecked: the op itself names bad shapes and lengths."""
    att = attentions(np.random.default_rng(8), 2, 1, 1, 3)
    with pytest.raises(RuntimeError, match=r"lengths\[0\] = 4 is outside"):
        ops.attention_rollout(att, torch.tensor([4, 1]), 0.5)
    with pytest.raises(RuntimeError, match="residual must lie in"):
        ops.attention_rollout(att, torch.tensor([3, 1]), 2.0)
    with pytest.raises(RuntimeError, match="must be contiguous"):
        ops.attention_rollout(att.transpose(3, 4), torch.tensor([3, 1]), 0.5)
    with pytest.raises(RuntimeError, match="lengths must be int64"):
        ops.attention_rollout(att, torch.tensor([3, 1], dtype=torch.int32), 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_opcheck(dtype):
    lengths = torch.tensor([4, 0, 2])
    att = attentions(np.random.default_rng(9), 3, 2, 2, 4, lengths, dtype)
    torch.library.opcheck(ops.attention_rollout.default, (att, lengths, 0.5))


def test_kernel_checks_values_in_valid_blocks_only():
    lengths = torch.tensor([3, 2])
    att = attentions(np.random.default_rng(10), 2, 2, 3, 3, lengths)
    att[1, :, :, 2, :] = -torch.inf  # padding of row 1: never read
    ops.attention_rollout(att, lengths, 0.5)
    att[1, 1, 2, 1, 0] = torch.inf
    with pytest.raises(RuntimeError, match=r"row 1 \(layer 1, head 2\)"):
        ops.attention_rollout(att, lengths, 0.5)


@pytest.mark.parametrize("residual", [0.0, 0.5])
def test_huge_float32_attention_does_not_overflow(residual):
    # issue 31, item 13: torch.full(..., 3e38) overflowed the head sums (all NaN, or all zeros)
    a = torch.full((2, 2, 3, 4, 4), 3e38)
    lengths = torch.tensor([4, 2])
    out = attention_rollout(a, lengths, residual)
    expected = attention_rollout(a.double(), lengths, residual).float()
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[0].sum(-1), torch.ones(4))  # rows of a valid block sum to 1
    assert out[1, :2, :2].sum(-1).tolist() == pytest.approx([1.0, 1.0]) and not out[1, 2:].any()


def test_attention_past_float64_head_sums_is_refused():
    with pytest.raises(ValueError, match=r"^attentions holds values up to 1e\+308.*overflow"):
        attention_rollout(torch.full((1, 1, 2, 3, 3), 1e308, dtype=F64))


@pytest.mark.parametrize("residual", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("causal", [False, True])
def test_layer_matrices_are_each_layer_rolled_out_alone(residual, causal):
    """``layer_matrices`` (attention flow's capacities) are the matrices the kernel multiplies: each
    layer rolled out alone, float64, zero off each row's valid block (garbage there never read), a
    causal attention's zero above the diagonal."""
    rng = np.random.default_rng(11)
    lengths = torch.tensor([6, 1, 0, 4])
    att = attentions(rng, 4, 3, 2, 6, lengths, torch.float32, causal)
    got = layer_matrices(att, lengths, residual)
    assert got.dtype == F64 and got.shape == (4, 3, 6, 6)
    for layer in range(3):
        alone = attention_rollout(att[:, layer : layer + 1].double(), lengths, residual)
        torch.testing.assert_close(got[:, layer], alone, rtol=1e-12, atol=1e-14)
    if causal:
        assert (torch.triu(got, 1) == 0).all()
    torch.testing.assert_close(layer_matrices(att[:1], None, residual), layer_matrices(att[:1], lengths[:1], residual))
