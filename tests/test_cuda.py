"""CUDA impls against the CPU impls on the same inputs (skipped without a GPU).

The CPU impls are checked against scipy and the plain-loop references elsewhere; here
every op runs on both back ends and must agree: integers (flip steps) equal, tau and the
exact p-value bit for bit (the same IEEE operations: the CUDA build uses --fmad=false),
floats otherwise to tolerance (the GPU sums in another order and has its own log/erfc).
Also: long rows (L = 4,096), a million rows within a memory bound, the same errors on bad
input, opcheck, non-default streams, a second GPU.

ATTNMETRICS_TEST_DEVICE=cpu runs this file against the CPU back end itself (a dry run of
the tests' own logic on a machine without a GPU); the GPU-only checks then skip.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from attnmetrics import _ops, flip_fraction, jsd, kendall_tau, tvd
from attnmetrics._ops import ops
from attnmetrics.flip import random_scores, removal_order
from attnmetrics.permutation import attention_permutations, permutation_test
from attnmetrics.protocol import token_mask

DEVICE = torch.device(os.environ.get("ATTNMETRICS_TEST_DEVICE") or "cuda")
ON_GPU = DEVICE.type == "cuda"
F64 = torch.float64

if ON_GPU and not torch.cuda.is_available():
    _skip = "needs a CUDA GPU"
elif ON_GPU and not _ops.CUDA_KERNELS:
    _skip = "a GPU is visible but attnmetrics was built without its CUDA kernels (nvcc missing?)"
else:
    _skip = None
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(_skip is not None, reason=_skip or "")]
gpu_only = pytest.mark.skipif(not ON_GPU, reason="checks CUDA itself (streams, memory, devices)")


def dev(*tensors):
    out = tuple(t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in tensors)
    return out if len(out) > 1 else out[0]


def host(x):
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # FlipResult, KendallTau
        return type(x)(*(host(t) for t in x))
    if isinstance(x, (tuple, list)):
        return type(x)(host(t) for t in x)
    return x.cpu() if isinstance(x, torch.Tensor) else x


def on_both(op, *args):
    """(CPU result, device result moved to the CPU) of op on the same inputs."""
    return op(*args), host(op(*dev(*args)))


def distributions(rng, shape, zeros=0.3):
    w = rng.exponential(size=shape)
    w[rng.random(shape) < zeros] = 0.0
    w[..., 0] += w.sum(-1) == 0
    return torch.from_numpy(w / w.sum(-1, keepdims=True))


def close(got, want, dtype, rtol64=1e-12, atol64=1e-300):
    # float32 results are a double rounded once: the two back ends may land 1 ulp apart
    rtol, atol = (2.5e-7, 1e-30) if dtype == torch.float32 else (rtol64, atol64)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)


# ---- tvd / jsd ---------------------------------------------------------------------------------


# widths cover the 4-lane groups (<= 16), a warp per row (< 2048), a block per row
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("width", [1, 2, 5, 16, 17, 50, 300, 2047, 2048, 4096, 10000])
def test_distances_match_cpu(dtype, width):
    rng = np.random.default_rng(width)
    for rows in (1, 3, 257 if width > 2048 else 1000):
        p = distributions(rng, (rows, width)).to(dtype)
        q = distributions(rng, (rows, width)).to(dtype)
        for op in (ops.tvd, ops.jsd):
            want, got = on_both(op, p, q)
            assert got.dtype == dtype and got.shape == (rows,)
            # float64: the back ends sum a row in other orders, a few ulps of its largest term
            # apart, which for a small distance is more than 1e-12 of it (H200: 8.7e-17 at
            # 1.8e-5, width 2)
            close(got, want, dtype, atol64=width * torch.finfo(F64).eps)
        # identical rows: exactly 0 on both
        assert (host(ops.jsd(*dev(p, p))) == 0).all() and (host(ops.tvd(*dev(p, p))) == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("width", [2, 16, 50, 4096])
def test_distances_read_strided_rows_in_place_like_cpu(dtype, width):
    """Rows a fixed stride apart (gapped, one row expanded, odd-stride size-1 dims; checks.h
    row_stride) read in place on the device: bit for bit the values of their contiguous copies,
    the CPU's within the tolerance above, no flag from the NaN between gapped rows, the flag of a
    negative entry in a broadcast row; and the public call's broadcast as the CPU's."""
    from tests.test_distances import in_place_layout

    g = torch.Generator().manual_seed(width)
    p, q = (torch.rand(40, width, generator=g, dtype=dtype) for _ in range(2))
    p_d, q_d = dev(p, q)
    for layout in ("gapped", "expanded", "unit dim"):
        x = in_place_layout(q_d, layout)
        y = p_d.view(1, 40, 1, width) if x.dim() == 4 else p_d
        for checked, plain in ((ops.tvd_checked, ops.tvd), (ops.jsd_checked, ops.jsd)):
            got = plain(y, x)
            assert torch.equal(got, plain(y, x.contiguous())), (layout, plain)
            flags = torch.zeros(1, dtype=torch.int32, device=DEVICE)
            assert torch.equal(checked(y, x, flags), got) and int(flags) == 0, (layout, checked)
            close(host(got), plain(y.cpu(), x.cpu()), dtype, atol64=width * torch.finfo(F64).eps)
    bad = q_d[0].clone()
    bad[width // 2] = -0.5
    flags = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    ops.tvd_checked(p_d, bad.expand(40, width), flags)
    assert int(flags) == 8
    for fn in (tvd, jsd):
        close(host(fn(p_d, q_d[0])), fn(p, q[0]), dtype, atol64=width * torch.finfo(F64).eps)


def test_value_flags_match_cpu():
    """The one-pass value checks of tvd/jsd on the GPU: every flag as the CPU sets it, on
    tensors long enough for the grid-stride loop and the per-warp OR."""
    for dtype in (torch.float32, F64):
        for n_p, n_q in ((1, 1), (33, 5), (300_000, 70_001)):
            for where, value, flags in ((None, 0, 0), ("p", math.nan, 1), ("q", -1e-30, 8), ("p", -math.inf, 1)):
                p, q = torch.rand(n_p, dtype=dtype), torch.rand(n_q, dtype=dtype)
                if where:
                    x = p if where == "p" else q
                    x[len(x) // 2] = value
                want, got = on_both(ops.value_flags, p, q)
                assert int(want) == flags and int(host(got)) == flags, (dtype, n_p, n_q, where)


def test_checked_distances_match_cpu():
    """tvd_checked / jsd_checked on the GPU (the checks in the distance kernel's own pass, each
    warp's flags ORed in by one atomic): the CPU's values and flags, ORed into a flags tensor
    that already holds a bit."""
    rng = np.random.default_rng(3)
    for dtype in (torch.float32, F64):
        p, q = distributions(rng, (1000, 50)).to(dtype), distributions(rng, (1000, 50)).to(dtype)
        q[700, 3] = -0.5
        for op, plain in ((ops.tvd_checked, ops.tvd), (ops.jsd_checked, ops.jsd)):
            want_flags, got_flags = torch.tensor([1], dtype=torch.int32), dev(torch.tensor([1], dtype=torch.int32))
            want, got = op(p, q, want_flags), host(op(*dev(p, q), got_flags))
            close(got, want, dtype)
            close(got, host(plain(*dev(p, q))), dtype)
            assert int(want_flags) == int(host(got_flags)) == 1 | 8
        # [..., K]: a 3-d input's rows in its leading shape, as the [N, K] view's; one row [K], a 0-d result
        p3, q3 = p.view(10, 100, 50), q.view(10, 100, 50)
        for op in (ops.tvd, ops.jsd):
            got = op(*dev(p3, q3))
            assert got.shape == (10, 100)
            assert torch.equal(host(got).reshape(-1), host(op(*dev(p, q))))
            want, got = on_both(op, p[5], q[5])
            assert got.shape == want.shape == ()
            close(got, want, dtype)


def test_distances_reject_bad_values_on_device_like_cpu():
    p = torch.full((5, 4), 0.25)
    for bad, match in ((float("nan"), "p must be finite"), (-0.5, "p must be non-negative, got min -0.5")):
        x = p.clone()
        x[3, 1] = bad
        for fn in (tvd, jsd):
            with pytest.raises(ValueError, match=match):
                fn(*dev(x, p))
            with pytest.raises(ValueError, match=match.replace("p must", "q must")):
                fn(*dev(p, x))


def test_distances_public_api_on_device():
    rng = np.random.default_rng(1)
    p = distributions(rng, (6, 7, 5))
    q = distributions(rng, (7, 5))  # broadcast
    for fn in (tvd, jsd):
        for dim, budget in ((-1, 10**9), (-1, 100), (1, 1000)):
            pp, qq = (p, q) if dim == -1 else (p / p.sum(dim, keepdim=True), q / q.sum(0, keepdim=True))
            want = fn(pp, qq, dim, memory_budget=budget)
            got = fn(*dev(pp, qq), dim, memory_budget=budget)
            assert got.device.type == DEVICE.type
            close(host(got), want, F64)


# ---- kendall_tau -------------------------------------------------------------------------------


def kendall_both(x, y, lengths):
    (t0, p0), (t1, p1) = on_both(ops.kendall_tau, x.contiguous(), y.contiguous(), lengths)
    return t0, p0, t1, p1


def assert_kendall_equal(x, y, lengths, exact_p=False):
    t0, p0, t1, p1 = kendall_both(x, y, lengths)
    # tau: the same integer counts and IEEE divisions and square roots on both back ends
    torch.testing.assert_close(t1, t0, rtol=0, atol=0, equal_nan=True)
    if exact_p:
        torch.testing.assert_close(p1, p0, rtol=0, atol=0, equal_nan=True)
    else:  # the normal approximation goes through each library's erf/erfc
        tail = p0 < 1e-50
        close(p1[~tail], p0[~tail], x.dtype)
        torch.testing.assert_close(p1[tail], p0[tail], rtol=1e-9, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_kendall_matches_cpu(dtype):
    rng = np.random.default_rng(0)
    for width, levels in ((33, None), (80, None), (120, 2), (400, 5), (50, 1)):
        x = rng.standard_normal((300, width))
        y = 0.4 * x + rng.standard_normal((300, width))
        if levels:
            x, y = np.round(x * levels), np.round(y * levels)
        lengths = torch.from_numpy(rng.integers(0, width + 1, 300))
        x, y = torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)
        assert_kendall_equal(x, y, lengths)
    # tie-free rows of at most 33: the exact p-value, bit for bit
    x = torch.from_numpy(rng.standard_normal((400, 33))).to(dtype)
    y = x + torch.from_numpy(rng.standard_normal((400, 33))).to(dtype)
    assert_kendall_equal(x, y, torch.from_numpy(rng.integers(2, 34, 400)), exact_p=True)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_kendall_long_rows_match_cpu(dtype):
    """L = 4,096 (and a row of 8,192, the longest the block-per-row kernel takes) and rows past
    it (8,193 and 9,000: one thread per row, tau_row), with ties and NaN, as the CPU counts them."""
    rng = np.random.default_rng(4)
    for width, rows in ((4096, 6), (8193, 3), (9000, 2)):
        x = np.round(rng.standard_normal((rows, width)) * 20)
        y = 0.3 * x + np.round(rng.standard_normal((rows, width)) * 20)
        x[0, 7] = np.nan
        lengths = torch.from_numpy(rng.integers(0, width + 1, rows))
        lengths[-1] = width
        if width == 4096:
            lengths[1] = 8192 // 2
        assert_kendall_equal(torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype), lengths)
    x = torch.from_numpy(rng.standard_normal((2, 8192))).to(dtype)
    assert_kendall_equal(x, x + 0.5 * torch.randn(2, 8192, dtype=dtype), torch.tensor([8192, 8191]))


def test_kendall_edge_rows():
    # L = 0, 1, 2, constant rows, NaN (propagated by the raw op), one swapped pair past 33
    x = torch.tensor([[1.0, 2, 3], [3, 1, 2], [5, 4, 0], [1, 1, 1], [1, float("nan"), 2]], dtype=F64)
    y = torch.tensor([[2.0, 1, 9], [1, 2, 3], [1, 3, 0], [2, 3, 4], [1, 2, 3]], dtype=F64)
    assert_kendall_equal(x, y, torch.tensor([0, 1, 2, 3, 3]), exact_p=True)
    for n in (34, 171, 172, 300):
        a = torch.arange(n, dtype=F64)
        b = a.clone()
        b[[5, 6]] = b[[6, 5]]
        xs, ys = a.expand(4, n), torch.stack([a, b, -a, -b])
        assert_kendall_equal(xs, ys, torch.full((4,), n), exact_p=True)
    assert_kendall_equal(torch.zeros(3, 0), torch.zeros(3, 0), torch.zeros(3, dtype=torch.int64))


def test_kendall_public_api_on_device():
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.standard_normal((40, 30)))
    y = torch.from_numpy(np.round(rng.standard_normal((40, 30))))
    lengths = torch.from_numpy(rng.integers(0, 31, 40))
    want = kendall_tau(x, y, lengths)
    got = kendall_tau(*dev(x, y, lengths))
    assert got.tau.device.type == DEVICE.type
    torch.testing.assert_close(host(got.tau), want.tau, rtol=0, atol=0, equal_nan=True)
    close(host(got.pvalue), want.pvalue, F64)
    # lengths as a list goes to the inputs' device; lengths on another device is an error
    torch.testing.assert_close(
        host(kendall_tau(*dev(x, y), lengths.tolist()).tau), want.tau, rtol=0, atol=0, equal_nan=True
    )
    if ON_GPU:
        with pytest.raises(ValueError, match="lengths is on cpu, expected cuda"):
            kendall_tau(*dev(x, y), lengths)


# ---- flip search ---------------------------------------------------------------------------------


def flip_batch(b, t, h, dtype=F64, seed=0, temperature=2.0, min_len=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, t + 1, (b,), generator=g)
    mask = torch.arange(t) < lengths[:, None]
    logits = torch.randn(b, t, generator=g, dtype=F64) * temperature
    att = torch.softmax(logits.masked_fill(~mask, -math.inf), 1).nan_to_num(0.0)
    values = torch.randn(b, t, h, generator=g, dtype=F64)
    return att.to(dtype), values.to(dtype), lengths


def raw_flip_inputs(b, t, c, dtype, seed, h=None):
    att, values, lengths = flip_batch(b, t, h or c, dtype, seed)
    order = removal_order(att, lengths)
    g = torch.Generator().manual_seed(seed + 1)
    bias = (0.1 * torch.randn(c, generator=g, dtype=F64)).to(dtype)
    offsets = torch.cumsum(lengths, 0) - lengths
    return att, values, bias, order, lengths, offsets


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("classes", [1, 2, 3, 16, 17, 40])  # <= 16: local sums; else scratch
def test_flip_search_linear_matches_cpu(dtype, classes):
    for t in (1, 12, 300):
        att, proj, bias, order, lengths, _ = raw_flip_inputs(200, t, classes, dtype, seed=classes + t)
        (r0, m0), (r1, m1) = on_both(ops.flip_search_linear, att, proj, bias, order, lengths)
        assert torch.equal(r1, r0)
        close(m1, m0, dtype, rtol64=1e-14)
        if t > 1:
            assert (r0 > 1).any()


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("hidden", [1, 3, 32, 33, 100])  # lanes: fewer, exactly, more than a warp
def test_renormalised_contexts_match_cpu(dtype, hidden):
    att, values, _, order, lengths, offsets = raw_flip_inputs(150, 20, 1, dtype, seed=hidden, h=hidden)
    att[::7] = 0  # rows of zero mass: zero contexts
    want, got = on_both(ops.renormalised_contexts, att, values, order, lengths, offsets)
    assert got.shape == (int(lengths.sum()), hidden)
    close(got, want, dtype, rtol64=1e-14)


def _decoders(h, c, dtype):
    torch.manual_seed(0)
    lin = nn.Linear(h, c).to(dtype)
    mlp = nn.Sequential(nn.Linear(h, 8), nn.Tanh(), nn.Linear(8, c)).to(dtype).eval()
    return {"linear": lin, "mlp": mlp}


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_flip_fraction_on_device(dtype, kind):
    att, values, lengths = flip_batch(300, 16, 6, dtype, seed=3)
    dec = _decoders(6, 3, dtype)[kind]
    dec_dev = _decoders(6, 3, dtype)[kind].to(DEVICE)
    scores = torch.randn(att.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    for order in ("attention", "reverse", scores):
        want = flip_fraction(att, values, dec, lengths, order)
        got = host(flip_fraction(*dev(att, values), dec_dev, dev(lengths), dev(order)))
        if dtype == F64:
            assert torch.equal(got.removed, want.removed)
        else:  # the projection / mlp GEMMs round differently on the GPU: near-ties may go either way
            assert (got.removed == want.removed).double().mean() >= 0.99
        ok = got.removed == want.removed
        close(got.mass[ok], want.mass[ok], dtype, rtol64=1e-13)
    # gradient orders run on the device; GEMMs differ, so the orders may at near-ties
    got = flip_fraction(*dev(att, values), dec_dev, dev(lengths), "attn_grad")
    want = flip_fraction(att, values, dec, lengths, "attn_grad")
    assert got.removed.device.type == DEVICE.type
    assert (host(got.removed) == want.removed).double().mean() >= 0.98


def test_random_order_with_a_device_generator():
    att, values, lengths = flip_batch(50, 12, 4, seed=5)
    dec = _decoders(4, 2, F64)["linear"].to(DEVICE)
    a, v, n = dev(att, values, lengths)
    res = flip_fraction(a, v, dec, n, "random", samples=3, generator=torch.Generator(DEVICE).manual_seed(1))
    g = torch.Generator(DEVICE).manual_seed(1)
    for s in range(3):
        want = flip_fraction(a, v, dec, n, random_scores(50, 12, g, DEVICE))
        assert torch.equal(res.removed[s], want.removed)
    if ON_GPU:
        with pytest.raises(ValueError, match="generator is on cpu, attention on cuda"):
            flip_fraction(a, v, dec, n, "random", generator=torch.Generator())


# ---- permutation test, projection, leave-one-out inputs -----------------------------------------


def perm_inputs(b, t, c, dtype, seed, min_len=0):
    att, proj, lengths = flip_batch(b, t, c, dtype, seed, min_len=min_len)
    bias = (0.3 * torch.randn(c, generator=torch.Generator().manual_seed(seed), dtype=F64)).to(dtype)
    return att, proj, bias, lengths


def test_attention_permutations_match_cpu():
    """The GPU draws exactly the CPU's permutations (the same counter-based generator)."""
    g = torch.Generator().manual_seed(0)
    for b, t, p in ((1, 1, 1), (50, 17, 9), (7, 300, 3), (4, 0, 2), (2000, 6, 4)):
        lengths = torch.randint(0, t + 1, (b,), generator=g)
        for seed, row_offset, perm_offset in ((0, 0, 0), (-123456789, 40, 7), (2**62, 2**63 - 3, 2**40)):
            want, got = on_both(ops.attention_permutations, lengths, t, p, seed, row_offset, perm_offset)
            assert torch.equal(got, want)
    assert torch.equal(host(attention_permutations(dev(lengths), 6, 4, 5)), attention_permutations(lengths, 6, 4, 5))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("classes", [1, 2, 3, 16, 17, 40])  # <= 16: local z and base; else scratch
def test_permutation_tvd_linear_matches_cpu(dtype, classes):
    for t, p in ((1, 5), (12, 100), (60, 7), (9, 1)):
        att, proj, bias, lengths = perm_inputs(300, t, classes, dtype, seed=classes + t)
        (m0, t0), (m1, t1) = on_both(ops.permutation_tvd_linear, att, proj, bias, lengths, p, 77, 3)
        # The same permutations, and the logits summed in the same order without FMA
        # (kernels/permutation.h): the same bits. Only exp differs (glibc's against CUDA's
        # libdevice, each within 1 ulp), so each output probability (<= 1) may differ by a
        # few ulps of 1 in float64, and a TVD, a difference of probabilities, by that much
        # absolutely: on a TVD of 1e-5 that is 1e-11 relative, which a relative tolerance
        # would misread as a different sum. Measured on an H200: 1.1e-16 at most (C = 1).
        atol64 = 4 * max(classes, 2) * torch.finfo(F64).eps
        close(t1, t0, dtype, rtol64=1e-13, atol64=atol64)
        close(m1, m0, dtype, rtol64=1e-13, atol64=atol64)
        assert (t0[lengths <= 1] == 0).all() and (t1[lengths.to(t1.device) <= 1] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_project_prefix_matches_cpu(dtype):
    g = torch.Generator().manual_seed(1)
    for b, t, h, c in ((1, 1, 1, 1), (40, 20, 33, 2), (30, 7, 300, 17), (5, 0, 4, 3), (6, 5, 0, 2)):
        values = torch.randn(b, t, h, generator=g, dtype=F64).to(dtype)
        weight = torch.randn(c, h, generator=g, dtype=F64).to(dtype)
        lengths = torch.randint(0, t + 1, (b,), generator=g)
        want, got = on_both(ops.project_prefix, values, weight, lengths)
        # the CPU's partial sums in the same order, no FMA: the same bits
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@gpu_only
@pytest.mark.parametrize("mask_token", [None, 4])
def test_sequence_ops_plan_from_host_lengths_without_waiting(mask_token):
    """leave_one_out_batch and rationale_batch with tokens (and rank) on the GPU and lengths (and
    sizes) on the host: the CPU impl's outputs bit for bit, on the GPU, the same range error, and
    no wait on the device (issue 32: the procedures call them once a chunk)."""
    g = torch.Generator().manual_seed(4)
    for b, t, lead, trail in ((1, 3, 1, 1), (200, 30, 1, 1), (50, 9, 0, 0), (6, 4, 2, 2), (0, 5, 1, 1)):
        tokens = torch.randint(5, 900, (b, t), generator=g)
        lengths = torch.randint(lead + trail, t + 1, (b,), generator=g)
        span = max(1, t - lead - trail)
        rank = torch.stack([torch.randperm(span, generator=g) for _ in range(b)]) if b else torch.zeros(0, span)
        rank = rank.to(torch.int64)
        sizes = torch.randint(-1, t + 2, (b, 3), generator=g)
        on_gpu = dev(tokens, rank)
        got = []
        waits = _device_reads(
            lambda: got.extend(
                [
                    ops.leave_one_out_batch(on_gpu[0], lengths, lead, trail, mask_token, 3),
                    ops.rationale_batch(on_gpu[0], lengths, on_gpu[1], sizes, lead, trail, True, mask_token, 3),
                ]
            )
        )
        assert waits == [], waits
        want = [
            ops.leave_one_out_batch(tokens, lengths, lead, trail, mask_token, 3),
            ops.rationale_batch(tokens, lengths, rank, sizes, lead, trail, True, mask_token, 3),
        ]
        for w_op, g_op in zip(want, got):
            for w, x in zip(w_op, g_op):
                assert x.device == on_gpu[0].device and torch.equal(x.cpu(), w)
    tokens, bad = torch.ones(2, 4, dtype=torch.int64), torch.tensor([3, 5])
    for call in (
        lambda: ops.leave_one_out_batch(dev(tokens), bad, 1, 1, None, 0),
        lambda: ops.rationale_batch(dev(tokens), bad, dev(tokens), torch.zeros(2, 1, dtype=torch.int64), 1, 1, True),
    ):
        with pytest.raises(RuntimeError, match=r"lengths\[1\] = 5 is outside \[lead \+ trail, T\] = \[2, 4\]"):
            call()
    with pytest.raises(RuntimeError, match="sizes must be on lengths' device cpu"):
        ops.rationale_batch(
            dev(tokens), bad.clamp(max=4), dev(tokens), dev(torch.zeros(2, 1, dtype=torch.int64)), 1, 1, True
        )


@pytest.mark.parametrize("mask_token", [None, 4])
def test_leave_one_out_batch_matches_cpu(mask_token):
    g = torch.Generator().manual_seed(2)
    for b, t, lead, trail in ((1, 3, 1, 1), (200, 30, 1, 1), (50, 9, 0, 0), (20, 400, 2, 1), (6, 4, 2, 2)):
        tokens = torch.randint(5, 900, (b, t), generator=g)
        lengths = torch.randint(lead + trail, t + 1, (b,), generator=g)
        want, got = on_both(ops.leave_one_out_batch, tokens, lengths, lead, trail, mask_token, 3)
        for w, x in zip(want, got):
            assert torch.equal(x, w)
    empty = torch.zeros(0, 5, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    want, got = on_both(ops.leave_one_out_batch, *empty, 1, 1, mask_token, 0)
    assert all(x.shape == w.shape for w, x in zip(want, got))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_lstm_runs_matches_cpu(dtype):
    """Leave-one-out's LSTM runs: the CPU's vector exp and the GPU's expf round apart, and
    cuBLAS sums in its own order: equal to tolerance; zero past each run's count on both."""
    g = torch.Generator().manual_seed(4)
    for runs, steps, hidden, features, rows in (
        (1, 1, 1, 1, 1),
        (300, 12, 128, 129, 50),
        (7, 5, 13, 0, 4),
        (0, 3, 8, 2, 2),
    ):
        gates = torch.randn(rows, 4 * hidden, generator=g, dtype=F64).to(dtype)
        index = torch.randint(0, rows, (steps, runs), generator=g)
        counts = torch.sort(torch.randint(0, steps + 1, (runs,), generator=g), descending=True).values
        h0, c0 = (torch.randn(runs, hidden, generator=g, dtype=F64).to(dtype) for _ in range(2))
        weight = (torch.randn(hidden, 4 * hidden + features, generator=g, dtype=F64) / hidden**0.5).to(dtype)
        results = []
        for on in (torch.device("cpu"), DEVICE):
            out = torch.full((steps, runs, features), float("nan"), dtype=dtype, device=on)
            states = torch.full((2, steps, runs, hidden), float("nan"), dtype=dtype, device=on)
            args = (gates, index, counts, h0, c0, weight)
            ops.lstm_runs(*(t.to(on) for t in args), out, states)
            results.append((out.cpu(), states.cpu()))
        (want_out, want_states), (got_out, got_states) = results
        tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got_out, want_out, **tol)
        torch.testing.assert_close(got_states, want_states, **tol)
    gates, h0 = torch.randn(3, 8, dtype=dtype), torch.zeros(2, 2, dtype=dtype)
    weight, index = torch.randn(2, 9, dtype=dtype), torch.zeros(3, 2, dtype=torch.int64)
    args = (gates, index, torch.tensor([3, 1]), h0, h0, weight, torch.empty(3, 2, 1, dtype=dtype))
    torch.library.opcheck(ops.lstm_runs.default, dev(*args))
    for counts, message in ((torch.tensor([1, 3]), "counts must be non-increasing"), (torch.tensor([4, 1]), "outside")):
        with pytest.raises(RuntimeError, match=message):
            ops.lstm_runs(*dev(*args[:2], counts, *args[3:]))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_spliced_attention_matches_cpu(dtype):
    """Leave-one-out's attention head: the CPU's vector tanh and the GPU's expf round apart,
    and the warp sums in its own order: equal to tolerance; zero where no position gets
    attention on both."""
    g = torch.Generator().manual_seed(5)
    for rows, width, dim, att, lead, trail, tanh in (
        (1, 1, 2, 1, 0, 0, True),
        (500, 40, 129, 128, 1, 1, True),  # J&W's head, SST-like deletions
        (9, 300, 40, 1, 1, 1, False),  # dot attention, long sequences
        (6, 7, 70, 33, 2, 0, True),  # more classes than a warp's lanes
        (0, 5, 4, 2, 0, 0, True),
    ):
        table = torch.randn(50, dim, generator=g, dtype=F64).to(dtype)
        pairs = torch.randint(0, 50, (rows, width, 2), generator=g)
        lengths = torch.randint(0, width + 1, (rows,), generator=g)
        v = torch.randn(att, generator=g, dtype=F64).to(dtype)
        args = (table, pairs, lengths, v, lead, trail, tanh)
        want = ops.spliced_attention(*args)
        got = ops.spliced_attention(*dev(*args)).cpu()
        tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got, want, **tol)
    args = dev(table[:, :4].contiguous(), torch.zeros(3, 5, 2, dtype=torch.int64), torch.tensor([5, 1, 0]), v[:2])
    torch.library.opcheck(ops.spliced_attention.default, (*args, 1, 1, True))
    bad = args[1].clone()
    bad[1, 0, 1] = 50
    with pytest.raises(RuntimeError, match=r"pairs\[1, 0, 1\] = 50 is outside the table's rows"):
        ops.spliced_attention(args[0], bad, args[2], args[3], 0, 0, True)
    bad[1, 0, 1] = 50 - 100  # not read: past the length less trail
    ops.spliced_attention(args[0], bad, args[2], args[3], 0, 1, True)
    with pytest.raises(RuntimeError, match=r"lengths\[0\] = 6 is outside \[0, T\] = \[0, 5\]"):
        ops.spliced_attention(args[0], args[1], dev(torch.tensor([6, 1, 0])), args[3], 0, 0, True)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_permutation_test_on_device(kind):
    """The public function on device tensors: the same permutations as on the CPU, so the
    same TVDs up to rounding (the mlp's GEMMs round differently on the GPU)."""
    att, values, lengths = flip_batch(200, 14, 6, F64, seed=4)
    dec, dec_dev = _decoders(6, 3, F64)[kind], _decoders(6, 3, F64)[kind].to(DEVICE)
    want = permutation_test(
        att, values, dec, lengths, permutations=20, generator=torch.Generator().manual_seed(3), return_all=True
    )
    got = permutation_test(
        *dev(att, values),
        dec_dev,
        dev(lengths),
        permutations=20,
        generator=torch.Generator().manual_seed(3),
        return_all=True,
    )
    assert got.median_tvd.device.type == DEVICE.type
    torch.testing.assert_close(host(got.tvd), want.tvd, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(host(got.median_tvd), want.median_tvd, rtol=1e-9, atol=1e-12)


# ---- attention rollout ---------------------------------------------------------------------------


def rollout_inputs(batch, layers, heads, width, dtype, seed):
    rng = np.random.default_rng(seed)
    att = torch.from_numpy(rng.random((batch, layers, heads, width, width))).to(dtype)
    lengths = torch.from_numpy(rng.integers(0, width + 1, batch))
    lengths[0] = width
    return att / att.sum(-1, keepdim=True), lengths


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("width", [1, 9, 70])
def test_attention_rollout_matches_cpu(dtype, width):
    """The same mixing (kernels/rollout.h); the products (BLAS on the CPU) agree to rounding,
    and a single layer, which multiplies nothing, to the bit."""
    att, lengths = rollout_inputs(37, 3, 4, width, dtype, seed=width)
    for residual in (0.0, 0.5):
        want, got = on_both(ops.attention_rollout, att, lengths, residual)
        tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(got, want, **tol)
        want, got = on_both(ops.attention_rollout, att[:, :1].contiguous(), lengths, residual)
        assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match=r"lengths\[1\] = 99 is outside \[0, T\]"):
        ops.attention_rollout(*dev(att, torch.tensor([width, 99] + [0] * 35)), 0.5)


def test_attention_rollout_public_api_on_device():
    """What the docstring promises: the result stays on the input's device and agrees with the
    CPU's to rounding (the layers' products run through cuBLAS there, BLAS here, in other
    orders), not bit for bit; one layer multiplies nothing and is the same bits."""
    from attnmetrics import attention_rollout

    att, lengths = rollout_inputs(5, 2, 3, 6, F64, seed=3)
    got = attention_rollout(*dev(att, lengths))
    assert got.device.type == DEVICE.type
    torch.testing.assert_close(host(got), attention_rollout(att, lengths), rtol=1e-12, atol=1e-15)
    one = att[:, :1].contiguous()
    assert torch.equal(host(attention_rollout(*dev(one, lengths))), attention_rollout(one, lengths))


# ---- the same errors on bad input --------------------------------------------------------------


def first_line(excinfo):
    return str(excinfo.value).splitlines()[0]


def assert_same_error(op, args):
    with pytest.raises(RuntimeError) as cpu:
        op(*args)
    with pytest.raises(RuntimeError) as cuda:
        op(*dev(*args))
    assert first_line(cuda) == first_line(cpu)


def test_flip_ops_reject_bad_input_like_cpu():
    att, values, bias, order, lengths, offsets = raw_flip_inputs(5, 6, 2, torch.float32, seed=43, h=3)
    proj = values[..., :2].contiguous()
    far, neg, dup, late = order.clone(), order.clone(), order.clone(), order.clone()
    far[0, 0] = 10**9
    neg[1, 0] = -1
    dup[3, 1] = dup[3, 0]
    late[4, 0] = late[4, 1]
    lengths = lengths.clamp(min=2)
    order = removal_order(att, lengths)
    offsets = torch.cumsum(lengths, 0) - lengths

    def linear(**kw):
        a = dict(attention=att, projected=proj, bias=bias, order=order, lengths=lengths) | kw
        return (ops.flip_search_linear, (a["attention"], a["projected"], a["bias"], a["order"], a["lengths"]))

    def contexts(**kw):
        a = dict(attention=att, values=values, order=order, lengths=lengths, offsets=offsets) | kw
        return (ops.renormalised_contexts, (a["attention"], a["values"], a["order"], a["lengths"], a["offsets"]))

    common = [
        dict(order=far),
        dict(order=neg),
        dict(order=dup),
        dict(order=late),
        dict(lengths=torch.full((5,), 7)),
        dict(lengths=torch.tensor([2, 3, -1, 9, 2])),
        dict(lengths=lengths[:4]),
        dict(lengths=lengths.int()),
        dict(order=order.int()),
        dict(order=order[:, :5].contiguous()),
        dict(attention=att.double()),
        dict(attention=att.t()),
        dict(attention=att[:, None]),
    ]
    for kw in common:
        for make in (linear, contexts):
            assert_same_error(*make(**kw))
    for kw in (
        dict(bias=bias[:1]),
        dict(projected=proj[:4]),
        dict(projected=proj.transpose(0, 1)),
        dict(bias=bias.double()),
        dict(projected=proj[..., :0]),
    ):
        assert_same_error(*linear(**kw))
    for kw in (
        dict(offsets=offsets + 1),
        dict(offsets=offsets[:3]),
        dict(offsets=offsets.flip(0)),
        # one defect per case: a non-contiguous slice would arrive contiguous on the GPU
        # (Tensor.to copies a tensor with gaps densely), leaving only its shape to refuse
        dict(values=values[:, :5].contiguous()),
        dict(values=values.double()),
    ):
        assert_same_error(*contexts(**kw))


def test_kendall_and_distances_reject_bad_input_like_cpu():
    x, full = torch.rand(3, 5), torch.full((3,), 5)
    for args in [
        (x, x, torch.tensor([5, 6, 1])),
        (x, x, torch.tensor([5, -2, 1])),
        (x, torch.rand(3, 4), full),
        (x, x, torch.full((2,), 5)),
        (x, x, full.int()),
        (x, x.double(), full),
        (x.long(), x.long(), full),
        (x[0], x[0], full[:1]),
        (torch.rand(5, 3).t(), x, full),
    ]:
        assert_same_error(ops.kendall_tau, args)
    good = torch.rand(3, 4)
    for op in (ops.tvd, ops.jsd):
        for args in [
            (torch.tensor(0.5), torch.tensor(0.5)),  # [..., K] needs K: one row [K] is valid
            (good, torch.rand(3, 5)),
            (good, good.double()),
            (good.long(), good.long()),
            (good.t(), good.t()),
        ]:
            assert_same_error(op, args)


def test_permutation_projection_loo_reject_bad_input_like_cpu():
    att, proj, bias, lengths = perm_inputs(5, 6, 2, torch.float32, seed=1)
    for args in [
        (att, proj, bias, torch.tensor([1, 2, 7, 0, 1]), 3, 0, 0),
        (att, proj, bias, torch.tensor([1, -2, 3, 0, 1]), 3, 0, 0),
        (att, proj, bias, lengths, 0, 0, 0),
        (att, proj, bias, lengths, 3, 0, -1),
        (att, proj, bias, lengths.int(), 3, 0, 0),
        (att, proj, bias, lengths[:4], 3, 0, 0),
        (att, proj, bias[:1], lengths, 3, 0, 0),
        (att, proj.double(), bias, lengths, 3, 0, 0),
        (att.long(), proj, bias, lengths, 3, 0, 0),
        (att.t(), proj, bias, lengths, 3, 0, 0),
        (att, proj.transpose(0, 1), bias, lengths, 3, 0, 0),
    ]:
        assert_same_error(ops.permutation_tvd_linear, args)
    for args in [
        (torch.tensor([1, 9]), 6, 2, 0, 0, 0),
        (torch.tensor([1, -1]), 6, 2, 0, 0, 0),
        (lengths, 6, 0, 0, 0, 0),
        (lengths, 6, 2, 0, -1, 0),
        (lengths, 6, 2, 0, 0, -2),
        (lengths, -1, 2, 0, 0, 0),
        (lengths, 2**32, 1, 0, 0, 0),
        (lengths.int(), 6, 2, 0, 0, 0),
        (lengths[None], 6, 2, 0, 0, 0),
    ]:
        assert_same_error(ops.attention_permutations, args)
    values, weight = proj[..., None].expand(5, 6, 2, 3).reshape(5, 6, 6).contiguous(), torch.rand(2, 6)
    for args in [
        (values, weight, torch.tensor([1, 2, 7, 0, 1])),
        (values, weight, torch.tensor([-1, 2, 3, 0, 1])),
        (values, weight[:, :5].contiguous(), lengths),
        (values, weight.double(), lengths),
        (values.long(), weight, lengths),
        (values[0], weight, lengths),
        (values, weight, lengths[:3]),
        (values, weight, lengths.int()),
        (values.transpose(0, 1), weight, lengths),
        (values, weight.t(), lengths),
    ]:
        assert_same_error(ops.project_prefix, args)
    tokens = torch.randint(5, 50, (4, 6))
    good = torch.tensor([3, 6, 2, 4])
    for args in [
        (tokens, torch.tensor([3, 7, 2, 4]), 1, 1, None, 0),
        (tokens, torch.tensor([3, 6, 1, 4]), 1, 1, 5, 0),
        (tokens, good, 7, 0, None, 0),
        (tokens, good, 0, -1, None, 0),
        (tokens, good, 1, 1, -3, 0),
        (tokens.int(), good, 1, 1, None, 0),
        (tokens, good.int(), 1, 1, None, 0),
        (tokens[0], good, 1, 1, None, 0),
        (tokens, good[:3], 1, 1, None, 0),
        (tokens.t(), good, 0, 0, None, 0),
    ]:
        assert_same_error(ops.leave_one_out_batch, args)


@gpu_only
def test_mixed_devices_are_rejected():
    x = torch.rand(3, 5)
    lengths = torch.full((3,), 5)
    with pytest.raises(RuntimeError, match=r"kendall_tau \(CUDA\): all inputs must be CUDA tensors on one device"):
        ops.kendall_tau(x.cuda(), x.cuda(), lengths)
    with pytest.raises(RuntimeError, match=r"tvd \(CUDA\): p and q must be CUDA tensors on one device"):
        ops.tvd(x.cuda(), x)
    att, values, bias, order, lengths, offsets = raw_flip_inputs(4, 5, 2, F64, seed=1)
    with pytest.raises(RuntimeError, match="lengths must be a CUDA tensor on cuda"):
        ops.flip_search_linear(*dev(att, values, bias, order), lengths)
    with pytest.raises(RuntimeError, match="bias must be a CUDA tensor on cuda"):
        ops.flip_search_linear(*dev(att, values), bias, *dev(order, lengths))
    with pytest.raises(RuntimeError, match="offsets must be a CUDA tensor on cuda"):
        ops.renormalised_contexts(*dev(att, values, order, lengths), offsets)


# ---- opcheck ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_opcheck_on_device(dtype):
    rng = np.random.default_rng(19)
    for shape in [(4, 3), (1, 10), (0, 5)]:
        p, q = (torch.from_numpy(rng.random(shape)).to(dtype) for _ in range(2))
        for op in (ops.tvd, ops.jsd):
            torch.library.opcheck(op, dev(p, q))
    x, y = (torch.from_numpy(rng.standard_normal((3, 40))).to(dtype) for _ in range(2))
    lengths = torch.tensor([5, 40, 33])
    torch.library.opcheck(ops.kendall_tau, dev(x, y, lengths))
    # every row flips, so no NaN mass (opcheck compares without equal_nan)
    att, values, bias, _, lengths, _ = raw_flip_inputs(5, 6, 2, dtype, seed=43, h=3)
    lengths = lengths.clamp(min=2)
    att = torch.where(torch.arange(6) < lengths[:, None], 0.3 / (lengths[:, None] - 1), 0.0).to(dtype)
    att[:, 0] = 0.7
    proj = torch.zeros(5, 6, 2, dtype=dtype)
    proj[:, :, 0], proj[:, 0] = 1.0, torch.tensor([0.0, 10.0], dtype=dtype)
    order, offsets = removal_order(att, lengths), torch.cumsum(lengths, 0) - lengths
    torch.library.opcheck(ops.flip_search_linear.default, dev(att, proj, bias, order, lengths))
    torch.library.opcheck(ops.renormalised_contexts.default, dev(att, values, order, lengths, offsets))
    att, proj, bias, lengths = perm_inputs(6, 7, 3, dtype, seed=2)
    torch.library.opcheck(ops.permutation_tvd_linear.default, dev(att, proj, bias, lengths) + (5, 11, 2))
    torch.library.opcheck(ops.attention_permutations.default, (dev(lengths), 7, 3, 4, 1, 2))
    torch.library.opcheck(ops.project_prefix.default, dev(proj, torch.rand(2, 3, dtype=dtype), lengths))
    tokens = torch.randint(5, 50, (6, 7))
    torch.library.opcheck(ops.leave_one_out_batch.default, (*dev(tokens, lengths.clamp(min=2)), 1, 1, None, 0))
    torch.library.opcheck(ops.leave_one_out_batch.default, (*dev(tokens, lengths.clamp(min=2)), 1, 1, 3, 0))
    att, lengths = rollout_inputs(4, 2, 3, 5, dtype, seed=5)
    torch.library.opcheck(ops.attention_rollout.default, (*dev(att, lengths), 0.5))


# ---- long rows, many rows --------------------------------------------------------------------------

L_LONG = 4096


def test_long_rows():
    rng = np.random.default_rng(4)
    for dtype in (torch.float32, F64):
        p, q = (distributions(rng, (8, L_LONG)).to(dtype) for _ in range(2))
        for op in (ops.tvd, ops.jsd):
            want, got = on_both(op, p, q)
            close(got, want, dtype)
    x = rng.standard_normal((6, L_LONG))
    y = 0.3 * x + rng.standard_normal((6, L_LONG))
    x[3:], y[3:] = np.round(x[3:] * 3), np.round(y[3:] * 3)  # ties
    lengths = torch.tensor([L_LONG, L_LONG - 1, 2000, L_LONG, 17, 4000])
    assert_kendall_equal(torch.from_numpy(x), torch.from_numpy(y), lengths)
    for classes in (2, 20):
        att, proj, bias, order, lengths, _ = raw_flip_inputs(4, L_LONG, classes, F64, seed=classes)
        (r0, m0), (r1, m1) = on_both(ops.flip_search_linear, att, proj, bias, order, lengths)
        assert torch.equal(r1, r0)
        close(m1, m0, F64, rtol64=1e-13)
    att, values, _, order, lengths, offsets = raw_flip_inputs(3, L_LONG, 1, F64, seed=8, h=4)
    want, got = on_both(ops.renormalised_contexts, att, values, order, lengths, offsets)
    close(got, want, F64, rtol64=1e-12)
    att, proj, bias, lengths = perm_inputs(3, L_LONG, 2, F64, seed=9, min_len=L_LONG - 100)
    (m0, t0), (m1, t1) = on_both(ops.permutation_tvd_linear, att, proj, bias, lengths, 10, 5, 0)
    close(t1, t0, F64, rtol64=1e-12)
    close(m1, m0, F64, rtol64=1e-12)
    want, got = on_both(ops.attention_permutations, lengths, L_LONG, 3, 5, 0, 0)
    assert torch.equal(got, want)
    values = torch.randn(3, L_LONG, 64, dtype=F64)
    want, got = on_both(ops.project_prefix, values, torch.randn(2, 64, dtype=F64), lengths)
    assert torch.equal(got, want)
    tokens = torch.randint(5, 900, (2, L_LONG))
    want, got = on_both(ops.leave_one_out_batch, tokens, torch.tensor([L_LONG, 1000]), 1, 1, None, 0)
    assert all(torch.equal(x, w) for w, x in zip(want, got))


MILLION = 1_000_000


class PeakMemory:
    """Bytes allocated on the device above the level at entry, at the peak (GPU only)."""

    def __enter__(self):
        if ON_GPU:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc):
        if ON_GPU:
            torch.cuda.synchronize()
            self.extra = torch.cuda.max_memory_allocated() - self.base
        else:
            self.extra = 0


