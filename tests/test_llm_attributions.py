"""The attention-derived attributions on pre-RMSNorm Llama-layout decoders (attnmetrics.llm) against the
plain per-sentence loops of attnmetrics/testing/llm_reference.py, in float64 to 1e-10, on tiny random
LlamaForSequenceClassification (grouped-query attention: 4 query heads, 2 key/value heads), Qwen2
(q/k/v biases) and a LlamaForCausalLM (biases on every projection, o_proj's included) used through a
prompt; ragged rows, one of a single token."""

from __future__ import annotations

import types

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from attnmetrics import llm  # noqa: E402
from attnmetrics.models.hf import HFClassifier  # noqa: E402
from attnmetrics.models.prompted import Prompt, PromptedLM  # noqa: E402
from attnmetrics.protocol import token_mask  # noqa: E402
from attnmetrics.testing import llm_reference as ref  # noqa: E402

F64 = torch.float64
TOL = dict(rtol=1e-10, atol=1e-10)

#: the tiny decoders: grouped-query attention everywhere (4 query heads, 2 key/value heads)
CLASSIFIERS = {
    "llama": ("LlamaConfig", "LlamaForSequenceClassification"),
    "qwen2": ("Qwen2Config", "Qwen2ForSequenceClassification"),
}
FAMILIES = [*CLASSIFIERS, "prompted"]
WORDS = ["<pad>", "<unk>", "<s>", "</s>", "Review", ":", "Sentiment", "positive", "negative"]
WORDS += [f"w{i}" for i in range(51)]


def _float64_rms_norms(model: torch.nn.Module) -> None:
    """transformers' RMSNorm computes in float32 whatever the model's dtype (``.to(torch.float32)``),
    so a float64 model's norms are float32-precise; give each the same formula in float64 so the
    comparison with the float64 loops can be at 1e-10 (the methods read the states the model computes,
    whatever its norm's rounding: ``test_the_models_own_float32_norms`` checks them unpatched)."""

    def forward(self, u):
        return self.weight * (u * torch.rsqrt(u.square().mean(-1, keepdim=True) + self.variance_epsilon))

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(forward, module)


