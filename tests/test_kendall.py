"""kendall_tau against scipy.stats.kendalltau, one call per row on the valid prefix."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from attnmetrics import kendall_tau
from attnmetrics._ops import ops
from attnmetrics.testing.reference import kendall_tau_reference


def scipy_rows(x, y, lengths):
    """(tau, p) per row from scipy on the same values (float64 results)."""
    xs, ys = x.numpy(), y.numpy()
    out = np.full((2, len(lengths)), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rows shorter than 2
        for b, n in enumerate(lengths.tolist()):
            res = stats.kendalltau(xs[b, :n], ys[b, :n])
            out[:, b] = res.statistic, res.pvalue
    return out


def check(x, y, lengths=None):
    """Compare with scipy: tau to the last bits, p to 1e-12 (1e-9 in the far tail,
    where libm's and cephes' erfc part ways)."""
    full = torch.full((x.shape[0],), x.shape[1]) if lengths is None else lengths
    tau, p = kendall_tau(x, y, lengths)
    assert tau.dtype == p.dtype == x.dtype and tau.shape == p.shape == (x.shape[0],)
    want_tau, want_p = scipy_rows(x, y, full)
    if x.dtype == torch.float32:
        want_tau, want_p = want_tau.astype(np.float32), want_p.astype(np.float32)
        np.testing.assert_allclose(tau.numpy(), want_tau, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(p.numpy(), want_p, rtol=1e-6, atol=1e-30)
        return tau, p
    np.testing.assert_allclose(tau.numpy(), want_tau, rtol=1e-14, atol=1e-15)
    tail = want_p < 1e-50
    np.testing.assert_allclose(p.numpy()[~tail], want_p[~tail], rtol=1e-12, atol=0)
    np.testing.assert_allclose(p.numpy()[tail], want_p[tail], rtol=1e-9, atol=0)
    return tau, p


def ragged(rng, batch, width, low=0):
    return torch.from_numpy(rng.integers(low, width + 1, batch))


def test_random_ragged_batch():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((300, 80)))
    y = torch.from_numpy(rng.standard_normal((300, 80)))
    check(x, y, ragged(rng, 300, 80))


@pytest.mark.parametrize("levels", [1, 2, 5])
def test_ties_in_x_and_y(levels):
    rng = np.random.default_rng(levels)
    x = torch.from_numpy(np.round(rng.standard_normal((200, 120)) * levels))
    y = torch.from_numpy(np.round(rng.standard_normal((200, 120)) * levels))
    tau, _ = check(x, y, ragged(rng, 200, 120))
    check(x, x + torch.from_numpy(rng.integers(0, 2, x.shape)), ragged(rng, 200, 120))  # correlated, joint ties
    check(x, torch.from_numpy(rng.standard_normal((200, 120))))  # ties in x only


def test_exact_regime_is_bit_for_bit():
    """Tie-free rows with L <= 33 take the exact p-value: same bits as scipy."""
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((400, 33)))
    y = torch.from_numpy(rng.standard_normal((400, 33)))
    y[::3] = x[::3] + 0.3 * y[::3]  # strong correlations: small p-values too
    lengths = ragged(rng, 400, 33, low=2)
    tau, p = kendall_tau(x, y, lengths)
    want_tau, want_p = scipy_rows(x, y, lengths)
    np.testing.assert_array_equal(tau.numpy(), want_tau)
    np.testing.assert_array_equal(p.numpy(), want_p)


@pytest.mark.parametrize("width", [50, 120, 400])
@pytest.mark.parametrize("levels", [None, 3])
def test_asymptotic_regime(width, levels):
    rng = np.random.default_rng(width)
    x = rng.standard_normal((60, width))
    y = 0.5 * x + rng.standard_normal((60, width))
    if levels:
        x, y = np.round(x * levels), np.round(y * levels)
    check(torch.from_numpy(x), torch.from_numpy(y), ragged(rng, 60, width, low=34))


@pytest.mark.parametrize("n", [34, 100, 170, 171, 172, 300])
def test_at_most_one_discordant_or_concordant_pair(n):
    """L > 33 but min(dis, tot - dis) <= 1: still the exact p-value (0 past 171!)."""
    x = torch.arange(n, dtype=torch.float64)
    swapped = x.clone()
    swapped[[5, 6]] = swapped[[6, 5]]
    y = torch.stack([x, swapped, -x, -swapped, x.flip(0)])
    tau, p = check(x.expand_as(y), y)
    np.testing.assert_array_equal(np.abs(tau.numpy()) == 1, [True, False, True, False, True])


def test_short_empty_and_padding_rows():
    x = torch.tensor([[1.0, 2.0, 3.0], [3.0, 1.0, 2.0], [5.0, 4.0, 0.0], [1.0, 1.0, 1.0]])
    y = torch.tensor([[2.0, 1.0, 9.0], [1.0, 2.0, 3.0], [1.0, 3.0, 0.0], [2.0, 2.0, 2.0]])
    lengths = torch.tensor([0, 1, 2, 3])
    tau, p = check(x, y, lengths)
    assert tau[:2].isnan().all() and p[:2].isnan().all()
    assert tau[2] == -1 and p[2] == 1  # n = 2: exact, p = 1
    assert tau[3].isnan() and p[3].isnan()  # constant rows


def test_padding_is_never_read():
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.standard_normal((20, 30)))
    y = torch.from_numpy(rng.standard_normal((20, 30)))
    lengths = ragged(rng, 20, 30)
    mask = torch.arange(30) >= lengths[:, None]
    tau, p = kendall_tau(x, y, lengths)
    tau2, p2 = kendall_tau(x.masked_fill(mask, float("nan")), y.masked_fill(mask, 7.0), lengths)
    torch.testing.assert_close((tau2, p2), (tau, p), rtol=0, atol=0, equal_nan=True)


def test_all_padding_rows():
    tau, p = kendall_tau(torch.zeros(4, 6), torch.zeros(4, 6), torch.zeros(4, dtype=torch.int64))
    assert tau.isnan().all() and p.isnan().all()
    tau, p = kendall_tau(torch.zeros(3, 0), torch.zeros(3, 0))
    assert tau.isnan().all() and p.isnan().all()


def test_constant_rows():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((3, 10)))
    y = torch.from_numpy(rng.standard_normal((3, 10)))
    x[0] = 2.0
    y[1] = -1.0
    x[2], y[2] = 0.0, 0.0
    tau, p = check(x, y)
    assert tau.isnan().all() and p.isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_infinities_and_signed_zeros_rank_like_scipy(dtype):
    """float32 rows are sorted on integer keys: -0 must tie with +0, infinities order."""
    rng = np.random.default_rng(4)
    x = torch.from_numpy(np.round(rng.standard_normal((10, 40)))).to(dtype)
    y = torch.from_numpy(rng.standard_normal((10, 40))).to(dtype)
    x[:, ::7] = float("inf")
    x[:, 1::6] = -0.0
    x[:, 2::6] = 0.0
    y[:, ::5] = -float("inf")
    y[:, 1::4] = -0.0
    y[:, 3::4] = 0.0
    check(x, y)
    check(-x, y, ragged(rng, 10, 40))


def test_non_contiguous_inputs():
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.standard_normal((50, 40)))
    y = torch.from_numpy(np.round(rng.standard_normal((50, 80)) * 2))
    lengths = ragged(rng, 50, 40)
    xt = x.t().contiguous().t()  # column-major
    ys = y[:, ::2]  # strided
    assert not xt.is_contiguous() and not ys.is_contiguous()
    want = kendall_tau(x, ys.contiguous(), lengths)
    torch.testing.assert_close(kendall_tau(xt, ys, lengths), want, rtol=0, atol=0, equal_nan=True)
    check(xt, ys, lengths)


def test_float32():
    rng = np.random.default_rng(6)
    x = torch.from_numpy(rng.standard_normal((100, 60))).float()
    y = torch.from_numpy(np.round(rng.standard_normal((100, 60)) * 2)).float()
    check(x, y, ragged(rng, 100, 60))
    check(x, x * 2 + y * 0.1, ragged(rng, 100, 60))


def test_int32_lengths_and_list_lengths():
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal((5, 9)))
    y = torch.from_numpy(rng.standard_normal((5, 9)))
    lengths = torch.tensor([9, 3, 0, 2, 8])
    want = kendall_tau(x, y, lengths)
    torch.testing.assert_close(kendall_tau(x, y, lengths.int()), want, equal_nan=True)
    torch.testing.assert_close(kendall_tau(x, y, lengths.tolist()), want, equal_nan=True)


def test_long_rows():
    rng = np.random.default_rng(8)
    x = torch.from_numpy(np.round(rng.standard_normal((3, 3000)) * 4))
    y = x + torch.from_numpy(rng.standard_normal((3, 3000)))
    check(x, y)


def test_matches_reference():
    rng = np.random.default_rng(9)
    x = torch.from_numpy(rng.standard_normal((40, 50)))
    y = torch.from_numpy(np.round(rng.standard_normal((40, 50))))
    lengths = ragged(rng, 40, 50)
    torch.testing.assert_close(
        kendall_tau(x, y, lengths), kendall_tau_reference(x, y, lengths), rtol=1e-12, atol=0, equal_nan=True
    )


@settings(max_examples=80, deadline=None)
@given(
    batch=st.integers(1, 6),
    width=st.integers(0, 45),
    levels=st.sampled_from([None, 1, 2, 4]),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_hypothesis_shapes(batch, width, levels, seed, dtype):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, width))
    y = rng.uniform(-1, 1, (batch, width)) + x * rng.uniform(-2, 2)
    if levels:
        x, y = np.round(x * levels), np.round(y * levels)
    check(torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype), ragged(rng, batch, width))


def test_opcheck():
    rng = np.random.default_rng(10)
    for dtype in (torch.float32, torch.float64):
        for batch, width in [(3, 8), (1, 40)]:
            x = torch.from_numpy(rng.standard_normal((batch, width))).to(dtype)
            y = torch.from_numpy(rng.standard_normal((batch, width))).to(dtype)
            lengths = torch.full((batch,), width, dtype=torch.int64)
            lengths[0] = 5
            torch.library.opcheck(ops.kendall_tau, (x, y, lengths))


# ---- errors ----------------------------------------------------------------------------------

X = torch.rand(3, 5)


@pytest.mark.parametrize(
    "x, y, lengths, match",
    [
        (
            X.masked_fill(torch.eye(3, 5, dtype=torch.bool), float("nan")),
            X,
            None,
            "x contains NaN in the valid prefix of row 0",
        ),
        (X, torch.cat([X[:2], torch.full((1, 5), float("nan"))]), None, "y contains NaN in the valid prefix of row 2"),
        (X, torch.rand(3, 4), None, r"y must have x's shape \[3, 5\], got \[3, 4\]"),
        (X, X.double(), None, "x and y must have one dtype, got x torch.float32 and y torch.float64"),
        (X.long(), X, None, "x must be float32 or float64, got torch.int64"),
        (X, X.half(), None, "y must be float32 or float64, got torch.float16"),
        (X[0], X[0], None, r"x must have shape \[B, T\], got \[5\]"),
        (torch.rand(0, 5), torch.rand(0, 5), None, r"x is an empty batch \(B = 0"),
        (X, X, torch.tensor([5, 6, 1]), r"lengths must lie in \[0, T\] = \[0, 5\], got min 1, max 6"),
        (X, X, torch.tensor([5, -1, 1]), r"lengths must lie in \[0, T\] = \[0, 5\], got min -1"),
        (X, X, torch.tensor([5, 5]), r"lengths must have shape \[B\] = \[3\], got \[2\]"),
        (X, X, torch.tensor([5.0, 5.0, 5.0]), "lengths must be an integer tensor, got torch.float32"),
    ],
)
def test_errors_name_the_argument(x, y, lengths, match):
    with pytest.raises(ValueError, match=match):
        kendall_tau(x, y, lengths)


def test_nan_outside_the_prefix_is_fine():
    x = X.clone()
    x[0, 4] = float("nan")
    kendall_tau(x, X, torch.tensor([4, 5, 5]))


def test_op_rejects_bad_input_without_crashing():
    x, full = torch.rand(3, 5), torch.full((3,), 5)
    bad = [
        ((x, x, torch.tensor([5, 6, 1])), r"lengths\[1\] = 6 is outside \[0, T\] = \[0, 5\]"),
        ((x, x, torch.tensor([5, -2, 1])), r"lengths\[1\] = -2 is outside"),
        ((x, torch.rand(3, 4), full), "y must have x's shape"),
        ((x, x, torch.full((2,), 5)), r"lengths must be \[B\] = \[3\]"),
        ((x, x, full.int()), "lengths must be int64"),
        ((x, x.double(), full), "y must have x's dtype"),
        ((x.long(), x.long(), full), "x must be float32 or float64"),
        ((x[0], x[0], full[:1]), r"x must be \[B, T\]"),
        ((torch.rand(5, 3).t(), x, full), "x and y must be contiguous"),
    ]
    for args, match in bad:
        with pytest.raises(RuntimeError, match=match):
            ops.kendall_tau(*args)


def test_op_propagates_nan_like_scipy():
    x = torch.rand(2, 6, dtype=torch.float64)
    x[0, 2] = float("nan")
    tau, p = ops.kendall_tau(x, torch.rand(2, 6, dtype=torch.float64), torch.full((2,), 6))
    assert tau[0].isnan() and p[0].isnan() and not tau[1].isnan()


@pytest.mark.parametrize("which", ["x", "y"])
def test_inputs_that_require_grad_are_refused(which):
    # tau used to come back with a grad_fn whose backward gave no gradient (only a warning)
    x, y = torch.rand(2, 5, dtype=torch.float64), torch.rand(2, 5, dtype=torch.float64)
    args = {"x": x, "y": y}
    args[which] = args[which].clone().requires_grad_(True)
    with pytest.raises(ValueError, match=rf"{which} requires grad.*no autograd: detach the inputs"):
        kendall_tau(args["x"], args["y"])
    with torch.no_grad():  # nobody asks for a gradient here
        got = kendall_tau(args["x"], args["y"])
    assert torch.equal(got.tau, kendall_tau(x, y).tau)
