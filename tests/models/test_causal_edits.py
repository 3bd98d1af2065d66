"""Causal prefix reuse for one-token edits of decoders (models/causal_edits.py): a Hugging Face
decoder classifier's (Llama with grouped-query attention, Qwen2 with q/k/v biases, Mistral with a
sliding window shorter than its rows, GPT-2) and a prompted model's (a tiny LlamaForCausalLM with
a word-level tokenizer, the template around the text) deletions and maskings equal a full
recomputation, edit by edit and through leave_one_out with and without the capability."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnmetrics  # noqa: E402
from attnmetrics.models.causal_edits import EditCounts, edit_counts  # noqa: E402
from attnmetrics.models.hf import HFClassifier  # noqa: E402
from attnmetrics.protocol import capability, token_mask  # noqa: E402
from tests.models.test_hf import tiny  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

F64, F32 = torch.float64, torch.float32
#: float64 to 1e-10, float32 to 1e-5
ATOL = {F64: 1e-10, F32: 1e-5}
MASK = 4


def decoder(family: str, dtype=F64):
    """A tiny HF decoder classifier: Llama (4 query heads over 2 key/value heads), Qwen2 (its biases
    made to count), Mistral (a sliding window of 3, shorter than the rows), GPT-2."""
    if family == "mistral_window":
        torch.manual_seed(0)
        config = transformers.MistralConfig(
            vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, num_labels=3, pad_token_id=0, sliding_window=3,
        )  # fmt: skip
        model = HFClassifier(transformers.MistralForSequenceClassification(config).eval())
    else:
        model = tiny(family)
    return model.to(dtype)


def ragged(rows: int = 6, width: int = 9, seed: int = 0, low: int = 1):
    """Right-padded ids 5..59 (padding 0), lengths in [low, width]: one full row, one of ``low``."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, width + 1, (rows,), generator=g)
    lengths[0], lengths[1] = width, low
    tokens = torch.randint(5, 60, (rows, width), generator=g)
    tokens[~token_mask(lengths, width)] = 0
    return tokens, lengths


def all_edits(lengths):
    """Every (row, position) of the rows' real tokens, shuffled (a call mixes rows and positions)."""
    rows = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(1))
    return rows[order], positions[order]


def edited(row: list[int], t: int, masked: bool) -> list[int]:
    return row[:t] + ([MASK] if masked else []) + row[t + 1 :]


class Plain:
    """The protocol of ``model`` without its optional capabilities: leave_one_out's generic path
    (every edited row run whole)."""

    def __init__(self, model):
        self.model, self.decoder, self.lead, self.trail = model, model.decoder, model.lead, model.trail

    def embed(self, tokens):
        return self.model.embed(tokens)

    def encode(self, embedded, lengths):
        return self.model.encode(embedded, lengths)

    def attend(self, hidden, lengths):
        return self.model.attend(hidden, lengths)


# ---- Hugging Face decoder classifiers ------------------------------------------------------------

FAMILIES = ["llama", "qwen2", "mistral_window", "gpt2"]