def _randomise(model: torch.nn.Module) -> None:
    """Biases and norm weights away from their 0 / 1 initialisation, so that every one counts."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))


def _config(family: str, **extra):
    config_class = CLASSIFIERS.get(family, ("LlamaConfig",))[0]
    return getattr(transformers, config_class)(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3, initializer_range=0.2, **extra,
    )  # fmt: skip


def tokenizer():
    """A word-level tokenizer over :data:`WORDS` (whitespace-split; every label word one token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def build(family: str, classes: int = 3, exact: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    if family == "prompted":
        lm = transformers.LlamaForCausalLM(_config(family, attention_bias=True))
        _randomise(lm)
        prompt = Prompt("test", "Review: {text} Sentiment:", {"negative": " negative", "positive": " positive"})
        model = PromptedLM(lm.eval().to(F64), tokenizer(), prompt, ["negative", "positive"])
        assert len(model.prefix_ids) == 2 and len(model.suffix_ids) == 2  # "Review :" and "Sentiment :"
    else:
        hf = getattr(transformers, CLASSIFIERS[family][1])(_config(family, num_labels=classes))
        _randomise(hf)
        model = HFClassifier(hf.eval().to(F64))
        assert model.family == "llama"
    if exact:
        _float64_rms_norms(model.hf)
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return build(request.param)


def ragged(rows: int = 5, width: int = 9, seed: int = 0):
    """Right-padded item ids 9..59 (the w* words): a full row, a one-token row, the rest random."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (rows,), generator=g)
    lengths[0], lengths[1] = width, 1
    tokens = torch.randint(9, len(WORDS), (rows, width), generator=g)
    tokens[~token_mask(lengths, width)] = 0
    return tokens, lengths


METHODS = {
    "value_norm": (llm.attention_value_norm, ref.attention_value_norm_reference),
    "alti": (llm.alti, ref.alti_reference),
    "alti_logit": (llm.alti_logit, ref.alti_logit_reference),
    "chefer": (llm.gradient_weighted_rollout, ref.gradient_weighted_rollout_reference),
    "value_zeroing": (llm.value_zeroing, ref.value_zeroing_reference),
}


@pytest.mark.parametrize("name", METHODS)
def test_each_method_equals_its_plain_loop(model, name):
    method, reference = METHODS[name]
    tokens, lengths = ragged()
    got = method(model, tokens, lengths)
    expected = reference(model, tokens, lengths)
    assert got.shape == tokens.shape and got.dtype == F64
    torch.testing.assert_close(got, expected, **TOL)
    assert (got[~token_mask(lengths, tokens.shape[1])] == 0).all()
    assert got[0].abs().sum() > 0 and got[1, 0] != 0  # the scores are not trivially 0 (the one-token row too)


def test_alti_logit_difference_equals_its_plain_loop(model):
    tokens, lengths = ragged()
    got = llm.alti_logit(model, tokens, lengths, target="difference")
    torch.testing.assert_close(got, ref.alti_logit_reference(model, tokens, lengths, target="difference"), **TOL)
    per_class = llm.alti_logit_contributions(model, tokens, lengths)
    assert per_class.shape == (*tokens.shape, 2 if isinstance(model, PromptedLM) else 3)
    logits = model(tokens, lengths)[0]
    predicted = logits.argmax(1)
    rows = torch.arange(len(tokens))
    torch.testing.assert_close(per_class[rows, :, predicted], llm.alti_logit(model, tokens, lengths), **TOL)


def test_alti_logit_with_one_sigmoid_logit_is_the_signed_logit():
    model = build("llama", classes=1)
    tokens, lengths = ragged()
    z = model(tokens, lengths)[0][:, 0]
    per_class = llm.alti_logit_contributions(model, tokens, lengths)[..., 0]
    sign = torch.where(z > 0, 1.0, -1.0).to(F64)[:, None]
    for target in ("logit", "difference"):
        got = llm.alti_logit(model, tokens, lengths, target=target)
        torch.testing.assert_close(got, sign * per_class, **TOL)
        torch.testing.assert_close(got, ref.alti_logit_reference(model, tokens, lengths, target=target), **TOL)


@pytest.mark.parametrize("name", METHODS)
def test_chunks_and_padding_change_nothing(name):
    model = build("prompted")
    method = METHODS[name][0]
    tokens, lengths = ragged()
    whole = method(model, tokens, lengths)
    # one row a chunk (and one query chunk at a time where a method chunks queries)
    torch.testing.assert_close(method(model, tokens, lengths, memory_budget=1), whole, **TOL)
    wider = torch.cat([tokens, torch.zeros(len(tokens), 4, dtype=torch.long)], 1)
    torch.testing.assert_close(method(model, wider, lengths)[:, : tokens.shape[1]], whole, **TOL)
    alone = method(model, tokens[2:3, : int(lengths[2])], lengths[2:3])
    torch.testing.assert_close(alone[0], whole[2, : int(lengths[2])], **TOL)


def test_the_models_own_float32_norms():
    # unpatched, transformers' RMSNorm rounds through float32: the methods follow the model's own states,
    # so they meet the float64 loops at float32's precision, not better
    model = build("llama", exact=False)
    tokens, lengths = ragged()
    for name in ("value_norm", "alti_logit"):
        method, reference = METHODS[name]
        with pytest.raises(AssertionError):
            reference(model, tokens, lengths)  # the loop's own check against the model's forward
        torch.testing.assert_close(method(model, tokens, lengths), _loose(reference, model, tokens, lengths),
                                   rtol=1e-5, atol=1e-6)  # fmt: skip


def _loose(reference, model, tokens, lengths):
    original = ref.states_loop

    def loose(model, ids, tolerance=1e-9):
        return original(model, ids, tolerance=1e-5)

    ref.states_loop = loose
    try:
        return reference(model, tokens, lengths)
    finally:
        ref.states_loop = original


def test_float32_model():
    model = build("qwen2", exact=False)
    model.float()
    tokens, lengths = ragged()
    got = llm.alti(model, tokens, lengths)
    model.double()
    _float64_rms_norms(model.hf)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref.alti_reference(model, tokens, lengths), rtol=1e-4, atol=1e-5)


def test_alti_shares_sum_to_one_and_value_zeroing_is_a_share():
    model = build("prompted")
    tokens, lengths = ragged()
    for method in (llm.alti, llm.value_zeroing):
        got = method(model, tokens, lengths)
        assert (got >= 0).all() and (got.sum(1) < 1).all()  # the template holds the rest of the share


def test_refusals():
    bert = HFClassifier(
        transformers.BertForSequenceClassification(
            transformers.BertConfig(
                vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
            )  # fmt: skip
        ).eval()
    )
    assert not llm.supports(bert) and llm.supports(build("llama")) and llm.supports(build("prompted"))
    tokens, lengths = ragged()
    with pytest.raises(TypeError, match="Llama-layout"):
        llm.alti(bert, tokens, lengths)
    with pytest.raises(ValueError, match="gated MLP"):
        llm.decompx(build("llama"), tokens, lengths)
    with pytest.raises(ValueError, match="summed stream"):
        llm.globenc(build("prompted"), tokens, lengths)
    with pytest.raises(ValueError, match="at least one token"):
        llm.alti(build("llama"), tokens, torch.zeros_like(lengths))
    with pytest.raises(ValueError, match="target"):
        llm.alti_logit(build("llama"), tokens, lengths, target="probability")
    sdpa = build("llama")
    sdpa.hf.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="attention implementation"):
        llm.attention_value_norm(sdpa, tokens, lengths)


@pytest.mark.parametrize("family", ["llama", "prompted"])
def test_the_battery_takes_them_for_llama_layout_decoders(family):
    from attnmetrics.app.battery import registry

    model = build(family)
    everything = registry.with_importances(["all"], {})
    chosen = {i.name: i for i in registry.chosen(model, registry.Settings((), everything))}
    attention_derived = {"value_norm", "alti", "alti_logit", "value_zeroing", "chefer"}
    assert attention_derived <= set(chosen) and not {"decompx", "globenc"} & set(chosen)
    assert "alti_logit" in registry.optional_names()
    tokens, lengths = ragged()
    settings = registry.Settings((), everything)
    for name in (*attention_derived, "decompx", "globenc"):
        importance = next(i for i in registry.importances() if i.name == name)
        if name in ("decompx", "globenc"):
            with pytest.raises(ValueError, match="does not carry over"):
                importance.compute(model, tokens, lengths, settings)
            continue
        method = METHODS[name][0]
        torch.testing.assert_close(importance.compute(model, tokens, lengths, settings), method(model, tokens, lengths))
    # a BERT-like model keeps attnmetrics.attributions' (and no ALTI-Logit)
    from attnmetrics import attributions

    bert = HFClassifier(
        transformers.BertForSequenceClassification(
            transformers.BertConfig(
                vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
            )  # fmt: skip
        ).eval()
    )
    chosen = {i.name: i for i in registry.chosen(bert, settings)}
    assert "alti_logit" not in chosen and "decompx" in chosen
    ids = torch.tensor([[1, 7, 8, 2]])
    torch.testing.assert_close(
        chosen["alti"].compute(bert, ids, torch.tensor([4]), settings), attributions.alti(bert, ids, torch.tensor([4]))
    )
