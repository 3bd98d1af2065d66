"""Tutek & Šnajder 2020's regularisers (concat, residual, tying, masked LM); their single-token
test is tests/test_single_token.py."""

import pytest
import torch

from attnmetrics.data import load_sst
from attnmetrics.models.classifier import REGULARISERS, EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.text import Vocabulary
from attnmetrics.models.training import (
    TrainConfig,
    load_checkpoint,
    make_optimizer,
    save_checkpoint,
    seed_everything,
    train,
)
from tests.inputs import SST_DIR
from tests.inputs import sentence_rows as ragged

torch.set_num_threads(1)
E, HID = 8, 8  # embedding size; hidden size (per direction for the BiLSTM, H = 16)


def model_with(regulariser: str, encoder: str = "lstm", seed: int = 0, **kw) -> EncoderAttentionClassifier:
    torch.manual_seed(seed)
    config = ModelConfig(30, embed_dim=E, hidden_size=HID, encoder=encoder, regulariser=regulariser, **kw)
    return EncoderAttentionClassifier(config).double().eval()


def test_registry_and_bad_config():
    assert REGULARISERS == ("none", "concat", "residual", "tying", "mlm")
    with pytest.raises(ValueError, match="unknown regulariser"):
        EncoderAttentionClassifier(ModelConfig(30, regulariser="dropout"))
    with pytest.raises(ValueError, match="mlm_mask_prob"):
        EncoderAttentionClassifier(ModelConfig(30, regulariser="mlm", mlm_mask_prob=0.0))
    # A config saved before the regulariser fields existed still loads, as "none".
    old = {
        k: v
        for k, v in ModelConfig(30).to_dict().items()
        if k not in ("regulariser", "tying_weight", "mlm_weight", "mlm_mask_prob")
    }
    assert ModelConfig.from_dict(old).regulariser == "none"


@pytest.mark.parametrize("encoder", ["lstm", "cnn", "average"])
def test_concat_appends_the_embedding(encoder):
    model = model_with("concat", encoder)
    plain = model_with("none", encoder)
    _, tokens, lengths = ragged()
    embedded = model.embed(tokens)
    hidden = model.encode(embedded, lengths)
    H = plain.encoder.output_size
    assert hidden.shape == (*tokens.shape, H + E) and model.decoder.in_features == H + E
    assert torch.equal(hidden[..., :H], model.encoder(embedded, lengths))  # same seed: same encoder
    pad = torch.arange(tokens.shape[1]) >= lengths[:, None]
    assert torch.equal(hidden[..., H:][~pad], embedded[~pad]) and torch.all(hidden[pad] == 0)
    # The embedding half reaches the decoder: its decoder columns move the logits.
    logits, attention = model(tokens, lengths)
    assert torch.allclose(logits, model.decoder(torch.einsum("bt,bth->bh", attention, hidden)))
    with torch.no_grad():
        model.decoder.weight[:, H:] += 1.0
    assert not torch.allclose(model(tokens, lengths)[0], logits)


def test_residual_adds_the_projected_embedding():
    model = model_with("residual")
    _, tokens, lengths = ragged(1)
    embedded = model.embed(tokens)
    hidden = model.encode(embedded, lengths)
    H = model.encoder.output_size
    assert hidden.shape == (*tokens.shape, H) and model.decoder.in_features == H
    pad = torch.arange(tokens.shape[1]) >= lengths[:, None]
    expected = model.encoder(embedded, lengths) + model.residual(embedded)
    assert torch.allclose(hidden[~pad], expected[~pad]) and torch.all(hidden[pad] == 0)
    logits, _ = model(tokens, lengths)
    with torch.no_grad():
        model.residual.weight.mul_(2.0)
    assert not torch.allclose(model(tokens, lengths)[0], logits)  # the projection reaches the decoder


def test_tying_loss_value():
    for hidden_size, identity in ((HID, False), (E // 2, True)):  # BiLSTM H = 2 * hidden_size
        torch.manual_seed(0)
        model = EncoderAttentionClassifier(
            ModelConfig(30, embed_dim=E, hidden_size=hidden_size, regulariser="tying", tying_weight=0.5)
        ).double()
        assert isinstance(model.tying, torch.nn.Identity) == identity
        rows, tokens, lengths = ragged(2)
        with torch.no_grad():
            out = model.states(tokens, lengths)
        total, count = 0.0, 0
        for i, row in enumerate(rows):  # plain loop over each row's real tokens
            for t in range(1, len(row) - 1):
                diff = model.tying(out.hidden[i, t]) - out.embedded[i, t]
                total += float(diff.detach() @ diff.detach())
                count += 1
        loss = model.auxiliary_loss(tokens, lengths, out.embedded, out.hidden)
        assert loss.item() == pytest.approx(0.5 * total / count, rel=1e-12)
    assert model_with("none").auxiliary_loss(tokens, lengths, out.embedded, out.hidden) is None


def test_mlm_head_shares_the_embedding_matrix():
    model = model_with("mlm", mlm_mask_prob=0.5).float().train()
    assert model.mlm_output.weight is model.embedding.weight
    assert sum(p is model.embedding.weight for p in model.parameters()) == 1  # trained once, not twice
    _, tokens, lengths = ragged(3, rows=16)
    torch.manual_seed(0)
    out = model.states(tokens, lengths)
    loss = model.auxiliary_loss(tokens, lengths, out.embedded, out.hidden)
    assert loss.shape == () and torch.isfinite(loss) and loss > 0
    loss.backward()
    assert model.mlm_proj.weight.grad.abs().sum() > 0 and model.embedding.weight.grad.abs().sum() > 0
    opt = make_optimizer(model, TrainConfig())
    opt.step()
    assert model.mlm_output.weight is model.embedding.weight


def test_regularised_checkpoint_round_trip(tmp_path):
    for regulariser in ("mlm", "residual"):
        model = model_with(regulariser).float()
        save_checkpoint(tmp_path / regulariser, model)
        loaded = load_checkpoint(tmp_path / regulariser).model
        assert loaded.config.regulariser == regulariser
        if regulariser == "mlm":
            assert loaded.mlm_output.weight is loaded.embedding.weight
        _, tokens, lengths = ragged(6)
        assert torch.equal(loaded(tokens, lengths)[0], model(tokens, lengths)[0])


@pytest.fixture(scope="module")
def sst_slice():
    assert SST_DIR is not None, "a test using sst_slice must carry the sst mark"
    splits = load_sst(SST_DIR)
    train_rows, dev_rows = splits.train[::20][:300], splits.dev[::10][:80]
    vocab = Vocabulary.build(t for t, _ in train_rows)
    return vocab, vocab.encode_split(train_rows), vocab.encode_split(dev_rows)


@pytest.mark.parametrize("regulariser", ["tying", "mlm"])
@pytest.mark.sst
def test_auxiliary_loss_decreases_in_training(regulariser, sst_slice):
    vocab, tr, dv = sst_slice
    seed_everything(0)
    model = EncoderAttentionClassifier(ModelConfig(len(vocab), embed_dim=16, hidden_size=8, regulariser=regulariser))

    def aux_on_train():
        torch.manual_seed(123)  # the same masks before and after
        with torch.no_grad():
            total = 0.0
            for b in tr.batches(100):
                out = model.states(b.tokens, b.lengths)
                total += model.auxiliary_loss(b.tokens, b.lengths, out.embedded, out.hidden).item()
            return total

    before = aux_on_train()
    train(model, tr, dv, TrainConfig(epochs=2, progress=False, lr=3e-3))
    assert aux_on_train() < before


# --------------------------------------------------------------------------- single-token inputs