SCRATCH_BUDGET = 256 * 2**20  # csrc/cuda/geometry.h kScratchBudget
MiB = 2**20


@pytest.mark.parametrize(
    "op",
    [
        "tvd",
        "jsd",
        "kendall_tau",
        "flip_search_linear",
        "renormalised_contexts",
        "attention_permutations",
        "permutation_tvd_linear",
        "project_prefix",
        "leave_one_out_batch",
    ],
)
def test_a_million_rows_within_memory_bound(op):
    """B = 1,000,000 rows (more than one thread-per-row pass: 2^18 slots), every row
    compared with the CPU, device memory above the inputs bounded."""
    g = torch.Generator().manual_seed(0)
    if op in ("tvd", "jsd"):
        width = 24
        p = torch.softmax(torch.randn(MILLION, width, generator=g), 1)
        q = torch.softmax(torch.randn(MILLION, width, generator=g), 1)
        fn = getattr(ops, op)
        want = fn(p, q)
        pd, qd = dev(p, q)
        with PeakMemory() as mem:
            got = fn(pd, qd)
        close(host(got), want, torch.float32)
        assert mem.extra <= 2 * MILLION * 4 + MiB  # the output, nothing per row else
    elif op == "kendall_tau":
        width = 24
        x = torch.randn(MILLION, width, generator=g)
        y = torch.round(2 * torch.randn(MILLION, width, generator=g))  # ties
        lengths = torch.randint(0, width + 1, (MILLION,), generator=g)
        want = ops.kendall_tau(x, y, lengths)
        xd, yd, ld = dev(x, y, lengths)
        with PeakMemory() as mem:
            got = host(ops.kendall_tau(xd, yd, ld))
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
        close(got[1], want[1], torch.float32)
        assert mem.extra <= SCRATCH_BUDGET + 2 * MILLION * 4 + MiB
    elif op == "flip_search_linear":
        att, proj, bias, order, lengths, _ = raw_flip_inputs(MILLION, 16, 2, torch.float32, seed=2)
        want = ops.flip_search_linear(att, proj, bias, order, lengths)
        args = dev(att, proj, bias, order, lengths)
        with PeakMemory() as mem:
            got = host(ops.flip_search_linear(*args))
        assert torch.equal(got[0], want[0])
        close(got[1], want[1], torch.float32)
        # outputs, the checks' byte per item and a few [B] int64 temporaries
        assert mem.extra <= MILLION * (8 + 4) + MILLION * 16 + 8 * MILLION * 8 + MiB
    elif op == "attention_permutations":
        lengths = torch.randint(0, 9, (MILLION,), generator=g)
        want = ops.attention_permutations(lengths, 8, 2, 3, 0, 0)
        ld = dev(lengths)
        with PeakMemory() as mem:
            got = host(ops.attention_permutations(ld, 8, 2, 3, 0, 0))
        assert torch.equal(got, want)
        assert mem.extra <= want.numel() * 8 + MiB  # the output only
    elif op == "permutation_tvd_linear":
        att, proj, bias, lengths = perm_inputs(MILLION, 8, 2, torch.float32, seed=4)
        want = ops.permutation_tvd_linear(att, proj, bias, lengths, 9, 7, 0)
        args = dev(att, proj, bias, lengths)
        with PeakMemory() as mem:
            got = host(ops.permutation_tvd_linear(*args, 9, 7, 0))
        close(got[1], want[1], torch.float32)
        close(got[0], want[0], torch.float32)
        assert mem.extra <= MILLION * 10 * 4 + SCRATCH_BUDGET + MiB  # outputs and scratch
    elif op == "project_prefix":
        values = torch.randn(MILLION, 6, 8, generator=g)
        weight = torch.randn(2, 8, generator=g)
        lengths = torch.randint(0, 7, (MILLION,), generator=g)
        want = ops.project_prefix(values, weight, lengths)
        args = dev(values, weight, lengths)
        with PeakMemory() as mem:
            got = host(ops.project_prefix(*args))
        assert torch.equal(got, want)
        assert mem.extra <= want.numel() * 4 + MiB
    elif op == "leave_one_out_batch":
        tokens = torch.randint(5, 900, (MILLION, 5), generator=g)
        lengths = torch.randint(2, 6, (MILLION,), generator=g)
        want = ops.leave_one_out_batch(tokens, lengths, 1, 1, None, 0)
        args = dev(tokens, lengths)
        with PeakMemory() as mem:
            got = host(ops.leave_one_out_batch(*args, 1, 1, None, 0))
        assert all(torch.equal(x, w) for w, x in zip(want, got))
        # outputs and a few [B] int64 temporaries (real counts, offsets, widths)
        assert mem.extra <= sum(w.numel() for w in want) * 8 + 6 * MILLION * 8 + MiB
    else:
        att, values, _, order, lengths, offsets = raw_flip_inputs(MILLION, 6, 1, torch.float32, seed=3, h=4)
        want = ops.renormalised_contexts(att, values, order, lengths, offsets)
        args = dev(att, values, order, lengths, offsets)
        with PeakMemory() as mem:
            got = host(ops.renormalised_contexts(*args))
        close(got, want, torch.float32)
        assert mem.extra <= want.numel() * 4 + MILLION * 6 + 8 * MILLION * 8 + MiB


