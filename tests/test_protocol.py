"""The model contract's check, the same on every Python (3.12 changed ``isinstance`` against a
runtime-checkable Protocol), and the device checks and cuDNN guard that the CUDA paths rely on,
proved on the CPU with stubbed backends."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnmetrics
from attnmetrics import _cudnn, gradient_importance
from attnmetrics._validation import check_generator, same_device
from attnmetrics.models import classifier
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.protocol import is_attention_classifier, missing_members
from tests.toy import ToyClassifier, toy_batch


def rnn_model(encoder: str = "lstm", classes: int = 2) -> EncoderAttentionClassifier:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=30, embed_dim=6, hidden_size=4, num_classes=classes, encoder=encoder)
    return EncoderAttentionClassifier(config).double().eval()


class PlainObject:
    """Not a module: the members as plain methods and attributes."""

    lead, trail = 0, 0

    def embed(self, tokens):
        return tokens

    def encode(self, embedded, lengths):
        return embedded

    def attend(self, hidden, lengths):
        return hidden

    def decoder(self, context):
        return context


# ---- the protocol check --------------------------------------------------------------------------


@pytest.mark.parametrize("encoder", ["lstm", "gru", "cnn", "average"])
def test_modules_whose_decoder_is_a_submodule_implement_the_protocol(encoder):
    model = rnn_model(encoder)
    assert "decoder" in model._modules  # not a class attribute: what getattr_static misses
    assert is_attention_classifier(model) and missing_members(model) == []


def test_plain_objects_and_toys_implement_the_protocol():
    assert is_attention_classifier(PlainObject())
    assert is_attention_classifier(ToyClassifier())
    assert attnmetrics.is_attention_classifier is is_attention_classifier


def test_missing_members_are_named_in_order():
    assert missing_members(nn.Linear(2, 2)) == ["embed", "encode", "attend", "decoder", "lead", "trail"]
    half = PlainObject()
    half.decoder = "not callable"
    half.attend = None
    assert missing_members(half) == ["attend", "decoder"]
    assert not is_attention_classifier(half)


def test_procedures_name_the_missing_members():
    tokens, lengths = toy_batch()
    model = ToyClassifier()
    del model.decoder
    with pytest.raises(TypeError, match=r"got ToyClassifier without decoder$"):
        gradient_importance(model, tokens, lengths)
    with pytest.raises(TypeError, match=r"got Linear without embed, encode, attend, decoder, lead, trail"):
        gradient_importance(nn.Linear(2, 2), tokens, lengths)


def test_the_protocol_is_not_runtime_checkable():
    """isinstance would answer wrongly for modules on Python >= 3.12: it refuses, on every version."""
    with pytest.raises(TypeError):
        isinstance(rnn_model(), attnmetrics.AttentionClassifier)


# ---- devices ---------------------------------------------------------------------------------------


def test_a_device_without_an_index_is_the_current_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert same_device(torch.device("cuda"), torch.device("cuda:0"))
    assert same_device("cuda:0", "cuda")
    assert not same_device("cuda", "cuda:1")
    assert not same_device("cuda:1", "cuda:0")
    assert not same_device("cpu", "cuda:0")
    assert same_device("cpu", torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert same_device("cuda", "cuda:1") and not same_device("cuda", "cuda:0")


def test_check_generator_compares_normalised_devices():
    g = torch.Generator()
    assert check_generator(g, torch.device("cpu")) is g
    with pytest.raises(ValueError, match="generator is on cpu, attention on cuda:0; they must match"):
        check_generator(g, torch.device("cuda:0"))


# ---- cuDNN's eval-mode RNN backward, stubbed on the CPU ---------------------------------------------


class CudnnRefusal(RuntimeError):
    pass


@pytest.fixture
def cudnn_stub(monkeypatch):
    """Every nn.RNNBase behaves as under cuDNN on a GPU: differentiating it in eval mode with
    cuDNN enabled fails as cuDNN's backward does. The CPU counts as cuDNN's device."""
    seen = []

    def refusing(forward):
        def stub(self, *args, **kwargs):
            seen.append(torch.backends.cudnn.enabled)
            if torch.backends.cudnn.enabled and not self.training and torch.is_grad_enabled():
                raise CudnnRefusal("cudnn RNN backward can only be called in training mode")
            return forward(self, *args, **kwargs)

        return stub

    for cls in (nn.LSTM, nn.GRU):
        monkeypatch.setattr(cls, "forward", refusing(cls.forward))
    # the encoders' runs over the padded batch (models/classifier.py: padded_runs) call cuDNN's
    # RNN functions directly, one direction a call
    encoder = classifier._BiRNNEncoder
    monkeypatch.setattr(encoder, "_direction", refusing(encoder._direction))
    monkeypatch.setattr(_cudnn, "CUDNN_DEVICE_TYPES", ("cpu",))
    return seen


def importances():
    fns = [gradient_importance]
    try:
        import captum  # noqa: F401
    except ImportError:
        return fns
    from attnmetrics import input_x_gradient, integrated_gradients

    return fns + [input_x_gradient, lambda m, t, n: integrated_gradients(m, t, n, steps=3)]


@pytest.mark.parametrize("encoder", ["lstm", "gru"])
def test_gradient_importances_differentiate_rnns_in_eval_mode_under_cudnn(cudnn_stub, monkeypatch, encoder):
    model = rnn_model(encoder)
    tokens, lengths = toy_batch()
    for importance in importances():
        monkeypatch.setattr(_cudnn, "CUDNN_DEVICE_TYPES", ())  # no guard: the stub refuses
        with pytest.raises(CudnnRefusal):
            importance(model, tokens, lengths)
        monkeypatch.setattr(_cudnn, "CUDNN_DEVICE_TYPES", ("cpu",))
        with torch.backends.cudnn.flags(enabled=True):
            got = importance(model, tokens, lengths)
            assert torch.backends.cudnn.enabled  # restored
        assert not model.training
        monkeypatch.setattr(_cudnn, "CUDNN_DEVICE_TYPES", ())
        with torch.backends.cudnn.flags(enabled=False):  # what the guard does, by hand
            want = importance(model, tokens, lengths)
        assert torch.equal(got, want)
    assert False in cudnn_stub  # the guarded calls ran with cuDNN off


def test_the_guard_leaves_models_without_rnns_and_other_devices_alone():
    with torch.backends.cudnn.flags(enabled=True):
        with _cudnn.eval_mode_backward(ToyClassifier(), torch.device("cuda")):  # no RNN module
            assert torch.backends.cudnn.enabled
        with _cudnn.eval_mode_backward(rnn_model(), torch.device("cpu")):
            assert torch.backends.cudnn.enabled
        with _cudnn.eval_mode_backward(rnn_model(), torch.device("cuda:0")):
            assert not torch.backends.cudnn.enabled
        assert torch.backends.cudnn.enabled
    assert not _cudnn.has_recurrent_module(PlainObject())


# ---- eval mode -------------------------------------------------------------------------------------


def test_eval_mode_restores_the_training_flag_even_when_the_block_raises():
    from attnmetrics.protocol import eval_mode

    model = rnn_model().train()
    with eval_mode(model) as inside:
        assert inside is model and not model.training
    assert model.training
    with pytest.raises(RuntimeError, match="inside"), eval_mode(model):
        raise RuntimeError("inside")
    assert model.training
    model.eval()
    with eval_mode(model):
        pass
    assert not model.training  # left as it was
    with eval_mode(PlainObject()):  # no eval/train: nothing to do
        pass


# ---- optional capabilities ---------------------------------------------------------------------------


def test_capabilities_are_found_by_getattr_and_unknown_names_refused():
    from attnmetrics.protocol import CAPABILITIES, capability

    model = rnn_model()  # J&W's BiLSTM reuses states for deletions and maskings
    assert capability(model, "deletion_logits") is not None and capability(model, "masking_logits") is not None
    assert capability(model, "rollout") is None and capability(PlainObject(), "deletion_logits") is None
    plain = PlainObject()
    plain.rollout = "not callable"
    assert capability(plain, "rollout") is None
    with pytest.raises(ValueError, match="unknown capability 'deletions'"):
        capability(model, "deletions")
    assert set(CAPABILITIES) == {"deletion_logits", "masking_logits", "subset_logits", "tested_attention", "rollout"}
