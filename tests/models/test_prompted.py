"""The prompted model (models/prompted.py, issue 46 item 2): a tiny random LlamaForCausalLM through
a template, against the language model run whole on the concatenated ids (an independent forward:
the ids are built by list concatenation, the logits read from the LM head's rows), float64."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnmetrics import importance, protocol  # noqa: E402
from attnmetrics.models.prompted import PROMPTS, Prompt, PromptedLM, prompt_named  # noqa: E402
from tests.models.test_causal_edits import prompted  # noqa: E402

F64 = torch.float64


def rows(model, seed: int = 0, lengths=(5, 1, 3, 7)):
    """Ragged text rows (ids of the tokenizer's filler words), right-padded with 0."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    tokens = torch.zeros(len(lengths), int(lengths.max()), dtype=torch.long)
    for b, n in enumerate(lengths.tolist()):
        tokens[b, :n] = torch.randint(15, 60, (n,), generator=g)
    return tokens, lengths


def lm_logits(model: PromptedLM, text: list[int]) -> torch.Tensor:
    """The label words' next-token logits after ``prefix + text + suffix``, from the LM's own head."""
    ids = torch.tensor([[*model.prefix_ids.tolist(), *text, *model.suffix_ids.tolist()]])
    vocabulary = model.hf(input_ids=ids).logits[0, -1]  # [vocab]
    return vocabulary[model.label_ids]


def test_the_protocol_forward_is_the_language_models_next_token_logits_of_the_label_words():
    model = prompted(F64)
    tokens, lengths = rows(model)
    want = torch.stack([lm_logits(model, tokens[b, :n].tolist()) for b, n in enumerate(lengths.tolist())])
    logits, attention = model(tokens, lengths)
    torch.testing.assert_close(logits, want, rtol=0, atol=1e-10)
    # the protocol's path (embed -> encode -> attend -> decoder), which gradients take, is the same model
    torch.testing.assert_close(protocol.forward(model, tokens, lengths).logits, want, rtol=0, atol=1e-10)
    assert torch.equal(attention.argmax(-1), lengths - 1)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral_window"])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_without_gradients_the_prefix_runs_once_and_the_logits_equal_the_whole_input_run(family, dtype):
    """The no-gradient forward reuses the template prefix's keys and values (computed once): equal
    to the LM run whole on each row's concatenated ids (float64 1e-10, float32 1e-5), for ragged
    rows and a one-token text, on each Llama layout (Mistral's window shorter than the rows); a
    weight changed in place afterwards is seen (the cache is computed again)."""
    model = prompted(dtype, family)
    tokens, lengths = rows(model)
    atol = 1e-10 if dtype == F64 else 1e-5

    def whole():
        return torch.stack([lm_logits(model, tokens[b, :n].tolist()) for b, n in enumerate(lengths.tolist())])

    with torch.no_grad():
        logits, attention = model(tokens, lengths)
        assert "_prefix_kv" in model.__dict__  # the reuse ran
        torch.testing.assert_close(logits, whole(), rtol=0, atol=atol)
        assert torch.equal(attention.argmax(-1), lengths - 1)
        # encode's text states: each text position's final state in the whole run (the last: the answer's)
        states = model.encode(model.embed(tokens), lengths)
        P = len(model.prefix_ids)
        for b, n in enumerate(lengths.tolist()):
            ids = torch.tensor([[*model.prefix_ids.tolist(), *tokens[b, :n].tolist(), *model.suffix_ids.tolist()]])
            run = model.hf.model(input_ids=ids).last_hidden_state[0]
            want = torch.cat([run[P : P + n - 1], run[-1:]])
            torch.testing.assert_close(states[b, :n], want, rtol=0, atol=atol)
            assert not states[b, n:].any()
        model.hf.model.layers[0].mlp.up_proj.weight.normal_(0, 1)  # the prefix's states change
        again, _ = model(tokens, lengths)
        torch.testing.assert_close(again, whole(), rtol=0, atol=atol)
    assert (again - logits).abs().max() > 100 * atol


def test_the_tested_attention_is_the_answer_positions_row_over_the_text_and_decomposes_exactly():
    model = prompted(F64)
    tokens, lengths = rows(model)
    own = model.tested_attention(tokens, lengths)
    heads = model.hf.config.num_attention_heads
    assert own.attention.shape == (4, heads, tokens.shape[1])
    assert torch.equal(own.lengths, lengths)
    torch.testing.assert_close(own.attention.sum(-1), torch.ones(4, heads, dtype=F64))
    past = protocol.token_mask(lengths, tokens.shape[1]).logical_not()
    assert own.attention[past[:, None].expand_as(own.attention)].abs().max() == 0
    context = torch.einsum("bht,bhtd->bd", own.attention, own.values)
    torch.testing.assert_close(own.decoder(context), own.logits, rtol=0, atol=1e-10)
    torch.testing.assert_close(own.logits, model(tokens, lengths)[0], rtol=0, atol=1e-10)
    # against a real forward whose answer row gives all the text's mass to its first token (the
    # template's positions keep their weights)
    P = len(model.prefix_ids)
    seq = model.sequence(tokens, lengths)
    r = torch.arange(4)

    def hook(query, key, value, probs, scaling):
        probs = probs.clone()
        a = probs[r, :, seq.pooled]
        text = protocol.token_mask(lengths + P, probs.shape[-1], P)[:, None]
        mass = (a * text).sum(-1, keepdim=True)
        first = torch.zeros_like(a)
        first[:, :, P] = 1
        probs[r, :, seq.pooled] = torch.where(text, mass * first, a)
        return probs

    model.last_attention._attnmetrics_hook = hook
    try:
        hidden = model.hf.model(
            input_ids=seq.ids, attention_mask=protocol.token_mask(seq.lengths, seq.ids.shape[1]).long()
        )
        want = model.decoder(hidden.last_hidden_state[r, seq.pooled])
    finally:
        del model.last_attention._attnmetrics_hook
    alpha = torch.zeros_like(own.attention)
    alpha[:, :, 0] = 1
    torch.testing.assert_close(own.decoder(torch.einsum("bht,bhtd->bd", alpha, own.values)), want, rtol=0, atol=1e-10)


def test_the_gradients_through_the_reused_prefix_equal_those_of_the_whole_input_run():
    """Eval mode reuses the prefix (constants), train mode runs the whole input (no dropout in the
    tiny model): the same gradient with respect to the text's embeddings (float64, 1e-10)."""
    model = prompted(F64)
    tokens, lengths = rows(model)
    grads = []
    for train in (False, True):
        model.train(train)
        embedded = model.embed(tokens).detach().requires_grad_(True)
        logits = model.decoder(model.encode(embedded, lengths)[torch.arange(len(lengths)), lengths - 1])
        (logits[:, 1] - logits[:, 0]).sum().backward()
        grads.append(embedded.grad)
    model.train(False)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-10)
    assert grads[0][3].abs().sum(-1).min() > 0  # the longest row: every token reached


