"""GPT-1 fine-tuned as an attention classifier (attnmetrics.models.gpt_classifier), on tiny configs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnmetrics
from attnmetrics.models.gpt import GPT, GPTConfig
from attnmetrics.models.gpt_classifier import EXTRACT, PAD, START, GPTClassifier
from attnmetrics.protocol import forward, token_mask
from attnmetrics.testing.reference import leave_one_out_reference

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 50


def config(n_layer: int = 2, dropout: float = 0.1) -> GPTConfig:
    return GPTConfig(vocab_size=VOCAB, n_layer=n_layer, d_model=16, n_head=2, context=16, dropout=dropout)


def model_(attention: str = "tanh", num_classes: int = 1, seed: int = 0, **kw) -> GPTClassifier:
    torch.manual_seed(seed)
    return GPTClassifier(config(), num_classes, attention, **kw).double().eval()


def batch(seed: int = 0):
    """``<start> text <extract>`` rows of 1..6 real tokens, right-padded with ``<pad>``."""
    g = torch.Generator().manual_seed(seed)
    real = [4, 1, 6, 2, 5]
    T = max(real) + 2
    tokens = torch.full((len(real), T), PAD, dtype=torch.int64)
    for b, n in enumerate(real):
        tokens[b, 0] = START
        tokens[b, 1 : n + 1] = torch.randint(4, VOCAB, (n,), generator=g)
        tokens[b, n + 1] = EXTRACT
    return tokens, torch.tensor(real) + 2


@pytest.mark.parametrize("attention", ["tanh", "dot", "uniform"])
def test_implements_the_protocol(attention):
    model = model_(attention)
    assert attnmetrics.is_attention_classifier(model)
    assert model.lead == model.trail == 1
    assert isinstance(model.decoder, torch.nn.Linear) and model.decoder.out_features == 1


@pytest.mark.parametrize("attention", ["tanh", "dot", "uniform"])
def test_attention_sums_to_one_over_real_tokens(attention):
    model = model_(attention)
    tokens, lengths = batch()
    with torch.no_grad():
        hidden = model.encode(model.embed(tokens), lengths)
        attn = model.attend(hidden, lengths)
    real = token_mask(lengths, tokens.shape[1], 1, 1)
    torch.testing.assert_close(attn.sum(1), torch.ones(len(lengths), dtype=attn.dtype))
    assert (attn[~real] == 0).all() and (attn[real] > 0).all()
    assert (attn[:, 0] == 0).all()  # <start>
    assert (attn[torch.arange(len(lengths)), lengths - 1] == 0).all()  # <extract>
    assert (hidden[~token_mask(lengths, tokens.shape[1])] == 0).all()  # zero on padding


@pytest.mark.parametrize("attention", ["tanh", "dot", "uniform"])
def test_batched_equals_each_row_alone(attention):
    model = model_(attention)
    tokens, lengths = batch(1)
    with torch.no_grad():
        logits, attn = model(tokens, lengths)
        for b in range(len(lengths)):
            n = int(lengths[b])
            one_logits, one_attn = model(tokens[b : b + 1, :n], lengths[b : b + 1])
            torch.testing.assert_close(logits[b : b + 1], one_logits, rtol=0, atol=1e-12)
            torch.testing.assert_close(attn[b : b + 1, :n], one_attn, rtol=0, atol=1e-12)


def test_padding_content_never_leaks():
    model = model_()
    tokens, lengths = batch(2)
    other = tokens.clone()
    pad = ~token_mask(lengths, tokens.shape[1])
    other[pad] = 7  # any id in the padding
    with torch.no_grad():
        a, b = model(tokens, lengths), model(other, lengths)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)


def test_flip_fraction_runs():
    model = model_()
    tokens, lengths = batch(3)
    out = forward(model, tokens, lengths)
    result = attnmetrics.flip_fraction(out.attention, out.hidden, model.decoder, out.lengths)
    assert result is not None


@pytest.mark.parametrize("attention", ["tanh", "dot", "uniform"])
def test_leave_one_out_matches_reference(attention):
    model = model_(attention, seed=4)
    model.train()  # leave_one_out must switch dropout off itself, and restore the mode
    tokens, lengths = batch(4)
    got = attnmetrics.leave_one_out(model, tokens, lengths)
    assert model.training
    want = leave_one_out_reference(model, tokens, lengths)
    assert got.dtype == torch.float64 and got.shape == (len(lengths), tokens.shape[1] - 1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert (got > 0).any()


def test_no_auxiliary_loss_without_lm_weight():
    model = model_(lm_weight=0.0)
    tokens, lengths = batch()
    out = model.states(tokens, lengths)
    assert model.auxiliary_loss(tokens, lengths, out.embedded, out.hidden) is None


def test_auxiliary_loss_is_weighted_next_token_cross_entropy():
    model = model_(lm_weight=0.5)
    tokens, lengths = batch(5)
    out = model.states(tokens, lengths)
    aux = model.auxiliary_loss(tokens, lengths, out.embedded, out.hidden)
    # by hand: each row alone through the whole GPT (its tied lm_head), t predicting t + 1
    losses = []
    for b in range(len(lengths)):
        n = int(lengths[b])
        logits = model.gpt(tokens[b : b + 1, :n]).logits[0]
        for t in range(n - 1):
            losses.append(-F.log_softmax(logits[t], -1)[tokens[b, t + 1]])
    want = 0.5 * torch.stack(losses).mean()
    torch.testing.assert_close(aux, want, rtol=0, atol=1e-12)
    aux.backward()  # gradients reach the shared embedding
    assert model.gpt.tokens.weight.grad.abs().sum() > 0


def randomised_gpt(n_layer: int = 2, seed: int = 1) -> GPT:
    torch.manual_seed(seed)
    gpt = GPT(config(n_layer))
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_()  # LayerNorms too, so no parameter matches a fresh initialisation
    return gpt


@pytest.mark.parametrize("k", [0, 1, 2, None])
def test_from_pretrained_copies_exactly_the_first_k_blocks(k):
    gpt = randomised_gpt(2)
    before = {n: p.clone() for n, p in gpt.state_dict().items()}
    model = GPTClassifier.from_pretrained(gpt, num_classes=1, attention="dot", lm_weight=0.25, transfer_layers=k)
    assert model.lm_weight == 0.25 and model.attention_name == "dot"
    assert torch.equal(model.gpt.tokens.weight, gpt.tokens.weight)
    assert torch.equal(model.gpt.positions.weight, gpt.positions.weight)
    assert model.gpt.lm_head.weight is model.gpt.tokens.weight  # still tied
    assert model.gpt.tokens.weight.data_ptr() != gpt.tokens.weight.data_ptr()
    copied = 2 if k is None else k
    for i in range(2):
        mine, theirs = model.gpt.blocks[i].state_dict(), gpt.blocks[i].state_dict()
        for name in theirs:
            same = torch.equal(mine[name], theirs[name])
            assert same == (i < copied), (i, name)
    # the source is untouched by building or training the copy
    model.train()
    tokens, lengths = batch()
    logits, _ = model(tokens, lengths)
    logits.sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for n, p in gpt.state_dict().items():
        assert torch.equal(p, before[n]), n


def test_from_pretrained_accepts_a_loaded_checkpoint_tuple():
    from attnmetrics.models.pretraining import Pretrained

    gpt = randomised_gpt(2)
    model = GPTClassifier.from_pretrained(Pretrained(gpt, None, {}), num_classes=3, transfer_layers=1)
    assert model.decoder.out_features == 3
    assert torch.equal(model.gpt.blocks[0].attn.qkv.weight, gpt.blocks[0].attn.qkv.weight)
    with pytest.raises(ValueError):
        GPTClassifier.from_pretrained(gpt, transfer_layers=3)


def test_fresh_init_and_pretrained_end_to_end_equal_when_all_copied():
    gpt = randomised_gpt(2, seed=3).double().eval()
    model = GPTClassifier.from_pretrained(gpt).double().eval()
    tokens, lengths = batch(6)
    with torch.no_grad():
        hidden = model.encode(model.embed(tokens), lengths)
        want = gpt(tokens, lengths).hidden
    real = token_mask(lengths, tokens.shape[1])
    torch.testing.assert_close(hidden[real], want[real], rtol=0, atol=1e-12)
    fresh = model_()
    assert not torch.equal(fresh.gpt.tokens.weight, model.gpt.tokens.weight)


def test_training_objective_adds_the_lm_loss():
    from attnmetrics.models.text import Batch
    from attnmetrics.models.training import Classification

    model = model_(lm_weight=0.5)
    tokens, lengths = batch(7)
    labels = torch.tensor([0, 1, 1, 0, 1])
    b = Batch(tokens=tokens, lengths=lengths, labels=labels, index=torch.arange(5))
    with_lm = Classification().loss(model, b, None)
    model.lm_weight = 0.0
    without = Classification().loss(model, b, None)
    out = model.states(tokens, lengths)
    torch.testing.assert_close(with_lm - without, 0.5 * model.lm_loss(tokens, lengths, out.hidden))


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        GPTClassifier(config(), attention="nope")
    with pytest.raises(ValueError):
        GPTClassifier(config(), num_classes=0)
    model = model_()
    with pytest.raises(ValueError):
        model.embed(torch.tensor([[START, VOCAB, EXTRACT]]))


MASK = 1  # any id: the mask token of leave-one-out's mask mode


def _edited_and_rerun(model, tokens, lengths, row: int, position: int, masked: bool) -> torch.Tensor:
    """The paper's own step (J&W sec. 4.1): drop the token (or put the mask token in its
    place), run the edited row alone."""
    n = int(lengths[row])
    middle = [torch.tensor([MASK])] if masked else []
    edited = torch.cat([tokens[row, :position], *middle, tokens[row, position + 1 : n]]).unsqueeze(0)
    with torch.no_grad():
        return model(edited, torch.tensor([edited.shape[1]]))[0][0]


@pytest.mark.parametrize("attention", ["tanh", "dot", "uniform"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("masked", [False, True])
def test_prefix_reuse_deletions_equal_deleting_and_rerunning(attention, seed, masked):
    # one call mixes rows and positions (the cached prefix is the call's smallest position);
    # row 1 has a single real token, whose deletion leaves <start> <extract> alone
    model = model_(attention, seed=seed, num_classes=3)
    tokens, lengths = batch(seed)
    rows = torch.tensor([0, 0, 0, 0, 1, 2, 2, 3, 4, 4])
    positions = torch.tensor([1, 2, 3, 4, 1, 1, 6, 2, 5, 3])
    with torch.no_grad():
        embedded = model.embed(tokens)
        prepared = model.masking_logits(embedded, lengths, MASK) if masked else model.deletion_logits(embedded, lengths)
        got = prepared(rows, positions)
    for i, (r, p) in enumerate(zip(rows.tolist(), positions.tolist())):
        want = _edited_and_rerun(model, tokens, lengths, r, p, masked)
        torch.testing.assert_close(got[i], want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["delete", "mask"])
def test_leave_one_out_uses_the_prefix_reuse(mode, monkeypatch):
    model = model_(seed=2)
    tokens, lengths = batch(2)
    calls = []
    name = "deletion_logits" if mode == "delete" else "masking_logits"
    prepare = getattr(GPTClassifier, name)

    def spy(self, embedded, lengths, *mask_token):
        calls.append(embedded.shape)
        return prepare(self, embedded, lengths, *mask_token)

    monkeypatch.setattr(GPTClassifier, name, spy)
    kw = dict(mode="mask", mask_token=MASK) if mode == "mask" else {}
    got = attnmetrics.leave_one_out(model, tokens, lengths, **kw)
    assert calls, f"leave_one_out did not take the model's {name}"
    want = leave_one_out_reference(model, tokens, lengths, **kw)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_masking_logits_rejects_a_mask_token_outside_the_vocabulary():
    model = model_()
    tokens, lengths = batch()
    with pytest.raises(ValueError, match="mask_token"):
        model.masking_logits(model.embed(tokens), lengths, VOCAB)


def test_inputs_wrap_start_and_extract_and_fit_the_context():
    from attnmetrics.models.bpe import BPETokenizer
    from attnmetrics.models.gpt_classifier import GPTInputs

    texts = ["a good film , truly good", "a bad film", "good and bad"] * 20
    tokenizer = BPETokenizer.train(texts, vocab_size=300, min_frequency=1)
    inputs = GPTInputs(tokenizer, context=6)
    split = inputs.encode_split([("a good film , truly good", 1), ("bad", 0)])
    assert split.labels == [1, 0] and len(inputs) == tokenizer.vocab_size
    long_, short = split.ids
    assert long_[0] == START and long_[-1] == EXTRACT and len(long_) == 6  # cut to the context
    assert long_[1:-1] == tokenizer.encode("a good film , truly good")[:4]
    assert short == [START, *tokenizer.encode("bad"), EXTRACT]
    with pytest.raises(ValueError, match="context must be >= 3"):
        GPTInputs(tokenizer, context=2)


def test_checkpoint_round_trip_rebuilds_the_classifier(tmp_path):
    from attnmetrics.models.bpe import BPETokenizer
    from attnmetrics.models.gpt_classifier import GPTInputs
    from attnmetrics.models.training import load_checkpoint, save_checkpoint

    tokenizer = BPETokenizer.train(["the quick brown fox jumps over the lazy dog"] * 5, vocab_size=300)
    torch.manual_seed(0)
    gpt = config().replace(vocab_size=tokenizer.vocab_size)
    model = GPTClassifier(gpt, num_classes=3, attention="dot", lm_weight=0.25).double().eval()
    save_checkpoint(tmp_path, model, GPTInputs(tokenizer, 16), extra={"dataset": "sst"})
    ckpt = load_checkpoint(tmp_path)
    assert isinstance(ckpt.model, GPTClassifier) and ckpt.model.config == model.config
    assert ckpt.extra == {"dataset": "sst"} and ckpt.vocab.encode(["fox"]) == GPTInputs(tokenizer, 16).encode(["fox"])
    tokens, lengths = batch()
    with torch.no_grad():
        torch.testing.assert_close(ckpt.model.double().eval()(tokens, lengths), model(tokens, lengths), rtol=0, atol=0)
    assert ckpt.model.gpt.lm_head.weight is ckpt.model.gpt.tokens.weight  # still tied


def test_checkpoint_refuses_a_tokenizer_of_another_size(tmp_path):
    from attnmetrics.models.bpe import BPETokenizer
    from attnmetrics.models.gpt_classifier import GPTInputs
    from attnmetrics.models.training import load_checkpoint, save_checkpoint

    tokenizer = BPETokenizer.train(["the quick brown fox jumps over the lazy dog"] * 5, vocab_size=300)
    save_checkpoint(tmp_path, model_(), GPTInputs(tokenizer, 16))
    with pytest.raises(ValueError, match=rf"tokenizer.json holds {tokenizer.vocab_size} tokens, model.json says 50"):
        load_checkpoint(tmp_path)


def test_checkpoint_config_out_of_bounds_is_refused_in_one_line_before_building(tmp_path):
    # issue 31, item 6: a GPT run's model.json with "n_layer": 1000000 built a million modules
    import json

    from attnmetrics.models.bpe import BPETokenizer
    from attnmetrics.models.gpt_classifier import GPTInputs
    from attnmetrics.models.training import load_checkpoint, save_checkpoint

    tokenizer = BPETokenizer.train(["the quick brown fox jumps over the lazy dog"] * 5, vocab_size=300)
    model = GPTClassifier(config().replace(vocab_size=tokenizer.vocab_size))
    save_checkpoint(tmp_path, model, GPTInputs(tokenizer, 16))
    meta = json.loads((tmp_path / "model.json").read_text())
    meta["model"]["gpt"]["n_layer"] = 1000
    (tmp_path / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"model\.json: .*n_layer must be <= 256") as e:
        load_checkpoint(tmp_path)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


def test_extract_readout_is_the_extract_state_alone():
    # GPT-1 sec. 3.3: the final transformer state of <extract> -> linear output layer
    model = model_("extract", num_classes=3)
    tokens, lengths = batch(3)
    with torch.no_grad():
        logits, attention = model(tokens, lengths)
        hidden = model.gpt(tokens, lengths).hidden
    extract = hidden[torch.arange(len(lengths)), lengths - 1]
    assert (tokens[torch.arange(len(lengths)), lengths - 1] == EXTRACT).all()
    torch.testing.assert_close(logits, model.decoder(extract), rtol=0, atol=1e-12)
    assert (attention[token_mask(lengths, tokens.shape[1], 1, 1)] == 0).all()  # weighs no real token
    assert model.attention_parameters() == []


def test_rollout_is_the_extract_row_of_the_blocks_attentions_rolled_out():
    # against Abnar & Zuidema's steps written out per row: head mean, 0.5 A + 0.5 I, rows
    # renormalised, the product from the first layer up, over the row's own L x L block
    model = model_(num_classes=3)
    tokens, lengths = batch(3)
    got = model.rollout(tokens, lengths)
    assert got.shape == (len(lengths), tokens.shape[1] - 1)
    for b in range(len(lengths)):
        n = int(lengths[b])
        with torch.no_grad():
            attentions = model.gpt(tokens[b : b + 1, :n], lengths[b : b + 1], return_attention=True).attentions
        rolled = torch.eye(n, dtype=torch.float64)
        for probs in attentions:
            a = 0.5 * probs[0].mean(0) + 0.5 * torch.eye(n, dtype=torch.float64)
            rolled = (a / a.sum(-1, keepdim=True)) @ rolled
        want = rolled[n - 1, 1 : n - 1]  # the <extract> row at the real tokens
        torch.testing.assert_close(got[b, : n - 2], want, rtol=1e-10, atol=1e-12)
        assert (got[b, n - 2 :] == 0).all()