# ---- streams and devices -----------------------------------------------------------------------------


@gpu_only
def test_side_stream_results_equal_default_stream():
    rng = np.random.default_rng(6)
    p, q = (distributions(rng, (500, 40)) for _ in range(2))
    x, y = (torch.from_numpy(rng.standard_normal((500, 40))) for _ in range(2))
    lengths = torch.from_numpy(rng.integers(0, 41, 500))
    att, proj, bias, order, flen, _ = raw_flip_inputs(500, 20, 3, F64, seed=6)
    calls = [
        (ops.tvd, dev(p, q)),
        (ops.jsd, dev(p, q)),
        (ops.kendall_tau, dev(x, y, lengths)),
        (ops.flip_search_linear, dev(att, proj, bias, order, flen)),
    ]
    want = [host(op(*args)) for op, args in calls]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = [op(*args) for op, args in calls]
    torch.cuda.current_stream().wait_stream(side)
    for g, w in zip(got, want):
        torch.testing.assert_close(host(g), w, rtol=0, atol=0, equal_nan=True)


@gpu_only
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_inputs_on_another_gpu_than_the_current_one():
    rng = np.random.default_rng(7)
    x, y = (torch.from_numpy(rng.standard_normal((50, 30))) for _ in range(2))
    lengths = torch.from_numpy(rng.integers(0, 31, 50))
    want = ops.kendall_tau(x, y, lengths)
    with torch.cuda.device(0):
        got = ops.kendall_tau(x.to("cuda:1"), y.to("cuda:1"), lengths.to("cuda:1"))
    assert got[0].device == torch.device("cuda:1")
    torch.testing.assert_close(host(got[0]), want[0], rtol=0, atol=0, equal_nan=True)


