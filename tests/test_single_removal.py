"""Single-weight removal (S&S 2019, sec. 3) against the per-row reference; McNemar's test."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats
from torch import nn

import attnmetrics
from attnmetrics.single_removal import SingleRemovalResult, single_removal
from attnmetrics.stats import McNemar, mcnemar
from attnmetrics.testing.reference import single_removal_reference
from tests.inputs import batch, gen, linear, make_decoder, mlp, wrapped

F64 = torch.float64
WHICH = ("top", "second", "lowest", "random")


def test_imports_this_checkout():
    assert Path(attnmetrics.__file__).resolve().is_relative_to(Path(__file__).resolve().parents[1])
    assert attnmetrics.single_removal is single_removal
    assert attnmetrics.SingleRemovalResult is SingleRemovalResult


def run(att, values, dec, lengths, which="top", seed=0, **kw):
    return single_removal(att, values, dec, lengths, which, generator=gen(seed), **kw)


def expected(att, values, dec, lengths, which, got):
    """The reference on the same rows; for "random" on the positions the run drew."""
    return single_removal_reference(att, values, dec, lengths, got.removed_index if which == "random" else which)


def assert_same(got: SingleRemovalResult, want: SingleRemovalResult, tol=1e-12):
    assert torch.equal(got.removed_index, want.removed_index)
    assert torch.equal(got.flipped, want.flipped)
    torch.testing.assert_close(got.removed_weight, want.removed_weight, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got.jsd, want.jsd, rtol=0, atol=tol, equal_nan=True)


# ---- parity with the reference ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("which", WHICH)
def test_parity(kind, classes, which):
    att, values, lengths = batch(b=60, seed=classes)
    dec = make_decoder(kind, values.shape[2], classes)
    got = run(att, values, dec, lengths, which)
    assert_same(got, expected(att, values, dec, lengths, which, got))
    long = lengths >= 2
    assert (got.jsd[long] > 0).all() and got.jsd[~long].isnan().all()
    assert (got.jsd[long] <= math.log(2)).all()
    if which == "top":
        assert got.flipped.any() and not got.flipped.all()


def test_which_picks_the_defined_weight():
    # ties: top and second are the two tied maxima in index order; lowest the first minimum
    att = torch.tensor([[0.1, 0.3, 0.2, 0.3, 0.1], [0.2] * 5, [0.5, 0.5, 0.0, 0.0, 0.0]], dtype=F64)
    values = torch.randn(3, 5, 2, generator=gen(0), dtype=F64)
    lengths = torch.tensor([5, 5, 2])
    want = {"top": [1, 0, 0], "second": [3, 1, 1], "lowest": [0, 0, 0]}
    for which, index in want.items():
        got = single_removal(att, values, linear(2, 2), lengths, which)
        assert got.removed_index.tolist() == index
        assert got.removed_weight.tolist() == [att[b, i].item() for b, i in enumerate(index)]
        assert_same(got, single_removal_reference(att, values, linear(2, 2), lengths, which))


def ss_random_reference(att, lengths, draws):
    """S&S's random non-top item, one row at a time: their ``random.randint(1, len - 1)`` into the
    descending order (serrano-s/attn-tests test_model.py:1021-1028; the two-item row removes the
    second, the one-item row nothing), with ``1 + d % (L - 1)`` for their randint, ``d`` our draw."""
    out = []
    for b in range(att.shape[0]):
        n = int(lengths[b])
        if n <= 1:
            out.append(-1)
            continue
        by_weight = sorted(range(n), key=lambda t: (-float(att[b, t]), t))  # descending, ties by index
        out.append(by_weight[1 + int(draws[b]) % (n - 1)])
    return out


def test_random_positions():
    att, values, lengths = batch(b=40, seed=5)
    dec = linear(6, 2)
    a = run(att, values, dec, lengths, "random", seed=3)
    assert torch.equal(a.removed_index, run(att, values, dec, lengths, "random", seed=3).removed_index)
    assert not torch.equal(a.removed_index, run(att, values, dec, lengths, "random", seed=4).removed_index)
    # random_among="all" (the old default): one randint(0, 2**62) per row, modulo L
    draw = torch.randint(0, 2**62, (40,), generator=gen(3))
    every = run(att, values, dec, lengths, "random", seed=3, random_among="all")
    assert torch.equal(every.removed_index, torch.where(lengths <= 1, -1, draw % lengths.clamp(min=1)))
    assert_same(every, expected(att, values, dec, lengths, "random", every))
    # uniform over the real tokens: 5-item rows, 20k draws
    att5 = torch.full((20000, 7), 0.2, dtype=F64)
    idx = single_removal(
        att5,
        torch.zeros(20000, 7, 1, dtype=F64),
        linear(1, 2),
        torch.full((20000,), 5),
        "random",
        random_among="all",
        generator=gen(9),
    ).removed_index
    assert idx.min() == 0 and idx.max() == 4
    assert scipy_stats.chisquare(torch.bincount(idx, minlength=5).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("keyed", [False, True])
def test_random_is_a_non_top_item_as_s_and_s(keyed):
    # the default: S&S's random item is drawn among the non-top items, in their sorted order
    att, values, lengths = batch(b=300, seed=6)
    att[:5] = 0.0  # rows 0-4: lengths 0, 1, 2, a tie for the top, a tie among the rest
    lengths[:5] = torch.tensor([0, 1, 2, 4, 4])
    att[1, 0] = 1.0
    att[2, :2] = torch.tensor([0.3, 0.7], dtype=F64)
    att[3, :4] = torch.tensor([0.4, 0.1, 0.4, 0.1], dtype=F64)
    att[4, :4] = torch.tensor([0.1, 0.7, 0.1, 0.1], dtype=F64)
    dec = make_decoder("mlp", 6, 3)
    generator = attnmetrics.KeyedRows(11, 40) if keyed else gen(11)
    got = single_removal(att, values, dec, lengths, "random", generator=generator)
    draws = attnmetrics.KeyedRows(11, 40).integers(300) if keyed else torch.randint(0, 2**62, (300,), generator=gen(11))
    assert got.removed_index.tolist() == ss_random_reference(att, lengths, draws)
    assert_same(got, expected(att, values, dec, lengths, "random", got))
    top = single_removal(att, values, dec, lengths, "top").removed_index
    long = lengths >= 2
    assert (got.removed_index[long] != top[long]).all()
    assert got.removed_index[:3].tolist() == [-1, -1, 0]  # L = 2: the other (lower) weight
    assert got.jsd[:2].isnan().all() and not got.flipped[:2].any() and got.removed_weight[:2].isnan().all()
    assert got.removed_index[3].item() in (1, 2, 3)  # tied top: index 0 is the top, index 2 may be drawn


def test_random_never_draws_the_top_and_is_uniform_over_the_rest():
    # 20k rows of 5 distinct weights, the top at a varying place: never the top, the other 4 uniform
    n = 20000
    att = torch.rand(n, 5, generator=gen(2), dtype=F64)
    att = att / att.sum(1, keepdim=True)
    lengths = torch.full((n,), 5)
    got = single_removal(att, torch.zeros(n, 5, 1, dtype=F64), linear(1, 2), lengths, "random", generator=gen(9))
    assert (got.removed_index != att.argmax(1)).all()
    rank = (att > att.gather(1, got.removed_index[:, None])).sum(1)  # 0 = top
    assert rank.min() == 1 and rank.max() == 4
    assert scipy_stats.chisquare(torch.bincount(rank, minlength=5)[1:].numpy()).pvalue > 1e-3
    # the old draw over all tokens hits the top a fifth of the time
    every = single_removal(
        att, torch.zeros(n, 5, 1, dtype=F64), linear(1, 2), lengths, "random", random_among="all", generator=gen(9)
    )
    assert abs((every.removed_index == att.argmax(1)).double().mean().item() - 0.2) < 0.02


def test_random_not_first_is_s_and_s_code_as_it_runs():
    # S&S's code zeroes the weight at the drawn rank's position: 1 + randint over [0, L - 2], never 0
    att, values, lengths = batch(b=200, seed=4)
    dec = linear(6, 2)
    got = run(att, values, dec, lengths, "random", seed=5, random_among="not_first")
    draw = torch.randint(0, 2**62, (200,), generator=gen(5))
    assert torch.equal(got.removed_index, torch.where(lengths <= 1, -1, 1 + draw % (lengths - 1).clamp(min=1)))
    assert_same(got, expected(att, values, dec, lengths, "random", got))


def test_random_among_is_checked():
    att, values, lengths = batch(b=4, seed=1)
    for bad in ("nontop", "top", None, 1):
        with pytest.raises(ValueError, match="random_among must be one of"):
            single_removal(att, values, linear(6, 2), lengths, "random", random_among=bad)


def test_short_rows_and_empty_rows():
    att, values, lengths = batch(b=6, t=5, seed=7)
    lengths = torch.tensor([0, 1, 0, 5, 1, 2])
    att = torch.where(torch.arange(5) < lengths[:, None], att + 1, 0)
    att = att / att.sum(1, keepdim=True).clamp(min=1)
    for dec in (linear(6, 2), mlp(6, 1)):
        for which in WHICH:
            got = run(att, values, dec, lengths, which)
            assert_same(got, expected(att, values, dec, lengths, which, got))
            short = lengths <= 1
            assert got.jsd[short].isnan().all() and not got.flipped[short].any()
            assert (got.removed_index[short] == -1).all() and got.removed_weight[short].isnan().all()
    for t in (3, 0):
        none = single_removal(
            torch.zeros(2, t, dtype=F64),
            torch.zeros(2, t, 2, dtype=F64),
            linear(2, 2),
            torch.zeros(2, dtype=torch.int64),
        )
        assert none.jsd.isnan().all() and (none.removed_index == -1).all()


def test_zero_remaining_mass_is_zero_context():
    # one-hot attention, top removed: nothing is left, the context is 0 and the logits the bias
    dec = nn.Linear(2, 2).double()
    with torch.no_grad():
        dec.weight.copy_(torch.eye(2))
        dec.bias.copy_(torch.tensor([0.0, 0.5]))
    att = torch.tensor([[0.0, 1.0, 0.0]], dtype=F64)
    values = torch.tensor([[[9.0, 0.0], [3.0, 0.0], [0.0, 9.0]]], dtype=F64)
    p = torch.softmax(torch.tensor([[3.0, 0.5]], dtype=F64), 1)
    q = torch.softmax(torch.tensor([[0.0, 0.5]], dtype=F64), 1)
    m = (p + q) / 2
    want = 0.5 * float((p * (p / m).log()).sum() + (q * (q / m).log()).sum())
    for d in (dec, wrapped(dec)):
        got = single_removal(att, values, d)
        assert got.flipped.tolist() == [True] and got.removed_index.tolist() == [1]
        assert got.jsd.item() == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("classes", [1, 3])
def test_float32(kind, classes):
    att, values, lengths = batch(b=80, t=15, seed=17)
    att32, values32 = att.float(), values.float()
    dec32 = make_decoder(kind, 6, classes, torch.float32)
    dec64 = make_decoder(kind, 6, classes)
    for which in ("top", "random"):
        got = run(att32, values32, dec32, lengths, which)
        assert got.jsd.dtype == torch.float32 and got.removed_weight.dtype == torch.float32
        want = single_removal_reference(
            att32.double(), values32.double(), dec64, lengths, got.removed_index if which == "random" else which
        )
        assert torch.equal(got.removed_index, want.removed_index)
        torch.testing.assert_close(got.jsd.double(), want.jsd, rtol=1e-4, atol=1e-6, equal_nan=True)
        # decisions may differ only within float32 rounding of a tie
        for b in (got.flipped != want.flipped).nonzero().flatten().tolist():
            n, i = int(lengths[b]), int(got.removed_index[b])
            w = att32[b, :n].double().clone()
            w[i] = 0
            z = dec64(((w / w.sum())[:, None] * values32[b, :n].double()).sum(0)[None])[0]
            margin = abs(z[0].item()) if classes == 1 else (z.topk(2).values[0] - z.topk(2).values[1]).item()
            assert margin < 1e-4


# ---- paths, chunking, batching ------------------------------------------------------------------


@pytest.mark.parametrize("classes", [1, 2, 4])
def test_closed_form_equals_general_path(classes):
    att, values, lengths = batch(b=300, t=20, h=7, seed=19)
    dec = linear(7, classes)
    for which in WHICH:
        closed = run(att, values, dec, lengths, which)
        assert_same(closed, run(att, values, wrapped(dec), lengths, which), tol=1e-14)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_any_memory_budget_same_answer(kind):
    att, values, lengths = batch(b=50, t=14, h=6, seed=23)
    dec = make_decoder(kind, 6, 3)
    for which in ("second", "random"):
        want = run(att, values, dec, lengths, which)
        for budget in (1, 2000, 10**6):
            assert_same(run(att, values, dec, lengths, which, memory_budget=budget), want, tol=1e-15)


def test_non_contiguous_and_padding_garbage():
    att, values, lengths = batch(b=20, t=9, h=5, seed=13)
    att_nc = att.t().contiguous().t()
    values_nc = values.transpose(1, 2).contiguous().transpose(1, 2)
    assert not att_nc.is_contiguous() and not values_nc.is_contiguous()
    pad = torch.arange(9) >= lengths[:, None]
    values_bad = values.masked_fill(pad[..., None], math.nan)  # padding is never read
    att_bad = att + pad * 3.0
    for dec in (linear(5, 3), mlp(5, 3)):
        for which in ("top", "lowest"):
            want = run(att, values, dec, lengths, which)
            assert_same(run(att_nc, values_nc, dec, lengths, which), want, tol=0)
            assert_same(run(att_bad, values_bad, dec, lengths, which), want, tol=1e-15)


def test_one_decoder_call_per_chunk():
    att, values, lengths = batch(b=30, t=10, h=4, seed=29)
    lin = linear(4, 2)
    calls = []

    def dec(x):
        calls.append(x.shape[0])
        return lin(x)

    single_removal(att, values, dec, lengths)
    assert calls == [2 * int((lengths >= 2).sum())]  # original and new context of every row


def test_linear_with_a_hook_is_called_as_is():
    att, values, lengths = batch(b=30, t=10, seed=53)
    lin = linear(6, 2)
    plain = single_removal(att, values, lin, lengths)
    lin.register_forward_hook(lambda mod, inp, out: out * torch.tensor([1.0, -3.0], dtype=F64))
    got = single_removal(att, values, lin, lengths)
    assert_same(got, single_removal_reference(att, values, lin, lengths, "top"))
    assert not torch.allclose(got.jsd, plain.jsd, equal_nan=True)


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 6),
    t=st.integers(0, 8),
    h=st.integers(1, 4),
    c=st.integers(1, 3),
    seed=st.integers(0, 10**6),
    kind=st.sampled_from(["linear", "mlp"]),
    which=st.sampled_from(WHICH),
)
def test_properties(b, t, h, c, seed, kind, which):
    att, values, lengths = batch(b, t, h, seed=seed)
    dec = make_decoder(kind, h, c)
    got = run(att, values, dec, lengths, which, seed=seed)
    assert all(f.shape == (b,) for f in got)
    ok = lengths >= 2
    assert ((got.removed_index >= 0) & (got.removed_index < lengths) == ok).all()
    assert_same(got, expected(att, values, dec, lengths, which, got))


# ---- errors ----------------------------------------------------------------------------------


def test_clear_errors():
    att, values, lengths = batch(b=4, t=5, h=3, seed=47, min_len=2)
    dec = linear(3, 2)

    def call(**kw):
        a = dict(attention=att, values=values, decoder=dec, lengths=lengths) | kw
        return single_removal(a.pop("attention"), a.pop("values"), a.pop("decoder"), a.pop("lengths"), **a)

    nan = att.clone()
    nan[0, 0] = math.nan
    bad_values = values.clone()
    bad_values[1, 0, 0] = math.inf
    cases = [
        (dict(attention=nan), "attention.*NaN"),
        (dict(attention=att * 1.5), "attention rows must sum to 1"),
        (dict(attention=att[:0], values=values[:0], lengths=lengths[:0]), "empty batch"),
        (dict(values=values[:, :4]), r"values must have shape \[B, T, H\]"),
        (dict(values=values.float()), "values dtype"),
        (dict(lengths=torch.tensor([1, 2, 3, 6])), "lengths must lie in"),
        (dict(which="max"), "which must be one of"),
        (dict(which=0), "which must be one of"),
        (dict(memory_budget=0), "memory_budget"),
        (dict(decoder=linear(4, 2)), "in_features 4.*H = 3"),
        (dict(values=bad_values), "values must be finite"),
        (dict(values=bad_values, decoder=wrapped(dec)), "values must be finite"),
        (dict(decoder=lambda x: x.sum(1)), r"logits \[N, C\]"),
        (dict(decoder=lambda x: x[:, :2] / 0), "NaN or infinite logits"),
    ]
    for kw, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call(**kw)
    with pytest.raises(TypeError, match="decoder must be callable"):
        call(decoder=3)


# ---- McNemar's exact test ------------------------------------------------------------------


def exact_two_sided(k, n):
    """Two-sided exact binomial p-value at p = ½, by hand: twice the smaller tail, at most 1."""
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(b01, b10, both=0, neither=0):
    a = [False] * b01 + [True] * b10 + [True] * both + [False] * neither
    b = [True] * b01 + [False] * b10 + [True] * both + [False] * neither
    return a, b


@pytest.mark.parametrize("b01,b10", [(3, 12), (12, 3), (0, 5), (7, 7), (1, 0), (40, 25)])
def test_mcnemar_by_hand(b01, b10):
    a, b = paired(b01, b10, both=9, neither=4)
    got = mcnemar(torch.tensor(a), np.array(b))
    assert (got.b01, got.b10) == (b01, b10)
    assert got.pvalue == pytest.approx(exact_two_sided(b01, b01 + b10), rel=1e-12)
    assert got.pvalue == pytest.approx(scipy_stats.binomtest(b01, b01 + b10).pvalue, rel=1e-12)
    # concordant pairs do not change the test
    assert mcnemar(*paired(b01, b10)) == got


def test_mcnemar_known_values_and_edges():
    assert mcnemar(*paired(3, 12)).pvalue == pytest.approx(2 * 576 / 2**15)  # 1 + 15 + 105 + 455
    assert mcnemar(*paired(0, 0, both=5, neither=3)) == McNemar(0, 0, 1.0)
    assert mcnemar([], []) == McNemar(0, 0, 1.0)
    assert mcnemar(*paired(6, 6)).pvalue == 1.0
    with pytest.raises(ValueError, match="booleans"):
        mcnemar([1, 0], [0, 1])
    with pytest.raises(ValueError, match="one length"):
        mcnemar([True], [True, False])
    with pytest.raises(ValueError, match="one-dimensional"):
        mcnemar(np.zeros((2, 2), bool), np.zeros((2, 2), bool))


def test_top_vs_random_flips_as_s_and_s():
    att, values, lengths = batch(b=300, t=15, seed=61, temperature=3.0, min_len=2)
    dec = linear(6, 2)
    top = single_removal(att, values, dec, lengths, "top").flipped
    rand = single_removal(att, values, dec, lengths, "random", generator=gen(1)).flipped
    res = mcnemar(top, rand)
    assert res.b01 == int((~top & rand).sum()) and res.b10 == int((top & ~rand).sum())
    assert res.b10 > res.b01  # the top weight matters more than a random one


def test_docstring_examples():
    import doctest
    import importlib

    # importlib, not attribute access: attnmetrics.single_removal is also the function's name
    for module in map(importlib.import_module, ("attnmetrics.single_removal", "attnmetrics.stats")):
        result = doctest.testmod(module, extraglobs={"torch": torch})
        assert result.attempted > 0 and result.failed == 0, module.__name__
