"""J&W's pair model (models/pair.py): the row layout, the model against a plain per-example
reference that runs passage and question as two sequences (attnmetrics/testing/pair_reference.py),
and the procedures on it perturbing the passage only (leave-one-out against a loop that edits the
passage's text; gradients; imposed attention keeping the question fixed); checkpoints; bad input."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnmetrics
from attnmetrics.data.pairs import Pair
from attnmetrics.data.tokens import EOS, PAD, SOS, UNK, tokenize
from attnmetrics.models.pair import PairAttentionClassifier, PairModelConfig, PairVocabulary
from attnmetrics.models.text import collate
from attnmetrics.models.training import load_checkpoint, save_checkpoint
from attnmetrics.protocol import is_attention_classifier
from attnmetrics.testing.pair_reference import pair_distribution_reference, pair_leave_one_out_reference

pytestmark = pytest.mark.usefixtures("one_thread")

PLACES = ("kitchen", "garden", "office", "hallway", "bedroom")
PEOPLE = ("mary", "john", "sandra", "daniel")
KINDS = [(e, a) for e in ("lstm", "gru", "cnn", "average") for a in ("tanh", "dot")]


def stories(n: int, seed: int = 0, longest: int = 6) -> list[tuple[Pair, int]]:
    """bAbI-1-like pairs of ragged lengths, one-fact passages (a 5-word passage) among them."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        facts = [(rng.choice(PEOPLE), rng.choice(PLACES)) for _ in range(rng.randint(1, longest))]
        who, where = facts[-1]
        question = f"where is {who}" if rng.random() < 0.7 else f"where is {who} now"  # ragged questions
        out.append((Pair(" . ".join(f"{a} went to the {b}" for a, b in facts), question), PLACES.index(where)))
    return out


def model_for(vocab: PairVocabulary, encoder: str, attention: str, dtype=torch.float64, seed: int = 0):
    torch.manual_seed(seed)
    config = PairModelConfig(len(vocab), vocab.question_width, len(PLACES), 6, 8, encoder, attention)
    return PairAttentionClassifier(config).to(dtype).eval()


@pytest.fixture(scope="module")
def data():
    pairs = stories(12)
    vocab = PairVocabulary.build_pairs(p for p, _ in pairs)
    return pairs, vocab


def batch(vocab, pairs):
    return collate(vocab.encode(p for p, _ in pairs))


def reference_ids(vocab, pair, passage=None):
    """The reference's inputs: the passage's ids with <SOS>/<EOS> (``passage``: other word ids), and
    the question's word ids, cut to the question part."""
    words = [vocab.stoi.get(w, UNK) for w in tokenize(pair.passage)] if passage is None else passage
    question = [vocab.stoi.get(w, UNK) for w in tokenize(pair.question)][: vocab.question_width]
    return [SOS, *words, EOS], question


def test_the_row_layout_puts_the_question_in_a_fixed_trailing_part(data):
    pairs, vocab = data
    V, Q = len(vocab), vocab.question_width
    assert Q == 4  # "where is NAME now"
    row = vocab.encode_text(Pair("Mary went to the garden.", "Where is Mary?"))
    words = [vocab.stoi[w] for w in ("mary", "went", "to", "the", "garden")]
    assert row == [SOS, *words, EOS, V + vocab.stoi["where"], V + vocab.stoi["is"], V + vocab.stoi["mary"], PAD]
    assert vocab.decode(row)[-4:] == ["?where", "?is", "?mary", "<PAD>"]
    # a question longer than the part is cut and counted; unknown words are <UNK> in either half
    rows = vocab.encode([Pair("zork went to the garden", "where is mary now then")])
    assert rows[0][1] == UNK and len(rows[0]) == 5 + 2 + Q and vocab.last_truncated == 1
    with pytest.raises(ValueError, match="needs a word in its passage and its question"):
        vocab.encode([Pair("...", "where is mary")])
    with pytest.raises(ValueError, match="must be a Pair"):
        vocab.encode(["a plain text"])


