"""The attention classifier, its training loop, metrics and checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnmetrics.data import load_sst
from attnmetrics.models.classifier import ATTENTIONS, ENCODERS, EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.text import EncodedSplit, Vocabulary, collate
from attnmetrics.models.training import (
    Classification,
    TrainConfig,
    classification_metrics,
    evaluate,
    load_checkpoint,
    loss_fn,
    make_optimizer,
    predict,
    save_checkpoint,
    seed_everything,
    train,
)
from attnmetrics.protocol import token_mask
from tests.inputs import SST_DIR


def small_model(num_classes: int = 1, vocab_size: int = 30, seed: int = 0) -> EncoderAttentionClassifier:
    torch.manual_seed(seed)
    return EncoderAttentionClassifier(
        ModelConfig(vocab_size, embed_dim=8, hidden_size=6, num_classes=num_classes)
    ).eval()


def ragged_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = [[2] + torch.randint(4, 30, (n,), generator=g).tolist() + [3] for n in (5, 1, 9, 3)]
    return rows, *collate(rows)


def test_implements_the_protocol():
    model = small_model()
    assert (model.lead, model.trail) == (1, 1)
    assert isinstance(model.decoder, nn.Linear) and model.decoder.in_features == 12
    try:
        from attnmetrics.protocol import is_attention_classifier
    except Exception as exc:  # the library's import builds its C++ extension
        pytest.skip(f"attnmetrics not importable here: {exc}")
    assert is_attention_classifier(model)


def test_token_mask():
    mask = token_mask(torch.tensor([4, 2, 3]), 5, 1, 1)
    assert mask.tolist() == [
        [False, True, True, False, False],
        [False, False, False, False, False],
        [False, True, False, False, False],
    ]


@pytest.mark.parametrize("num_classes", [1, 3])
def test_attention_masks_specials_and_padding(num_classes):
    model = small_model(num_classes)
    _, tokens, lengths = ragged_batch()
    logits, attention = model(tokens, lengths)
    assert logits.shape == (4, num_classes) and attention.shape == tokens.shape
    real = token_mask(lengths, tokens.shape[1], 1, 1)
    assert torch.all(attention[~real] == 0)  # exactly zero at <SOS>, <EOS> and padding
    assert torch.allclose(attention.sum(1), torch.ones(4), atol=1e-6)
    assert torch.all(attention[real] > 0)
    hidden = model.encode(model.embed(tokens), lengths)
    pad = torch.arange(tokens.shape[1]) >= lengths[:, None]
    assert torch.all(hidden[pad] == 0)
    assert torch.equal(model.attend(hidden, lengths), attention)


def test_padded_batch_equals_rows_alone():
    model = small_model()
    rows, tokens, lengths = ragged_batch(1)
    logits, attention = model(tokens, lengths)
    for i, row in enumerate(rows):
        alone_logits, alone_attention = model(*collate([row]))
        assert torch.allclose(logits[i], alone_logits[0], atol=1e-6)
        assert torch.allclose(attention[i, : len(row)], alone_attention[0], atol=1e-6)


def test_imposed_attention():
    model = small_model()
    _, tokens, lengths = ragged_batch(2)
    logits, attention = model(tokens, lengths)
    same, _ = model(tokens, lengths, attention=attention)
    assert torch.allclose(same, logits)
    real = token_mask(lengths, tokens.shape[1], 1, 1).float()
    uniform = real / real.sum(1, keepdim=True)
    imposed, used = model(tokens, lengths, attention=uniform)
    assert used is uniform and not torch.allclose(imposed, logits)
    hidden = model.encode(model.embed(tokens), lengths)
    expected = model.decoder((uniform.unsqueeze(-1) * hidden).sum(1))
    assert torch.allclose(imposed, expected, atol=1e-6)
    with pytest.raises(ValueError, match="imposed attention"):
        model(tokens, lengths, attention=uniform[:, :-1])


def test_pretrained_embeddings_and_bad_config():
    weights = torch.randn(30, 8)
    model = EncoderAttentionClassifier(ModelConfig(30, embed_dim=8, hidden_size=6), weights)
    assert torch.equal(model.embedding.weight[1:], weights[1:]) and torch.all(model.embedding.weight[0] == 0)
    with pytest.raises(ValueError, match="embeddings must be"):
        EncoderAttentionClassifier(ModelConfig(30, embed_dim=8), torch.randn(30, 9))
    with pytest.raises(ValueError, match="unknown encoder"):
        EncoderAttentionClassifier(ModelConfig(30, encoder="transformer"))
    with pytest.raises(ValueError, match="unknown attention"):
        EncoderAttentionClassifier(ModelConfig(30, attention="bilinear"))
    with pytest.raises(ValueError, match="multiple of 4"):
        EncoderAttentionClassifier(ModelConfig(30, hidden_size=6, encoder="cnn"))


def test_weight_decay_spares_attention():
    model = small_model()
    decayed, free = make_optimizer(model, TrainConfig()).param_groups
    assert decayed["weight_decay"] == 1e-5 and free["weight_decay"] == 0.0
    assert {id(p) for p in free["params"]} == {id(p) for p in model.attention.parameters()}
    assert len(decayed["params"]) + len(free["params"]) == len(list(model.parameters()))


# --------------------------------------------------------------------------- encoder x attention zoo

ZOO = [(e, a) for e in ENCODERS for a in ATTENTIONS]


def zoo_model(encoder: str, attention: str, num_classes: int = 1, seed: int = 0) -> EncoderAttentionClassifier:
    """A small model in float64, so batch-vs-alone comparisons can be tight."""
    torch.manual_seed(seed)
    config = ModelConfig(30, embed_dim=8, hidden_size=8, num_classes=num_classes, encoder=encoder, attention=attention)
    return EncoderAttentionClassifier(config).double().eval()


def test_registries():
    assert set(ENCODERS) == {"lstm", "gru", "cnn", "average"} and set(ATTENTIONS) == {"tanh", "dot", "uniform"}
    # H: both directions for the RNNs, the whole hidden_size for cnn (4 widths x 2) and average.
    sizes = {e: zoo_model(e, "tanh").encoder.output_size for e in ENCODERS}
    assert sizes == {"lstm": 16, "gru": 16, "cnn": 8, "average": 8}


@pytest.mark.parametrize("encoder, attention", ZOO)
@pytest.mark.parametrize("num_classes", [1, 3])
def test_zoo_attention_masks_specials_and_padding(encoder, attention, num_classes):
    model = zoo_model(encoder, attention, num_classes)
    _, tokens, lengths = ragged_batch(4)
    logits, attn = model(tokens, lengths)
    assert logits.shape == (4, num_classes) and attn.shape == tokens.shape
    real = token_mask(lengths, tokens.shape[1], 1, 1)
    assert torch.all(attn[~real] == 0)  # exactly zero at <SOS>, <EOS> and padding
    assert torch.all(attn[real] > 0)
    assert torch.allclose(attn.sum(1), torch.ones(4, dtype=attn.dtype), atol=1e-12)
    hidden = model.encode(model.embed(tokens), lengths)
    assert (
        hidden.shape
        == (4, tokens.shape[1], model.encoder.output_size)
        == (4, tokens.shape[1], model.decoder.in_features)
    )
    pad = torch.arange(tokens.shape[1]) >= lengths[:, None]
    assert torch.all(hidden[pad] == 0)


@pytest.mark.parametrize("encoder, attention", ZOO)
def test_zoo_row_alone_equals_padded_batch(encoder, attention):
    model = zoo_model(encoder, attention)
    rows, tokens, lengths = ragged_batch(5)
    logits, attn = model(tokens, lengths)
    for i, row in enumerate(rows):
        alone_logits, alone_attn = model(*collate([row]))
        assert torch.allclose(logits[i], alone_logits[0], atol=1e-12, rtol=0)
        assert torch.allclose(attn[i, : len(row)], alone_attn[0], atol=1e-12, rtol=0)
    # Whatever sits at the padding positions of the embeddings must not reach real tokens.
    embedded = model.embed(tokens)
    pad = (torch.arange(tokens.shape[1]) >= lengths[:, None]).unsqueeze(-1)
    noisy = embedded + pad * torch.randn(
        embedded.shape, dtype=embedded.dtype, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(model.encode(noisy, lengths), model.encode(embedded, lengths))


@pytest.mark.parametrize("encoder, reach", [("average", 0), ("cnn", 3), ("lstm", None), ("gru", None)])
def test_encoder_context_width(encoder, reach):
    """Changing token j moves hidden state t only within the encoder's reach: none for the
    average encoder, |t - j| <= 3 for widths up to 7, everywhere for the BiRNNs."""
    model = zoo_model(encoder, "tanh")
    T, j = 12, 6
    tokens, lengths = collate([[2] + list(range(4, 4 + T - 2)) + [3]])
    embedded = model.embed(tokens)
    changed = embedded.clone()
    changed[0, j] += 1.0
    moved = (model.encode(changed, lengths) - model.encode(embedded, lengths)).abs().amax(-1)[0] > 0
    expected = [reach is None or abs(t - j) <= reach for t in range(T)]
    assert moved.tolist() == expected


def test_dot_attention_is_scaled_learned_query():
    model = zoo_model("lstm", "dot")
    _, tokens, lengths = ragged_batch(6)
    hidden = model.encode(model.embed(tokens), lengths)
    w = model.attention.w.weight[0]
    real = token_mask(lengths, tokens.shape[1], 1, 1)
    for i in range(len(lengths)):
        h = hidden[i][real[i]]
        expected = torch.softmax(h @ w / h.shape[-1] ** 0.5, dim=0)
        assert torch.allclose(model.attend(hidden, lengths)[i][real[i]], expected, atol=1e-12)


@pytest.mark.parametrize("encoder, attention", ZOO)
def test_zoo_imposed_attention_and_gradients(encoder, attention):
    model = zoo_model(encoder, attention, num_classes=3)
    _, tokens, lengths = ragged_batch(7)
    logits, attn = model(tokens, lengths)
    real = token_mask(lengths, tokens.shape[1], 1, 1).double()
    skewed = real * torch.arange(
        1, tokens.shape[1] + 1, dtype=real.dtype
    )  # differs from every model's own, uniform's too
    skewed = skewed / skewed.sum(1, keepdim=True)
    imposed, _ = model(tokens, lengths, attention=skewed)
    assert not torch.allclose(imposed, logits)
    assert torch.allclose(model(tokens, lengths, attention=attn)[0], logits)

    model.train()
    loss = loss_fn(model(tokens, lengths)[0], torch.tensor([0, 1, 2, 1]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    assert torch.all(model.embedding.weight.grad[0] == 0)  # <PAD> is never trained


@pytest.mark.parametrize("encoder, attention", ZOO)
@pytest.mark.sst
def test_zoo_training_on_sst_lowers_loss(encoder, attention, sst_slice):
    vocab, tr, dv = sst_slice
    seed_everything(0)
    model = EncoderAttentionClassifier(
        ModelConfig(len(vocab), embed_dim=16, hidden_size=8, encoder=encoder, attention=attention)
    )
    part = tr.subset(192)
    before = evaluate(model, part)["loss"]
    train(model, part, dv.subset(50), TrainConfig(epochs=2, progress=False, lr=3e-3))
    assert evaluate(model, part)["loss"] < before


# --------------------------------------------------------------------------- metrics


def test_classification_metrics():
    logits = torch.tensor([[2.0], [-1.0], [0.0], [3.0]])  # decisions 1, 0, 0 (p = 0.5 -> 0), 1
    m = classification_metrics(logits, torch.tensor([1, 0, 1, 0]))
    assert m["accuracy"] == 0.5
    assert m["macro_f1"] == pytest.approx(0.5)  # both classes: tp 1, fp 1, fn 1
    assert m["roc_auc"] == pytest.approx(0.5)
    three = classification_metrics(torch.eye(3).repeat(2, 1), torch.tensor([0, 1, 2, 0, 1, 2]))
    assert three == {"accuracy": 1.0, "macro_f1": 1.0, "roc_auc": 1.0}
    assert np.isnan(classification_metrics(logits, torch.ones(4, dtype=torch.int64))["roc_auc"])


def test_predict_keeps_split_order():
    model = small_model()
    rows, tokens, lengths = ragged_batch(3)
    split = EncodedSplit(rows, [0, 1, 0, 1])
    shuffled = list(split.batches(3, shuffle=True, generator=torch.Generator().manual_seed(0)))
    p = predict(model, shuffled)
    logits, attention = model(tokens, lengths)
    assert torch.allclose(p.logits, logits, atol=1e-6) and torch.allclose(p.attention, attention, atol=1e-6)
    assert p.lengths.tolist() == lengths.tolist() and p.labels.tolist() == [0, 1, 0, 1]
    assert set(evaluate(model, split)) == {"accuracy", "macro_f1", "roc_auc", "loss"}


# --------------------------------------------------------------------------- training on real data


@pytest.fixture(scope="module")
def sst_slice():
    assert SST_DIR is not None, "a test using sst_slice must carry the sst mark"
    splits = load_sst(SST_DIR)
    vocab = Vocabulary.build([t for t, _ in splits.train[:400]])
    return vocab, vocab.encode_split(splits.train[:400]), vocab.encode_split(splits.dev[:100])


def fresh(vocab, seed=0):
    seed_everything(seed)
    return EncoderAttentionClassifier(ModelConfig(len(vocab), embed_dim=32, hidden_size=16))


@pytest.mark.sst
def test_one_epoch_lowers_loss_and_is_deterministic(sst_slice):
    vocab, tr, dv = sst_slice
    config = TrainConfig(epochs=1, progress=False)
    model = fresh(vocab)
    before = evaluate(model, tr)["loss"]
    result = train(model, tr, dv, config)
    assert evaluate(model, tr)["loss"] < before
    assert result.best_epoch == 1 and len(result.history) == 1

    again = fresh(vocab)
    train(again, tr, dv, config)
    assert torch.equal(predict(model, dv).logits, predict(again, dv).logits)


@pytest.mark.sst
def test_keeps_best_dev_epoch_and_checkpoint_round_trip(sst_slice, tmp_path):
    vocab, tr, dv = sst_slice
    model = fresh(vocab, seed=1)
    config = TrainConfig(epochs=2, progress=False, seed=1)
    result = train(model, tr.subset(200), dv, config)
    best = max(result.history, key=lambda h: h["dev_roc_auc"])
    assert result.best_epoch == best["epoch"]
    assert evaluate(model, dv)["roc_auc"] == pytest.approx(result.best_dev["roc_auc"])

    save_checkpoint(tmp_path / "ckpt", model, vocab, extra={"train": {"epochs": 2}})
    loaded, loaded_vocab, extra = load_checkpoint(tmp_path / "ckpt")
    assert loaded.config == model.config and loaded_vocab.itos == vocab.itos and extra == {"train": {"epochs": 2}}
    assert torch.equal(predict(loaded, dv).logits, predict(model, dv).logits)
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        load_checkpoint(tmp_path)


@pytest.mark.sst
def test_ties_on_dev_roc_auc_go_to_the_lower_dev_loss(sst_slice, monkeypatch):
    """A saturated dev set (ROC-AUC 1.0 from the first epoch, as two BBC topics give): the epoch
    kept is the tied one with the lowest dev loss; a higher ROC-AUC still wins over any loss."""
    import attnmetrics.models.training as training

    vocab, tr, dv = sst_slice
    scripted = iter(
        [
            dict(roc_auc=0.9, loss=0.1),
            dict(roc_auc=1.0, loss=0.5),
            dict(roc_auc=1.0, loss=0.2),
            dict(roc_auc=1.0, loss=0.3),
            dict(roc_auc=float("nan"), loss=0.0),
        ]
    )
    monkeypatch.setattr(training, "evaluate", lambda *a, **k: dict(accuracy=1.0, macro_f1=1.0, **next(scripted)))
    result = train(fresh(vocab), tr.subset(40), dv, TrainConfig(epochs=5, progress=False))
    assert result.best_epoch == 3 and result.best_dev["loss"] == 0.2


def test_multiclass_training_step():
    model = small_model(num_classes=3)
    _, tokens, lengths = ragged_batch()
    labels = torch.tensor([0, 1, 2, 1])
    logits, _ = model(tokens, lengths)
    loss = loss_fn(logits, labels)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    assert model.attention.proj.weight.grad is not None


def test_token_ids_outside_the_vocabulary_are_named():
    model = EncoderAttentionClassifier(ModelConfig(vocab_size=10, embed_dim=4, hidden_size=3))
    for bad in (10, -1):
        with pytest.raises(ValueError, match=r"ids in \[0, vocab_size\) = \[0, 10\)"):
            model.embed(torch.tensor([[2, bad, 3]]))


class _Scaled(Classification):
    """The task loss times 1000: gradients whose global norm is well above 1."""

    def loss(self, model, batch, attention):
        return 1000 * super().loss(model, batch, attention)


@pytest.mark.sst
@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_grad_clip_bounds_the_global_norm_at_each_step(sst_slice, monkeypatch, clip):
    # GPT-1's code clips the global gradient norm at 1 (openai/finetune-transformer-lm opt.py:30-31,
    # train.py:333 --max_grad_norm 1); grad_clip=0 leaves the gradients alone
    vocab, tr, dv = sst_slice
    norms = []
    step = torch.optim.Adam.step

    def record(self, *a, **kw):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in grads]))))
        return step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.Adam, "step", record)
    train(
        fresh(vocab), tr, dv, TrainConfig(epochs=1, batch_size=32, progress=False, grad_clip=clip), objective=_Scaled()
    )
    assert len(norms) == -(-len(tr) // 32)
    if clip:
        assert max(norms) <= clip * (1 + 1e-6) and min(norms) > 0.99 * clip  # every step's norm was above 1
    else:
        assert min(norms) > 1.0


def test_grad_clip_must_be_a_non_negative_number():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="grad_clip"):
            TrainConfig(grad_clip=bad)


@pytest.mark.sst
def test_linear_schedule_warms_up_then_decays_to_zero(sst_slice, monkeypatch):
    # GPT-1 sec. 4.1: "a linear learning rate decay schedule with warmup over 0.2% of training"
    vocab, tr, dv = sst_slice
    seen = []
    step = torch.optim.Adam.step

    def record(self, *a, **kw):
        seen.append((self.param_groups[0]["lr"], self.param_groups[0]["decoupled_weight_decay"]))
        return step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.Adam, "step", record)
    config = TrainConfig(
        epochs=2, batch_size=16, lr=0.01, progress=False, schedule="linear", warmup=0.25, decoupled_weight_decay=True
    )
    train(fresh(vocab), tr, dv, config)
    lrs = np.array([lr for lr, _ in seen])
    total = 2 * -(-len(tr) // 16)
    warm = -(-total // 4)
    assert len(lrs) == total and all(decoupled for _, decoupled in seen)
    np.testing.assert_allclose(lrs[:warm], 0.01 * np.arange(1, warm + 1) / warm)  # rises to the peak
    np.testing.assert_allclose(lrs[warm:], 0.01 * (total - np.arange(warm, total)) / (total - warm))  # to 0 at the end
    with pytest.raises(ValueError, match="warmup needs schedule='linear'"):
        TrainConfig(warmup=0.1)
    with pytest.raises(ValueError, match="fraction of the training steps"):
        TrainConfig(schedule="linear", warmup=1.5)


# ---- the RNN encoders over the padded batch (their CUDA path) ---------------------------------


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_padded_runs_give_the_packed_outputs_and_gradients(rnn, bidirectional, monkeypatch):
    """On a GPU the RNN encoders run over the padded batch, the backward direction over the
    rows reversed in place (attnmetrics.models.classifier.padded_runs): outputs and every
    gradient as packed sequences give them (float64; ragged rows, a one-position row, a
    full-width row), in training and eval mode."""
    import attnmetrics.models.classifier as classifier

    torch.manual_seed(0)
    encoder = ENCODERS[rnn](embed_dim=5, hidden_size=4)
    if not bidirectional:
        encoder = type(encoder).__new__(type(encoder))
        classifier._BiRNNEncoder.__init__(encoder, 5, 4, bidirectional=False)
    encoder = encoder.double()
    lengths = torch.tensor([7, 1, 4, 7, 2, 5])
    x = torch.randn(6, 7, 5, dtype=torch.float64)

    def run(padded: bool):
        monkeypatch.setattr(classifier, "padded_runs", lambda device: padded)
        encoder.zero_grad()
        xi = x.clone().requires_grad_(True)
        out = encoder(xi, lengths)
        (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)).sum().backward()
        return out.detach(), xi.grad, [p.grad.clone() for p in encoder.parameters()]

    for mode in (encoder.train, encoder.eval):
        mode()
        packed, padded = run(False), run(True)
        torch.testing.assert_close(padded[0], packed[0], rtol=0, atol=1e-12)
        assert (padded[0][token_mask(lengths, 7).logical_not()] == 0).all()  # padding exactly zero
        torch.testing.assert_close(padded[1], packed[1], rtol=0, atol=1e-12)
        for got, want in zip(padded[2], packed[2]):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
