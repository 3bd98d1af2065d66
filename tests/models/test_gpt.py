"""GPT-1's model and its byte-level BPE (attnmetrics.models.gpt / .bpe).

The model is checked against a plain per-head, per-position reference written from the paper's
equations, in float64; tests marked ``network`` read the Gutenberg books from the pinned wheel
(``$ATTNMETRICS_CACHE``; skipped with ATTNMETRICS_OFFLINE=1).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

from attnmetrics.models import gpt as G
from attnmetrics.models.bpe import DELIM, EXTRACT, PAD, SPECIALS, START, BPETokenizer
from attnmetrics.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")

offline = pytest.mark.skipif(os.environ.get("ATTNMETRICS_OFFLINE") == "1", reason="ATTNMETRICS_OFFLINE=1")


TINY = GPTConfig(vocab_size=37, n_layer=2, d_model=12, n_head=3, context=10, dropout=0.1)


def tiny_model(seed: int = 0, config: GPTConfig = TINY) -> GPT:
    torch.manual_seed(seed)
    model = GPT(config).double().eval()
    with torch.no_grad():  # non-trivial layer norms and biases, so the reference checks them too
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def reference_forward(model: GPT, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One unpadded row ``tokens [T]`` -> (logits [T, V], probs per layer [heads, T, T]), by loops:
    h_0 = W_e[u] + W_p; per block a = concat_h softmax_{s<=t}(q_t·k_s/√D) v; h = LN(h + a W_o);
    h = LN(h + GELU(h W_1) W_2); logits = h W_e^T (GPT-1 sec. 3.1, post-LN as in its code)."""
    c = model.config
    D = c.d_model // c.n_head
    T = len(tokens)
    h = model.tokens.weight[tokens] + model.positions.weight[:T]
    probs_all = []
    for blk in model.blocks:
        qkv = h @ blk.attn.qkv.weight.T + blk.attn.qkv.bias
        q, k, v = qkv[:, : c.d_model], qkv[:, c.d_model : 2 * c.d_model], qkv[:, 2 * c.d_model :]
        out = torch.zeros(T, c.d_model, dtype=h.dtype)
        probs = torch.zeros(c.n_head, T, T, dtype=h.dtype)
        for head in range(c.n_head):
            sl = slice(head * D, (head + 1) * D)
            for t in range(T):
                scores = torch.stack([q[t, sl] @ k[s, sl] / math.sqrt(D) for s in range(t + 1)])
                p = torch.exp(scores - scores.max())
                p = p / p.sum()
                probs[head, t, : t + 1] = p
                out[t, sl] = sum(p[s] * v[s, sl] for s in range(t + 1))
        a = out @ blk.attn.proj.weight.T + blk.attn.proj.bias
        h = F.layer_norm(h + a, (c.d_model,), blk.ln_1.weight, blk.ln_1.bias, blk.ln_1.eps)
        x = h @ blk.mlp.fc.weight.T + blk.mlp.fc.bias
        gelu = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        m = gelu @ blk.mlp.proj.weight.T + blk.mlp.proj.bias
        h = F.layer_norm(h + m, (c.d_model,), blk.ln_2.weight, blk.ln_2.bias, blk.ln_2.eps)
        probs_all.append(probs)
    return h @ model.tokens.weight.T, probs_all


# --------------------------------------------------------------------------- model


def test_forward_matches_the_loop_reference():
    model = tiny_model()
    tokens = torch.randint(0, TINY.vocab_size, (TINY.context,), generator=torch.Generator().manual_seed(1))
    out = model(tokens[None], return_attention=True)
    logits, probs = reference_forward(model, tokens)
    assert out.logits.shape == (1, TINY.context, TINY.vocab_size) and out.logits.dtype == torch.float64
    assert out.hidden.shape == (1, TINY.context, TINY.d_model)
    assert len(out.attentions) == TINY.n_layer
    torch.testing.assert_close(out.logits[0], logits, rtol=0, atol=1e-12)
    for got, want in zip(out.attentions, probs):
        assert got.shape == (1, TINY.n_head, TINY.context, TINY.context)
        torch.testing.assert_close(got[0], want, rtol=0, atol=1e-12)
    assert model(tokens[None]).attentions is None


def test_causal_changing_token_t_never_changes_earlier_outputs():
    model = tiny_model()
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, TINY.vocab_size, (3, TINY.context), generator=g)
    base = model(tokens, return_attention=True)
    for t in range(TINY.context):
        changed = tokens.clone()
        changed[:, t] = (changed[:, t] + 1 + torch.randint(0, TINY.vocab_size - 1, (3,), generator=g)) % TINY.vocab_size
        out = model(changed, return_attention=True)
        torch.testing.assert_close(out.logits[:, :t], base.logits[:, :t], rtol=0, atol=1e-13)
        for a, b in zip(out.attentions, base.attentions):
            torch.testing.assert_close(a[:, :, :t], b[:, :, :t], rtol=0, atol=1e-13)
        if t < TINY.context - 1:  # and it does reach the later ones
            assert not torch.allclose(out.logits[:, t:], base.logits[:, t:])


