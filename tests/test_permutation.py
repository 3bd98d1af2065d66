"""Permutation test (J&W 2019, sec. 4.2): the generator, the kernels against J&W's loop."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch import nn

import attnmetrics
from attnmetrics.permutation import (
    PermutationResult,
    attention_permutations,
    draw_seed,
    permutation_test,
)
from attnmetrics.testing.reference import permutation_test_reference
from tests.inputs import batch, gen, linear, make_decoder, mlp, wrapped

F64 = torch.float64


def test_imports_this_checkout():
    assert Path(attnmetrics.__file__).resolve().is_relative_to(Path(__file__).resolve().parents[1])
    assert attnmetrics.permutation_test is permutation_test
    assert attnmetrics.PermutationResult is PermutationResult


# ---- inputs ---------------------------------------------------------------------------------


def run(att, values, dec, lengths, p=20, seed=0, **kw):
    return permutation_test(att, values, dec, lengths, permutations=p, generator=gen(seed), return_all=True, **kw)


def reference(att, values, dec, lengths, p=20, seed=0):
    return permutation_test_reference(att, values, dec, lengths, p, draw_seed(gen(seed)))


# ---- the generator --------------------------------------------------------------------------

_M64 = 2**64 - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _fin(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix(z):
    return _fin((z + _GOLDEN) & _M64)


def python_permutation(seed, row, p, n):
    """The algorithm documented in csrc/kernels/permutation.h, written again in Python."""
    state = _mix(_mix(_mix(seed & _M64) ^ row) ^ p)

    def next64():
        nonlocal state
        state = (state + _GOLDEN) & _M64
        return _fin(state)

    def bounded(x, k):  # Lemire: uniform in [0, k) from a 32-bit x
        m = x * k
        while (m & 0xFFFFFFFF) < (2**32 - k) % k:
            m = (next64() & 0xFFFFFFFF) * k
        return m >> 32

    out = list(range(n))
    i = n - 1
    while i >= 1:
        z = next64()
        for step, x in ((i, z & 0xFFFFFFFF), (i - 1, z >> 32)):
            if step >= 1:
                j = bounded(x, step + 1)
                out[step], out[j] = out[j], out[step]
        i -= 2
    return out


def test_generator_follows_documented_algorithm():
    lengths = torch.tensor([0, 1, 2, 3, 7, 17, 40])
    for seed in (0, 1, -1, 2**63 - 1, -(2**63), 123456789):
        perms = attention_permutations(lengths, 40, 3, seed, row_offset=5, permutation_offset=2)
        for b, n in enumerate(lengths.tolist()):
            for p in range(3):
                want = python_permutation(seed, 5 + b, 2 + p, n) + list(range(n, 40))
                assert perms[b, p].tolist() == want


def test_prefixes_are_permutations_padding_is_identity():
    lengths = torch.randint(0, 31, (60,), generator=gen(1))
    perms = attention_permutations(lengths, 30, 25, 99)
    assert perms.shape == (60, 25, 30) and perms.dtype == torch.int64
    for b, n in enumerate(lengths.tolist()):
        assert torch.equal(perms[b, :, :n].sort(1).values, torch.arange(n).expand(25, n))
        assert torch.equal(perms[b, :, n:], torch.arange(n, 30).expand(25, 30 - n))
    # not degenerate: rows of 10+ items see many distinct permutations
    long = (lengths >= 10).nonzero().flatten()
    assert all(len({tuple(x) for x in perms[b].tolist()}) == 25 for b in long.tolist())


@pytest.mark.parametrize("n", [3, 4])
def test_every_order_equally_likely(n):
    # 120k permutations of one length over all n! orders: chi-square goodness of fit
    rows, per_row = 3000, 40
    perms = attention_permutations(torch.full((rows,), n), n, per_row, 2024)
    orders = {o: i for i, o in enumerate(itertools.permutations(range(n)))}
    codes = torch.tensor([orders[tuple(x)] for x in perms.view(-1, n).tolist()])
    counts = torch.bincount(codes, minlength=len(orders)).numpy()
    assert stats.chisquare(counts).pvalue > 1e-3, counts


def test_neighbouring_rows_and_permutations_are_independent():
    # joint order of (row r, row r+1) and of (permutation p, p+1): 36 cells for n = 3
    perms = attention_permutations(torch.full((4000,), 3), 3, 20, 7)
    orders = {o: i for i, o in enumerate(itertools.permutations(range(3)))}
    code = torch.tensor([[orders[tuple(x)] for x in row] for row in perms.tolist()])
    for joint in (code[:-1:2] * 6 + code[1::2], code[:, :-1:2] * 6 + code[:, 1::2]):
        counts = torch.bincount(joint.flatten(), minlength=36).numpy()
        assert stats.chisquare(counts).pvalue > 1e-3


def test_long_rows_uniform_positions():
    # where position 0's weight goes, in rows of 50: uniform over the 50 slots
    perms = attention_permutations(torch.full((1000,), 50), 50, 50, 3)
    slot = (perms == 0).float().argmax(2).flatten()
    assert stats.chisquare(torch.bincount(slot, minlength=50).numpy()).pvalue > 1e-3


def test_offsets_select_rows_and_permutations():
    lengths = torch.randint(0, 13, (30,), generator=gen(2))
    full = attention_permutations(lengths, 12, 8, 5)
    assert torch.equal(attention_permutations(lengths[10:20], 12, 8, 5, row_offset=10), full[10:20])
    for p in range(8):
        one = attention_permutations(lengths, 12, 1, 5, permutation_offset=p)
        assert torch.equal(one[:, 0], full[:, p])
    # a row's permutations depend on its lengths and index only, not on the other rows
    other = lengths.clone()
    other[::2] = 12 - other[::2]
    assert torch.equal(attention_permutations(other, 12, 8, 5)[1::2], full[1::2])


def test_seed_from_generator_is_reproducible():
    assert draw_seed(gen(4)) == draw_seed(gen(4)) != draw_seed(gen(5))
    assert 0 <= draw_seed(gen(4)) < 2**63
    lengths = torch.full((20,), 9)
    a = attention_permutations(lengths, 9, 4, draw_seed(gen(4)))
    assert not torch.equal(a, attention_permutations(lengths, 9, 4, draw_seed(gen(5))))


# ---- parity with J&W's loop -----------------------------------------------------------------


def assert_same(got: PermutationResult, want, tol=1e-12):
    median, tvds = want
    torch.testing.assert_close(got.tvd, tvds, rtol=0, atol=tol)
    torch.testing.assert_close(got.median_tvd, median, rtol=0, atol=tol)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("classes", [1, 2, 3])
@pytest.mark.parametrize("p", [10, 7])
def test_parity_with_reference(kind, classes, p):
    att, values, lengths = batch(seed=classes + p)
    dec = make_decoder(kind, values.shape[2], classes)
    got = run(att, values, dec, lengths, p, seed=classes)
    want = reference(att, values, dec, lengths, p, seed=classes)
    assert_same(got, want)
    assert got.median_tvd.dtype == F64 and got.tvd.shape == (40, p)
    long = lengths >= 2
    assert (got.median_tvd[long] > 0).float().mean() > 0.8  # a test that can see a wrong TVD
    assert (got.median_tvd[~long] == 0).all() and (got.tvd[~long] == 0).all()


def test_median_is_numpys():
    # even P: mean of the two middle values (np.median), not torch.median's lower one
    att, values, lengths = batch(b=60, seed=3, min_len=3)
    for dec in (linear(6, 2), mlp(6, 2)):
        got = run(att, values, dec, lengths, p=6)
        np_median = torch.from_numpy(np.median(got.tvd.numpy(), axis=1))
        torch.testing.assert_close(got.median_tvd, np_median, rtol=0, atol=1e-15)
        assert (got.median_tvd - got.tvd.median(1).values).abs().max() > 1e-6


def test_by_hand_two_items():
    # L = 2, alpha (0.9, 0.1), h = (4, -4), logit = context: the identity keeps TVD 0, the swap
    # gives context -3.2 against 3.2: TVD |sigmoid(-3.2) - sigmoid(3.2)|
    att = torch.tensor([[0.9, 0.1]], dtype=F64)
    values = torch.tensor([[[4.0], [-4.0]]], dtype=F64)
    dec = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        dec.weight.fill_(1.0)
    swap = abs(torch.sigmoid(torch.tensor(-3.2, dtype=F64)) - torch.sigmoid(torch.tensor(3.2, dtype=F64)))
    for d in (dec, wrapped(dec)):
        res = run(att, values, d, None, p=40, seed=8)
        perms = attention_permutations(torch.tensor([2]), 2, 40, draw_seed(gen(8)))
        swapped = (perms[0, :, 0] == 1).to(F64)
        torch.testing.assert_close(res.tvd[0], swapped * swap, rtol=0, atol=1e-15)
        assert 0 < swapped.sum() < 40
        median = swap * (0.5 if swapped.sum() == 20 else float(swapped.sum() > 20))
        torch.testing.assert_close(res.median_tvd[0], median.to(F64), rtol=0, atol=1e-15)


def test_ties_in_attention():
    t, h = 8, 5
    pair = torch.tensor([0.1, 0.2, 0.1, 0.2, 0.15, 0.15, 0.05, 0.05], dtype=F64)
    att = torch.stack([torch.full((t,), 1 / t, dtype=F64), pair, pair.flip(0)])
    values = torch.randn(3, t, h, generator=gen(0), dtype=F64)
    for dec in (linear(h, 2), mlp(h, 3)):
        got = run(att, values, dec, None, p=30)
        assert_same(got, reference(att, values, dec, torch.full((3,), t), p=30))
        assert (got.tvd[0].abs() < 1e-15).all()  # equal weights: every permutation is the original
        assert (got.median_tvd[1:] > 0).all()


def test_short_rows_and_all_padding():
    att, values, lengths = batch(b=6, t=5, seed=7)
    lengths = torch.tensor([0, 1, 0, 5, 1, 2])
    att = torch.where(torch.arange(5) < lengths[:, None], att + 1, 0)
    att = att / att.sum(1, keepdim=True).clamp(min=1)
    for dec in (linear(6, 2), mlp(6, 1)):
        got = run(att, values, dec, lengths)
        assert_same(got, reference(att, values, dec, lengths))
        assert (got.tvd[lengths <= 1] == 0).all() and (got.median_tvd[lengths <= 1] == 0).all()
        assert got.max_attention[lengths == 0].isnan().all()
        assert (got.max_attention[lengths == 1] == 1).all()
    for t in (4, 0):
        empty = run(
            torch.zeros(3, t, dtype=F64),
            torch.randn(3, t, 2, dtype=F64),
            linear(2, 2),
            torch.zeros(3, dtype=torch.int64),
        )
        assert (empty.median_tvd == 0).all() and empty.max_attention.isnan().all()


def test_max_attention():
    att, values, lengths = batch(b=30, seed=9, min_len=1)
    att_garbage = att + (torch.arange(12) >= lengths[:, None]) * 5.0  # padding is ignored
    got = permutation_test(att_garbage, values, linear(6, 2), lengths, permutations=2).max_attention
    want = torch.tensor([float(att[b, :n].max()) for b, n in enumerate(lengths.tolist())], dtype=F64)
    assert torch.equal(got, want)


def test_non_contiguous_and_padding_garbage():
    att, values, lengths = batch(b=20, t=9, h=5, seed=13)
    att_nc = att.t().contiguous().t()
    values_nc = values.transpose(1, 2).contiguous().transpose(1, 2)
    assert not att_nc.is_contiguous() and not values_nc.is_contiguous()
    pad = (torch.arange(9) >= lengths[:, None])[..., None]
    values_bad = values.masked_fill(pad, math.nan)  # padding is never read
    for dec in (linear(5, 3), mlp(5, 3)):
        want = run(att, values, dec, lengths)
        assert_same(run(att_nc, values_nc, dec, lengths), (want.median_tvd, want.tvd), tol=0)
        assert_same(run(att_nc, values_nc, dec, lengths, memory_budget=64), (want.median_tvd, want.tvd))
        assert_same(run(att, values_bad, dec, lengths), (want.median_tvd, want.tvd))


@pytest.mark.parametrize("dtype_classes", [(torch.float32, 1), (torch.float32, 3)])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_float32(kind, dtype_classes):
    dtype, classes = dtype_classes
    att, values, lengths = batch(b=50, t=15, seed=17)
    att32, values32 = att.float(), values.float()
    dec32 = make_decoder(kind, 6, classes, dtype)
    got = run(att32, values32, dec32, lengths)
    assert got.median_tvd.dtype == torch.float32 and got.tvd.dtype == torch.float32
    assert_same(got, reference(att32, values32, dec32, lengths), tol=2e-6)
    # and against the float64 run on the same (float32-rounded) inputs
    dec64 = make_decoder(kind, 6, classes)
    want = run(att32.double(), values32.double(), dec64, lengths)
    torch.testing.assert_close(got.median_tvd.double(), want.median_tvd, rtol=0, atol=2e-6)


# ---- paths, chunking, batching ------------------------------------------------------------------


@pytest.mark.parametrize("classes", [1, 2, 4])
def test_closed_form_equals_general_path(classes):
    att, values, lengths = batch(b=200, t=20, h=7, seed=19)
    dec = linear(7, classes)
    closed, general = run(att, values, dec, lengths), run(att, values, wrapped(dec), lengths)
    assert_same(closed, (general.median_tvd, general.tvd), tol=1e-14)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_any_memory_budget_same_answer(kind):
    att, values, lengths = batch(b=24, t=14, h=6, seed=23)
    dec = make_decoder(kind, 6, 3)
    want = run(att, values, dec, lengths)
    for budget in (1, 8 * 6 * 21, 5000, 10**6):
        got = run(att, values, dec, lengths, memory_budget=budget)
        assert_same(got, (want.median_tvd, want.tvd), tol=1e-15)


def test_decoder_calls_are_batched():
    att, values, lengths = batch(b=30, t=10, h=4, seed=29)
    lin = linear(4, 2)
    calls = []

    def dec(x):
        calls.append(x.shape[0])
        return lin(x)

    run(att, values, dec, lengths, p=20)
    assert calls == [30 * 21]  # every row's original and permuted contexts in one call
    calls.clear()
    run(att, values, dec, lengths, p=20, memory_budget=8 * 4 * 8 * 7)  # 7 contexts per call
    assert max(calls) <= 7 and sum(calls) == 30 * 21


def test_rows_do_not_depend_on_the_rest_of_the_batch():
    att, values, lengths = batch(b=25, t=11, seed=31)
    other_att, other_values, other_lengths = batch(b=25, t=11, seed=32)
    odd = torch.arange(25) % 2 == 1
    mixed_att = torch.where(odd[:, None], att, other_att)
    mixed_values = torch.where(odd[:, None, None], values, other_values)
    mixed_lengths = torch.where(odd, lengths, other_lengths)
    for dec in (linear(6, 3), mlp(6, 3)):
        whole = run(att, values, dec, lengths)
        mixed = run(mixed_att, mixed_values, dec, mixed_lengths)
        torch.testing.assert_close(mixed.tvd[odd], whole.tvd[odd], rtol=0, atol=1e-15)
        # documented: a row's permutations follow its index; moved rows get new ones
        shifted = run(att.roll(1, 0), values.roll(1, 0), dec, lengths.roll(1, 0))
        moved = lengths.roll(1, 0) >= 4
        assert not torch.allclose(shifted.tvd[moved], whole.tvd.roll(1, 0)[moved])


def test_linear_with_a_hook_is_called_as_is():
    att, values, lengths = batch(b=30, t=10, seed=53)
    lin = linear(6, 2)
    plain = run(att, values, lin, lengths)
    lin.register_forward_hook(lambda mod, inp, out: out * torch.tensor([1.0, -3.0], dtype=F64))
    got = run(att, values, lin, lengths)
    assert_same(got, reference(att, values, lin, lengths))
    assert not torch.allclose(got.median_tvd, plain.median_tvd)


def test_generator_reproducibility():
    att, values, lengths = batch(b=20, seed=37)
    dec = linear(6, 2)
    a, b = run(att, values, dec, lengths, seed=3), run(att, values, dec, lengths, seed=3)
    assert torch.equal(a.tvd, b.tvd) and torch.equal(a.median_tvd, b.median_tvd)
    assert not torch.equal(run(att, values, dec, lengths, seed=4).tvd, a.tvd)
    torch.manual_seed(11)
    c = permutation_test(att, values, dec, lengths, permutations=20, return_all=True)
    torch.manual_seed(11)
    d = permutation_test(att, values, dec, lengths, permutations=20, return_all=True)
    assert torch.equal(c.tvd, d.tvd)
    only = permutation_test(att, values, dec, lengths, permutations=20, generator=gen(3))
    assert only.tvd is None and torch.equal(only.median_tvd, a.median_tvd)
    default = permutation_test(att, values, dec, lengths, generator=gen(3), return_all=True)
    assert default.tvd.shape == (20, 100)  # J&W's 100


# ---- properties --------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 6),
    t=st.integers(0, 9),
    h=st.integers(1, 4),
    c=st.integers(1, 3),
    p=st.integers(1, 9),
    seed=st.integers(0, 10**6),
    kind=st.sampled_from(["linear", "mlp"]),
)
def test_properties(b, t, h, c, p, seed, kind):
    att, values, lengths = batch(b, t, h, seed=seed)
    dec = make_decoder(kind, h, c)
    res = run(att, values, dec, lengths, p, seed=seed)
    assert res.median_tvd.shape == (b,) and res.tvd.shape == (b, p) and res.max_attention.shape == (b,)
    assert ((res.tvd >= 0) & (res.tvd <= 1)).all()
    assert (res.tvd[lengths <= 1] == 0).all()
    assert_same(res, reference(att, values, dec, lengths, p, seed=seed))


# ---- raw ops -------------------------------------------------------------------------------


def _ops():
    from attnmetrics._ops import ops

    return ops


def raw_inputs(dtype=torch.float32):
    att, values, lengths = batch(b=5, t=6, h=3, dtype=dtype, seed=43)
    return att, values, values[..., :2].contiguous(), torch.zeros(2, dtype=dtype), lengths


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_opcheck(dtype):
    att, values, proj, bias, lengths = raw_inputs(dtype)
    ops = _ops()
    torch.library.opcheck(ops.attention_permutations.default, (lengths, 6, 4, 17, 3, 2))
    torch.library.opcheck(ops.permutation_tvd_linear.default, (att, proj, bias, lengths, 4, 17))
    torch.library.opcheck(ops.permutation_tvd_linear.default, (att, proj, bias, lengths, 3, -5, 9))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_project_prefix(dtype):
    # values @ W.T on each valid prefix, zero on padding, which is never read (NaN there)
    att, values, lengths = batch(b=30, t=9, h=37, dtype=dtype, seed=44)  # H not a multiple of 8 or 16
    weight = torch.randn(3, 37, generator=gen(1), dtype=F64).to(dtype)
    pad = torch.arange(9) >= lengths[:, None]
    got = _ops().project_prefix(values.masked_fill(pad[..., None], math.nan), weight, lengths)
    want = (values.double() @ weight.double().t()).masked_fill(pad[..., None], 0)
    tol = 1e-5 if dtype == torch.float32 else 1e-13
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert got.dtype == dtype and (got[pad] == 0).all()
    torch.library.opcheck(_ops().project_prefix.default, (values, weight, lengths))
    for kw, word in [
        (dict(weight=weight[:, :5].contiguous()), "weight"),
        (dict(weight=weight.t()), "weight"),
        (dict(weight=weight.to(F64 if dtype == torch.float32 else torch.float32)), "weight dtype"),
        (dict(values=values.transpose(1, 2)), "values"),
        (dict(values=values[0]), "values"),
        (dict(values=values.long()), "values"),
        (dict(lengths=lengths[:3]), "lengths"),
        (dict(lengths=lengths + 9), "lengths"),
        (dict(lengths=lengths.int()), "lengths"),
    ]:
        a = dict(values=values, weight=weight, lengths=lengths) | kw
        with pytest.raises(RuntimeError, match=word):
            _ops().project_prefix(a["values"], a["weight"], a["lengths"])


def test_raw_ops_reject_bad_input():
    att, values, proj, bias, lengths = raw_inputs()
    ops = _ops()

    def linear_op(**kw):
        a = dict(attention=att, projected=proj, bias=bias, lengths=lengths, permutations=3, seed=1, row_offset=0) | kw
        return ops.permutation_tvd_linear(*a.values())

    def perms_op(**kw):
        a = dict(lengths=lengths, width=6, permutations=3, seed=1, row_offset=0, permutation_offset=0) | kw
        return ops.attention_permutations(*a.values())

    shared = [
        (dict(lengths=torch.full((5,), 7)), "lengths"),
        (dict(lengths=torch.full((5,), -1)), "lengths"),
        (dict(lengths=lengths.int()), "lengths"),
        (dict(permutations=0), "permutations"),
        (dict(row_offset=-1), "row_offset"),
        (dict(lengths=lengths[:, None]), "lengths"),
    ]
    for kw, word in shared + [
        (dict(lengths=lengths[:4]), "lengths"),
        (dict(attention=att.double()), "dtype"),
        (dict(attention=att.t()), "attention"),
        (dict(attention=att[:, None]), "attention"),
        (dict(attention=att.long()), "attention"),
    ]:
        with pytest.raises(RuntimeError, match=word):
            linear_op(**kw)
    for kw, word in shared + [
        (dict(width=2**32), "width"),
        (dict(width=-1), "width"),
        (dict(permutation_offset=-2), "permutation_offset"),
        (dict(lengths=lengths.double()), "lengths"),
    ]:
        with pytest.raises(RuntimeError, match=word):
            perms_op(**kw)
    for kw, word in [
        (dict(bias=bias[:1]), "bias"),
        (dict(projected=proj[:4]), "projected"),
        (dict(projected=proj.transpose(0, 1)), "projected"),
        (dict(bias=bias.double()), "bias"),
        (dict(projected=proj[..., :0].contiguous()), "C >= 1"),
    ]:
        with pytest.raises(RuntimeError, match=word):
            linear_op(**kw)


# ---- errors of the public API ------------------------------------------------------------


def test_a_general_decoders_errors_in_a_later_chunk_name_their_rows():
    """The general decoder's loop checks its contexts and logits once, after it (no device read per
    chunk): an overflowing context or non-finite logits in the last of many chunks still raise,
    naming that chunk's rows, and a finite batch gives the same TVDs at any budget."""
    g = torch.Generator().manual_seed(53)
    lengths = torch.randint(2, 6, (12,), generator=g)
    mask = torch.arange(5) < lengths[:, None]
    # two heads, each row a distribution over its real tokens; the contexts are summed over heads
    att = torch.softmax(torch.randn(12, 2, 5, generator=g).masked_fill(~mask[:, None], -math.inf), -1)
    values = torch.randn(12, 2, 5, 3, generator=g)

    def mlp(x):
        return torch.stack([x.sum(1), -x.sum(1)], 1) / 3

    def call(v, decoder=mlp, budget=2**11):
        generator = torch.Generator().manual_seed(0)
        return permutation_test(
            att, v, decoder, lengths, permutations=6, generator=generator, return_all=True, memory_budget=budget
        )

    whole, chunked = call(values, budget=2**30), call(values)
    assert torch.equal(whole.tvd, chunked.tvd)
    big = values.clone()
    big[11] = 3e38  # finite, but the two heads' contexts sum past float32's largest
    with pytest.raises(ValueError, match=r"a context sum_t alpha_t h_t of rows \d+\.\.11 overflowed torch\.float32"):
        call(big)
    marked = values.clone()
    marked[11] = 1e7  # finite contexts; the decoder below gives NaN for them alone

    def nan_on_marked(x):
        return mlp(x).masked_fill((x.abs() > 1e6).any(1, keepdim=True), math.nan)

    with pytest.raises(ValueError, match="decoder returned NaN or infinite logits"):
        call(marked, decoder=nan_on_marked)
    assert torch.isfinite(call(values, decoder=nan_on_marked).tvd).all()