@pytest.mark.parametrize("encoder,attention", KINDS)
def test_the_model_equals_the_two_sequence_reference(data, encoder, attention):
    pairs, vocab = data
    model = model_for(vocab, encoder, attention)
    assert is_attention_classifier(model) and (model.lead, model.trail) == (1, 1 + vocab.question_width)
    tokens, lengths = batch(vocab, pairs)
    with torch.no_grad():
        logits, attention_ = model(tokens, lengths)
    got = attnmetrics.output_distribution(logits)
    for b, (pair, _) in enumerate(pairs):
        with torch.no_grad():
            want = pair_distribution_reference(model, *reference_ids(vocab, pair))
        torch.testing.assert_close(got[b], want, rtol=0, atol=1e-10)
        # attention: on the passage's words only, summing to 1
        n = len(tokenize(pair.passage))
        assert attention_[b, 1 : 1 + n].sum().item() == pytest.approx(1, abs=1e-12)
        assert attention_[b, 0] == 0 and not attention_[b, 1 + n :].any()


def test_a_row_alone_equals_the_row_in_a_padded_batch(data):
    pairs, vocab = data
    model = model_for(vocab, "lstm", "tanh")
    tokens, lengths = batch(vocab, pairs)
    with torch.no_grad():
        together = model(tokens, lengths)[0]
        for b in range(len(pairs)):
            n = int(lengths[b])
            torch.testing.assert_close(model(tokens[b : b + 1, :n], lengths[b : b + 1])[0][0], together[b])


@pytest.mark.parametrize("encoder,attention", KINDS)
@pytest.mark.parametrize("mode", ["delete", "mask"])
def test_leave_one_out_deletes_passage_words_and_nothing_else(data, encoder, attention, mode):
    pairs, vocab = data
    model = model_for(vocab, encoder, attention)
    tokens, lengths = batch(vocab, pairs)
    got = attnmetrics.leave_one_out(model, tokens, lengths, mode=mode, mask_token=UNK if mode == "mask" else None)
    want = pair_leave_one_out_reference(model, [reference_ids(vocab, p) for p, _ in pairs], mode, UNK)
    for b, w in enumerate(want):
        torch.testing.assert_close(got[b, : len(w)], w, rtol=0, atol=1e-10)
        assert not got[b, len(w) :].any()  # nothing scored at <EOS>, the question part or padding


def test_leave_one_out_of_a_one_word_passage():
    pairs = [(Pair("garden", "where is mary"), 1), (Pair("mary went to the kitchen", "where is mary"), 0)]
    vocab = PairVocabulary.build_pairs(p for p, _ in pairs)
    model = model_for(vocab, "lstm", "tanh")
    tokens, lengths = batch(vocab, pairs)
    got = attnmetrics.leave_one_out(model, tokens, lengths)
    want = pair_leave_one_out_reference(model, [reference_ids(vocab, p) for p, _ in pairs])
    torch.testing.assert_close(got[0, :1], want[0], rtol=0, atol=1e-10)


def test_imposed_attention_mixes_the_passage_with_the_question_fixed(data):
    """The permutation test, the adversary and single-weight removal mix the states with other
    weights; the decoder must then see [sum_t a_t h_t ; q], J&W's ``get_output``."""
    pairs, vocab = data
    model = model_for(vocab, "lstm", "tanh")
    tokens, lengths = batch(vocab, pairs)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        own = model(tokens, lengths)[1]
        for b, (pair, _) in enumerate(pairs):
            n = len(tokenize(pair.passage))
            imposed = torch.zeros_like(own[b : b + 1])
            imposed[0, 1 : 1 + n] = own[b, 1 : 1 + n][torch.randperm(n, generator=generator)]
            logits = model(tokens[b : b + 1], lengths[b : b + 1], imposed)[0]
            # the reference with the permuted weights: the context from the passage states, q fixed
            passage = [vocab.stoi[w] for w in tokenize(pair.passage)]
            ids = torch.tensor([SOS, *passage, EOS])
            h = model.passage_encoder(model.embedding.weight[ids][None], torch.tensor([len(ids)]))[0, 1:-1]
            q = model._question(model.embed(tokens[b : b + 1]), lengths[b : b + 1])[0]
            context = torch.cat([(imposed[0, 1 : 1 + n, None] * h).sum(0), q])
            torch.testing.assert_close(logits[0], model.decoder(context), rtol=0, atol=1e-12)