def test_attention_rows_sum_to_one_over_visible_positions_and_zero_elsewhere():
    model = tiny_model()
    T = TINY.context
    tokens = torch.randint(0, TINY.vocab_size, (4, T), generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor([T, 1, 5, 7])
    for probs in model(tokens, lengths, return_attention=True).attentions:
        for b, L in enumerate(lengths.tolist()):
            visible = torch.ones(T, T, dtype=torch.bool).tril()
            visible[L:] = False
            visible[:, L:] = False
            p = probs[b]
            assert (p[:, ~visible] == 0).all()  # future and padding keys, padding queries: exactly 0
            assert (p[:, visible] > 0).all()
            torch.testing.assert_close(p[:, :L].sum(-1), torch.ones(TINY.n_head, L, dtype=p.dtype), rtol=0, atol=1e-14)


def test_padding_never_leaks_batched_equals_each_row_alone():
    model = tiny_model()
    T = TINY.context
    g = torch.Generator().manual_seed(4)
    lengths = torch.tensor([3, T, 1, 6])
    tokens = torch.randint(0, TINY.vocab_size, (4, T), generator=g)
    tokens[token_pad := torch.arange(T)[None] >= lengths[:, None]] = PAD
    batched = model(tokens, lengths, return_attention=True)
    garbage = tokens.clone()  # whatever sits in the padding makes no difference
    garbage[token_pad] = torch.randint(0, TINY.vocab_size, (int(token_pad.sum()),), generator=g)
    again = model(garbage, lengths, return_attention=True)
    for b, L in enumerate(lengths.tolist()):
        alone = model(tokens[b : b + 1, :L], return_attention=True)
        for out in (batched, again):
            torch.testing.assert_close(out.logits[b, :L], alone.logits[0], rtol=0, atol=1e-12)
            for pb, pa in zip(out.attentions, alone.attentions):
                torch.testing.assert_close(pb[b, :, :L, :L], pa[0], rtol=0, atol=1e-12)
    assert torch.isfinite(batched.logits).all()


def test_post_layer_norm_structure():
    model = tiny_model()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()
    seen = []
    model.blocks[-1].ln_2.register_forward_hook(lambda m, i, o: seen.append(o))
    tokens = torch.randint(0, TINY.vocab_size, (2, TINY.context))
    hidden = model(tokens).hidden
    # Post-LN: each block ends in a layer norm, so the stack's output is that norm's output and
    # has zero mean and unit variance at every position (a pre-LN stack's residual stream has not).
    assert hidden is seen[0]
    torch.testing.assert_close(hidden.mean(-1), torch.zeros(2, TINY.context, dtype=hidden.dtype), atol=1e-12, rtol=0)
    torch.testing.assert_close(
        hidden.var(-1, unbiased=False), torch.ones(2, TINY.context, dtype=hidden.dtype), atol=1e-4, rtol=0
    )  # eps = 1e-5
    block = model.blocks[0]
    assert [n for n, _ in block.named_children()] == ["attn", "ln_1", "mlp", "ln_2"]
    assert block.mlp.fc.out_features == 4 * TINY.d_model


def test_output_layer_is_tied_to_the_token_embedding():
    model = tiny_model()
    assert model.lm_head.weight is model.tokens.weight
    assert model.lm_head.bias is None
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["tokens.weight"].data_ptr()
    assert model.num_parameters() == sum(v.numel() for v in state.values()) - state["lm_head.weight"].numel()
    tokens = torch.randint(0, TINY.vocab_size, (1, 4))
    before = model(tokens).logits
    with torch.no_grad():
        model.tokens.weight[5] += 1.0  # the output row of token 5 moves with its embedding
    after = model(tokens).logits
    assert not torch.allclose(after[..., 5], before[..., 5])


def test_the_attention_function_is_the_single_source_of_probabilities(monkeypatch):
    model = tiny_model()
    tokens = torch.randint(0, TINY.vocab_size, (2, 6))
    lengths = torch.tensor([6, 4])
    base = model(tokens, lengths, return_attention=True)
    calls = []

    def uniform(q, k, v, mask):  # the intervention: uniform over visible keys
        calls.append(mask.shape)
        probs = mask.expand(*q.shape[:2], -1, -1).to(q.dtype)
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(1)
        return probs @ v, probs

    monkeypatch.setattr(G, "attention", uniform)
    out = model(tokens, lengths, return_attention=True)
    assert len(calls) == TINY.n_layer
    assert not torch.allclose(out.logits, base.logits)
    for probs in out.attentions:  # the returned probabilities are the intervention's
        torch.testing.assert_close(probs[0, :, 2, :3], torch.full((TINY.n_head, 3), 1 / 3, dtype=probs.dtype))
    monkeypatch.undo()
    # one layer's method alone
    monkeypatch.setattr(model.blocks[1].attn, "attention", uniform)
    one = model(tokens, lengths, return_attention=True)
    torch.testing.assert_close(one.attentions[0], base.attentions[0])
    assert not torch.allclose(one.attentions[1], base.attentions[1])


def test_dropout_only_in_training():
    model = tiny_model()
    tokens = torch.randint(0, TINY.vocab_size, (2, TINY.context))
    torch.testing.assert_close(model(tokens).logits, model(tokens).logits, rtol=0, atol=0)
    model.train()
    assert not torch.allclose(model(tokens).logits, model(tokens).logits)


def test_configs_and_errors():
    c = GPTConfig.named("gpt1", 40478)  # GPT-1's 40,000 merges + bytes and specials
    assert (c.n_layer, c.d_model, c.n_head, c.context, c.dropout) == (12, 768, 12, 512, 0.1)
    with torch.device("meta"):
        n = GPT(c).num_parameters()
    assert 116e6 < n < 118e6  # "117M" (GPT-2 paper, table 2)
    small = GPTConfig.named("small", 8192)
    assert small == GPTConfig(8192) and GPTConfig.from_dict(small.to_dict()) == small
    with pytest.raises(ValueError, match="unknown GPT config"):
        GPTConfig.named("huge", 10)
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPTConfig(10, d_model=10, n_head=3)
    with pytest.raises(ValueError, match="unknown GPT config keys"):
        GPTConfig.from_dict({"vocab_size": 3, "layers": 2})
    model = tiny_model()
    with pytest.raises(ValueError, match="exceeds the model's context"):
        model(torch.zeros(1, TINY.context + 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="lengths"):
        model(torch.zeros(2, 4, dtype=torch.int64), torch.tensor([0, 4]))


# --------------------------------------------------------------------------- tokenizer

SAMPLE = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.\n\n  However little known the feelings or views of such a man may be...\n"
) * 20


@pytest.fixture(scope="module")
def small_tokenizer():
    return BPETokenizer.train([SAMPLE], vocab_size=400)


@pytest.mark.parametrize(
    "text", ["", "plain words", "  leading and trailing  \n\n\t", "Caf\xe9 C\xe6sar — naïve 東京 🙂", "<pad> as text"]
)
def test_bpe_round_trip_any_string(small_tokenizer, text):
    ids = small_tokenizer.encode(text)
    assert all(0 <= i < small_tokenizer.vocab_size for i in ids)
    assert small_tokenizer.decode(ids) == text


def test_bpe_specials_merges_save_and_load(small_tokenizer, tmp_path):
    tok = small_tokenizer
    assert (PAD, START, DELIM, EXTRACT) == (0, 1, 2, 3)
    assert [tok.tokenizer.id_to_token(i) for i in range(4)] == list(SPECIALS)
    assert 300 < tok.vocab_size <= 400  # fewer when no pair is left twice in the text
    assert len(tok.encode("a single man in possession")) < len("a single man in possession") / 2  # merges learnt
    # special tokens are never produced from text, and are dropped when decoding
    assert not set(tok.encode("<start> x <delim> y <extract>")) & {PAD, START, DELIM, EXTRACT}
    assert tok.decode([START, *tok.encode("hello"), DELIM]) == "hello"
    tok.save(tmp_path / "tokenizer.json")
    again = BPETokenizer.load(tmp_path / "tokenizer.json")
    assert again.encode(SAMPLE) == tok.encode(SAMPLE) and again.vocab_size == tok.vocab_size
    assert again.decode(again.encode("<pad><start>")) == "<pad><start>"
    assert BPETokenizer.train([SAMPLE], vocab_size=400).to_str() == tok.to_str()  # deterministic
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        BPETokenizer.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="vocab_size"):
        BPETokenizer.train([SAMPLE], vocab_size=100)


