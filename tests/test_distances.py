"""tvd / jsd against independent references: scipy's jensenshannon and a numpy formula."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon

from attnmetrics import jsd, tvd
from attnmetrics._ops import ops
from attnmetrics.testing.reference import jsd_reference, tvd_reference

LN2 = math.log(2.0)


def distributions(rng, shape, zeros=0.0):
    """Rows along the last dim summing to 1 (float64), a fraction `zeros` of entries exactly 0."""
    w = rng.exponential(size=shape)
    if zeros:
        w[rng.random(shape) < zeros] = 0.0
        w[..., 0] += w.sum(-1) == 0  # keep every row a distribution
    return w / w.sum(-1, keepdims=True)


def scipy_jsd(p, q):
    # jensenshannon is the distance (square root) and renormalises; base e by default.
    return np.array([jensenshannon(a, b) ** 2 for a, b in zip(p, q)])


def numpy_tvd(p, q):
    return 0.5 * np.abs(p - q).sum(-1)


@pytest.mark.parametrize("zeros", [0.0, 0.3, 0.8])
@pytest.mark.parametrize("k", [1, 2, 7, 64, 300])
def test_matches_scipy_and_numpy_float64(k, zeros):
    rng = np.random.default_rng(k)
    p, q = distributions(rng, (50, k), zeros), distributions(rng, (50, k), zeros)
    got_j = jsd(torch.from_numpy(p), torch.from_numpy(q)).numpy()
    got_t = tvd(torch.from_numpy(p), torch.from_numpy(q)).numpy()
    np.testing.assert_allclose(got_j, scipy_jsd(p, q), rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(got_t, numpy_tvd(p, q), rtol=1e-13, atol=1e-16)


def test_float32_accumulates_in_double():
    rng = np.random.default_rng(0)
    p32 = torch.from_numpy(distributions(rng, (100, 500), 0.2)).float()
    q32 = torch.from_numpy(distributions(rng, (100, 500), 0.2)).float()
    p64, q64 = p32.double().numpy(), q32.double().numpy()  # the float32 values, exactly
    got_j, got_t = jsd(p32, q32), tvd(p32, q32)
    assert got_j.dtype == got_t.dtype == torch.float32
    # One rounding to float32 at the end, nothing accumulated in float32.
    np.testing.assert_allclose(
        got_j.numpy(), scipy_jsd(p64 / p64.sum(1, keepdims=True), q64 / q64.sum(1, keepdims=True)), rtol=1e-5
    )
    expected_t = numpy_tvd(p64, q64)
    np.testing.assert_allclose(got_t.numpy(), expected_t.astype(np.float32), rtol=2e-7)


def test_disjoint_and_identical_rows():
    p = torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]], dtype=torch.float64)
    q = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]], dtype=torch.float64)
    np.testing.assert_allclose(jsd(p, q).numpy(), [LN2, 0.0, 0.0], atol=1e-16)
    np.testing.assert_allclose(tvd(p, q).numpy(), [1.0, 0.0, 0.0], atol=1e-16)


def test_matches_reference():
    rng = np.random.default_rng(3)
    p = torch.from_numpy(distributions(rng, (20, 9), 0.3))
    q = torch.from_numpy(distributions(rng, (20, 9), 0.3))
    torch.testing.assert_close(jsd(p, q), jsd_reference(p, q), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(tvd(p, q), tvd_reference(p, q), rtol=1e-13, atol=1e-15)


def jsd_long_double(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(JSD per row, its error scale) in numpy's long double (x86's 80-bit: 64-bit mantissa, logl),
    0 log 0 = 0: a reference a few bits more precise than float64. The scale is
    ½ Σ x (1 + |log(x / m)|): float64 rounds each ratio x / m (an error of an ulp in the log, however
    small the log) and each log (an ulp of it), so a correct kernel is within a few ulps of it."""
    p, q = p.astype(np.longdouble), q.astype(np.longdouble)
    m = (p + q) / 2

    def parts(x):
        with np.errstate(divide="ignore", invalid="ignore"):
            log = np.where(x > 0, np.log(x / m), 0)
        return x * log, x * (1 + np.abs(log))

    (tp, sp), (tq, sq) = parts(p), parts(q)
    return (tp + tq).sum(-1) / 2, (sp + sq).sum(-1) / 2


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),  # four entries a step on AVX2 CPUs, then a masked tail of one to three
    st.sampled_from(["spread", "near equal", "tiny", "zeros", "subnormal"]),
    st.integers(0, 2**31 - 1),
)
def test_jsd_float64_within_ulps_of_a_long_double_reference(width, kind, seed):
    """jsd's float64 kernel (on AVX2 CPUs four logs at once, from the ratio of each pair's smaller
    entry; the others entry by entry) against a long double reference: the error stays within
    a few float64 ulps of the reference's error scale, over probabilities spread across 300 decades,
    pairs nearly equal (where the terms cancel), exact zeros, and subnormals (the scalar lanes)."""
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("numpy's long double is float64 on this platform")
    rng = np.random.default_rng(seed)
    p = rng.random((3, width))
    if kind == "spread":
        p = p * 10.0 ** -rng.integers(0, 300, (3, width))
        q = rng.random((3, width)) * 10.0 ** -rng.integers(0, 300, (3, width))
    elif kind == "near equal":
        q = p * (1 + rng.uniform(-1e-9, 1e-9, p.shape))
    elif kind == "tiny":
        q = p * 1e-200
    elif kind == "zeros":
        q = rng.random((3, width))
        p[rng.random(p.shape) < 0.4] = 0
        q[rng.random(q.shape) < 0.4] = 0
    else:
        q = np.where(rng.random(p.shape) < 0.5, 5e-324 * rng.integers(1, 10**6, p.shape), rng.random(p.shape))
    want, size = jsd_long_double(p, q)
    got = ops.jsd(torch.from_numpy(p), torch.from_numpy(q)).numpy()
    err = np.abs(got.astype(np.longdouble) - want)
    assert (err <= 8 * np.finfo(np.float64).eps * size + 1e-300).all(), (err, size)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