@gpu_only
@pytest.mark.parametrize("rnn", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_padded_rnn_runs_match_packing_on_the_device(rnn, dtype, monkeypatch):
    """The RNN encoders' padded runs (their CUDA path: the backward direction over each row's
    real positions reversed in place, its weights in a buffer of their own) against packed
    sequences on the same GPU and against the CPU's packing: outputs and every gradient, in
    training and eval mode, ragged rows with a one-position and a full-width row. (cuDNN copies
    the forward direction's weights each call, with a warning: a cost, not a wrong value.)"""
    import attnmetrics.models.classifier as classifier
    from attnmetrics._cudnn import eval_mode_backward

    torch.manual_seed(0)
    encoder = classifier.LSTMEncoder(6, 5) if rnn is nn.LSTM else classifier.GRUEncoder(6, 5)
    lengths = torch.tensor([9, 1, 4, 9, 2, 5, 7])
    x = torch.randn(7, 9, 6, dtype=dtype)

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 as the CPU computes it

    def run(device, padded):
        monkeypatch.setattr(classifier, "padded_runs", lambda _: padded)
        encoder.zero_grad()  # before moving: .to() would move the last run's gradients in place
        module = encoder.to(device=device, dtype=dtype)
        xi = x.to(device).detach().clone().requires_grad_(True)
        # in eval mode as the gradient importances differentiate it (cuDNN's RNN backward refuses eval mode)
        with contextlib.nullcontext() if module.training else eval_mode_backward(module, device):
            out = module(xi, lengths.to(device))
            (out * torch.linspace(-1, 1, out.numel(), dtype=dtype, device=device).view_as(out)).sum().backward()
        return [t.detach().cpu().clone() for t in [out, xi.grad, *(p.grad for p in module.parameters())]]

    # float32: cuDNN's and the CPU's sums in other orders (measured on an H100: 3.4e-5 at most, on a weight's gradient)
    tol = dict(rtol=1e-3, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-11)
    for mode in ("train", "eval"):
        getattr(encoder, mode)()
        want = run(torch.device("cpu"), False)
        for padded in (False, True):
            got = run(DEVICE, padded)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, **tol)
        assert (got[0][~token_mask(lengths, 9)] == 0).all()