@pytest.mark.network
@offline
def test_bpe_round_trip_on_gutenberg():
    from attnmetrics.data import GUTENBERG_HELD_OUT, load_gutenberg

    books = load_gutenberg()
    assert len(books) == 18 and GUTENBERG_HELD_OUT in books
    assert 11_600_000 < sum(len(t) for t in books.values()) < 11_750_000  # 11.7 MB of (mostly ASCII) text
    assert "Caesar" in books["shakespeare-caesar.txt"] and "C\xe6sar" in books["shakespeare-caesar.txt"]
    train = [books[n][:40_000] for n in books if n != GUTENBERG_HELD_OUT]
    tok = BPETokenizer.train(train, vocab_size=1024)
    for name, text in books.items():
        piece = text[:20_000]
        ids = tok.encode(piece)
        assert tok.decode(ids) == piece, name
        assert len(ids) < len(piece) / 2, name  # BPE compresses unseen text too


@pytest.mark.parametrize(
    "field, value",
    [("n_layer", 10**6), ("n_head", 10**4), ("d_model", 10**6), ("vocab_size", 10**9), ("context", 10**5)],
)
def test_a_config_out_of_bounds_is_refused_before_anything_is_built(field, value):
    # a checkpoint's "n_layer": 1000000 built a million modules before failing (issue 31, item 6)
    with pytest.raises(ValueError, match=rf"^{field} must be <= \d+ .*got {value}$"):
        GPTConfig.from_dict({**GPTConfig(100).to_dict(), field: value})