def test_dim(dim):
    rng = np.random.default_rng(5)
    p = torch.from_numpy(rng.random((4, 5, 6)))
    q = torch.from_numpy(rng.random((4, 5, 6)))
    p, q = p / p.sum(dim, keepdim=True), q / q.sum(dim, keepdim=True)
    for fn, ref in ((jsd, jsd_reference), (tvd, tvd_reference)):
        got = fn(p, q, dim=dim)
        assert got.shape == ref(p, q, dim).shape
        torch.testing.assert_close(got, ref(p, q, dim), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "p_shape, q_shape, dim",
    [((6, 5), (5,), -1), ((1, 5), (6, 5), -1), ((3, 1, 5), (4, 5), -1), ((5, 1), (5, 7), 0), ((5,), (5,), 0)],
)
def test_broadcasting(p_shape, q_shape, dim):
    rng = np.random.default_rng(7)
    p = torch.from_numpy(rng.random(p_shape))
    q = torch.from_numpy(rng.random(q_shape))
    shape = torch.broadcast_shapes(p.shape, q.shape)
    pe, qe = p.expand(shape), q.expand(shape)
    for fn, ref in ((jsd, jsd_reference), (tvd, tvd_reference)):
        got = fn(p, q, dim=dim)
        torch.testing.assert_close(got, ref(pe, qe, dim), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(got, fn(pe.contiguous(), qe.contiguous(), dim=dim), rtol=0, atol=0)


def test_non_contiguous_inputs():
    rng = np.random.default_rng(11)
    p = torch.from_numpy(distributions(rng, (30, 8)))
    q = torch.from_numpy(distributions(rng, (30, 8)))
    pt = p.t().contiguous().t()  # column-major storage
    qs = torch.zeros(30, 16, dtype=torch.float64)[:, ::2]
    qs.copy_(q)  # strided view
    assert not pt.is_contiguous() and not qs.is_contiguous()
    for fn in (jsd, tvd):
        torch.testing.assert_close(fn(pt, qs), fn(p, q), rtol=0, atol=0)


@pytest.mark.parametrize("budget", [1, 100, 1000, 10**9])
@pytest.mark.parametrize(
    "p_shape, q_shape, dim", [((37, 5), (37, 5), -1), ((3, 11, 4), (4,), -1), ((2, 3, 7, 5), (3, 1, 5), 2)]
)
def test_chunking_matches_unchunked(budget, p_shape, q_shape, dim):
    rng = np.random.default_rng(13)
    p = torch.from_numpy(rng.random(p_shape))
    q = torch.from_numpy(rng.random(q_shape))
    for fn in (jsd, tvd):
        torch.testing.assert_close(fn(p, q, dim, memory_budget=budget), fn(p, q, dim), rtol=0, atol=0)


def test_large_batch_bounded_chunks():
    rng = np.random.default_rng(17)
    p = torch.from_numpy(distributions(rng, (200_000, 3))).float()
    q = torch.from_numpy(distributions(rng, (3,))).float()  # broadcast over the batch
    got = jsd(p, q, memory_budget=2**20)
    torch.testing.assert_close(got, jsd_reference(p.double(), q.double()).float(), rtol=1e-5, atol=1e-7)


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 40),
    rows=st.integers(1, 8),
    zeros=st.sampled_from([0.0, 0.5, 0.9]),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_bounds_and_symmetry(k, rows, zeros, seed, dtype):
    rng = np.random.default_rng(seed)
    p = torch.from_numpy(distributions(rng, (rows, k), zeros)).to(dtype)
    q = torch.from_numpy(distributions(rng, (rows, k), zeros)).to(dtype)
    eps = 1e-6 if dtype == torch.float32 else 1e-12
    j, t = jsd(p, q), tvd(p, q)
    assert ((j >= 0) & (j <= LN2 + eps)).all()
    assert ((t >= 0) & (t <= 1 + eps)).all()
    assert torch.equal(tvd(q, p), t)
    torch.testing.assert_close(jsd(q, p), j, rtol=eps, atol=eps)
    assert (jsd(p, p) == 0).all() and (tvd(p, p) == 0).all()