def test_gradient_importance_is_over_the_passage_and_the_question_is_held(data):
    pairs, vocab = data
    model = model_for(vocab, "lstm", "tanh")
    tokens, lengths = batch(vocab, pairs)
    got = attnmetrics.gradient_importance(model, tokens, lengths)
    for b, (pair, _) in enumerate(pairs):
        n = len(tokenize(pair.passage))
        assert got[b, :n].sum().item() == pytest.approx(1, abs=1e-12)
        assert not got[b, n:].any()
    # J&W's definition on the reference: grad x input of each p_c w.r.t. the passage's embeddings,
    # attention detached, |.| summed over classes, L1-normalised
    pair = pairs[0][0]
    passage = [vocab.stoi[w] for w in tokenize(pair.passage)]
    ids = torch.tensor([SOS, *passage, EOS])
    x = model.embedding.weight[ids].detach().clone().requires_grad_(True)
    question = tokens[:1]
    q = model._question(model.embed(question), lengths[:1])[0].detach()
    h = model.passage_encoder(x[None], torch.tensor([len(ids)]))[0]
    hidden = torch.cat([h, q.expand(len(ids), -1)], -1)[None]
    mask = torch.zeros(1, len(ids), dtype=torch.bool)
    mask[0, 1:-1] = True
    a = model.attention(hidden, mask).detach()
    p = attnmetrics.output_distribution(model.decoder((a[..., None] * hidden).sum(1)))[0]
    total = torch.zeros(len(ids), dtype=x.dtype)
    for c in range(len(p)):
        (g,) = torch.autograd.grad(p[c], x, retain_graph=True)
        total += (g * x).sum(-1).abs()
    want = total[1:-1] / total[1:-1].sum()
    torch.testing.assert_close(got[0, : len(passage)], want.detach(), rtol=0, atol=1e-10)
    # J&W's QA code (gradient_mem): the predicted class's probability alone
    (g,) = torch.autograd.grad(p.max(), x, retain_graph=True)
    top = (g * x).sum(-1).abs()[1:-1]
    predicted = attnmetrics.gradient_importance(model, tokens, lengths, classes="predicted")
    torch.testing.assert_close(predicted[0, : len(passage)], (top / top.sum()).detach(), rtol=0, atol=1e-10)
    assert not torch.allclose(predicted[0, : len(passage)], got[0, : len(passage)], atol=1e-3)
    with pytest.raises(ValueError, match="classes must be one of"):
        attnmetrics.gradient_importance(model, tokens, lengths, classes="top")


def test_the_question_part_must_hold_a_question(data):
    pairs, vocab = data
    model = model_for(vocab, "lstm", "tanh")
    tokens, lengths = batch(vocab, pairs[:2])
    Q = vocab.question_width
    broken = tokens.clone()
    broken[0, int(lengths[0]) - Q : int(lengths[0])] = PAD
    with pytest.raises(ValueError, match="question part"):
        model(broken, lengths)
    gap = tokens.clone()
    gap[0, int(lengths[0]) - Q] = PAD  # <PAD> before a word
    with pytest.raises(ValueError, match="question part"):
        model(gap, lengths)
    with pytest.raises(ValueError, match=r"ids in \[0, "):
        model(tokens + 2 * len(vocab), lengths)


