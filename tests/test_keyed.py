"""KeyedRows: per-instance random streams. The bits against a pure-Python splitmix64 written from
its published definition; every procedure's draws independent of how the rows are batched."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmetrics import KeyedRows, adversarial_attention, flip_fraction, permutation_test, single_removal
from attnmetrics.flip import random_scores
from attnmetrics.permutation import attention_permutations
from tests.inputs import batch, heads_batch, linear, mlp

U64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(state: int) -> tuple[int, int]:
    """(next state, output): Steele, Lea & Flood 2014 / Vigna's splitmix64.c."""
    state = (state + GOLDEN) & U64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return state, z ^ (z >> 31)


def reference_stream(seed: int, row: int, count: int) -> list[int]:
    """Row ``row``'s first ``count`` outputs: state ``mix(mix(seed) ^ row)``, mix = one splitmix64 output."""
    key = splitmix64(splitmix64(seed & U64)[1] ^ row)[1]
    out = []
    for _ in range(count):
        key, z = splitmix64(key)
        out.append(z)
    return out


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(-(2**63), 2**63 - 1),
    offset=st.integers(0, 2**62),
    batch_size=st.integers(1, 5),
    count=st.integers(1, 6),
    start=st.integers(0, 4),
)
def test_bits_are_splitmix64_from_each_rows_key(seed, offset, batch_size, count, start):
    got = KeyedRows(seed, offset).bits(batch_size, count, start=start)
    for b in range(batch_size):
        want = reference_stream(seed, offset + b, start + count)[start:]
        assert [int(v) & U64 for v in got[b]] == want


def test_uniform_and_normal_have_their_distributions():
    keyed = KeyedRows(7, 3)
    u = keyed.uniform(400, (250,))
    assert u.dtype == torch.float64 and u.min() >= 0 and u.max() < 1
    n = 100_000
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    z = keyed.normal(400, (250,))
    assert abs(z.mean().item()) < 5 / math.sqrt(n)
    assert abs(z.var().item() - 1) < 5 * math.sqrt(2 / n)
    assert keyed.normal(2, (3,), dtype=torch.float32).dtype == torch.float32
    i = keyed.integers(n)
    assert i.min() >= 0 and i.max() < 2**62 and i.float().mean() / 2**62 == pytest.approx(0.5, abs=0.01)


def test_rows_of_different_seeds_or_instances_differ():
    a = KeyedRows(1).uniform(4, (8,))
    assert not torch.equal(a, KeyedRows(2).uniform(4, (8,)))
    assert torch.equal(a[1:], KeyedRows(1, 1).uniform(3, (8,)))  # the same instance, wherever it sits


def split_and_join(call, n: int, cuts: list[int]):
    """``call(rows, KeyedRows)`` on the whole batch and on consecutive pieces of it, each piece
    keyed by its first instance: both results, the pieces concatenated."""
    whole = call(slice(0, n), KeyedRows(11, 0))
    bounds = [0, *cuts, n]
    parts = [call(slice(s, e), KeyedRows(11, s)) for s, e in zip(bounds, bounds[1:]) if e > s]
    return whole, [torch.cat(p) for p in zip(*parts)]


@pytest.mark.parametrize("multi", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("decoder", ["linear", "mlp"])
def test_every_procedure_gives_each_instance_the_same_draws_in_any_batch(multi, dtype, decoder):
    if multi:
        att, values, lengths = heads_batch(b=23, t=9, h=5, dtype=dtype, seed=3, first=(0, 1))
    else:
        att, values, lengths = batch(b=23, t=9, h=5, dtype=dtype, seed=3)
        att = att.T.contiguous().T  # non-contiguous input
    dec = (linear(5, 2) if decoder == "linear" else mlp(5, 2)).to(dtype)
    procedures = {
        "flip": lambda r, g: (
            flip_fraction(att[r], values[r], dec, lengths[r], order="random", samples=3, generator=g).removed.T,
        ),
        "permutation": lambda r, g: (
            permutation_test(att[r], values[r], dec, lengths[r], permutations=7, generator=g, return_all=True).tvd,
        ),
        "single_removal": lambda r, g: (
            *single_removal(att[r], values[r], dec, lengths[r], which="random", generator=g)[::3],  # jsd, index
        ),
        "adversarial": lambda r, g: adversarial_attention(att[r], values[r], dec, lengths[r], steps=3, generator=g)[:2],
    }
    for name, call in procedures.items():
        whole, joined = split_and_join(call, len(lengths), [1, 2, 10, 17])
        for w, j in zip(whole, joined):
            torch.testing.assert_close(
                w, j, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-12, equal_nan=True, msg=name
            )


def test_keyed_permutations_are_the_kernels_with_the_instance_offset():
    att, values, lengths = batch(b=6, t=7, h=3, min_len=2, seed=1)
    dec = mlp(3, 2)
    got = permutation_test(att, values, dec, lengths, permutations=5, generator=KeyedRows(42, 100), return_all=True).tvd
    perms = attention_permutations(lengths, 7, 5, 42, row_offset=100)
    for b in range(6):
        for p in range(5):
            permuted = att[b, perms[b, p]]
            want = (torch.softmax(dec(permuted @ values[b]), -1) - torch.softmax(dec(att[b] @ values[b]), -1)).abs()
            assert got[b, p].item() == pytest.approx(0.5 * want.sum().item(), abs=1e-12)


def test_random_flip_sample_s_reads_its_own_stretch_of_each_stream():
    keyed = KeyedRows(5, 9)
    streams = keyed.uniform(4, (3 * 6,))
    for s in range(3):
        assert torch.equal(random_scores(4, 6, keyed, sample=s), streams[:, s * 6 : (s + 1) * 6])


@pytest.mark.parametrize(
    ("keyed", "match"),
    [
        (
            KeyedRows(2**63),
            r"KeyedRows\.seed must be an int in \[-9223372036854775808, 2\*\*63\), got 9223372036854775808",
        ),
        (KeyedRows(0, -1), r"KeyedRows\.offset must be an int in \[0, 2\*\*63\), got -1"),
        (KeyedRows(0, 1.5), r"KeyedRows\.offset must be an int in \[0, 2\*\*63\), got 1\.5"),
        (KeyedRows(True), r"KeyedRows\.seed must be an int"),
    ],
)
def test_bad_keys_are_named(keyed, match):
    att, values, lengths = batch(b=3, t=4, h=2)
    with pytest.raises(ValueError, match=match):
        flip_fraction(att, values, linear(2, 2), lengths, order="random", generator=keyed)