@pytest.mark.parametrize("masked", [False, True], ids=["delete", "mask"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_decoders_edits_equal_the_edited_rows_run_whole(family, dtype, masked):
    model = decoder(family, dtype)
    tokens, lengths = ragged(low=1 if masked else 2)
    rows, positions = all_edits(lengths)
    with torch.no_grad():
        embedded = model.embed(tokens)
        prepared = model.masking_logits(embedded, lengths, MASK) if masked else model.deletion_logits(embedded, lengths)
        got = torch.cat([prepared(rows[c : c + 7], positions[c : c + 7]) for c in range(0, len(rows), 7)])
        torch.testing.assert_close(prepared.unedited_logits(), model(tokens, lengths)[0], rtol=0, atol=ATOL[dtype])
        for i, (r, t) in enumerate(zip(rows.tolist(), positions.tolist())):
            seq = edited(tokens[r, : lengths[r]].tolist(), t, masked)
            want = model(torch.tensor([seq]), torch.tensor([len(seq)]))[0][0]
            torch.testing.assert_close(got[i], want, rtol=0, atol=ATOL[dtype])
    assert prepared.recomputed == edit_counts(lengths.tolist(), mode="mask" if masked else "delete").recomputed
    assert isinstance(prepared.position_bytes, int) and prepared.position_bytes > 0


@pytest.mark.parametrize("mode", ["delete", "mask"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_leave_one_out_with_the_reuse_equals_it_without(family, dtype, mode, monkeypatch):
    model = decoder(family, dtype)
    tokens, lengths = ragged(rows=7, width=10, low=2)
    kw = {"mode": mode, "mask_token": MASK} if mode == "mask" else {}
    assert capability(model, "deletion_logits") and capability(model, "masking_logits")
    assert capability(Plain(model), "deletion_logits") is None
    want = attnmetrics.leave_one_out(Plain(model), tokens, lengths, **kw)
    got = attnmetrics.leave_one_out(model, tokens, lengths, **kw)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL[dtype])
    # calls sized by position_bytes: a small budget splits the edits into calls of one or two
    calls = []
    prepare = type(model)._prefix_deletions if mode == "delete" else type(model)._prefix_maskings

    def spy(self, *args):
        edits = prepare(self, *args)

        def counted(rows, positions):
            calls.append(len(rows))
            return edits(rows, positions)

        counted.position_bytes, counted.unedited_logits = edits.position_bytes, edits.unedited_logits
        return counted

    monkeypatch.setattr(type(model), "_prefix_deletions" if mode == "delete" else "_prefix_maskings", spy)
    budget = 2 * 10 * prepare(model, model.embed(tokens), lengths, *([MASK] if mode == "mask" else [])).position_bytes
    small = attnmetrics.leave_one_out(model, tokens, lengths, memory_budget=budget, **kw)
    torch.testing.assert_close(small, want, rtol=0, atol=ATOL[dtype])
    assert sum(calls) == int(lengths.sum()) and len(calls) > len(lengths)  # rows split across calls


def test_encoders_have_no_edit_capability_and_a_bad_mask_token_is_named():
    assert capability(tiny("bert"), "deletion_logits") is None
    assert capability(tiny("bert"), "masking_logits") is None
    model = decoder("llama")
    tokens, lengths = ragged()
    with pytest.raises(ValueError, match="mask_token"):
        model.masking_logits(model.embed(tokens), lengths, 60)
    with pytest.raises(ValueError, match="at least 2 positions"):
        model.deletion_logits(model.embed(tokens), lengths)  # a one-token row: nothing left to read


# ---- a prompted model ----------------------------------------------------------------------------

WORDS = ["Review", ":", "Sentiment", "(", "positive", "or", "negative", "):", "good", "bad", "film"]


def prompted(dtype=F64, family: str = "llama"):
    """A PromptedLM over a tiny random LlamaForCausalLM (grouped-query attention; ``family``
    "qwen2": Qwen2's, its q/k/v biases made to count; "mistral_window": Mistral's with a sliding
    window of 3, shorter than the rows) with a word-level tokenizer: template ``Review:
    {text}\\nSentiment (positive or negative):`` (2 prefix, 6 suffix tokens), label words
    " negative", " positive"."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnmetrics.models.prompted import Prompt, PromptedLM

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<s>", "</s>", *WORDS, *(f"w{i}" for i in range(45))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    kind, extra = {
        "llama": ("Llama", {}),
        "qwen2": ("Qwen2", {}),
        "mistral_window": ("Mistral", {"sliding_window": 3}),
    }[family]
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    lm = getattr(transformers, f"{kind}ForCausalLM")(config).eval().to(dtype)
    if family == "qwen2":  # its q/k/v biases start at 0: made to count
        with torch.no_grad():
            for layer in lm.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    prompt = Prompt(
        "plain", "Review: {text}\nSentiment (positive or negative):", {"neg": " negative", "pos": " positive"}
    )
    model = PromptedLM(lm, tokenizer, prompt, ["neg", "pos"])
    assert (len(model.prefix_ids), len(model.suffix_ids)) == (2, 6)
    return model


def whole_logits(model, text: list[int]) -> torch.Tensor:
    """The label words' logits of the template around ``text`` (possibly empty), run whole by the LM."""
    ids = torch.tensor([[*model.prefix_ids.tolist(), *text, *model.suffix_ids.tolist()]])
    return model.decoder(model.hf.model(input_ids=ids).last_hidden_state[0, -1])


@pytest.mark.parametrize("masked", [False, True], ids=["delete", "mask"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
def test_a_prompted_models_edits_equal_the_edited_prompts_run_whole(dtype, masked):
    model = prompted(dtype)
    tokens, lengths = ragged(low=1)  # a one-token text: its deletion leaves the template alone
    rows, positions = all_edits(lengths)
    with torch.no_grad():
        embedded = model.embed(tokens)
        prepared = model.masking_logits(embedded, lengths, MASK) if masked else model.deletion_logits(embedded, lengths)
        got = torch.cat([prepared(rows[c : c + 5], positions[c : c + 5]) for c in range(0, len(rows), 5)])
        torch.testing.assert_close(prepared.unedited_logits(), model(tokens, lengths)[0], rtol=0, atol=ATOL[dtype])
        for i, (r, t) in enumerate(zip(rows.tolist(), positions.tolist())):
            want = whole_logits(model, edited(tokens[r, : lengths[r]].tolist(), t, masked))
            torch.testing.assert_close(got[i], want, rtol=0, atol=ATOL[dtype])
    mode = "mask" if masked else "delete"
    assert prepared.recomputed == edit_counts(lengths.tolist(), 2, 6, mode).recomputed


@pytest.mark.parametrize("mode", ["delete", "mask"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
def test_a_prompted_models_leave_one_out_with_the_reuse_equals_it_without(dtype, mode):
    model = prompted(dtype)
    tokens, lengths = ragged(rows=7, width=10, low=1 if mode == "mask" else 2)
    kw = {"mode": mode, "mask_token": MASK} if mode == "mask" else {}
    want = attnmetrics.leave_one_out(Plain(model), tokens, lengths, **kw)
    got = attnmetrics.leave_one_out(model, tokens, lengths, **kw)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL[dtype])
    assert (got[lengths == 1, 1:] == 0).all() and (got[token_mask(lengths, 10)] > 0).any()


def test_edit_counts_give_the_reuses_share_of_the_work():
    # a text of 3 between 2 and 1 template tokens (whole 6): deleting t = 0, 1, 2 recomputes
    # 3, 2, 1 of the shortened 5; masking 4, 3, 2 of 6
    assert edit_counts([3], 2, 1, "delete") == EditCounts(6, 15, 6)
    assert edit_counts([3], 2, 1, "mask") == EditCounts(9, 18, 6)
    # a decoder classifier's deletion of its last token recomputes its new last position
    assert edit_counts([3]) == EditCounts(2 + 1 + 1, 6, 3)
    # SmolLM2's chat template (41 + 6 tokens) around SST-like texts of 23 tokens
    counts = edit_counts([23], 41, 6)
    assert counts == EditCounts(391, 23 * 69, 70)
    assert counts.ratio == pytest.approx(461 / 1657) and counts.recomputed / counts.full == pytest.approx(
        0.246, abs=1e-3
    )
    with pytest.raises(ValueError, match="mode"):
        edit_counts([3], mode="swap")