def test_gradients_reach_every_text_token_and_nothing_past_its_length():
    model = prompted(F64)
    tokens, lengths = rows(model)
    grads = importance.gradient_importance(model, tokens, lengths)
    assert grads.shape == tokens.shape
    assert (grads[~protocol.token_mask(lengths, tokens.shape[1])] == 0).all()
    assert (grads[protocol.token_mask(lengths, tokens.shape[1])] > 0).all()


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_deleting_a_one_token_text_leaves_the_template_which_leave_one_out_and_eraser_run(dtype, monkeypatch):
    """A prompted model keeps its template when every text token is deleted (lead = trail = 0, yet
    the input is never empty): leave-one-out's deletion of a one-token text, comprehensiveness'
    deletion of a whole text (every fraction of a one-token text under ceil rounding) and ALTI's
    empty rationale for sufficiency are the template alone, ``prefix + suffix`` run by the LM itself
    (an independent forward); equal whether ERASER would choose the reuse or not (the protocol's
    forward has no position left for an empty text, so such rows always take the reuse)."""
    import attnmetrics
    from attnmetrics.eraser import ERASER_FRACTIONS, alti_aopc
    from tests.models.test_causal_edits import ATOL, Plain

    model = prompted(dtype)
    assert protocol.edits_whole_texts(model, "deletion_logits") and protocol.edits_whole_texts(model, "subset_logits")
    plain = Plain(model)  # the protocol without the capabilities: nothing runs an empty text for it
    plain.encodes_empty_text = True
    assert not protocol.edits_whole_texts(plain, "subset_logits")
    tokens, lengths = rows(model, seed=2, lengths=(4, 1, 3, 1))

    def p(text):  # the output distribution from the LM's own head, float64
        return torch.softmax(lm_logits(model, text).detach().to(F64), -1)

    texts = [tokens[b, :n].tolist() for b, n in enumerate(lengths.tolist())]
    own, template = [p(t) for t in texts], p([])
    loo = attnmetrics.leave_one_out(model, tokens, lengths)
    for b, text in enumerate(texts):
        want = [0.5 * (own[b] - p(text[:t] + text[t + 1 :])).abs().sum() for t in range(len(text))]
        torch.testing.assert_close(loo[b, : len(text)].to(F64), torch.stack(want), rtol=0, atol=ATOL[dtype])
    scores = torch.randn(4, 4, generator=torch.Generator().manual_seed(5), dtype=dtype)
    for share in (1.0, 0.0):  # the reuse where it saves; a full recomputation chosen for every block
        monkeypatch.setattr(attnmetrics.eraser, "SUBSET_REUSE_SHARE", share)
        got = attnmetrics.comprehensiveness(model, tokens, lengths, scores)
        for b in (1, 3):  # k = 1 of 1 at every fraction: the template alone
            y = int(own[b].argmax())
            want = torch.full((len(ERASER_FRACTIONS),), float(own[b][y] - template[y]), dtype=F64)
            torch.testing.assert_close(got.values[b].to(F64), want, rtol=0, atol=ATOL[dtype])
        suff = attnmetrics.sufficiency(model, tokens, lengths, scores, aopc="alti")
        predicted = torch.stack(own).argmax(1)
        empty = torch.stack([own[b][y] - template[y] for b, y in enumerate(predicted.tolist())])
        want = alti_aopc(suff.values.to(F64), empty, keep_rationale=True)
        torch.testing.assert_close(suff.aopc.to(F64), want, rtol=0, atol=ATOL[dtype])
    # an empty text given as a row is named (the protocol's forward has no position for the answer's state)
    empty_row = lengths.clone()
    empty_row[2] = 0
    for call in (lambda: model(tokens, empty_row), lambda: importance.gradient_importance(model, tokens, empty_row)):
        with pytest.raises(ValueError, match=r"at least one text token .* got lengths\[2\] = 0"):
            call()
    assert attnmetrics.leave_one_out(model, tokens, empty_row)[2].eq(0).all()  # nothing to delete: zeros