@gpu_only
def test_battery_memory_budget_on_the_device():
    """The battery's chunks on a GPU: more than the CPU's 256 MiB, at most 4 GiB."""
    from attnmetrics._validation import DEFAULT_MEMORY_BUDGET
    from attnmetrics.app.battery.registry import GPU_MEMORY_BUDGET, memory_budget

    assert memory_budget(torch.device("cpu")) == DEFAULT_MEMORY_BUDGET
    assert DEFAULT_MEMORY_BUDGET <= memory_budget(DEVICE) <= GPU_MEMORY_BUDGET


_SYNC_DEBUG_SET = []  # non-empty once this process has set torch's sync debug mode


def _device_reads(fn) -> list[str]:
    """Where ``fn()`` waits on the GPU (torch's sync debug mode: ``.item()``, ``.cpu()``,
    ``nonzero``, a blocking copy to the host...): the Python line of each wait that torch turns
    into a Python warning, and ``"stderr"`` for each it prints to the process's stderr instead
    (a C++ warning raised outside a Python call's handler: the H200 run printed 28 of them).
    The first time a process sets the mode, torch itself waits once (torch/cuda/__init__.py; seen
    on the H200 in two tests' first calls): a throwaway count absorbs it."""
    import tempfile
    import warnings

    if not _SYNC_DEBUG_SET:
        _SYNC_DEBUG_SET.append(True)
        _device_reads(lambda: None)
    torch.cuda.synchronize()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as err, warnings.catch_warnings(record=True) as caught:
        os.dup2(err.fileno(), 2)
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        printed = err.read().decode(errors="replace").count("synchronizing CUDA operation")
    return [f"{os.path.basename(w.filename)}:{w.lineno}" for w in caught if "synchronizing" in str(w.message)] + [
        "stderr"
    ] * printed


