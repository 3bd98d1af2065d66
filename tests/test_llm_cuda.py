"""The decoder-LLM path on a GPU (issue 46): tiny random Llama-layout decoders in float64 (a prompted
LlamaForCausalLM with biases on every projection, a Llama and a Qwen2 classifier; grouped-query
attention) on the device against the same model built again on the CPU, on ragged rows with a
one-token text: the forward (the template prefix's reused keys and values), leave-one-out and ERASER's
comprehensiveness and sufficiency (the causal reuses), gradients, integrated gradients and each
attention-derived method.

The tolerance is float32's, not float64's: transformers computes the rotary tables (cos, sin) in float32
whatever the model's dtype, and the GPU's float32 sin and cos differ from the CPU's in the last bits, so
a float64 model agrees across devices to about 1e-7 (on an H200, 2026-11-29: at most 2.8e-7 absolute
over these tests). An error of the code (a position, a head, a reused prefix off by one) moves them by
orders of magnitude more.

Marked ``cuda``: CI has no GPU and skips it. ``ATTNMETRICS_TEST_DEVICE=cpu`` runs it against a second
CPU copy (a dry run of the test itself, which proves nothing about a GPU)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import attnmetrics  # noqa: E402
from attnmetrics import importance  # noqa: E402
from tests.test_llm_attributions import METHODS, build, ragged  # noqa: E402

DEVICE = torch.device(os.environ.get("ATTNMETRICS_TEST_DEVICE") or "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs CUDA"),
]
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module", params=["prompted", "llama", "qwen2"])
def pair(request):
    """(the model on the CPU, the same model built again and moved to the device)"""
    return build(request.param), build(request.param).to(DEVICE)


@pytest.fixture(scope="module")
def rows(pair):
    """Ragged rows, one of a single text token where deleting it is defined (a prompted model keeps its
    template; a classifier's deletions need two tokens: its one-token row is given a second)."""
    tokens, lengths = ragged(rows=6, width=9, seed=3)
    if not hasattr(pair[0], "prefix_ids"):
        lengths[1], tokens[1, 1] = 2, 9
    scores = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    return tokens, lengths, scores


def on(device, *tensors):
    return [t.to(device) for t in tensors]


def assert_same(got, want):
    """``got`` (computed on the device) equals ``want`` (on the CPU): tensors, or the tensor fields of a
    result dataclass or tuple."""
    if isinstance(want, torch.Tensor):
        assert got.device.type == DEVICE.type, f"a result is on {got.device}, expected {DEVICE.type}"
        torch.testing.assert_close(got.cpu(), want, **TOL)
        return
    fields = [getattr(want, f.name) for f in dataclasses.fields(want)] if dataclasses.is_dataclass(want) else list(want)
    others = [getattr(got, f.name) for f in dataclasses.fields(got)] if dataclasses.is_dataclass(got) else list(got)
    compared = 0
    for g, w in zip(others, fields, strict=True):
        if isinstance(w, torch.Tensor):
            assert_same(g, w)
            compared += 1
    assert compared, "nothing was compared"


def both(op, pair, rows, *extra):
    cpu, dev = pair
    tokens, lengths, scores = rows
    args = (tokens, lengths, scores)[: 2 + len(extra)]
    return op(dev, *on(DEVICE, *args)), op(cpu, *args)


def test_forward_with_the_reused_prefix(pair, rows):
    with torch.no_grad():
        got, want = both(lambda m, t, n: m(t, n), pair, rows)
    assert_same(got, want)


def test_leave_one_out(pair, rows):
    got, want = both(attnmetrics.leave_one_out, pair, rows)
    assert_same(got, want)


@pytest.mark.parametrize("metric", ["comprehensiveness", "sufficiency"])
def test_eraser(pair, rows, metric):
    fn = getattr(attnmetrics, metric)
    got, want = both(lambda m, t, n, s: fn(m, t, n, s), pair, rows, "scores")
    assert_same(got, want)


def test_gradients_and_integrated_gradients(pair, rows):
    got, want = both(importance.gradient_importance, pair, rows)
    assert_same(got, want)
    pytest.importorskip("captum")
    got, want = both(lambda m, t, n: attnmetrics.integrated_gradients(m, t, n, steps=8), pair, rows)
    assert_same(got, want)


@pytest.mark.parametrize("name", METHODS)
def test_attention_derived_methods(pair, rows, name):
    method = METHODS[name][0]
    got, want = both(method, pair, rows)
    assert_same(got, want)
