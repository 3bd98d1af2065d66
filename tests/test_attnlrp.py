"""AttnLRP on Llama-layout decoders (attnmetrics.llm.attnlrp): equal to ``lxt``'s own relevances on tiny
random Llama (grouped-query attention) and Qwen2 (q/k/v biases) models, both as a fine-tuned classifier
and as a prompted model (tests/fixtures/attnlrp_lxt.json, written by benchmarks/peers/attnlrp_lxt.py in
``lxt``'s own environment); relevance conserved on a bias-free model except for what the softmaxes
absorb (and not conserved once any rule is broken); the battery's ``--attnlrp``."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from attnmetrics.llm import attnlrp as lrp  # noqa: E402
from attnmetrics.llm.attnlrp import attnlrp, rules  # noqa: E402
from attnmetrics.models.hf import HFClassifier, hooked  # noqa: E402
from attnmetrics.models.prompted import Prompt, PromptedLM  # noqa: E402
from attnmetrics.protocol import token_mask  # noqa: E402
from tests.inputs import ROOT  # noqa: E402

F64 = torch.float64
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "attnlrp_lxt.json").read_text())
SPEC = FIXTURE["spec"]
#: the fixture's parity: each relevance within 1e-4 of lxt's, relative to the row's largest
PARITY = 1e-4


def _worker():
    """benchmarks/peers/attnlrp_lxt.py as a module: the models' construction the fixture was made with."""
    spec = importlib.util.spec_from_file_location("attnlrp_lxt", ROOT / "benchmarks" / "peers" / "attnlrp_lxt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WORKER = _worker()


def padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(r) for r in rows])
    tokens = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
    return tokens, lengths


def classifier_of(lm, label_ids: list[int]) -> HFClassifier:
    """``lm``'s weights as a ``...ForSequenceClassification`` whose head holds ``lm_head``'s rows of
    ``label_ids``: its logits at a row's last token are the label words' next-token logits there."""
    name = type(lm).__name__.replace("CausalLM", "SequenceClassification")
    config = type(lm.config)(**SPEC["config"], num_labels=len(label_ids))
    hf = getattr(transformers, name)(config).to(lm.dtype)
    missing, unexpected = hf.load_state_dict(
        {k: v for k, v in lm.state_dict().items() if k != "lm_head.weight"}, strict=False
    )
    assert missing == ["score.weight"] and not unexpected
    with torch.no_grad():
        hf.score.weight.copy_(lm.lm_head.weight[label_ids])
    return HFClassifier(hf.eval())


WORDS = ["<pad>", "<s>", "</s>", "p0", "p1", "s0", "s1", *(f"w{i}" for i in range(7, 40))]


def prompted_of(lm) -> PromptedLM:
    """``lm`` prompted with the fixture's template (``p0 p1 {text} s0 s1``) and label words (``w20``,
    ``w21``, ``w22``), through a word-level tokenizer whose ids are the fixture's."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    words = {c: f" {WORDS[i]}" for c, i in zip("abc", SPEC["label_ids"])}
    model = PromptedLM(lm, tokenizer, Prompt("fixture", "p0 p1 {text} s0 s1", words), list("abc"))
    assert model.prefix_ids.tolist() == SPEC["prefix"] and model.suffix_ids.tolist() == SPEC["suffix"]
    assert model.label_ids == SPEC["label_ids"]
    return model


def gradient_x_input(model, tokens, lengths) -> torch.Tensor:
    """Plain Gradient × Input of the whole rows (no rule): what AttnLRP's rules change."""
    words = model.embed(tokens).detach().requires_grad_(True)
    logits = model.decoder(model.encode(words, lengths)[torch.arange(len(tokens)), lengths - 1])
    (gradient,) = torch.autograd.grad(logits.max(1).values.sum(), words)
    return (words * gradient).sum(-1) * token_mask(lengths, tokens.shape[1])


def assert_parity(got: torch.Tensor, expected: torch.Tensor) -> float:
    """``got`` within PARITY of ``expected`` relative to its largest entry; the relative error."""
    error = float((got - expected).abs().max() / expected.abs().max())
    assert error < PARITY, error
    return error


# ---- lxt's own relevances ------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(SPEC["architectures"]))
def test_a_classifier_equals_lxt_on_every_position(family):
    lm = WORKER.build(family, SPEC)
    model = classifier_of(lm, SPEC["label_ids"])
    tokens, lengths = padded(FIXTURE["rows"])  # lxt ran each row alone; here they are one padded batch
    results = FIXTURE["results"][family]
    with torch.no_grad():  # the weights are the fixture's: the same label words' logits
        logits = model(tokens, lengths)[0]
    torch.testing.assert_close(logits, torch.tensor([r["logits"] for r in results]), rtol=0, atol=1e-5)
    assert logits.argmax(1).tolist() == [r["predicted"] for r in results]
    got = attnlrp(model, tokens, lengths)
    assert got.shape == tokens.shape and got.dtype == torch.float32
    plain = gradient_x_input(model, tokens, lengths)
    for i, r in enumerate(results):
        expected = torch.tensor(r["relevance"])
        assert_parity(got[i, : lengths[i]], expected)
        assert (got[i, lengths[i] :] == 0).all()
        # the rules matter: plain Gradient x Input is far from lxt's
        assert (plain[i, : lengths[i]] - expected).abs().max() > 0.05 * expected.abs().max()