@gpu_only
def test_procedures_read_the_device_a_fixed_number_of_times():
    """Issue 32 (one orchestration shaped for the device): validation reads the device a fixed
    number of times per public call and nothing reads it inside the per-chunk loops, so a call
    split into many chunks by a small memory budget waits on the GPU exactly as often as the same
    call in one chunk. The Python side of every procedure is checked on the CPU
    (tests/test_device_reads.py); this adds the reads inside our CUDA ops. Leave-one-out and ERASER
    through the kernels give ``leave_one_out_batch`` and ``rationale_batch`` their lengths on the
    host, so those ops plan there and read nothing (they read once a chunk before 2026-11-27).
    Left out, because an op of theirs reads back its output size and row checks once a chunk:
    leave-one-out through the BiLSTM's own deletions (which plan each call's runs on the host),
    flip search over a general decoder (``renormalised_contexts``) and the permutation test over a
    general decoder (``attention_permutations`` reads its lengths' range once a chunk: 5 reads in
    one chunk, 20 in 16 on the H200, 2026-11-27)."""
    from attnmetrics import (
        adversarial_attention,
        attention_gradient,
        comprehensiveness,
        leave_one_out,
        permutation_test,
        single_removal,
        single_token_test,
    )
    from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
    from attnmetrics.protocol import forward
    from tests.toy import ProtocolOnly

    torch.manual_seed(0)
    model = EncoderAttentionClassifier(ModelConfig(vocab_size=50, embed_dim=8, hidden_size=6)).to(DEVICE).eval()
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 25, (64,), generator=g)
    tokens = torch.randint(4, 50, (64, int(lengths.max())), generator=g)
    tokens[torch.arange(tokens.shape[1]) >= lengths[:, None]] = 0
    tokens, lengths = dev(tokens, lengths)
    f = forward(model, tokens, lengths)
    p = torch.softmax(torch.randn(20_000, 50, device=DEVICE), -1)
    hidden = f.hidden.shape[-1]
    mlp = nn.Sequential(nn.Linear(hidden, 8), nn.Tanh(), nn.Linear(8, 2)).to(DEVICE)  # the general decoder path
    plain = ProtocolOnly(model)  # no deletion_logits: the leave_one_out_batch kernel and the whole model
    scores = torch.rand(f.attention.shape, generator=g).to(DEVICE)
    calls = {
        "leave_one_out (kernel)": lambda budget: leave_one_out(plain, tokens, lengths, memory_budget=budget),
        "leave_one_out, mask (kernel)": lambda budget: leave_one_out(
            plain, tokens, lengths, mode="mask", mask_token=1, memory_budget=budget
        ),
        "comprehensiveness": lambda budget: (
            comprehensiveness(plain, tokens, lengths, scores[:, 1:], memory_budget=budget).values
        ),
        "tvd": lambda budget: tvd(p, p.flip(0), memory_budget=budget),
        "flip_fraction": lambda budget: flip_fraction(
            f.attention, f.hidden, model.decoder, f.lengths, memory_budget=budget
        ),
        "attention_gradient, an MLP decoder": lambda budget: attention_gradient(
            f.attention, f.hidden, mlp, f.lengths, memory_budget=budget
        ),
        "permutation_test": lambda budget: permutation_test(
            f.attention, f.hidden, model.decoder, f.lengths, permutations=20, memory_budget=budget
        ),
        "single_removal, an MLP decoder": lambda budget: single_removal(
            f.attention, f.hidden, mlp, f.lengths, memory_budget=budget
        ),
        "adversarial_attention": lambda budget: adversarial_attention(
            f.attention, f.hidden, model.decoder, f.lengths, steps=3, memory_budget=budget
        ),
        "adversarial_attention, an MLP decoder": lambda budget: adversarial_attention(
            f.attention, f.hidden, mlp, f.lengths, steps=3, memory_budget=budget
        ),
        "single_token_test": lambda budget: single_token_test(  # max_rows: its calls' size
            model, tokens, lengths, max_rows=8192 if budget == 2**30 else 64
        ),
    }
    counts, differ = {}, {}
    for name, call in calls.items():
        call(2**30)  # warm: cuDNN plans, the caching allocator
        one, many = _device_reads(lambda: call(2**30)), _device_reads(lambda: call(2**16))
        counts[name] = (len(one), len(many))
        if len(one) != len(many):
            differ[name] = (Counter(one), Counter(many))
    print(counts)
    assert not differ, differ