def test_a_prompted_model_saves_no_weights_and_reloads_from_its_source(tmp_path):
    model = prompted(F64)
    assert model.state_dict() == {}
    with pytest.raises(ValueError, match="come from its source"):
        model.load_state_dict({"x": torch.zeros(1)})
    config = model.config.to_dict()
    assert config["encoder"] == "prompted" and config["architecture"] == "LlamaForCausalLM"
    assert config["label_ids"] == model.label_ids


def test_the_shipped_prompts_hold_text_once_and_name_every_class_of_their_data_sets():
    from attnmetrics.data import BBC_CLASSES

    for prompt in PROMPTS.values():
        assert prompt.template.count("{text}") == 1
    for name in ("sentiment", "sentiment-oneword", "sentiment-plain"):
        assert PROMPTS[name].words(("negative", "positive"))
    assert len(set(PROMPTS["topic"].words(BBC_CLASSES))) == len(BBC_CLASSES)


@pytest.mark.parametrize(
    ("template", "words", "message"),
    [
        ("sentiment", ["a"], r"--label-words: one word per class \(neg, pos\), got 1"),
        ("Review:", None, r"neither a prompt's name .* nor a template holding \{text\}"),
        ("Review: {text}", None, r"a template needs --label-words, one per class \(neg, pos\)"),
    ],
)
def test_prompt_named_refuses_in_one_line(template, words, message):
    with pytest.raises(ValueError, match=message):
        prompt_named(template, words, ["neg", "pos"])


def test_a_shipped_prompt_without_a_word_for_a_class_names_it():
    with pytest.raises(ValueError, match=r"no label word for class 'sports'"):
        PROMPTS["sentiment"].words(("negative", "sports"))


@pytest.mark.parametrize(
    ("template", "words", "message"),
    [
        ("Review: {text} {text}", ["negative", "positive"], r"exactly once, it holds it 2 times"),
        ("Review: {text}", ["negative", "positive"], r"at least one token after \{text\}"),
        ("Review: {text} Sentiment:", ["negative", "good film"], r"label word 'good film' \(class 'pos'\) is 2 tokens"),
        ("Review: {text} Sentiment:", ["good", "good"], r"not distinct tokens"),
    ],
)
def test_bad_prompts_are_refused_naming_what_is_wrong(template, words, message):
    model = prompted(F64)
    tokenizer = model.tokenizer
    prompt = Prompt("custom", template, dict(zip(["neg", "pos"], words)))
    with pytest.raises(ValueError, match=message):
        PromptedLM(model.hf, tokenizer, prompt, ["neg", "pos"])