@pytest.mark.parametrize("family", list(SPEC["architectures"]))
def test_a_prompted_model_equals_lxt_on_the_texts_tokens(family):
    model = prompted_of(WORKER.build(family, SPEC))
    tokens, lengths = padded(SPEC["texts"])
    got = attnlrp(model, tokens, lengths)
    assert got.shape == tokens.shape  # [B, T_items]: the text's tokens only
    assert (got[~token_mask(lengths, tokens.shape[1])] == 0).all()
    start = len(SPEC["prefix"])
    for i, r in enumerate(FIXTURE["results"][family]):
        assert_parity(got[i, : lengths[i]], torch.tensor(r["relevance"][start : start + int(lengths[i])]))


def test_a_prompted_model_is_its_whole_rows_classifier_at_the_texts_positions():
    """The template is context: the prompted model's relevances are those of a classifier run on the
    whole rows (template included), at the text's positions, in float64 to 1e-10."""
    lm = WORKER.build("llama", SPEC).to(F64)
    prompted, whole = prompted_of(lm), classifier_of(lm, SPEC["label_ids"])
    tokens, lengths = padded(SPEC["texts"])
    rows, full = padded(FIXTURE["rows"])
    got, expected = attnlrp(prompted, tokens, lengths), attnlrp(whole, rows, full)
    start = len(SPEC["prefix"])
    assert got.dtype == F64
    torch.testing.assert_close(got, expected[:, start : start + tokens.shape[1]] * token_mask(lengths, tokens.shape[1]))
    assert (expected[:, :start].abs() > 0).all()  # the template's positions take relevance, not scored


# ---- conservation --------------------------------------------------------------------------------


def bias_free(seed: int = 3) -> HFClassifier:
    """A tiny bias-free LlamaForSequenceClassification (grouped-query attention), float64."""
    config = transformers.LlamaConfig(**SPEC["config"], num_labels=3)
    hf = transformers.LlamaForSequenceClassification(config).to(F64)
    WORKER.randomise(hf, seed)
    hf.double()
    assert not any(name.endswith("bias") for name, _ in hf.named_parameters())
    return HFClassifier(hf.eval())


RAGGED = [[9, 17, 31, 12, 25, 38, 8], [14, 9, 33], [27], [7, 8]]


def relevance_and_absorbed(model: HFClassifier, tokens, lengths):
    """Under the rules, one forward with every layer's queries, keys and probabilities read (eager
    attention): each position's relevance ``[B, T]``, the explained logit ``[B]``, and what the
    softmaxes absorb ``[B]``: per layer, the relevance the probabilities get (half of the attention
    output's, ``0.5 sum p * dy/dp``) less what the scores pass on to the queries and keys
    (``sum q * g_q + k * g_k`` at their quarter gradients = ``0.5 sum s * dy/ds``)."""
    seen = []

    def hook(query, key, value, probs, scaling):
        seen.append((query, key, probs))
        return probs

    rows, width = torch.arange(len(tokens)), tokens.shape[1]
    with rules(model), hooked(model.attention_layers, hook):
        words = model.embed(tokens).detach().requires_grad_(True)
        hidden = model.base(inputs_embeds=words, attention_mask=token_mask(lengths, width).long()).last_hidden_state
        logits = model.decoder(hidden[rows, lengths - 1])
        target = logits.max(1).values
        grads = torch.autograd.grad(target.sum(), [words, *(t for triple in seen for t in triple)])
    absorbed = torch.zeros_like(target)
    for i, (q, k, p) in enumerate(seen):
        g_q, g_k, g_p = grads[1 + 3 * i : 4 + 3 * i]
        to_scores = 0.5 * ((q * g_q).sum((1, 2, 3)) + (k * g_k).sum((1, 2, 3)))
        absorbed += 0.5 * (p * g_p).sum((1, 2, 3)) - 0.5 * to_scores
    return (words * grads[0]).sum(-1), target.detach(), absorbed


def test_relevance_is_conserved_but_for_what_the_softmaxes_absorb():
    """On a bias-free model every rule but the softmax's conserves relevance: the positions' relevances
    sum to the logit less what the softmaxes absorb, row by row (a one-token row too, whose softmax
    takes its half of every attention output's relevance and passes none on)."""
    model = bias_free()
    tokens, lengths = padded(RAGGED)
    relevance, logit, absorbed = relevance_and_absorbed(model, tokens, lengths)
    keep = token_mask(lengths, tokens.shape[1])
    got = attnlrp(model, tokens, lengths)  # the fused attention path: the same relevances
    torch.testing.assert_close(got, relevance * keep, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.sum(1), logit - absorbed, rtol=1e-9, atol=1e-12)
    assert (absorbed.abs() > 1e-3 * logit.abs()).all()  # the softmaxes do absorb: sum R = logit is not it


