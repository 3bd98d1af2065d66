"""Flip search (S&S 2019, sec. 4): kernels against the per-row and sequential references."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import attnmetrics
from attnmetrics.flip import (
    FlipResult,
    attention_gradient,
    flip_fraction,
    random_scores,
    removal_order,
)
from attnmetrics.outputs import decision
from attnmetrics.testing.reference import flip_fraction_reference, flip_search_sequential
from tests.inputs import batch, linear, make_decoder, mlp

F64 = torch.float64
NAMED = ("attention", "reverse", "gradient", "attn_grad", "sign_grad_attn")


def test_imports_this_checkout():
    assert Path(attnmetrics.__file__).resolve().is_relative_to(Path(__file__).resolve().parents[1])


# ---- inputs ---------------------------------------------------------------------------------


def assert_same(got: FlipResult, want: FlipResult, mass_tol=1e-12):
    assert torch.equal(got.removed, want.removed), (got.removed, want.removed)
    assert torch.equal(got.flipped, want.flipped)
    torch.testing.assert_close(got.fraction, want.fraction, equal_nan=True, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.mass, want.mass, equal_nan=True, rtol=mass_tol, atol=mass_tol)


# ---- parity with the references (float64: exact equality of `removed`) ---------------------


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("order", NAMED)
def test_parity_named_orders(kind, classes, order):
    att, values, lengths = batch(seed=classes)
    dec = make_decoder(kind, values.shape[2], classes)
    got = flip_fraction(att, values, dec, lengths, order)
    want = flip_fraction_reference(att, values, dec, lengths, order)
    assert_same(got, want)
    assert_same(flip_search_sequential(att, values, dec, lengths, order), want)
    # a meaningful test: some rows flip, some at a later step than 1
    assert got.flipped.any() and (got.removed > 1).any()


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_score_tensor_with_ties(kind):
    att, values, lengths = batch(b=30, t=10, seed=5)
    g = torch.Generator().manual_seed(3)
    scores = torch.randint(0, 3, att.shape, generator=g)  # integer scores: many ties
    dec = make_decoder(kind, values.shape[2], 2)
    got = flip_fraction(att, values, dec, lengths, scores)
    assert_same(got, flip_fraction_reference(att, values, dec, lengths, scores))
    assert_same(flip_search_sequential(att, values, dec, lengths, scores), got)
    assert_same(flip_fraction(att, values, dec, lengths, scores.to(F64)), got)


def test_ties_in_attention():
    # rows of equal weights (uniform, and pairs of equal weights) over distinct values
    t, h = 8, 5
    rows = [torch.full((t,), 1 / t, dtype=F64)]
    pair = torch.tensor([0.1, 0.2, 0.1, 0.2, 0.15, 0.15, 0.05, 0.05], dtype=F64)
    rows += [pair, pair.flip(0)]
    att = torch.stack(rows)
    g = torch.Generator().manual_seed(0)
    values = torch.randn(3, t, h, generator=g, dtype=F64)
    lengths = torch.full((3,), t)
    order = removal_order(att, lengths)
    assert order[0].tolist() == list(range(t))  # all tied: index order
    assert order[1].tolist() == [1, 3, 4, 5, 0, 2, 6, 7]
    for dec in (linear(h, 2), mlp(h, 2)):
        for o in ("attention", "reverse"):
            want = flip_fraction_reference(att, values, dec, lengths, o)
            assert_same(flip_fraction(att, values, dec, lengths, o), want)
            assert_same(flip_search_sequential(att, values, dec, lengths, o), want)


def test_removal_order():
    scores = torch.tensor([[0.2, 0.5, 0.2, 9.0], [-math.inf, 1.0, -math.inf, 0.0], [3.0, 2.0, 1.0, 0.0]])
    order = removal_order(scores, torch.tensor([3, 4, 0]))
    assert order.tolist() == [[1, 0, 2, 3], [1, 3, 0, 2], [0, 1, 2, 3]]
    assert order.dtype == torch.int64


def test_short_rows_never_flip():
    att, values, lengths = batch(b=6, t=5, seed=7)
    lengths = torch.tensor([0, 1, 0, 5, 1, 2])
    att = torch.where(torch.arange(5) < lengths[:, None], att + 1, 0)
    att = att / att.sum(1, keepdim=True).clamp(min=1)
    for dec in (linear(6, 2), mlp(6, 1)):
        got = flip_fraction(att, values, dec, lengths)
        assert_same(got, flip_fraction_reference(att, values, dec, lengths))
        short = lengths <= 1
        assert (got.removed[short] == -1).all() and not got.flipped[short].any()
        assert got.fraction[short].isnan().all() and got.mass[short].isnan().all()
        ones = flip_fraction(att, values, dec, lengths, never_flipped=1.0)
        assert (ones.fraction[~ones.flipped] == 1.0).all()
        assert torch.equal(ones.fraction[ones.flipped], got.fraction[got.flipped])


def test_all_padding_batch():
    att = torch.zeros(3, 4, dtype=F64)
    values = torch.randn(3, 4, 2, dtype=F64)
    for dec in (linear(2, 2), lambda x: linear(2, 2)(x)):
        got = flip_fraction(att, values, dec, torch.zeros(3, dtype=torch.int64))
        assert (got.removed == -1).all()


def test_never_flips_and_flips_at_step_one():
    h = 2
    dec = nn.Linear(h, 2).double()
    with torch.no_grad():
        dec.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        dec.bias.zero_()
    # row 0: the top item alone decides class 1; removing it flips to class 0 at k = 1
    # row 1: every item votes class 0: never flips
    att = torch.tensor([[0.6, 0.25, 0.15], [0.5, 0.3, 0.2]], dtype=F64)
    values = torch.tensor([[[0, 5.0], [1, 0], [1, 0]], [[3.0, 0], [2, 0], [1, 0]]], dtype=F64)
    for d in (dec, mlp_like(dec)):
        got = flip_fraction(att, values, d)
        assert got.removed.tolist() == [1, -1]
        assert got.mass[0].item() == pytest.approx(0.6) and got.mass[1].isnan()
        assert got.fraction[0].item() == pytest.approx(1 / 3)
    # a dominating bias: no row of a random batch ever flips
    att, values, lengths = batch(seed=11)
    big = linear(values.shape[2], 3)
    with torch.no_grad():
        big.bias.copy_(torch.tensor([0.0, 100.0, 0.0]))
    for d in (big, mlp_like(big)):
        got = flip_fraction(att, values, d, lengths, "gradient")
        assert not got.flipped.any()
        assert_same(got, flip_fraction_reference(att, values, d, lengths, "gradient"))


def mlp_like(lin):
    """The same map as `lin`, hidden from the closed-form path."""
    return lambda x: lin(x)


def test_zero_remaining_mass_is_zero_context():
    # after removing the two non-zero weights nothing is left: logits = bias (class 1)
    dec = nn.Linear(2, 2).double()
    with torch.no_grad():
        dec.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
        dec.bias.copy_(torch.tensor([0.0, 1.0]))
    att = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=F64)
    values = torch.tensor([[[4.0, 0], [3.0, 0], [2.0, 0], [1.0, 0]]], dtype=F64)
    want = flip_fraction_reference(att, values, dec, torch.tensor([4]))
    assert want.removed.tolist() == [2] and want.mass.tolist() == [1.0]
    for d in (dec, mlp_like(dec)):
        assert_same(flip_fraction(att, values, d), want)
        assert_same(flip_search_sequential(att, values, d, torch.tensor([4])), want)


def test_non_contiguous_inputs():
    att, values, lengths = batch(b=20, t=9, h=5, seed=13)
    att_nc = att.t().contiguous().t()  # same values, column-major strides
    values_nc = values.transpose(1, 2).contiguous().transpose(1, 2)
    assert not att_nc.is_contiguous() and not values_nc.is_contiguous()
    scores = torch.randn(att.shape, dtype=F64).t().contiguous().t()
    for dec in (linear(5, 3), mlp(5, 3)):
        for o in ("attention", "gradient", scores):
            want = flip_fraction(att, values, dec, lengths, o)
            got = flip_fraction(att_nc, values_nc, dec, lengths, o)
            assert_same(got, want)
            assert_same(flip_fraction(att_nc, values_nc, dec, lengths, o, memory_budget=64), want)
            assert_same(flip_fraction_reference(att, values, dec, lengths, o), want)


# ---- float32: decisions near a tie may legitimately differ --------------------------------


def step_margins(att, values, dec, lengths, scores):
    """Per row, the float64 decision margin at each step k = 0..L-1 (top-1 minus top-2 logit,
    or |logit| for C = 1), via the literal definition."""
    out = []
    with torch.no_grad():
        for b in range(att.shape[0]):
            n = int(lengths[b])
            ranked = sorted(range(n), key=lambda i: -float(scores[b, i]))
            w = att[b, :n].clone()
            margins = []
            for k in range(n):
                if k:
                    w[ranked[k - 1]] = 0
                ctx = (w / w.sum())[:, None].mul(values[b, :n]).sum(0) if w.sum() > 0 else values[b, 0] * 0
                z = dec(ctx[None])[0]
                margins.append(
                    z.abs()[0].item() if z.numel() == 1 else (z.topk(2).values[0] - z.topk(2).values[1]).item()
                )
            out.append(margins)
    return out


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("classes", [1, 3])
def test_float32_matches_float64_up_to_near_ties(kind, classes):
    att, values, lengths = batch(b=60, t=15, seed=17)
    dec64 = make_decoder(kind, values.shape[2], classes)
    dec32 = make_decoder(kind, values.shape[2], classes, torch.float32)
    att32, values32 = att.float(), values.float()
    att32 = att32 / att32.sum(1, keepdim=True).clamp(min=1e-30)
    got = flip_fraction(att32, values32, dec32, lengths)
    want = flip_fraction_reference(att32.double(), values32.double(), dec64, lengths, att32.double())
    margins = step_margins(att32.double(), values32.double(), dec64, lengths, att32.double())
    differ = (got.removed != want.removed).nonzero().flatten().tolist()
    for b in differ:  # only where some step up to the later answer sits within rounding of a tie
        last = max(int(got.removed[b]), int(want.removed[b]))
        last = int(lengths[b]) - 1 if min(int(got.removed[b]), int(want.removed[b])) < 0 else last
        assert min(margins[b][: last + 1]) < 1e-4, (b, got.removed[b], want.removed[b])
    assert len(differ) <= 2
    assert got.mass.dtype == torch.float32 and got.fraction.dtype == torch.float32
    ok = got.flipped & want.flipped & (got.removed == want.removed)
    torch.testing.assert_close(got.mass[ok].double(), want.mass[ok], rtol=1e-5, atol=1e-6)
    # the float32 references agree with each other and with the kernels the same way
    ref32 = flip_fraction_reference(att32, values32, dec32, lengths)
    assert (ref32.removed != got.removed).sum() <= 2


# ---- paths, chunking, batching ---------------------------------------------------------------


@pytest.mark.parametrize("classes", [1, 2, 4])
def test_closed_form_equals_general_path(classes):
    att, values, lengths = batch(b=300, t=20, h=7, seed=19, temperature=3.0)
    dec = linear(7, classes)
    for o in ("attention", "reverse", "attn_grad"):
        closed = flip_fraction(att, values, dec, lengths, o)
        general = flip_fraction(att, values, mlp_like(dec), lengths, o)
        assert_same(closed, general, mass_tol=1e-14)
        assert closed.flipped.sum() > 10


def test_linear_with_a_hook_is_called_as_is():
    # a hook changes what the Linear computes: the closed form must not bypass it
    att, values, lengths = batch(b=30, t=10, seed=53)
    lin = linear(6, 2)
    plain = flip_fraction(att, values, lin, lengths)
    lin.register_forward_hook(lambda mod, inp, out: out * torch.tensor([1.0, -1.0], dtype=F64))
    got = flip_fraction(att, values, lin, lengths)
    assert_same(got, flip_fraction_reference(att, values, lin, lengths))
    assert not torch.equal(got.removed, plain.removed)


@pytest.mark.parametrize("kind", ["linear", "mlp", "lambda"])
def test_any_memory_budget_same_answer(kind):
    att, values, lengths = batch(b=50, t=14, h=6, seed=23)
    dec = make_decoder("mlp" if kind == "mlp" else "linear", 6, 3)
    dec = mlp_like(dec) if kind == "lambda" else dec
    want = flip_fraction(att, values, dec, lengths, "gradient")
    for budget in (1, 8 * 6 * 3, 1000, 10**5):
        assert_same(flip_fraction(att, values, dec, lengths, "gradient", memory_budget=budget), want)
        torch.testing.assert_close(
            attention_gradient(att, values, dec, lengths, memory_budget=budget),
            attention_gradient(att, values, dec, lengths),
        )


def test_decoder_calls_are_batched():
    att, values, lengths = batch(b=30, t=10, h=4, seed=29)
    lin = linear(4, 2)
    calls = []

    def dec(x):
        calls.append(x.shape[0])
        return lin(x)

    flip_fraction(att, values, dec, lengths)
    assert calls == [int(lengths.sum())]  # one call for all contexts of the batch
    calls.clear()
    flip_fraction(att, values, dec, lengths, memory_budget=8 * 4 * 8 * 5)  # 5 contexts per call
    assert max(calls) <= 5 and sum(calls) == int(lengths.sum())


def test_row_alone_equals_row_in_batch():
    att, values, lengths = batch(b=25, t=11, seed=31)
    for dec in (linear(6, 3), mlp(6, 3)):
        whole = flip_fraction(att, values, dec, lengths, "sign_grad_attn")
        for b in range(0, 25, 4):
            n = max(int(lengths[b]), 1)
            alone = flip_fraction(att[b : b + 1, :n], values[b : b + 1, :n], dec, lengths[b : b + 1], "sign_grad_attn")
            assert alone.removed.item() == whole.removed[b].item()
            torch.testing.assert_close(alone.mass[0], whole.mass[b], equal_nan=True)


# ---- random orders -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_random_order(kind):
    att, values, lengths = batch(b=30, t=12, seed=37)
    dec = make_decoder(kind, 6, 2)
    res = flip_fraction(att, values, dec, lengths, "random", samples=3, generator=torch.Generator().manual_seed(5))
    assert all(f.shape == (3, 30) for f in res)
    again = flip_fraction(att, values, dec, lengths, "random", samples=3, generator=torch.Generator().manual_seed(5))
    for a, b in zip(res, again):
        assert torch.equal(a.nan_to_num(-7), b.nan_to_num(-7))
    # sample s is ordered by the s-th draw of random_scores from the same generator
    g = torch.Generator().manual_seed(5)
    for s in range(3):
        scores = random_scores(30, 12, g)
        want = flip_fraction_reference(att, values, dec, lengths, scores)
        assert_same(FlipResult(*(f[s] for f in res)), want)
    assert not torch.equal(res.removed[0], res.removed[1])
    one = flip_fraction(att, values, dec, lengths, "random", generator=torch.Generator().manual_seed(5))
    assert one.removed.shape == (30,) and torch.equal(one.removed, res.removed[0])


def test_random_orders_are_uniform_permutations():
    # first item removed from a 3-item row: each position about 1/3 of the time
    order = removal_order(random_scores(30000, 3, torch.Generator().manual_seed(0)))
    counts = torch.bincount(order[:, 0], minlength=3).double() / 30000
    assert torch.allclose(counts, torch.full((3,), 1 / 3, dtype=F64), atol=0.02)


# ---- attention gradient --------------------------------------------------------------------


@pytest.mark.parametrize("classes", [1, 3])
def test_attention_gradient_matches_jacobian(classes):
    att, values, lengths = batch(b=6, t=5, h=3, seed=41, min_len=1)
    dec = mlp(3, classes)
    got = attention_gradient(att, values, dec, lengths)
    for b in range(6):
        n = int(lengths[b])
        h = values[b, :n]
        logits = dec((att[b, :n, None] * h).sum(0)[None])
        y = int(decision(logits)[0])

        def prob(a):
            z = dec((a[:, None] * h).sum(0)[None])[0]
            p = torch.sigmoid(z[0]) if classes == 1 else torch.softmax(z, 0)[y]
            return (1 - p) if classes == 1 and y == 0 else p

        jac = torch.autograd.functional.jacobian(prob, att[b, :n])
        torch.testing.assert_close(got[b, :n], jac)
        assert (got[b, n:] == 0).all()


def test_attention_gradient_never_reads_padding():
    att, values, lengths = batch(b=6, t=5, h=3, seed=42, min_len=1)
    dec = mlp(3, 2)
    want = attention_gradient(att, values, dec, lengths)
    junk = values.clone()
    junk[torch.arange(5) >= lengths[:, None]] = math.nan  # NaN in every padding position
    assert junk.isnan().any()
    torch.testing.assert_close(attention_gradient(att, junk, dec, lengths), want, rtol=0, atol=0)


# ---- properties ------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 6),
    t=st.integers(0, 7),
    h=st.integers(1, 4),
    c=st.integers(1, 3),
    seed=st.integers(0, 10**6),
    kind=st.sampled_from(["linear", "mlp"]),
    order=st.sampled_from(NAMED),
)
def test_properties(b, t, h, c, seed, kind, order):
    att, values, lengths = batch(b, t, h, seed=seed)
    dec = make_decoder(kind, h, c)
    res = flip_fraction(att, values, dec, lengths, order)
    for f in res:
        assert f.shape == (b,)
    assert res.removed.dtype == torch.int64 and res.flipped.dtype == torch.bool
    assert res.fraction.dtype == F64 and res.mass.dtype == F64
    assert torch.equal(res.flipped, res.removed >= 0)
    assert ((res.removed == -1) | ((res.removed >= 1) & (res.removed < lengths))).all()
    assert (res.mass[res.flipped] <= 1 + 1e-12).all()
    assert_same(res, flip_fraction_reference(att, values, dec, lengths, order))


# ---- raw ops -------------------------------------------------------------------------------


def _ops():
    from attnmetrics._ops import ops

    return ops


def raw_inputs(dtype=torch.float32):
    att, values, lengths = batch(b=5, t=6, h=3, dtype=dtype, seed=43)
    order = removal_order(att, lengths)
    offsets = torch.cumsum(lengths, 0) - lengths
    proj = values[..., :2].contiguous()
    return att, values, proj, torch.zeros(2, dtype=dtype), order, lengths, offsets


def test_renormalised_contexts_values():
    att, values, _, _, order, lengths, offsets = raw_inputs(F64)
    out = _ops().renormalised_contexts(att, values, order, lengths, offsets)
    assert out.shape == (int(lengths.sum()), 3)
    for b in range(5):
        n = int(lengths[b])
        for k in range(n):
            keep = order[b, k:n]
            w = att[b, keep]
            want = (w[:, None] * values[b, keep]).sum(0) / w.sum()
            torch.testing.assert_close(out[int(offsets[b]) + k], want)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_opcheck(dtype):
    # opcheck compares outputs without equal_nan, so every row must flip (mass not NaN):
    # the top item votes class 1 strongly, the others class 0
    att, values, _, bias, order, lengths, offsets = raw_inputs(dtype)
    lengths = lengths.clamp(min=2)
    att = torch.where(torch.arange(6) < lengths[:, None], 0.3 / (lengths[:, None] - 1), 0.0).to(dtype)
    att[:, 0] = 0.7
    proj = torch.zeros(5, 6, 2, dtype=dtype)
    proj[:, :, 0], proj[:, 0] = 1.0, torch.tensor([0.0, 10.0], dtype=dtype)
    order, offsets = removal_order(att, lengths), torch.cumsum(lengths, 0) - lengths
    assert (_ops().flip_search_linear(att, proj, bias, order, lengths)[0] == 1).all()
    torch.library.opcheck(_ops().flip_search_linear.default, (att, proj, bias, order, lengths))
    torch.library.opcheck(_ops().renormalised_contexts.default, (att, values, order, lengths, offsets))


def test_raw_ops_reject_bad_input():
    att, values, proj, bias, order, lengths, offsets = raw_inputs()
    ops = _ops()

    def linear_op(**kw):
        a = dict(attention=att, projected=proj, bias=bias, order=order, lengths=lengths) | kw
        return ops.flip_search_linear(a["attention"], a["projected"], a["bias"], a["order"], a["lengths"])

    def contexts_op(**kw):
        a = dict(attention=att, values=values, order=order, lengths=lengths, offsets=offsets) | kw
        return ops.renormalised_contexts(a["attention"], a["values"], a["order"], a["lengths"], a["offsets"])

    far = order.clone()
    far[0, 0] = 10**9
    neg = order.clone()
    neg[1, 0] = -1
    dup = order.clone()
    dup[3, 1] = dup[3, 0]
    cases = [
        (dict(order=far), "order"),
        (dict(order=neg), "order"),
        (dict(order=dup), "order"),
        (dict(lengths=torch.full((5,), 7)), "lengths"),
        (dict(lengths=torch.full((5,), -1)), "lengths"),
        (dict(lengths=lengths[:4]), "lengths"),
        (dict(lengths=lengths.int()), "lengths"),
        (dict(order=order.int()), "order"),
        (dict(order=order[:, :5].contiguous()), "order"),
        (dict(attention=att.double()), "dtype"),
        (dict(attention=att.t()), "attention"),
        (dict(attention=att[:, None]), "attention"),
    ]
    for kw, word in cases:
        for op in (linear_op, contexts_op):
            with pytest.raises(RuntimeError, match=word):
                op(**kw)
    for kw, word in [
        (dict(bias=bias[:1]), "bias"),
        (dict(projected=proj[:4]), "projected"),
        (dict(projected=proj.transpose(0, 1)), "projected"),
        (dict(bias=bias.double()), "bias"),
    ]:
        with pytest.raises(RuntimeError, match=word):
            linear_op(**kw)
    for kw, word in [
        (dict(offsets=offsets + 1), "offsets"),
        (dict(offsets=offsets[:3]), "offsets"),
        (dict(values=values[:, :5]), "values"),
        (dict(values=values.double()), "values"),
    ]:
        with pytest.raises(RuntimeError, match=word):
            contexts_op(**kw)


# ---- errors of the public API ------------------------------------------------------------


def test_clear_errors():
    att, values, lengths = batch(b=4, t=5, h=3, seed=47, min_len=2)
    dec = linear(3, 2)

    def call(**kw):
        a = dict(attention=att, values=values, decoder=dec, lengths=lengths) | kw
        order = a.pop("order", "attention")
        return flip_fraction(
            a["attention"],
            a["values"],
            a["decoder"],
            a["lengths"],
            order,
            **{k: v for k, v in a.items() if k not in ("attention", "values", "decoder", "lengths")},
        )

    nan = att.clone()
    nan[0, 0] = math.nan
    negative = att.clone()
    negative[1, 0], negative[1, 1] = -0.1, negative[1, 1] + 0.1
    unnormalised = att * 1.5
    bad_scores = torch.zeros_like(att)
    bad_scores[2, 0] = math.nan
    cases = [
        (dict(attention=nan), "attention.*NaN"),
        (dict(attention=negative), "attention.*non-negative"),
        (dict(attention=unnormalised), "attention rows must sum to 1"),
        (dict(attention=att[:0], values=values[:0], lengths=lengths[:0]), "empty batch"),
        (dict(attention=att[0]), r"attention must have shape \[B, T\]"),
        (dict(values=values[:, :4]), r"values must have shape \[B, T, H\]"),
        (dict(values=values[:3]), r"values must have shape \[B, T, H\]"),
        (dict(values=values.float()), "values dtype"),
        (dict(values=values.long()), "values must be float"),
        (dict(lengths=torch.tensor([1, 2, 3, 6])), "lengths must lie in"),
        (dict(lengths=torch.tensor([1, 2, 3, -1])), "lengths must lie in"),
        (dict(lengths=lengths[:2]), "lengths must have shape"),
        (dict(lengths=lengths.float()), "lengths must be an integer"),
        (dict(order="attentoin"), "order must be one of"),
        (dict(order=torch.zeros(4, 4)), r"order as a score tensor must have shape \[B, T\] = \[4, 5\]"),
        (dict(order=bad_scores), r"order \(score tensor\) contains NaN"),
        (dict(order="random", samples=0), "samples must be an int >= 1"),
        (dict(memory_budget=0), "memory_budget"),
        (dict(decoder=linear(4, 2)), "in_features 4.*H = 3"),
        (dict(decoder=linear(3, 2, torch.float32)), "decoder weight"),
        (dict(decoder=lambda x: x.sum(1)), r"logits \[N, C\]"),
        (dict(decoder=lambda x: x[:1, :2]), r"logits \[N, C\]"),
        (dict(decoder=lambda x: x[:, :2] / 0), "NaN or infinite logits"),
    ]
    for kw, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call(**kw)
    with pytest.raises(ValueError, match="does not depend differentiably"):
        attention_gradient(att, values, lambda x: torch.ones(x.shape[0], 2), lengths)
    with pytest.raises(ValueError, match="scores must be a"):
        removal_order(torch.zeros(3))
    with pytest.raises(TypeError, match="decoder must be callable"):
        call(decoder=3)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_attention_gradient_non_finite_values_are_named(kind, bad):
    # inf used to give NaN gradients silently (mlp) and NaN was blamed on the decoder
    att, values, lengths = batch(b=6, min_len=2)
    values[3, 1, 0] = bad
    with pytest.raises(ValueError, match=r"values must be finite on each row's valid prefix.*row 3"):
        attention_gradient(att, values, make_decoder(kind, values.shape[2], 2), lengths)
    values[3, 1, 0] = 0.0
    values[3, lengths[3] :] = bad  # padding is never read
    attention_gradient(att, values, make_decoder(kind, values.shape[2], 2), lengths)


@pytest.mark.parametrize("param", ["0.weight", "2.bias"])
def test_attention_gradient_non_finite_decoder_parameter_is_named(param):
    att, values, lengths = batch(b=6, min_len=2)
    dec = mlp(values.shape[2], 2)
    with torch.no_grad():
        dec.get_parameter(param).view(-1)[0] = math.nan
    with pytest.raises(ValueError, match=rf"decoder\.{re.escape(param)} must be finite"):
        attention_gradient(att, values, dec, lengths)


def test_overflow_is_not_called_non_finite_values():
    att, values, lengths = batch(b=6, min_len=2, dtype=torch.float32)
    dec = linear(values.shape[2], 2, torch.float32)
    with torch.no_grad():
        dec.weight.mul_(100.0)
    huge = values * 1e37  # finite in float32; W·h is not
    assert torch.isfinite(huge).all()
    with pytest.raises(ValueError, match=r"projection W·h .* overflowed torch\.float32"):
        flip_fraction(att, huge, dec, lengths)
    with pytest.raises(ValueError, match=r"decoder returned NaN or infinite logits on finite contexts.*overflowed"):
        attention_gradient(att, huge, dec, lengths)
    # a convex combination overflows only through the 1e-4 tolerance on the attention sum
    big = torch.full((2, 2, values.shape[2]), torch.finfo(torch.float32).max)
    att = torch.tensor([[0.5, 0.5], [0.50005, 0.5]])
    with pytest.raises(ValueError, match=r"the context sum_t alpha_t h_t overflowed torch\.float32 in row 1"):
        attention_gradient(att, big, dec)