def test_a_model_that_is_not_llama_layout_is_refused_naming_it():
    config = transformers.GPT2Config(vocab_size=20, n_embd=8, n_layer=1, n_head=2, n_positions=16)
    lm = transformers.GPT2LMHeadModel(config)
    with pytest.raises(ValueError, match=r"Llama-layout causal language model .* got GPT2LMHeadModel"):
        PromptedLM(lm, None, PROMPTS["sentiment"], ["negative", "positive"])


def test_a_half_precision_checkpoint_is_computed_in_float32_and_said(tmp_path):
    from attnmetrics.models.prompted import load_causal_lm

    model = prompted(F64)
    model.hf.to(torch.float16).save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)
    lm, _, upcast = load_causal_lm(tmp_path)
    assert upcast == torch.float16
    assert {p.dtype for p in lm.parameters()} == {torch.float32}


def test_a_folder_that_is_not_a_checkpoint_is_named(tmp_path):
    from attnmetrics.models.prompted import load_causal_lm

    with pytest.raises(ValueError, match=rf"{tmp_path}: cannot load the Hugging Face tokenizer"):
        load_causal_lm(tmp_path)
    with pytest.raises(ValueError, match=r"no such GGUF file"):
        load_causal_lm(tmp_path / "model.Q4_1.gguf")


def test_a_causal_lm_folder_without_its_tokenizer_is_named(tmp_path):
    from attnmetrics.models.prompted import load_causal_lm

    prompted(F64).hf.save_pretrained(tmp_path)  # weights and config.json, no tokenizer files
    with pytest.raises(ValueError, match=rf"{tmp_path} has no tokenizer files"):
        load_causal_lm(tmp_path)


@pytest.mark.parametrize("chat_bos", [True, False], ids=["template-writes-bos", "tokenizer-adds-bos"])
def test_a_chat_template_that_writes_the_bos_token_gets_one_not_two(chat_bos):
    """A Llama-3-like chat template starts with the BOS token's text; the tokenizer adds BOS of its own
    accord too (a post-processor): the prompt must start with one BOS either way."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from tests.models.test_causal_edits import WORDS

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<s>", "</s>", *WORDS, *(f"w{i}" for i in range(45))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    opening = "{{ bos_token }}" if chat_bos else ""
    tokenizer.chat_template = opening + "{% for m in messages %}{{ m['content'] }}{% endfor %} Sentiment :"
    config = transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3,
    )  # fmt: skip
    lm = transformers.LlamaForCausalLM(config).eval()
    prompt = Prompt("chat", "Review : {text}", {"neg": " negative", "pos": " positive"}, chat=True)
    model = PromptedLM(lm, tokenizer, prompt, ["neg", "pos"])
    assert model.prefix_ids.tolist() == [2, vocab["Review"], vocab[":"]]


def test_attention_flow_runs_over_the_whole_input_from_the_text_to_the_answer_position():
    """The graph of a prompted model holds the template's positions; each text token's flow to the
    answer position equals networkx's max flow on a graph built here from the model's attention (0.5
    head mean + 0.5 I, rows renormalised, over the whole input), one row at a time."""
    from attnmetrics.attributions import attention_flow
    from attnmetrics.testing.reference import networkx_max_flows

    model = prompted(F64)
    tokens, lengths = rows(model, lengths=(4, 1, 3))
    got = attention_flow(model, tokens, lengths)
    assert got.shape == tokens.shape
    prefix = len(model.prefix_ids)
    for b, n in enumerate(lengths.tolist()):
        ids = torch.tensor([[*model.prefix_ids.tolist(), *tokens[b, :n].tolist(), *model.suffix_ids.tolist()]])
        probs = model.whole_attentions(tokens[b : b + 1, :n], lengths[b : b + 1])[0]  # [L, H, N, N]
        size = ids.shape[1]
        capacities = []
        for layer in probs:
            mixed = 0.5 * layer.mean(0) + 0.5 * torch.eye(size, dtype=F64)
            capacities.append((mixed / mixed.sum(-1, keepdim=True)).tolist())
        want = networkx_max_flows(capacities, size - 1, range(prefix, prefix + n))
        torch.testing.assert_close(got[b, :n], torch.tensor(want, dtype=F64), rtol=1e-9, atol=1e-12)
        assert (got[b, n:] == 0).all()
    assert float(got[0].std()) > 0  # tokens told apart