def test_clear_errors():
    att, values, lengths = batch(b=4, t=5, h=3, seed=47, min_len=2)
    dec = linear(3, 2)

    def call(**kw):
        a = dict(attention=att, values=values, decoder=dec, lengths=lengths) | kw
        return permutation_test(a.pop("attention"), a.pop("values"), a.pop("decoder"), a.pop("lengths"), **a)

    nan = att.clone()
    nan[0, 0] = math.nan
    bad_values = values.clone()
    bad_values[1, 0, 0] = math.inf
    nan_bias = linear(3, 2)
    with torch.no_grad():
        nan_bias.bias[0] = math.nan
    cases = [
        (dict(attention=nan), "attention.*NaN"),
        (dict(attention=att * 1.5), "attention rows must sum to 1"),
        (dict(attention=att[:0], values=values[:0], lengths=lengths[:0]), "empty batch"),
        (dict(values=values[:, :4]), r"values must have shape \[B, T, H\]"),
        (dict(values=values.float()), "values dtype"),
        (dict(lengths=torch.tensor([1, 2, 3, 6])), "lengths must lie in"),
        (dict(lengths=lengths[:2]), "lengths must have shape"),
        (dict(permutations=0), "permutations must be an int >= 1"),
        (dict(permutations=2.0), "permutations must be an int >= 1"),
        (dict(permutations=True), "permutations must be an int >= 1"),
        (dict(return_all=1), "return_all must be a bool"),
        (dict(memory_budget=0), "memory_budget"),
        (dict(decoder=linear(4, 2)), "in_features 4.*H = 3"),
        (dict(decoder=linear(3, 2, torch.float32)), "decoder weight"),
        (dict(decoder=nan_bias), r"decoder\.bias must be finite"),
        (dict(values=bad_values), "values must be finite"),
        (dict(values=bad_values, decoder=wrapped(dec)), "values must be finite"),
        (dict(decoder=lambda x: x.sum(1)), r"logits \[N, C\]"),
        (dict(decoder=lambda x: x[:1, :2]), r"logits \[N, C\]"),
        (dict(decoder=lambda x: x[:, :2] / 0), "NaN or infinite logits"),
    ]
    for kw, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call(**kw)
    with pytest.raises(TypeError, match="decoder must be callable"):
        call(decoder=3)
    for args, pattern in [
        ((lengths, 5, 0, 1), "permutations"),
        ((lengths, 4, 2, 1), "lengths must lie in"),
        ((lengths, 5, 2, 2**63), "seed must be an int64"),
        ((lengths[:, None], 5, 2, 1), "lengths must be a"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            attention_permutations(*args)


def test_docstring_examples():
    import doctest

    import attnmetrics.permutation as module

    result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
