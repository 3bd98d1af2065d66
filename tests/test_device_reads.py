"""Issue 32's orchestration, checked on the CPU: with the GPU's plan forced (few large padded
calls, :func:`attnmetrics.loo.padded_calls`; the RNN over the padded batch,
:func:`attnmetrics.models.classifier.padded_runs`), a procedure reads tensors back to the host
(``.item()``, ``.tolist()``, ``bool``/``int`` of a tensor, ``.cpu()``, ``.numpy()``) as often when a
small memory budget splits it into many chunks and model calls as in one: its validation reads a
fixed number of times and its loops read nothing (their checks wait for one read at the end,
:mod:`attnmetrics._deferred`). Reads inside the C++ ops are not seen here; the same property
with those counted is ``tests/test_cuda.py::test_procedures_read_the_device_a_fixed_number_of_times``
(a GPU's sync debug mode).

Not covered, and why: leave-one-out through a model's own ``deletion_logits`` (the BiLSTM's
reuse, ``models/deletions.py``) plans each call's LSTM runs from their lengths on the host.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from attnmetrics import (
    adversarial_attention,
    attention_gradient,
    comprehensiveness,
    flip_fraction,
    leave_one_out,
    permutation_test,
    single_removal,
    single_token_test,
    sufficiency,
    tvd,
)
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.protocol import forward
from tests.toy import ProtocolOnly

READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.__float__,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
}
ONE_CHUNK, MANY_CHUNKS = 2**30, 2**12


class HostReads(TorchFunctionMode):
    """Counts the tensor-to-host reads made inside it (by Python code: torch's own ops are not seen)."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self.count[func.__name__] += 1
        return func(*args, **(kwargs or {}))


class Counted(nn.Module):
    """A module that counts its calls (the decoder or the model's encoder)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, *args):
        self.calls += 1
        return self.inner(*args)


@pytest.fixture
def gpu_plan(monkeypatch):
    import attnmetrics.loo
    import attnmetrics.models.classifier

    monkeypatch.setattr(attnmetrics.loo, "padded_calls", lambda device: True)
    monkeypatch.setattr(attnmetrics.models.classifier, "padded_runs", lambda device: True)


def _setting():
    torch.manual_seed(0)
    model = EncoderAttentionClassifier(ModelConfig(vocab_size=50, embed_dim=8, hidden_size=6)).eval()
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 25, (48,), generator=g)
    tokens = torch.randint(4, 50, (48, int(lengths.max())), generator=g)
    tokens[torch.arange(tokens.shape[1]) >= lengths[:, None]] = 0
    with torch.no_grad():
        f = forward(model, tokens, lengths)
    scores = torch.rand(f.attention.shape, generator=g)
    heads = torch.softmax(torch.randn(48, 3, f.attention.shape[1], generator=g), -1)
    heads = heads.masked_fill(torch.arange(heads.shape[-1]) >= f.lengths[:, None, None], 0)
    heads = heads / heads.sum(-1, keepdim=True)
    head_values = torch.randn(48, 3, f.attention.shape[1], 4, generator=g)
    return model, tokens, lengths, f, scores, heads, head_values


def _seeded():
    return torch.Generator().manual_seed(5)


def _calls():
    model, tokens, lengths, f, scores, heads, head_values = _setting()
    plain = ProtocolOnly(model)
    hidden = f.hidden.shape[-1]
    mlp = Counted(nn.Sequential(nn.Linear(hidden, 8), nn.Tanh(), nn.Linear(8, 2)))
    head_mlp = Counted(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    p = torch.softmax(torch.randn(3000, 20, generator=torch.Generator().manual_seed(3)), -1)
    a, h, n = f.attention.detach(), f.hidden.detach(), f.lengths
    # name -> (call of a budget, the number of model or decoder calls so far, which must grow with the chunks; or None)
    return {
        "tvd": (lambda b: tvd(p, p.flip(0), memory_budget=b), None),
        "leave_one_out, delete": (
            lambda b: leave_one_out(plain, tokens, lengths, memory_budget=b),
            lambda: plain.encode_calls,
        ),
        "leave_one_out, mask": (
            lambda b: leave_one_out(plain, tokens, lengths, mode="mask", mask_token=1, memory_budget=b),
            lambda: plain.encode_calls,
        ),
        "comprehensiveness": (
            lambda b: comprehensiveness(plain, tokens, lengths, scores[:, 1:], memory_budget=b).values,
            lambda: plain.encode_calls,
        ),
        "sufficiency": (
            lambda b: sufficiency(plain, tokens, lengths, scores[:, 1:], memory_budget=b).values,
            lambda: plain.encode_calls,
        ),
        "flip_fraction, an MLP decoder": (
            lambda b: flip_fraction(a, h, mlp, n, memory_budget=b).removed,
            lambda: mlp.calls,
        ),
        "flip_fraction, gradient order": (
            lambda b: flip_fraction(a, h, mlp, n, order="gradient", memory_budget=b).removed,
            lambda: mlp.calls,
        ),
        "flip_fraction, heads and an MLP": (
            lambda b: flip_fraction(heads, head_values, head_mlp, n, memory_budget=b).removed,
            lambda: head_mlp.calls,
        ),
        "attention_gradient": (lambda b: attention_gradient(a, h, mlp, n, memory_budget=b), lambda: mlp.calls),
        "permutation_test, an MLP decoder": (
            lambda b: (
                permutation_test(
                    a, h, mlp, n, permutations=10, memory_budget=b, return_all=True, generator=_seeded()
                ).tvd
            ),
            lambda: mlp.calls,
        ),
        "permutation_test, heads and an MLP": (
            lambda b: (
                permutation_test(
                    heads,
                    head_values,
                    head_mlp,
                    n,
                    permutations=10,
                    memory_budget=b,
                    return_all=True,
                    generator=_seeded(),
                ).tvd
            ),
            lambda: head_mlp.calls,
        ),
        "single_removal, an MLP decoder": (
            lambda b: single_removal(a, h, mlp, n, which="random", generator=_seeded(), memory_budget=b).jsd,
            lambda: mlp.calls,
        ),
        "single_removal, a linear decoder": (
            lambda b: single_removal(a, h, model.decoder, n, memory_budget=b).jsd,
            None,
        ),
        "adversarial_attention, an MLP decoder": (
            lambda b: adversarial_attention(a, h, mlp, n, steps=3, generator=_seeded(), memory_budget=b).attention,
            lambda: mlp.calls,
        ),
        "adversarial_attention, a linear decoder": (
            lambda b: (
                adversarial_attention(a, h, model.decoder, n, steps=3, generator=_seeded(), memory_budget=b).attention
            ),
            None,
        ),
        "single_token_test": (  # its chunks are max_rows single-token inputs a call
            lambda b: single_token_test(plain, tokens, lengths, max_rows=8192 if b == ONE_CHUNK else 16).alone,
            lambda: plain.encode_calls,
        ),
    }


CALLS = list(_calls())


def assert_reads_do_not_grow(call, calls_so_far, small_budget: int) -> None:
    """``call(budget)`` reads the host as often at ``small_budget`` as in one chunk, with the same
    values; ``calls_so_far()`` (the model's or decoder's calls; None: not counted) must show that the
    small budget did split the work."""
    reads, calls, results = [], [], []
    for budget in (ONE_CHUNK, small_budget):
        before = calls_so_far() if calls_so_far is not None else 0
        with HostReads() as mode:
            results.append(call(budget))
        reads.append(sum(mode.count.values()))
        calls.append((calls_so_far() if calls_so_far is not None else 0) - before)
    if calls_so_far is not None:
        assert calls[1] > calls[0] >= 1, calls
    assert reads[0] == reads[1], (reads, calls)
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", CALLS)
def test_reads_do_not_grow_with_the_chunks(gpu_plan, name):
    call, counted = _calls()[name]
    assert_reads_do_not_grow(call, counted, MANY_CHUNKS)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_a_transformers_model_calls_read_nothing(gpu_plan, family):
    """transformers tests a padding mask for padding before building it (a read per model call); our
    mask function skips that test where calls are padded: leave-one-out and comprehensiveness on a
    Hugging Face model read as often in many calls as in one."""
    pytest.importorskip("transformers", reason="transformers is optional")
    from tests.models import test_hf

    model = ProtocolOnly(test_hf.tiny(family))
    tokens, lengths = test_hf.ragged(family, 24, 11, 4)
    lengths = lengths.clamp(min=2)  # GPT-2 has no special tokens: a one-token row cannot lose it
    scores = torch.rand(24, 11, generator=torch.Generator().manual_seed(6))
    for call in (
        lambda b: leave_one_out(model, tokens, lengths, mode="mask", mask_token=3, memory_budget=b),
        lambda b: comprehensiveness(model, tokens, lengths, scores, memory_budget=b).values,
    ):
        assert_reads_do_not_grow(call, lambda: model.encode_calls, 2**13)


@pytest.mark.parametrize("method", ["globenc", "alti", "value_zeroing", "gradient_weighted_rollout", "decompx"])
def test_the_attention_derived_attributions_read_nothing_per_chunk(gpu_plan, method):
    """The attributions run a forward per chunk of rows; their checks wait for the end (attention
    flow is left out: its max-flow runs on the host, a copy per chunk by design)."""
    pytest.importorskip("transformers", reason="transformers is optional")
    import attnmetrics.attributions
    from tests.models import test_hf

    model = test_hf.tiny("bert")
    tokens, lengths = test_hf.ragged("bert", 24, 11, 4)
    forwards = []
    model.hf.bert.register_forward_hook(lambda *_: forwards.append(1))
    fn = getattr(attnmetrics.attributions, method)
    assert_reads_do_not_grow(lambda b: fn(model, tokens, lengths, memory_budget=b), lambda: len(forwards), 2**13)


def test_the_gpu_plan_gives_the_cpu_plans_values(monkeypatch):
    """The forced plan is the GPU's orchestration on the CPU: its values are the CPU plan's."""
    import attnmetrics.loo
    import attnmetrics.models.classifier

    cpu = {name: call(ONE_CHUNK) for name, (call, _) in _calls().items()}
    monkeypatch.setattr(attnmetrics.loo, "padded_calls", lambda device: True)
    monkeypatch.setattr(attnmetrics.models.classifier, "padded_runs", lambda device: True)
    for name, (call, _) in _calls().items():
        torch.testing.assert_close(call(MANY_CHUNKS), cpu[name], rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)
