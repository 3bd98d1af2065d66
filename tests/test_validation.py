"""Bad inputs shared by the public API: each gives a ValueError or TypeError naming the argument,
what was expected and what was given, before any kernel runs."""

from __future__ import annotations

import math

import pytest
import torch

from attnmetrics import (
    adversarial_attention,
    attention_gradient,
    flip_fraction,
    jsd,
    kendall_tau,
    permutation_test,
    single_removal,
    tvd,
)
from tests.inputs import batch, linear, mlp

F64 = torch.float64


def _procedures():
    """(name, call(attention, values, decoder, lengths, **kw)) of the four attention procedures."""
    return [
        ("flip_fraction", lambda a, v, d, n, **kw: flip_fraction(a, v, d, n, **kw)),
        ("single_removal", lambda a, v, d, n, **kw: single_removal(a, v, d, n, **kw)),
        ("permutation_test", lambda a, v, d, n, **kw: permutation_test(a, v, d, n, permutations=3, **kw)),
        ("adversarial_attention", lambda a, v, d, n, **kw: adversarial_attention(a, v, d, n, steps=1, **kw)),
    ]


PROCEDURES = dict(_procedures())
#: the keyword that makes each procedure draw from its generator
RANDOM = {"flip_fraction": dict(order="random"), "single_removal": dict(which="random")}


@pytest.mark.parametrize("name", PROCEDURES)
@pytest.mark.parametrize("bad", [5, "seed", 1.5])
def test_generator_of_the_wrong_type_is_named(name, bad):
    att, values, lengths = batch(b=4, t=5, h=3, min_len=2)
    with pytest.raises(
        TypeError,
        match=rf"generator must be a torch\.Generator, an attnmetrics\.KeyedRows or None, got {type(bad).__name__}",
    ):
        PROCEDURES[name](att, values, linear(3, 2), lengths, generator=bad, **RANDOM.get(name, {}))


@pytest.mark.parametrize("bad", ["x", "1.0", None, True])
def test_never_flipped_must_be_a_float(bad):
    att, values, lengths = batch(b=4, t=5, h=3, min_len=2)
    with pytest.raises(
        TypeError, match=rf"never_flipped must be a float \(NaN, or e\.g\. 1\.0\), got {type(bad).__name__}"
    ):
        flip_fraction(att, values, linear(3, 2), lengths, never_flipped=bad)
    got = flip_fraction(att, values, linear(3, 2), lengths, never_flipped=1)  # an int is a real number
    assert torch.all(got.fraction[~got.flipped] == 1.0)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("name", PROCEDURES)
def test_values_with_no_features_are_named(name):
    # H = 0 gave a ZeroDivisionError (chunk sizes) or a meaningless result
    att, values, lengths = batch(b=4, t=5, h=3, min_len=2)
    empty = values[:, :, :0]
    for dec in (torch.nn.Linear(0, 2).double(), lambda x: torch.zeros(x.shape[0], 2, dtype=x.dtype)):
        with pytest.raises(ValueError, match=r"values must have H >= 1 features .* got H = 0: shape \[4, 5, 0\]"):
            PROCEDURES[name](att, empty, dec, lengths)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("name", PROCEDURES)
def test_linear_decoder_without_classes_is_named(name):
    # nn.Linear(H, 0) reached the kernels ("projected must have C >= 1") or a reshape error
    att, values, lengths = batch(b=4, t=5, h=3, min_len=2)
    with pytest.raises(ValueError, match=r"decoder is an nn\.Linear with out_features 0; .* C >= 1"):
        PROCEDURES[name](att, values, torch.nn.Linear(3, 0).double(), lengths)


@pytest.mark.parametrize("name", [*PROCEDURES, "attention_gradient"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float16])
def test_decoder_logits_of_another_dtype_are_named(name, dtype):
    # int64 and float16 logits were decided silently (or failed later in tvd/jsd, blaming p)
    att, values, lengths = batch(b=4, t=5, h=3, min_len=2)

    def dec(x):
        return (x[:, :2] * 100).to(dtype)

    call = PROCEDURES.get(name, lambda a, v, d, n: attention_gradient(a, v, d, n))
    with pytest.raises(ValueError, match=rf"decoder must return float32 or float64 logits .*float64.*, got {dtype}"):
        call(att, values, dec, lengths)


