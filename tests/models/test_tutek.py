"""Tutek & Šnajder 2020: the regularisers (concat, residual, tying, masked LM) and the
single-token-input test against a plain loop (one forward per token)."""

import pytest
import scipy.stats
import torch

from attnmetrics.app.battery import run_battery
from attnmetrics.models.classifier import REGULARISERS, EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.data import load_sst
from attnmetrics.models.text import Vocabulary, collate
from attnmetrics.models.training import (
    TrainConfig,
    load_checkpoint,
    make_optimizer,
    save_checkpoint,
    seed_everything,
    train,
)
from attnmetrics.models.tutek import single_token_inputs, single_token_test
from attnmetrics.outputs import decision, output_distribution
from tests.inputs import SST_DIR

torch.set_num_threads(1)
E, HID = 8, 8  # embedding size; hidden size (per direction for the BiLSTM, H = 16)


def model_with(regulariser: str, encoder: str = "lstm", seed: int = 0, **kw) -> EncoderAttentionClassifier:
    torch.manual_seed(seed)
    config = ModelConfig(30, embed_dim=E, hidden_size=HID, encoder=encoder, regulariser=regulariser, **kw)
    return EncoderAttentionClassifier(config).double().eval()


def ragged(seed: int = 0, rows: int = 6):
    g = torch.Generator().manual_seed(seed)
    ids = [
        [2] + torch.randint(4, 30, (int(n),), generator=g).tolist() + [3]
        for n in torch.randint(1, 9, (rows,), generator=g)
    ]
    return ids, *collate(ids)


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


def test_single_token_inputs_keep_the_rows_specials():
    tokens, lengths = collate([[2, 5, 6, 7, 3], [9, 8, 11, 3, 4], [2, 3]])
    inputs, rows, positions = single_token_inputs(tokens, lengths, lead=1, trail=1)
    assert inputs.tolist() == [[2, 5, 3], [2, 6, 3], [2, 7, 3], [9, 8, 4], [9, 11, 4], [9, 3, 4]]
    assert rows.tolist() == [0, 0, 0, 1, 1, 1] and positions.tolist() == [0, 1, 2] * 2
    inputs, _, _ = single_token_inputs(tokens, lengths, lead=2, trail=0)
    assert inputs[:, :2].tolist() == [[2, 5]] * 3 + [[9, 8]] * 3


@pytest.mark.parametrize("num_classes, encoder", [(1, "lstm"), (3, "cnn"), (2, "average")])
def test_single_token_matches_a_plain_loop(num_classes, encoder):
    torch.manual_seed(0)
    model = (
        EncoderAttentionClassifier(
            ModelConfig(30, embed_dim=E, hidden_size=8, encoder=encoder, num_classes=num_classes)
        )
        .double()
        .eval()
    )
    rows, tokens, lengths = ragged(4, rows=9)
    rows.append([2, 7, 3])  # one real token: tau undefined, agreement defined
    tokens, lengths = collate(rows)
    got = single_token_test(model, tokens, lengths, max_rows=7)  # several calls, rows split across them
    with torch.no_grad():
        for i, row in enumerate(rows):
            logits, attention = model(*collate([row]))
            y = int(decision(logits)[0])
            alone, alone_decisions = [], []
            for t in range(1, len(row) - 1):  # one forward per token
                lg, _ = model(*collate([[row[0], row[t], row[-1]]]))
                alone.append(float(output_distribution(lg)[0, y]))
                alone_decisions.append(int(decision(lg)[0]))
            L = len(alone)
            assert got.lengths[i] == L
            assert torch.allclose(got.alone[i, :L], torch.tensor(alone, dtype=torch.float64), atol=1e-12)
            att = attention[0, 1 : L + 1]
            top = int(torch.argmax(att))
            assert bool(got.top_agrees[i]) == (alone_decisions[top] == y)
            if L >= 2:
                ref = scipy.stats.kendalltau(att.numpy(), alone)
                assert float(got.tau[i]) == pytest.approx(ref.statistic, abs=1e-9)
                assert float(got.pvalue[i]) == pytest.approx(ref.pvalue, abs=1e-9)
            else:
                assert torch.isnan(got.tau[i])


def test_single_token_in_the_battery():
    torch.manual_seed(0)
    model = EncoderAttentionClassifier(ModelConfig(30, embed_dim=E, hidden_size=HID)).eval()
    _, tokens, lengths = ragged(5, rows=12)
    summary, instances = run_battery(
        model, [(tokens, lengths)], ("neg", "pos"), experiments=["single_token"], progress=False
    )
    s = summary["single_token"]
    assert s["n"] == 12 and 0 <= s["top_token_agreement"] <= 1
    assert {"mean", "std", "significant", "n"} <= set(s["tau"]) and -1 <= s["tau"]["mean"] <= 1
    direct = single_token_test(model, tokens, lengths)
    assert instances["single_token"]["top_token_agrees"] == direct.top_agrees.tolist()
    assert s["top_token_agreement"] == pytest.approx(direct.top_agrees.float().mean().item())