def test_checkpoint_round_trip(data, tmp_path):
    pairs, vocab = data
    model = model_for(vocab, "cnn", "dot", torch.float32)
    save_checkpoint(tmp_path / "model", model, vocab, extra={"dataset": "babi1"})
    loaded = load_checkpoint(tmp_path / "model")
    assert isinstance(loaded.model, PairAttentionClassifier) and isinstance(loaded.vocab, PairVocabulary)
    assert loaded.vocab.question_width == vocab.question_width and loaded.vocab.itos == vocab.itos
    tokens, lengths = batch(vocab, pairs)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(tokens, lengths)[0], model(tokens, lengths)[0], rtol=0, atol=0)


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="unknown pair encoder 'gpt'"):
        PairAttentionClassifier(PairModelConfig(10, 2, 3, encoder="gpt"))
    with pytest.raises(ValueError, match="unknown pair attention 'uniform'"):
        PairAttentionClassifier(PairModelConfig(10, 2, 3, attention="uniform"))
    with pytest.raises(ValueError, match="num_classes must be >= 2"):
        PairAttentionClassifier(PairModelConfig(10, 2, 1))
    with pytest.raises(ValueError, match=r"embeddings must be \[10, 50\]"):
        PairAttentionClassifier(PairModelConfig(10, 2, 3), torch.zeros(11, 50))


WORDS = ("mary", "john", "went", "to", "the", "garden", "kitchen", "where", "is", "apple", "zork")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(WORDS), min_size=1, max_size=9),
            st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(1, 5),
)
def test_every_pair_row_has_the_layout_the_model_reads(examples, width):
    """Any passages and questions: <SOS> passage <EOS>, then exactly Q question slots (question ids
    in the upper half, <PAD> after), the passage and the (cut) question read back by decode."""
    vocab = PairVocabulary(WORDS[:6], width)
    V = len(vocab)
    pairs = [Pair(" ".join(p), " ".join(q)) for p, q in examples]
    rows = vocab.encode(pairs)
    assert vocab.last_truncated == sum(len(q) > width for _, q in examples)
    for row, (passage, question) in zip(rows, examples):
        n = len(passage)
        assert len(row) == n + 2 + width and row[0] == SOS and row[n + 1] == EOS
        assert all(i < V for i in row[: n + 2]) and all(i >= V or i == PAD for i in row[n + 2 :])
        assert vocab.decode(row[1 : n + 1]) == [w if w in WORDS[:6] else "<UNK>" for w in passage]
        asked = [w for w in question[:width]]
        assert vocab.decode(row[n + 2 : n + 2 + len(asked)]) == [
            "?" + (w if w in WORDS[:6] else "<UNK>") for w in asked
        ]
        assert row[n + 2 + len(asked) :] == [PAD] * (width - len(asked))


@pytest.mark.parametrize("keep", [False, True])
def test_eraser_removes_passage_words_and_keeps_the_question(data, keep):
    """ERASER's comprehensiveness (sufficiency with ``keep``) on the pair model against a loop that
    deletes the top-k passage words from the passage's text (or keeps only them) and runs the
    two-sequence reference: the question stays whole in every perturbed input."""
    pairs, vocab = data
    model = model_for(vocab, "lstm", "tanh")
    tokens, lengths = batch(vocab, pairs)
    rng = torch.Generator().manual_seed(1)
    scores = torch.rand(tokens.shape[0], tokens.shape[1] - 1, generator=rng, dtype=torch.float64)
    fractions = (0.1, 0.3, 0.6)
    metric = attnmetrics.sufficiency if keep else attnmetrics.comprehensiveness
    got = metric(model, tokens, lengths, scores, fractions)
    for b, (pair, _) in enumerate(pairs):
        passage = [vocab.stoi[w] for w in tokenize(pair.passage)]
        n = len(passage)
        with torch.no_grad():
            y = pair_distribution_reference(model, *reference_ids(vocab, pair))
            top = int(y.argmax())
            order = sorted(range(n), key=lambda t: (-float(scores[b, t]), t))
            for j, f in enumerate(fractions):
                k = min(n, -(-int(round(f * n * 1e9)) // 10**9))  # ceil(f n), as ERASER's
                chosen = set(order[:k])
                kept = [w for t, w in enumerate(passage) if (t in chosen) == keep]
                if not kept:
                    continue  # nothing left of the passage: the model's empty-passage case, covered above
                want = y[top] - pair_distribution_reference(model, *reference_ids(vocab, pair, kept))[top]
                torch.testing.assert_close(got.values[b, j], want, rtol=0, atol=1e-10)