def _meta_calls():
    att, values, lengths = batch(b=4, t=5, h=3, min_len=2)
    meta = {"attention": att.to("meta"), "values": values.to("meta")}
    calls = [
        ("p", lambda: tvd(att.to("meta"), att)),
        ("q", lambda: jsd(att, att.to("meta"))),
        ("x", lambda: kendall_tau(att.to("meta"), att)),
        ("y", lambda: kendall_tau(att, att.to("meta"))),
    ]
    for call in PROCEDURES.values():
        for arg in ("attention", "values"):
            a, v = (meta["attention"], values) if arg == "attention" else (att, meta["values"])
            calls.append((arg, lambda call=call, a=a, v=v: call(a, v, linear(3, 2), None)))
    return calls


@pytest.mark.parametrize("arg, call", _meta_calls())
def test_meta_tensors_are_named(arg, call):
    # meta tensors failed inside torch ("Cannot copy out of meta tensor")
    with pytest.raises(
        ValueError, match=rf"{arg} is on device 'meta' \(a tensor without data\); expected a CPU or CUDA"
    ):
        call()


@pytest.mark.parametrize("fn", [tvd, jsd])
@pytest.mark.parametrize("bad", [True, False, 2.0**20])
def test_distance_memory_budget_is_checked_like_the_other_ops(fn, bad):
    # True was accepted as a budget of 1 byte
    p = torch.tensor([[0.5, 0.5]])
    with pytest.raises(ValueError, match=rf"memory_budget must be a positive int \(bytes\), got {bad!r}"):
        fn(p, p, memory_budget=bad)


def test_sum_tolerance_scales_with_the_row_length_and_dtype():
    # a genuine float32 softmax over 10**6 items misses 1 by more than the old fixed 1e-4
    n = 10**6
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, generator=g) * 0.01
    z[: n // 2] += 5
    att = torch.softmax(z, 0)[None]
    assert abs(float(att.sum(dtype=F64)) - 1) > 1e-4  # the case the fixed tolerance rejected
    values = torch.randn(1, n, 1, generator=g)
    dec = linear(1, 2, torch.float32)
    flip_fraction(att, values, dec)  # accepted
    off = att.clone()
    off[0, 0] += 1.01 - float(att.sum(dtype=F64))  # the row sums to 1.01
    with pytest.raises(ValueError, match=r"row 0 sums to 1\.01, beyond the tolerance 0\.00745 for 1000000"):
        flip_fraction(off, values, dec)
    short = torch.tensor([[0.5, 0.5002]])  # 2e-4 off: still rejected for a short row, in both dtypes
    for dtype in (torch.float32, F64):
        with pytest.raises(ValueError, match=r"attention rows must sum to 1.*tolerance 0\.0001 for 2"):
            flip_fraction(short.to(dtype), torch.ones(1, 2, 1, dtype=dtype), linear(1, 2, dtype))


@pytest.mark.parametrize(
    "name", ["flip_fraction", "adversarial_attention", "attention_gradient", "single_removal", "permutation_test"]
)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_values_are_named_with_any_decoder(name, bad):
    # with an MLP, inf in values gave flip_fraction a silent result and NaN was blamed on the
    # decoder by adversarial_attention; a small budget checks that the row is the batch's
    att, values, lengths = batch(b=6, min_len=2)
    values[3, 1, 0] = bad
    call = {
        "flip_fraction": lambda v: flip_fraction(att, v, mlp(6, 2), lengths, memory_budget=2000),
        "adversarial_attention": lambda v: adversarial_attention(
            att, v, mlp(6, 2), lengths, steps=1, memory_budget=2000
        ),
        "attention_gradient": lambda v: attention_gradient(att, v, mlp(6, 2), lengths, memory_budget=200),
        "single_removal": lambda v: single_removal(att, v, mlp(6, 2), lengths, memory_budget=2000),
        "permutation_test": lambda v: permutation_test(att, v, mlp(6, 2), lengths, permutations=3, memory_budget=2000),
    }[name]
    with pytest.raises(ValueError, match=r"values must be finite on each row's valid prefix.*in row 3$"):
        call(values)
    values[3, 1, 0] = 0.0
    values[3, lengths[3] :] = bad  # padding is never read
    call(values)


@pytest.mark.parametrize("name", PROCEDURES)
@pytest.mark.parametrize("param", ["weight", "bias"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_linear_decoder_is_named(name, param, bad):
    # the closed forms never call the decoder: a NaN bias gave flip_fraction 'never flips' for every
    # row, and the others an internal message about p or the values
    att, values, lengths = batch(b=6, min_len=2)
    dec = linear(values.shape[2], 2)
    with torch.no_grad():
        getattr(dec, param)[0] = bad
    with pytest.raises(ValueError, match=rf"decoder\.{param} must be finite"):
        PROCEDURES[name](att, values, dec, lengths)