@pytest.mark.parametrize("op", [ops.tvd, ops.jsd])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(op, dtype):
    rng = np.random.default_rng(19)
    for shape in [(4, 3), (1, 10), (0, 5), (7,), (2, 3, 5), (2, 0, 4)]:
        p = torch.from_numpy(rng.random(shape)).to(dtype)
        q = torch.from_numpy(rng.random(shape)).to(dtype)
        torch.library.opcheck(op, (p, q))


@pytest.mark.parametrize("ops_pair", [(ops.tvd, ops.tvd_checked), (ops.jsd, ops.jsd_checked)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ops_take_any_leading_dims(ops_pair, dtype):
    """The kernels reduce the last dim of [..., K]: a 3-d or 1-d input gives, bit for bit, the
    [N, K] view's rows in its leading shape."""
    rng = np.random.default_rng(23)
    for shape in [(2, 3, 13), (13,), (3, 1, 2, 9)]:
        p, q = (torch.from_numpy(rng.random(shape)).to(dtype) for _ in range(2))
        for op in ops_pair:
            args = (p, q) if op in (ops.tvd, ops.jsd) else (p, q, torch.zeros(1, dtype=torch.int32))
            flat = op(*(a.reshape(-1, shape[-1]) if a.dtype != torch.int32 else a for a in args))
            got = op(*args)
            assert got.shape == shape[:-1]
            assert torch.equal(got.reshape(-1), flat)


def in_place_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x [rows, K] as a tensor of its values that the kernels read in place, without a copy:
    rows with a gap after each (NaN there, which no check may see), the first row expanded over
    the batch (stride 0), or a size-1 dim of an odd stride."""
    rows, k = x.shape
    if layout == "gapped":
        wide = torch.full((rows, k + 3), float("nan"), dtype=x.dtype, device=x.device)
        wide[:, :k] = x
        return wide[:, :k]
    if layout == "expanded":
        return x[0].expand(rows, k)
    return x.as_strided((1, rows, 1, k), (7, k, 5, 1))  # [1, rows, 1, K]


@given(
    st.integers(1, 12),
    st.sampled_from([1, 2, 7, 8, 13, 40]),
    st.sampled_from(["gapped", "expanded", "unit dim"]),
    st.sampled_from(["p", "q", "both"]),
    st.sampled_from([torch.float32, torch.float64]),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
@settings(max_examples=150, deadline=None)
def test_ops_read_rows_a_fixed_stride_apart_in_place(rows, k, layout, which, dtype, bad, seed):
    """Inputs whose rows lie a fixed stride apart (checks.h row_stride) give, bit for bit, the
    values and flags of their contiguous copies; a bad entry of a broadcast row is flagged, NaN
    in the gaps between rows is not."""
    g = torch.Generator().manual_seed(seed)
    p, q = (torch.rand(rows, k, generator=g, dtype=dtype) for _ in range(2))
    if bad:
        q[0, int(torch.randint(0, k, (1,), generator=g))] = -0.5  # row 0: the expanded one too
    p, q = (in_place_layout(x, layout) if which in (name, "both") else x for name, x in (("p", p), ("q", q)))
    if p.dim() != q.dim():
        p, q = (x.view(1, rows, 1, k) if x.dim() == 2 else x for x in (p, q))
    copies = (p.contiguous(), q.contiguous())
    for checked, plain in ((ops.tvd_checked, ops.tvd), (ops.jsd_checked, ops.jsd)):
        torch.testing.assert_close(plain(p, q), plain(*copies), rtol=0, atol=0)
        flags, want = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        torch.testing.assert_close(checked(p, q, flags), checked(*copies, want), rtol=0, atol=0)
        assert int(flags) == int(want) == (8 if bad else 0)


def test_python_and_cpp_agree_on_what_is_read_in_place():
    """distances._in_place_rows copies exactly the inputs the ops refuse (checks.h row_stride)."""
    from attnmetrics.distances import _in_place_rows

    x = torch.rand(6, 4, dtype=torch.float64)
    layouts = [
        x,
        x.t(),
        x[0].expand(6, 4),
        x[:, :3],
        x[::2],
        x[:, ::2],
        x.view(2, 3, 4),
        x.view(2, 3, 4)[:, :2],
        x.view(2, 3, 4).transpose(0, 1),
        x[0].expand(2, 3, 4),
        x.view(1, 6, 4).expand(2, 6, 4),
        x.as_strided((6, 1, 4), (4, 9, 1)),
        x[:, :1],
        x.t()[:, :1],
        x.t()[:1],
        torch.rand(0, 3).t(),
    ]
    for t in layouts:
        in_place = _in_place_rows(t) is t
        try:
            ops.tvd(t, t)
            accepted = True
        except RuntimeError as e:
            assert "must be contiguous along K" in str(e)
            accepted = False
        assert in_place == accepted, (tuple(t.shape), t.stride())


# ---- value_flags: the value checks in one pass (the GPU path of tvd/jsd's validation) ---------


def flags_by_definition(p, q):
    """Bit 0/1: p holds a NaN or infinite / a negative finite entry; bits 2/3: the same for q."""

    def of(x):
        return int((~torch.isfinite(x)).any()) | 2 * int((torch.isfinite(x) & (x < 0)).any())

    return of(p) | of(q) << 2


@given(
    st.lists(st.sampled_from([0.0, 0.25, 1.0, -0.5, -0.0, float("nan"), float("inf"), -float("inf")]), max_size=9),
    st.lists(st.sampled_from([0.0, 0.5, -2.0, float("nan"), float("inf")]), max_size=7),
    st.sampled_from([torch.float32, torch.float64]),
)
@settings(max_examples=200, deadline=None)
def test_value_flags_follow_the_definition(p, q, dtype):
    p, q = torch.tensor(p, dtype=dtype), torch.tensor(q, dtype=dtype)
    assert int(ops.value_flags(p, q)) == flags_by_definition(p, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_value_flags_opcheck_and_errors(dtype):
    p, q = torch.rand(4, 3, dtype=dtype), torch.rand(2, 5, dtype=dtype)
    torch.library.opcheck(ops.value_flags, (p, q))
    with pytest.raises(RuntimeError, match="value_flags: q must have p's dtype"):
        ops.value_flags(p, q.half())
    with pytest.raises(RuntimeError, match="value_flags: p and q must be contiguous"):
        ops.value_flags(p.t(), q)
    with pytest.raises(RuntimeError, match="value_flags: p must be float32 or float64"):
        ops.value_flags(p.long(), q.long())


# ---- tvd_checked / jsd_checked: the distance and the value checks in one call -----------------


@given(
    st.integers(1, 5),
    st.integers(1, 40),  # float32 on AVX2 CPUs: eight entries a step, then the tail
    st.lists(st.sampled_from([-0.5, float("nan"), float("inf"), -float("inf")]), max_size=3),
    st.lists(st.sampled_from([-2.0, float("nan"), float("inf")]), max_size=3),
    st.sampled_from([torch.float32, torch.float64]),
    st.integers(0, 2**31 - 1),
)
@settings(max_examples=150, deadline=None)
def test_checked_ops_give_the_distance_and_the_flags(rows, width, bad_p, bad_q, dtype, seed):
    """Each checked op's values are its unchecked op's, bit for bit, and the flags it ORs in are
    value_flags' by definition, bad entries planted anywhere (hypothesis); where no entry is bad,
    the values are the float64 formula's (TVD accumulates in double)."""
    g = torch.Generator().manual_seed(seed)
    p, q = torch.rand(rows, width, generator=g, dtype=dtype), torch.rand(rows, width, generator=g, dtype=dtype)
    for x, bad in ((p, bad_p), (q, bad_q)):
        where = torch.randint(0, rows * width, (len(bad),), generator=g)
        x.view(-1)[where] = torch.tensor(bad, dtype=dtype)
    for checked, plain in ((ops.tvd_checked, ops.tvd), (ops.jsd_checked, ops.jsd)):
        flags = torch.zeros(1, dtype=torch.int32)
        out = checked(p, q, flags)
        torch.testing.assert_close(out, plain(p, q), rtol=0, atol=0, equal_nan=True)
        assert int(flags) == flags_by_definition(p, q)
    if not bad_p and not bad_q:
        want = (0.5 * (p.double() - q.double()).abs().sum(-1)).to(dtype)
        torch.testing.assert_close(ops.tvd(p, q), want, rtol=2e-7 if dtype == torch.float32 else 1e-15, atol=0)


@pytest.mark.parametrize("op", [ops.tvd_checked, ops.jsd_checked])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_checked_ops_or_into_flags_opcheck_and_errors(op, dtype):
    p, q = torch.rand(4, 3, dtype=dtype), torch.rand(4, 3, dtype=dtype)
    flags = torch.tensor([8], dtype=torch.int32)  # a bit from an earlier chunk stays
    op(p, q, flags)
    assert int(flags) == 8
    p[1, 2] = -1.0
    op(p, q, flags)
    assert int(flags) == 8 | 2
    torch.library.opcheck(op, (p.abs(), q, torch.zeros(1, dtype=torch.int32)))
    name = op._qualified_op_name.split("::")[1]
    for bad in (torch.zeros(1), torch.zeros(2, dtype=torch.int32)):
        with pytest.raises(RuntimeError, match=f"{name}: flags must be a contiguous int32 tensor of one element"):
            op(p, q, bad)
    with pytest.raises(RuntimeError, match=f"{name}: q must have p's shape"):
        op(p, q[:2], torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize("fn", [tvd, jsd])
def test_a_bad_value_in_a_later_chunk_or_a_strided_input_is_found(fn):
    """The checks run in the kernels' pass over each chunk: a NaN in the last chunk of a call
    split by its memory budget, or in a transposed input, still raises, naming the input."""
    p, q = torch.full((64, 8), 0.125), torch.full((64, 8), 0.125)
    p[-1, 3] = float("nan")
    with pytest.raises(ValueError, match="p must be finite"):
        fn(p, q, memory_budget=8 * 17 * 4)  # 8 rows a chunk
    q[5, 0] = -0.25
    with pytest.raises(ValueError, match="q must be non-negative, got min -0.25"):
        fn(p.abs().nan_to_num(0.125).t(), q.t(), dim=0)


# ---- errors ----------------------------------------------------------------------------------

GOOD = torch.tensor([[0.5, 0.5], [0.1, 0.9]])


@pytest.mark.parametrize("fn", [tvd, jsd])
@pytest.mark.parametrize(
    "p, q, match",
    [
        (torch.tensor([[0.5, float("nan")]]), GOOD, "p must be finite"),
        (GOOD, torch.tensor([[float("inf"), 0.5]]), "q must be finite"),
        (GOOD, torch.tensor([[-float("inf"), 0.5]]), "q must be finite"),
        (torch.tensor([[1.5, -0.5]]), GOOD, "p must be non-negative, got min -0.5"),
        (GOOD, torch.ones(2, 3) / 3, r"p and q must be broadcastable, got shapes \[2, 2\] and \[2, 3\]"),
        (GOOD, GOOD.double(), "p and q must have one dtype, got p torch.float32 and q torch.float64"),
        (GOOD.long(), GOOD, "p must be float32 or float64, got torch.int64"),
        (GOOD, GOOD.half(), "q must be float32 or float64, got torch.float16"),
        (torch.empty(0, 2), GOOD, r"p is empty \(shape \[0, 2\]\)"),
        (GOOD, torch.empty(2, 0), r"q is empty"),
        (torch.tensor(0.5), GOOD, "p must have at least one dimension"),
    ],
)
def test_errors_name_the_argument(fn, p, q, match):
    with pytest.raises(ValueError, match=match):
        fn(p, q)


@pytest.mark.parametrize("fn", [tvd, jsd])
def test_bad_dim_budget_and_type(fn):
    with pytest.raises(ValueError, match=r"dim must lie in \[-2, 1\] for shape \[2, 2\], got 2"):
        fn(GOOD, GOOD, dim=2)
    with pytest.raises(ValueError, match="memory_budget must be a positive int"):
        fn(GOOD, GOOD, memory_budget=0)
    with pytest.raises(TypeError, match="p must be a torch.Tensor, got list"):
        fn([0.5, 0.5], GOOD)


@pytest.mark.parametrize("op", [ops.tvd, ops.jsd])
def test_op_rejects_bad_input_without_crashing(op):
    good = torch.rand(3, 4)
    bad = [
        ((torch.tensor(0.5), torch.tensor(0.5)), "p must be \\[..., K\\] \\(at least one dimension\\)"),
        ((good, torch.rand(3, 5)), "q must have p's shape"),
        ((good, good.double()), "q must have p's dtype"),
        ((good.long(), good.long()), "p must be float32 or float64"),
        ((good.t(), good.t()), "must be contiguous along K with their rows a fixed stride apart"),
        ((good, torch.rand(3, 8)[:, ::2]), r"got strides \[4, 1\] and \[8, 2\]"),
        ((torch.rand(2, 3, 4), torch.rand(3, 4).expand(2, 3, 4)), r"got strides \[12, 4, 1\] and \[0, 4, 1\]"),
    ]
    for args, match in bad:
        with pytest.raises(RuntimeError, match=match):
            op(*args)


# ---- autograd -------------------------------------------------------------------------------


def tvd_torch(p, q, dim=-1):
    return 0.5 * (p - q).abs().sum(dim)


def jsd_torch(p, q, dim=-1):
    m = (p + q) / 2
    return 0.5 * (torch.xlogy(p, p / m) + torch.xlogy(q, q / m)).sum(dim)


def interior(shape, seed):
    """Strictly positive float64 distributions with no ties between p and q (both differentiable)."""
    return torch.tensor(distributions(np.random.default_rng(seed), shape)).clamp_min(1e-3).requires_grad_(True)


@pytest.mark.parametrize("fn", [tvd, jsd])
@pytest.mark.parametrize(
    "p_shape, q_shape, dim",
    [((5, 4), (5, 4), -1), ((3, 5, 4), (5, 4), -1), ((4, 5), (4, 1), 0), ((2, 3, 4), (2, 3, 4), 1)],
)
def test_gradcheck(fn, p_shape, q_shape, dim):
    # the backward used to give no gradient at all (only torch's warning)
    p, q = interior(p_shape, 1), interior(q_shape, 2)
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b, dim), (p, q))
    # and it is the pure-torch formula's gradient
    ref = tvd_torch if fn is tvd else jsd_torch
    w = torch.randn(torch.broadcast_shapes(p_shape, q_shape), dtype=torch.float64).sum(dim)
    got = torch.autograd.grad((fn(p, q, dim) * w).sum(), (p, q))
    want = torch.autograd.grad((ref(p, q, dim) * w).sum(), (p, q))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


def test_gradients_at_zeros_and_ties():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    q = torch.tensor([[0.5, 0.0, 0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    (dp, dq) = torch.autograd.grad(tvd(p, q).sum(), (p, q))
    assert dp.tolist() == [[0.0, 0.5, -0.5, 0.0]] and dq.tolist() == [[0.0, -0.5, 0.5, 0.0]]
    (dp, dq) = torch.autograd.grad(jsd(p, q).sum(), (p, q))
    half_ln2 = 0.5 * LN2  # p > 0 = q: ½ log(p / (p / 2)); p == 0: 0
    torch.testing.assert_close(dp, torch.tensor([[0.0, half_ln2, 0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(dq, torch.tensor([[0.0, 0.0, half_ln2, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("fn", [tvd, jsd])
def test_grad_of_one_input_and_float32(fn):
    p = torch.tensor([[0.2, 0.8]], requires_grad=True)
    q = torch.tensor([[0.6, 0.4]])
    (dp,) = torch.autograd.grad(fn(p, q).sum(), p)
    assert dp.dtype == torch.float32 and dp.shape == p.shape
    with torch.no_grad():
        assert not fn(p, q).requires_grad
