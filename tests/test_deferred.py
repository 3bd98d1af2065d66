"""attnmetrics._deferred: checks that wait for one device read at the end of a public call."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnmetrics import attention_gradient, flip_fraction, leave_one_out
from attnmetrics._deferred import defer, deferred, deferring
from tests.test_device_reads import HostReads

YES, NO = torch.tensor(True), torch.tensor(False)


def test_outside_a_scope_a_check_raises_at_once():
    defer(YES, lambda: AssertionError("not built when the check passes"))
    with pytest.raises(ValueError, match="now"):
        defer(NO, lambda: ValueError("now"))
    assert not deferring()


def test_inside_a_scope_the_first_failed_check_raises_when_it_closes_after_one_read():
    ran = []
    with pytest.raises(ValueError, match="first") as info:
        with HostReads() as reads:
            with deferred():
                assert deferring()
                defer(YES, lambda: AssertionError("passed"))
                defer(NO, lambda: ValueError("first"))
                ran.append("after the failed check")
                for _ in range(20):
                    defer(torch.tensor([False]), lambda: ValueError("later"))
    assert ran == ["after the failed check"]
    assert sum(reads.count.values()) == 1, reads.count
    assert info.value.__cause__ is None
    assert not deferring()


def test_a_nested_scope_leaves_the_read_to_the_outermost():
    with pytest.raises(ValueError, match="inner"):
        with deferred():
            with deferred():
                defer(NO, lambda: ValueError("inner"))
            assert deferring()  # the inner scope closed without raising
            defer(NO, lambda: ValueError("outer"))


def test_a_body_that_raises_after_a_failed_check_reports_the_check():
    with pytest.raises(ValueError, match="the cause") as info:
        with deferred():
            defer(NO, lambda: ValueError("the cause"))
            raise RuntimeError("a consequence")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not deferring()


def test_a_body_that_raises_with_every_check_passed_raises_its_own_error():
    with pytest.raises(RuntimeError, match="its own"):
        with deferred():
            defer(YES, lambda: ValueError("passed"))
            raise RuntimeError("its own")
    assert not deferring()


def test_the_scope_works_as_a_decorator_and_closes_per_call():
    @deferred()
    def check(ok):
        defer(torch.tensor(ok), lambda: ValueError("failed"))
        return "returned"

    assert check(True) == "returned"
    with pytest.raises(ValueError, match="failed"):
        check(False)
    assert check(True) == "returned" and not deferring()


def test_an_id_outside_the_vocabulary_is_still_named_by_a_procedure():
    """Inside leave-one-out the embedding's range check is deferred and the lookup clamps: the
    error is the one a direct call raises, and nothing reads out of bounds first."""
    from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig

    model = EncoderAttentionClassifier(ModelConfig(vocab_size=20, embed_dim=4, hidden_size=3)).eval()
    tokens = torch.tensor([[2, 5, 6, 3], [2, 7, 25, 3]])
    message = r"tokens must be ids in \[0, vocab_size\) = \[0, 20\), got min 2, max 25"
    with pytest.raises(ValueError, match=message):
        model.embed(tokens)
    with pytest.raises(ValueError, match=message):
        leave_one_out(model, tokens, torch.tensor([4, 4]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_gradient_names_the_row_of_a_later_chunk(dtype):
    """One-row chunks of two-head attention; row 9's heads each hold the dtype's largest values,
    so their summed context overflows: the error names row 9, as checking chunk by chunk did."""
    att = torch.full((12, 2, 3), 1 / 3, dtype=dtype)
    values = torch.ones(12, 2, 3, 2, dtype=dtype)
    values[9] = torch.finfo(dtype).max  # finite values whose context (a sum over heads) overflows
    decoder = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 2)).to(dtype)
    match = f"the context sum_t alpha_t h_t overflowed {dtype} in row 9"
    with pytest.raises(ValueError, match=match):
        attention_gradient(att, values, decoder, memory_budget=1)
    with pytest.raises(ValueError, match=match):
        flip_fraction(att, values, decoder, order="gradient", memory_budget=1)
    values[9] = 1.0
    assert attention_gradient(att, values, decoder, memory_budget=1).isfinite().all()


def test_attention_gradient_names_a_non_finite_decoder_parameter():
    att = torch.full((6, 3), 1 / 3, dtype=torch.float64)
    decoder = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 2)).double()
    with torch.no_grad():
        decoder[2].weight[1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"2\.weight must be finite"):
        attention_gradient(att, torch.ones(6, 3, 2, dtype=torch.float64), decoder, memory_budget=1)


def test_a_hugging_face_models_ids_are_checked_too():
    pytest.importorskip("transformers", reason="transformers is optional")
    from tests.models import test_hf

    model = test_hf.tiny("bert")
    tokens, lengths = test_hf.ragged("bert", 4, 9, 0)
    tokens[2, 1] = 10_000  # a real token of row 2
    vocab = model.hf.bert.get_input_embeddings().num_embeddings
    message = rf"tokens must be ids in \[0, vocab_size\) = \[0, {vocab}\), got min \d+, max 10000"
    with pytest.raises(ValueError, match=message):
        model.embed(tokens)
    with pytest.raises(ValueError, match=message):
        leave_one_out(model, tokens, lengths, mode="mask", mask_token=3)