def _rms_not_held(norm):
    def forward(u):
        return norm.weight * u * torch.rsqrt(u.square().mean(-1, keepdim=True) + norm.variance_epsilon)

    return forward


def _product_whole(mlp):
    return lambda u: mlp.down_proj(lrp.identity_rule(mlp.act_fn, mlp.gate_proj(u)) * mlp.up_proj(u))


def _silu_by_gradient(mlp):
    return lambda u: mlp.down_proj(lrp.divide_gradient(mlp.act_fn(mlp.gate_proj(u)) * mlp.up_proj(u), 2))


@pytest.mark.parametrize(
    "broken",
    [
        ("_rms_norm_forward", _rms_not_held),
        ("_gated_mlp_forward", _product_whole),
        ("_gated_mlp_forward", _silu_by_gradient),
        ("FACTORS", {"q": 2, "k": 2, "v": 2}),
        ("FACTORS", {"q": 4, "k": 4, "v": 1}),
    ],
    ids=["rms-not-held", "product-not-halved", "silu-by-its-gradient", "queries-keys-halved", "values-whole"],
)
def test_conservation_fails_once_a_rule_is_broken(broken, monkeypatch):
    name, replacement = broken
    monkeypatch.setattr(lrp, name, replacement)
    model = bias_free()
    tokens, lengths = padded(RAGGED[:2])
    relevance, logit, absorbed = relevance_and_absorbed(model, tokens, lengths)
    assert ((relevance.sum(1) - (logit - absorbed)).abs() > 1e-3 * logit.abs()).any()


# ---- the call ------------------------------------------------------------------------------------


def test_chunks_and_the_models_own_modules_are_left_as_they_were():
    model = bias_free()
    norm = model.base.layers[0].input_layernorm
    own = norm.forward  # the class's
    marked = lambda u: own(u)  # noqa: E731  (an instance's own forward: another procedure's patch)
    norm.forward = marked
    tokens, lengths = padded(RAGGED)
    with torch.no_grad():
        before = model(tokens, lengths)[0]
    whole = attnlrp(model, tokens, lengths)
    torch.testing.assert_close(attnlrp(model, tokens, lengths, memory_budget=1), whole, rtol=1e-10, atol=1e-12)
    assert norm.forward is marked
    layers = model.base.layers
    assert all("forward" not in m.__dict__ for layer in layers for m in (layer.post_attention_layernorm, layer.mlp))
    assert "forward" not in model.base.norm.__dict__
    assert all(not getattr(layer.self_attn, f"{p}_proj")._forward_hooks for layer in layers for p in "qkv")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, lengths)[0], before, rtol=0, atol=0)


def test_what_it_refuses():
    model = bias_free()
    with pytest.raises(TypeError, match="needs a Llama-layout decoder"):
        attnlrp(object(), *padded(RAGGED))
    tokens, lengths = padded(RAGGED)
    with pytest.raises(ValueError, match="every row needs at least one token"):
        attnlrp(model, tokens, torch.tensor([7, 3, 0, 2]))
    with pytest.raises(ValueError, match="vocab"):
        attnlrp(model, tokens + 100, lengths)


# ---- the battery ---------------------------------------------------------------------------------


def test_the_battery_computes_it_for_llama_layout_decoders_only():
    from attnmetrics.app.battery import collect, registry, run_conventions
    from attnmetrics.app.battery.runner import BatteryConfig
    from attnmetrics.app.parser import build_parser

    assert build_parser().parse_args(["run", "--dataset", "sst", "--attnlrp"]).attnlrp is True
    assert build_parser().parse_args(["run", "--dataset", "sst"]).attnlrp is False
    importance = next(i for i in registry.importances() if i.name == "attnlrp")
    on, off = registry.Settings((), {"attnlrp": True}), registry.Settings()
    model = bias_free()
    assert importance.enabled(model, on) and importance.enabled(None, on)
    assert not importance.enabled(model, off)
    gpt2 = types_model_of_family("gpt2")
    assert not importance.enabled(gpt2, on)
    tokens, lengths = padded([r for r in RAGGED if len(r) > 1])  # ERASER deletes: no one-token row
    torch.testing.assert_close(importance.compute(model, tokens, lengths, on), attnlrp(model, tokens, lengths))
    values, seconds = collect(
        model, [(0, tokens, lengths)], options={"attnlrp": True}, experiments=["kendall", "eraser"], progress=False
    )
    assert values["kendall/attention vs attnlrp/tau"].shape == (3,)
    assert values["eraser/attnlrp/comprehensiveness/aopc"].shape == (3,)
    assert "attnlrp" in seconds
    assert "predicted class's logit" in run_conventions(BatteryConfig())["attnlrp"]


def types_model_of_family(family: str):
    """A stand-in model of another family (the importance decides on ``family`` alone)."""
    import types

    return types.SimpleNamespace(family=family)
