"""The attention-derived attributions (the package attnmetrics/attributions/) against plain loops written from
the papers' equations (attnmetrics/testing/reference.py): one sentence at a time, explicit loops over
layers, heads and tokens, every state recomputed from the Hugging Face model's weights (embeddings
included), on a small random ``BertForSequenceClassification`` (no download). The loop's own forward
is checked against the model's first, so the references cannot drift from the model they explain."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnmetrics.attributions import (  # noqa: E402
    FLOW_SCALE,
    METHODS,
    alti,
    attention_flow,
    decompx,
    decompx_contributions,
    gradient_weighted_rollout,
    supports,
)
from attnmetrics.attributions.flow import _max_flows  # noqa: E402
from attnmetrics.models.hf import HFClassifier  # noqa: E402
from attnmetrics.protocol import token_mask  # noqa: E402
from attnmetrics.testing.reference import (  # noqa: E402
    ATTRIBUTION_REFERENCES,
    alti_sentence_reference,
    attention_flow_reference,
    attention_flow_sentence_reference,
    attention_value_norm_sentence_reference,
    decompx_sentence_contributions,
    decompx_sentence_reference,
    globenc_sentence_reference,
    gradient_weighted_rollout_sentence_reference,
    networkx_max_flows,
    value_zeroing_sentence_reference,
)

F64 = torch.float64
#: the name each function gives itself in its errors
FUNCTION = {"value_norm": "attention_value_norm", "chefer": "gradient_weighted_rollout"}


def tiny(layers: int = 3, seed: int = 0, dtype=F64) -> HFClassifier:
    """A random BERT classifier; every parameter (LayerNorm gains and biases too) drawn from
    N(0, 0.5^2) so that no bias or gain is the 0 or 1 that would hide a convention."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=24,
        num_labels=2, max_position_embeddings=32,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return HFClassifier(model.to(dtype)).eval()


def batch(rows: int = 6, width: int = 9, seed: int = 0):
    """Right-padded ``[CLS]=1 ... [SEP]=2`` rows of ids 5..49: the first full width, the second one
    real token (length 3), the rest random lengths."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width + 1, (rows,), generator=g)
    lengths[0], lengths[1] = width, 3
    tokens = torch.randint(5, 50, (rows, width), generator=g)
    tokens[:, 0] = 1
    tokens[torch.arange(rows), lengths - 1] = 2
    tokens[~token_mask(lengths, width)] = 0
    return tokens, lengths


# ---- the plain loops (attnmetrics/testing/reference.py) -----------------------------------------

LOOPS = {
    "value_norm": attention_value_norm_sentence_reference,
    "globenc": globenc_sentence_reference,
    "alti": alti_sentence_reference,
    "value_zeroing": value_zeroing_sentence_reference,
    "chefer": gradient_weighted_rollout_sentence_reference,
    "decompx": decompx_sentence_reference,
    "attention_flow": attention_flow_sentence_reference,
}


def expected(name, model, tokens, lengths):
    """[B, T - 1]: the loop's scores of each row's real tokens ([SEP] and padding 0)."""
    return ATTRIBUTION_REFERENCES[name](model, tokens, lengths)


# ---- tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def inputs():
    return batch()


@pytest.fixture(scope="module")
def references(model, inputs):
    return {name: expected(name, model, *inputs) for name in METHODS}


@pytest.mark.parametrize("name", METHODS)
def test_equals_the_plain_loop_in_float64(name, model, inputs, references):
    got = METHODS[name](model, *inputs)
    assert got.dtype == F64 and got.shape == (6, 8)
    torch.testing.assert_close(got, references[name], rtol=1e-10, atol=1e-12)
    # not a constant, not all zero: the reference has something to tell apart
    assert float(references[name][0].std()) > 1e-3 * float(references[name][0].abs().max())


@pytest.mark.parametrize("name", METHODS)
def test_one_layer_and_chunked_to_any_budget(name):
    """One layer (the rollout is the layer itself); a budget of 1 byte: one row, one query and
    one (row, token) pair a chunk."""
    one = tiny(layers=1, seed=1)
    tokens, lengths = batch(rows=4, width=7, seed=1)
    want = expected(name, one, tokens, lengths)
    torch.testing.assert_close(METHODS[name](one, tokens, lengths), want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(METHODS[name](one, tokens, lengths, memory_budget=1), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", METHODS)
def test_small_budget_matches_default(name, model, inputs, references):
    torch.testing.assert_close(METHODS[name](model, *inputs, memory_budget=1), references[name], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        METHODS[name](model, *inputs, memory_budget=20_000), references[name], rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("name", METHODS)
def test_padding_invariance(name, model, inputs):
    """A row alone, at its own width, gives what it gives inside the padded batch; padding ids
    are never read."""
    tokens, lengths = inputs
    together = METHODS[name](model, tokens, lengths)
    scrambled = tokens.clone()
    scrambled[~token_mask(lengths, tokens.shape[1])] = 7  # any id in the padding
    torch.testing.assert_close(METHODS[name](model, scrambled, lengths), together, rtol=0, atol=0)
    for b in range(tokens.shape[0]):
        n = int(lengths[b])
        alone = METHODS[name](model, tokens[b : b + 1, :n], lengths[b : b + 1])
        torch.testing.assert_close(alone[0], together[b, : n - 1], rtol=1e-12, atol=1e-14)
        assert (together[b, n - 2 :] == 0).all()  # [SEP] and padding


@pytest.mark.parametrize("name", METHODS)
def test_a_row_without_real_tokens_scores_nothing(name, model):
    tokens = torch.tensor([[1, 2, 0, 0], [1, 9, 11, 2]])
    lengths = torch.tensor([2, 4])
    got = METHODS[name](model, tokens, lengths)
    assert (got[0] == 0).all()
    torch.testing.assert_close(got[1:], expected(name, model, tokens[1:], lengths[1:]), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", METHODS)
def test_float32(name, inputs, references):
    got = METHODS[name](tiny(dtype=torch.float32), *inputs)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), references[name], rtol=2e-4, atol=1e-6)


def test_shares_sum_to_one_over_every_position(model, inputs):
    """ALTI and Value Zeroing roll out row-stochastic matrices: with [CLS] and [SEP] (which the
    importance drops) the pooled row sums to 1; here the real tokens take part of it."""
    tokens, lengths = inputs
    for name in ("alti", "value_zeroing"):
        with torch.no_grad():
            row = LOOPS[name](model, tokens[0].tolist())
        assert abs(sum(row) - 1) < 1e-12
        got = METHODS[name](model, tokens, lengths)
        assert ((got >= 0) & (got <= 1)).all() and (got.sum(1) < 1).all()


def tiny_labels(labels: int, seed: int = 2) -> HFClassifier:
    """:func:`tiny` with ``labels`` outputs (1: one sigmoid logit, the protocol's binary head)."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
        num_labels=labels, max_position_embeddings=32,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return HFClassifier(model.to(F64)).eval()


@pytest.mark.parametrize(("labels", "seed", "rows_seed"), [(1, 4, 3), (3, 8, 4)])
def test_chefer_differentiates_the_predicted_class_logit(labels, seed, rows_seed):
    """Chefer et al.'s target is the predicted class's logit: with one sigmoid logit z that is z
    for class 1 and -z for class 0, with three classes the argmax (seeds chosen so that the rows'
    predictions differ: each row's own class is differentiated in the one backward)."""
    m = tiny_labels(labels, seed)
    tokens, lengths = batch(rows=8, width=8, seed=rows_seed)
    with torch.no_grad():
        logits, _ = m(tokens, lengths)
    predicted = set((logits[:, 0] > 0).long().tolist() if labels == 1 else logits.argmax(1).tolist())
    assert len(predicted) > 1  # more than one class predicted: each row's own target is used
    want = expected("chefer", m, tokens, lengths)
    torch.testing.assert_close(gradient_weighted_rollout(m, tokens, lengths), want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        gradient_weighted_rollout(m, tokens, lengths, memory_budget=1), want, rtol=1e-10, atol=1e-12
    )


def test_chefer_is_the_cls_row_of_the_identity_plus_clipped_products(model, inputs):
    """R starts at I and only adds non-negative terms: the [CLS] self-relevance (which the result
    drops, as the other methods drop the lead token) is at least 1, every other entry >= 0, and
    some real token gets relevance (the gradients are not all clipped away)."""
    tokens, lengths = inputs
    with torch.no_grad():
        row = LOOPS["chefer"](model, tokens[0].tolist())
    assert row[0] >= 1 and min(row) >= 0
    got = gradient_weighted_rollout(model, tokens, lengths)
    assert (got >= 0).all() and (got[0] > 0).any()
    torch.testing.assert_close(got[0, : len(row) - 2], torch.tensor(row[1:-1], dtype=F64), rtol=1e-10, atol=1e-12)


def test_decompx_contributions_sum_to_the_logits(model, inputs):
    """Completeness (DecompX eq. 14): every bias is assigned to the tokens by AbsDot and the
    activations are linearised by their own ratio at each token's pre-activation, so the
    contributions of every position ([CLS] and [SEP] included) sum to the model's logits exactly,
    in the batched function as in the loop; padding contributes nothing."""
    tokens, lengths = inputs
    y = decompx_contributions(model, tokens, lengths)
    assert y.shape == (6, 9, 2) and y.dtype == F64
    with torch.no_grad():
        logits, _ = model(tokens, lengths)
    torch.testing.assert_close(y.sum(1), logits, rtol=1e-8, atol=1e-8)
    assert (y[~token_mask(lengths, 9)] == 0).all()
    # the loop's contributions are the same numbers, and the importance is the predicted class's
    for b in (0, 1):
        n = int(lengths[b])
        with torch.no_grad():
            loop = torch.tensor(decompx_sentence_contributions(model, tokens[b, :n].tolist()), dtype=F64)
        torch.testing.assert_close(y[b, :n], loop, rtol=1e-10, atol=1e-12)
    chosen = logits.argmax(1)
    want = y.gather(2, chosen[:, None, None].expand(-1, 9, 1))[..., 0] * token_mask(lengths, 9, 1, 1)
    torch.testing.assert_close(decompx(model, tokens, lengths), want[:, 1:], rtol=1e-12, atol=1e-14)
    # signed: some tokens argue against the predicted class
    assert (want[:, 1:] < 0).any() and (want[:, 1:] > 0).any()


def test_decompx_contributions_sum_to_the_logits_in_float32(inputs):
    m = tiny(dtype=torch.float32)
    tokens, lengths = inputs
    with torch.no_grad():
        logits, _ = m(tokens, lengths)
    y = decompx_contributions(m, tokens, lengths, memory_budget=1)
    torch.testing.assert_close(y.sum(1), logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("labels", "seed", "rows_seed"), [(1, 4, 3), (3, 8, 4)])
def test_decompx_explains_the_predicted_class(labels, seed, rows_seed):
    """One sigmoid logit z: class 1's contributions are z's, class 0's those of -z; three classes:
    the argmax's. The contributions of each class sum to its logit."""
    m = tiny_labels(labels, seed)
    tokens, lengths = batch(rows=8, width=8, seed=rows_seed)
    with torch.no_grad():
        logits, _ = m(tokens, lengths)
    predicted = set((logits[:, 0] > 0).long().tolist() if labels == 1 else logits.argmax(1).tolist())
    assert len(predicted) > 1
    torch.testing.assert_close(decompx_contributions(m, tokens, lengths).sum(1), logits, rtol=1e-8, atol=1e-8)
    want = expected("decompx", m, tokens, lengths)
    torch.testing.assert_close(decompx(m, tokens, lengths), want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(decompx(m, tokens, lengths, memory_budget=1), want, rtol=1e-10, atol=1e-12)


def test_decompx_needs_the_classification_head(model, inputs):
    headless = tiny(layers=1)
    headless.hf.bert.pooler = None
    with pytest.raises(ValueError, match="decompx decomposes the classification head.*no pooler"):
        decompx(headless, *inputs)


def rollout_matrices(model, ids):
    """Attention flow's (and rollout's) per-layer capacities of one sentence, from the reference
    loop's attention: ``[L, n, n]`` float64, ``0.5 * mean_h A_h + 0.5 * I``, rows renormalised."""
    from attnmetrics.testing.reference import states_loop

    with torch.no_grad():
        states = states_loop(model, ids)
    a = torch.stack([torch.tensor(r["A"], dtype=F64).mean(0) for _, _, r in states])
    m = 0.5 * a + 0.5 * torch.eye(len(ids), dtype=F64)
    return m / m.sum(-1, keepdim=True)


@pytest.mark.parametrize("layers", [1, 2])
def test_attention_flow_with_one_or_two_layers_is_the_edge_or_the_disjoint_paths(layers):
    """L = 1: the one edge, ``Â_0[p, j]``; L = 2: the paths ``(0, j) -> (1, k) -> (2, p)`` share no
    edge, so the flow is ``sum_k min(Â_0[k, j], Â_1[p, k])``; both equal networkx's max flow."""
    m = tiny(layers=layers, seed=3)
    tokens, lengths = batch(rows=4, width=8, seed=5)
    got = attention_flow(m, tokens, lengths)
    for b in range(4):
        n = int(lengths[b])
        c = rollout_matrices(m, tokens[b, :n].tolist())
        if layers == 1:
            want = c[0, 0]
        else:
            want = torch.minimum(c[0], c[1, 0][:, None]).sum(0)
        torch.testing.assert_close(got[b, : n - 2], want[1 : n - 1], rtol=1e-12, atol=1e-14)
        with torch.no_grad():
            loop = torch.tensor(attention_flow_sentence_reference(m, tokens[b, :n].tolist()), dtype=F64)
        torch.testing.assert_close(loop, want, rtol=1e-12, atol=1e-14)


def test_attention_flow_is_bounded_by_the_cuts_at_either_end(model, inputs):
    """Every flow is >= 0, at most the pooled node's in-capacity (one row of the last matrix: 1)
    and at most the source's out-capacity (its column of the first matrix); it is not rollout."""
    tokens, lengths = inputs
    got = attention_flow(model, tokens, lengths)
    assert (got >= 0).all()
    for b in range(tokens.shape[0]):
        n = int(lengths[b])
        c = rollout_matrices(model, tokens[b, :n].tolist())
        flows = got[b, : n - 2]
        assert (flows <= c[-1, 0].sum() + 1e-12).all()
        assert (flows <= c[0].sum(0)[1 : n - 1] + 1e-12).all()
    # some flows are strictly inside both bounds (not merely a cut at one end)
    rolled = model.rollout(tokens, lengths)
    assert not torch.allclose(got, rolled)


@pytest.mark.parametrize("kind", ["stochastic", "ties", "tiny"])
def test_max_flows_equal_networkx_on_hard_graphs(kind):
    """The integer max flow (capacities floored to multiples of 2^-30) then the exact capacity of
    its minimum cut: equal to networkx's float max flow on row-stochastic graphs, on capacities in
    eighths (many tied cuts); with capacities far below 2^-30 (floored to 0) the rounded graph's
    cut may take some of them in, and the result is then above the max flow by at most their sum:
    never below it, never past the documented bound (``attention_flow``'s precision note)."""
    import numpy as np

    rng = np.random.default_rng({"stochastic": 0, "ties": 1, "tiny": 2}[kind])
    for layers, n in [(3, 5), (4, 7), (6, 4)]:
        m = rng.random((layers, n, n)) ** 3
        if kind == "ties":
            m = (np.floor(m * 8) + np.eye(n)) / 8  # no row all 0
        elif kind == "tiny":
            m = np.where(rng.random((layers, n, n)) < 0.5, m * 1e-12, m)
        m = m / m.sum(-1, keepdims=True)
        sources = np.arange(n)
        got = _max_flows(m, 1, sources)
        want = np.array(networkx_max_flows(m, 1, sources))
        # never below the max flow, and within the documented bound |C| 2^-30 above it
        bound = ((layers - 2) * n * n + 2 * n) / FLOW_SCALE
        assert (got >= want - 1e-15).all() and (got < want + bound).all()
        if kind != "tiny":  # the rounded graph's minimum cut is a minimum cut: exact
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
        else:  # off by at most the sub-2^-30 capacities the rounded cut took in (here 4e-12)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


#: the two methods that read the logits name them first (the chunks' logits checks)
READS_LOGITS = ("chefer", "decompx")


@pytest.mark.parametrize("corruption", ["NaN weight", "1e30 embedding"])
@pytest.mark.parametrize("name", METHODS)
def test_states_that_are_not_finite_are_named(name, corruption, inputs):
    """A NaN query weight (every state from layer 1 on is NaN) or one word's float32 embedding at
    1e30 (its LayerNorm's variance overflows: NaN from the embeddings on): no method returns
    scores, each names the row (or the logits) that is not finite. Value Zeroing returned clean
    shares here (a NaN distance counted as 1: 1/9 each for the 1e30 row)."""
    m = tiny(dtype=torch.float32)
    with torch.no_grad():
        if corruption == "NaN weight":
            m.hf.bert.encoder.layer[1].attention.self.query.weight[0, 0] = float("nan")
        else:
            m.hf.bert.embeddings.word_embeddings.weight[inputs[0][0, 1]] = 1e30
    match = (
        "model returned NaN or infinite logits on the input rows"
        if name in READS_LOGITS
        else f"^{FUNCTION.get(name, name)} is not finite in row 0: the model's states hold NaN or inf"
    )
    with pytest.raises(ValueError, match=match):
        METHODS[name](m, *inputs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", METHODS)
def test_cuda_equals_cpu(name, model, inputs, references):
    cuda = tiny().cuda()
    got = METHODS[name](cuda, inputs[0].cuda(), inputs[1].cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), references[name], rtol=1e-9, atol=1e-11)


# ---- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", METHODS)
def test_a_model_without_transformer_layers_is_refused(name, inputs):
    from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig

    lstm = EncoderAttentionClassifier(ModelConfig(60, embed_dim=8, hidden_size=6))
    with pytest.raises(TypeError, match=f"{FUNCTION.get(name, name)}.*EncoderAttentionClassifier"):
        METHODS[name](lstm, *inputs)
    assert not supports(lstm)


@pytest.mark.parametrize("name", [name for name in METHODS if name != "attention_flow"])  # flow: rollout's models
def test_gpt2_is_refused_with_the_reason(name):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=60, n_embd=16, n_layer=1, n_head=2, n_positions=32, pad_token_id=0)
    gpt2 = HFClassifier(transformers.GPT2ForSequenceClassification(config).eval())
    tokens, lengths = torch.tensor([[5, 6, 7]]), torch.tensor([3])
    with pytest.raises(ValueError, match="BERT-like.*GPT2ForSequenceClassification.*pre-LayerNorm"):
        METHODS[name](gpt2, tokens, lengths)
    assert not supports(gpt2)


def test_supports_the_bert_adapter(model):
    assert supports(model)


@pytest.mark.parametrize("name", METHODS)
def test_bad_inputs_are_named(name, model, inputs):
    tokens, lengths = inputs
    f = METHODS[name]
    with pytest.raises(ValueError, match=r"tokens must be int64 token ids, got torch.float32"):
        f(model, tokens.float(), lengths)
    with pytest.raises(ValueError, match=r"lengths must lie in \[lead \+ trail, T\] = \[2, 9\].*got min 1"):
        f(model, tokens, torch.where(torch.arange(6) == 0, 1, lengths))
    with pytest.raises(ValueError, match=r"lengths must have shape \[B\] = \[6\], got \[5\]"):
        f(model, tokens, lengths[:5])
    with pytest.raises(ValueError, match=r"memory_budget must be a positive int \(bytes\), got 0"):
        f(model, tokens, lengths, memory_budget=0)
    with pytest.raises(TypeError, match="lengths must be a torch.Tensor, got list"):
        f(model, tokens, lengths.tolist())
    vocab = model.hf.bert.get_input_embeddings().num_embeddings
    past = tokens.clone()
    past[2, 1] = vocab + 7  # an id past the vocabulary: was an IndexError from the embedding lookup
    with pytest.raises(ValueError, match=rf"tokens must be ids in \[0, vocab_size\) = \[0, {vocab}\).*max {vocab + 7}"):
        f(model, past, lengths)


def test_an_attention_without_probabilities_is_named(inputs):
    sdpa = tiny(layers=1)
    sdpa.hf.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match=r"attention probabilities.*\(sdpa\) returns none"):
        alti(sdpa, *inputs)


def test_the_model_is_left_as_it_was(inputs):
    """Eval mode during the call, its training flag restored; no hook left on the attention."""
    m = tiny(layers=1)
    m.train()
    attention = m.hf.bert.encoder.layer[0].attention.self
    before = METHODS["alti"](m, *inputs)
    assert m.training
    # transformers installs a hook of its own on the first forward; none of ours stays
    assert not [h for h in attention._forward_hooks.values() if h.__module__.startswith("attnmetrics")]
    torch.testing.assert_close(METHODS["alti"](m.eval(), *inputs), before, rtol=0, atol=0)  # no dropout used


def test_chefer_leaves_no_gradients_and_needs_none_enabled(inputs, references):
    """Gradients are taken inside the call: under no_grad, with every parameter frozen, it gives
    the same numbers and leaves no ``.grad`` and no ``requires_grad`` changed."""
    m = tiny()
    for p in m.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        got = gradient_weighted_rollout(m, *inputs)
    torch.testing.assert_close(got, references["chefer"], rtol=1e-10, atol=1e-12)
    assert not got.requires_grad
    assert all(p.grad is None and not p.requires_grad for p in m.parameters())
    m = tiny()
    gradient_weighted_rollout(m, *inputs)
    assert all(p.grad is None and p.requires_grad for p in m.parameters())


# ---- the battery ------------------------------------------------------------------------------

BATTERY = {
    "value_norm": "value_norm",
    "globenc": "globenc",
    "alti": "alti",
    "value_zeroing": "value_zeroing",
    "chefer": "chefer",
    "decompx": "decompx",
    "attention_flow": "attention_flow",
}


def test_battery_runs_each_when_asked_and_only_then(model, inputs, references):
    from attnmetrics.app.battery import collect, registry
    from attnmetrics.app.parser import build_parser

    tokens, lengths = inputs
    chosen = dict(experiments=["flip", "kendall", "eraser"], orders=["attention"], progress=False)
    options = {name: True for name in BATTERY}
    values, seconds = collect(model, [(0, tokens, lengths)], options=options, **chosen)
    for name in BATTERY:
        assert values[f"kendall/attention vs {name}/tau"].shape == (6,)
        assert values[f"flip/{name}/removed"].shape[0] == 6
        assert values[f"eraser/{name}/comprehensiveness/aopc"].shape == (6,)
        assert name in seconds
    # per-head τ only for the last layer's value norm, not the rolled-out ones
    importances = {i.name: i for i in registry.importances()}
    assert importances["value_norm"].head_partner
    rolled = ("globenc", "alti", "value_zeroing", "chefer", "decompx", "attention_flow")
    assert not any(importances[n].head_partner for n in rolled)
    # what the battery computes is the library's function
    s = registry.Settings(options=options)
    for name in BATTERY:
        torch.testing.assert_close(importances[name].compute(model, tokens, lengths, s), references[name])
    # off by default: neither computed nor flagged
    off, _ = collect(model, [(0, tokens, lengths)], **chosen)
    assert not any(name in key for key in off for name in BATTERY)
    args = build_parser().parse_args(["run", "--dataset", "sst"])
    assert not any(getattr(args, name) for name in BATTERY)
    args = build_parser().parse_args(
        [
            "run", "--dataset", "sst", "--alti", "--globenc", "--value-zeroing", "--value-norm", "--chefer",
            "--decompx", "--attention-flow",
        ]
    )  # fmt: skip
    assert all(getattr(args, name) for name in BATTERY)


def test_battery_skips_them_where_they_do_not_apply():
    from attnmetrics.app.battery import registry
    from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig

    lstm = EncoderAttentionClassifier(ModelConfig(60, embed_dim=8, hidden_size=6))
    s = registry.Settings(options={name: True for name in BATTERY})
    assert not set(BATTERY) & {i.name for i in registry.chosen(lstm, s)}
    assert set(BATTERY) <= {i.name for i in registry.chosen(tiny(layers=1), s)}


# ---- attention flow on every model attention rollout supports -------------------------------------


def tiny_gpt(layers: int = 3, seed: int = 0, dtype=F64, attention: str = "tanh", num_classes: int = 2):
    """Our GPT classifier (post-LayerNorm causal blocks, pooled at ``<extract>``), every parameter
    drawn from N(0, 0.5^2) so that the attention is far from uniform; ``attention="extract"``:
    GPT-1's read-out of the ``<extract>`` state (the one the decompositions apply to)."""
    from attnmetrics.models.gpt import GPTConfig
    from attnmetrics.models.gpt_classifier import GPTClassifier

    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=50, n_layer=layers, d_model=16, n_head=2, context=16, dropout=0.1)
    model = GPTClassifier(config, num_classes=num_classes, attention=attention)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model.to(dtype).eval()


def tiny_gpt2(layers: int = 3, seed: int = 0, dtype=F64) -> HFClassifier:
    """A GPT-2 Hugging Face classifier (pre-LayerNorm causal blocks, pooled at the last real
    token, no special tokens), parameters drawn as :func:`tiny`'s."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=50, n_embd=16, n_layer=layers, n_head=2, n_positions=32, num_labels=2, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    model = transformers.GPT2ForSequenceClassification(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return HFClassifier(model.to(dtype)).eval()


CAUSAL = {"gpt": tiny_gpt, "gpt2": tiny_gpt2}


def causal_batch(family: str, rows: int = 6, width: int = 9, seed: int = 0):
    """Right-padded rows: ours ``<start> ... <extract>`` (one real token in row 1: length 3), GPT-2's
    ids alone (one token in row 1: length 1); the first full width, the rest ragged."""
    from attnmetrics.models.gpt_classifier import EXTRACT, START

    tokens, lengths = batch(rows, width, seed)
    if family == "gpt":
        tokens[:, 0] = START
        tokens[torch.arange(rows), lengths - 1] = EXTRACT
    else:
        lengths = lengths - 2
        lengths[0] = width
        tokens = torch.where(token_mask(lengths, width), tokens.roll(-1, 1).clamp_min(5), 0)
    return tokens, lengths


@pytest.mark.parametrize("family", CAUSAL)
def test_attention_flow_of_a_causal_model_equals_networkx(family):
    """Our GPT classifier and a GPT-2 classifier, 3 layers (the min-cut path), ragged rows and a
    one-token row: the networkx loop over each sentence alone, unpadded, pooled at its last token."""
    m = CAUSAL[family]()
    tokens, lengths = causal_batch(family)
    got = attention_flow(m, tokens, lengths)
    want = attention_flow_reference(m, tokens, lengths)
    assert got.dtype == F64 and got.shape == (6, 9 - m.lead)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    real = token_mask(lengths - m.lead - m.trail, 9 - m.lead)
    assert (got[~real] == 0).all() and (got[real] > 0).all()
    assert float(want[0].std()) > 1e-3 * float(want[0].abs().max())  # something to tell apart
    if family == "gpt2":  # one position: every capacity is 1, so is its flow
        assert int(lengths[1]) == 1 and float(got[1, 0]) == 1.0
    # chunked one row at a time: the same flows
    torch.testing.assert_close(attention_flow(m, tokens, lengths, memory_budget=1), got, rtol=1e-12, atol=1e-14)
    assert not torch.allclose(got, m.rollout(tokens, lengths))


@pytest.mark.parametrize("family", ["bert", *CAUSAL])
@pytest.mark.parametrize("layers", [1, 2])
def test_attention_flow_closed_forms_on_every_model(family, layers):
    """The per-layer matrices are rollout's (``layer_matrices`` of the model's ``layer_attentions``),
    a causal model's zero above the diagonal; one layer: the flow is the pooled row of the matrix,
    which is also rollout's importance; two: ``sum_k min(Â_0[k, j], Â_1[p, k])``."""
    from attnmetrics.rollout import layer_matrices

    m = (lambda layers, seed: tiny(layers, seed)) if family == "bert" else CAUSAL[family]
    m = m(layers, seed=3)
    tokens, lengths = causal_batch(family, rows=4, width=8, seed=5) if family != "bert" else batch(4, 8, 5)
    got = attention_flow(m, tokens, lengths)
    if layers == 1:
        torch.testing.assert_close(got, m.rollout(tokens, lengths), rtol=1e-12, atol=1e-14)
    pooled = m.pooled(lengths)
    for b in range(4):
        n = int(lengths[b])
        with torch.no_grad():
            c = layer_matrices(m.layer_attentions(tokens[b : b + 1, :n], lengths[b : b + 1]))[0]
        if family != "bert":
            assert (torch.triu(c, 1) == 0).all() and int(pooled[b]) == n - 1
        p = int(pooled[b])
        want = c[0, p] if layers == 1 else torch.minimum(c[0], c[1, p][:, None]).sum(0)
        torch.testing.assert_close(got[b, : n - m.lead - m.trail], want[m.lead : n - m.trail], rtol=1e-12, atol=1e-14)


def test_max_flows_equal_networkx_on_causal_graphs():
    """Lower-triangular row-stochastic graphs (a decoder's), pooled at the last position: the
    integer max flow's minimum cut in exact capacities equals networkx's float max flow."""
    import numpy as np

    rng = np.random.default_rng(4)
    for layers, n in [(3, 5), (4, 7), (6, 4)]:
        m = np.tril(rng.random((layers, n, n)) ** 3) + 0.5 * np.eye(n)
        m = m / m.sum(-1, keepdims=True)
        sources = np.arange(n)
        np.testing.assert_allclose(
            _max_flows(m, n - 1, sources), networkx_max_flows(m, n - 1, sources), rtol=1e-12, atol=1e-15
        )


def test_attention_flow_refuses_a_model_without_attention_layers_with_the_reason(inputs):
    from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig

    lstm = EncoderAttentionClassifier(ModelConfig(60, embed_dim=8, hidden_size=6))
    with pytest.raises(
        TypeError,
        match=r"attention_flow needs a transformer's attention layers .*got EncoderAttentionClassifier: it has no "
        "attention layers to roll out",
    ):
        attention_flow(lstm, *inputs)


def test_an_attention_without_probabilities_is_named_for_gpt2():
    sdpa = tiny_gpt2(layers=1)
    sdpa.hf.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match=r"attention probabilities.*\(sdpa\) returns none"):
        attention_flow(sdpa, *causal_batch("gpt2"))


@pytest.mark.parametrize("family", CAUSAL)
def test_battery_runs_attention_flow_wherever_rollout_applies(family):
    from attnmetrics.app.battery import registry

    m = CAUSAL[family](layers=2)
    tokens, lengths = causal_batch(family)
    s = registry.Settings(options={name: True for name in BATTERY})
    chosen = {i.name: i for i in registry.chosen(m, s)}
    assert "rollout" in chosen and "attention_flow" in chosen
    # the decompositions: BERT-like and our GPT with its extract read-out only (this one's is tanh)
    assert not (set(BATTERY) - {"attention_flow"}) & set(chosen)
    torch.testing.assert_close(
        chosen["attention_flow"].compute(m, tokens, lengths, s), attention_flow_reference(m, tokens, lengths)
    )


# ---- the decompositions on our GPT classifier (extract read-out) ----------------------------------

#: the decompositions (every method but attention flow, which runs wherever rollout does)
DECOMPOSITIONS = [name for name in METHODS if name != "attention_flow"]


def tiny_extract(layers: int = 3, seed: int = 0, dtype=F64, num_classes: int = 2):
    return tiny_gpt(layers, seed, dtype, attention="extract", num_classes=num_classes)


@pytest.fixture(scope="module")
def gpt_model():
    return tiny_extract()


@pytest.fixture(scope="module")
def gpt_inputs():
    return causal_batch("gpt")


@pytest.fixture(scope="module")
def gpt_references(gpt_model, gpt_inputs):
    return {name: expected(name, gpt_model, *gpt_inputs) for name in METHODS}


def test_supports_our_gpt_with_its_extract_read_out_only(gpt_model):
    assert supports(gpt_model)
    assert not supports(tiny_gpt(layers=1))  # the tanh attention head over the real tokens


@pytest.mark.parametrize("name", METHODS)
def test_gpt_equals_the_plain_loop_in_float64(name, gpt_model, gpt_inputs, gpt_references):
    """Ragged rows (row 1: one real token), every chunking: the plain causal loops, each
    sentence alone, pooled at its <extract>."""
    tokens, lengths = gpt_inputs
    want = gpt_references[name]
    got = METHODS[name](gpt_model, tokens, lengths)
    assert got.dtype == F64 and got.shape == (6, 8)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert float(want[0].std()) > 1e-3 * float(want[0].abs().max())  # something to tell apart
    assert int(lengths[1]) == 3 and float(got[1, 0]) != 0 and (got[1, 1:] == 0).all()
    for budget in (1, 20_000):
        torch.testing.assert_close(
            METHODS[name](gpt_model, tokens, lengths, memory_budget=budget), want, rtol=1e-10, atol=1e-12
        )


@pytest.mark.parametrize("name", DECOMPOSITIONS)
def test_gpt_one_layer_and_padding_invariance(name):
    """One layer at a budget of one byte; each row alone at its own width gives what it gives in
    the padded batch, whatever the padding's ids."""
    one = tiny_extract(layers=1, seed=1)
    tokens, lengths = causal_batch("gpt", rows=4, width=7, seed=1)
    want = expected(name, one, tokens, lengths)
    torch.testing.assert_close(METHODS[name](one, tokens, lengths, memory_budget=1), want, rtol=1e-10, atol=1e-12)
    scrambled = tokens.clone()
    scrambled[~token_mask(lengths, tokens.shape[1])] = 7
    together = METHODS[name](one, scrambled, lengths)
    torch.testing.assert_close(together, want, rtol=1e-10, atol=1e-12)
    for b in range(tokens.shape[0]):
        n = int(lengths[b])
        alone = METHODS[name](one, tokens[b : b + 1, :n], lengths[b : b + 1])
        torch.testing.assert_close(alone[0], together[b, : n - 1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", DECOMPOSITIONS)
def test_gpt_float32(name, gpt_inputs, gpt_references):
    got = METHODS[name](tiny_extract(dtype=torch.float32), *gpt_inputs)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), gpt_references[name], rtol=2e-4, atol=1e-6)


#: every method on BERT and ours; attention flow (rollout's models) on GPT-2 too
HALF_CASES = [(family, name) for family in ("bert", "gpt") for name in METHODS] + [("gpt2", "attention_flow")]


def half_model(family: str, dtype: torch.dtype):
    """The family's small random model in ``dtype`` and its rows."""
    if family == "bert":
        return tiny(dtype=dtype), batch()
    return (tiny_extract if family == "gpt" else tiny_gpt2)(dtype=dtype), causal_batch(family)


def assert_left_as_it_was(model, params: list, before: list):
    """The same parameter objects, in their half dtype, holding the same bits."""
    assert all(p is q for p, q in zip(params, model.parameters(), strict=True))
    assert all(p.dtype == b.dtype and torch.equal(p, b) for p, b in zip(params, before))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("family", "name"), HALF_CASES)
def test_half_precision_is_computed_in_float32(family, name, dtype):
    """A float16 or bfloat16 model gives, in float32, what the same weights converted to float32
    give (computed in the half dtype: ~1e-3 off on these models, 95 % for ALTI on a width-256 BERT in
    bfloat16; Chefer and DecompX refused its half logits), and is left as it was."""
    half, (tokens, lengths) = half_model(family, dtype)
    want = METHODS[name](half_model(family, dtype)[0].float(), tokens, lengths)
    params = list(half.parameters())
    before = [p.detach().clone() for p in params]
    got = METHODS[name](half, tokens, lengths)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))
    assert float(want[0].std()) > 1e-3 * float(want[0].abs().max())  # something to tell apart
    assert_left_as_it_was(half, params, before)


def test_a_half_precision_model_is_left_as_it_was_after_an_error():
    """The float32 copies are dropped when a call raises too (here DecompX on the NaN logits of a
    bfloat16 embedding row at 1e30, whose square overflows float32 as well)."""
    half, (tokens, lengths) = half_model("bert", torch.bfloat16)
    with torch.no_grad():
        half.hf.bert.embeddings.word_embeddings.weight[tokens[0, 1]] = 1e30
    params = list(half.parameters())
    before = [p.detach().clone() for p in params]
    with pytest.raises(ValueError, match="model returned NaN or infinite logits"):
        decompx(half, tokens, lengths)
    assert_left_as_it_was(half, params, before)


def test_gpt_loop_is_causal_and_checked_against_the_model(gpt_model, gpt_inputs):
    """The reference's own forward equals our GPT's only with its causal attention: the same loop
    with every key visible misses the model's states, so the loops' self-checks would catch a
    decomposition of the wrong attention."""
    from attnmetrics.testing.reference import _embeddings, _loop_layers, layer_loop

    tokens, lengths = gpt_inputs
    ids = tokens[0, : int(lengths[0])].tolist()
    with torch.no_grad():
        own = gpt_model.gpt(torch.tensor([ids])).hidden[0]
        for causal in (True, False):
            x = _embeddings(gpt_model, ids)
            for layer in _loop_layers(gpt_model):
                layer["causal"] = causal
                r = layer_loop(layer, x)
                if causal:  # no query attends to a later key
                    assert all(
                        r["A"][h][i][j] == 0 for h in range(2) for i in range(len(ids)) for j in range(i + 1, len(ids))
                    )
                x = r["out"]
            assert torch.allclose(torch.stack(x), own, rtol=1e-9, atol=1e-9) == causal


def test_gpt_shares_sum_to_one_and_later_tokens_take_none(gpt_model, gpt_inputs):
    """On a causal model a token gets nothing from later ones: ALTI's per-layer matrices are
    lower-triangular (``T_i(x_j) = 0`` for j > i), and zeroing a later token's values leaves an
    earlier query's output exactly as it was. Value Zeroing's matrices are row-stochastic, so its
    pooled (last) row sums to 1 over every position; ALTI's rows sum to 1 but for a row of zeros,
    which its first position (one contributor, itself) gets where the biases outweigh it
    (``||y_0||_1 <= ||LN'(b_O) + beta||_1``): that loses only <start>'s own share (nothing else
    flows through position 0), so with that row set to its one token the row sums to 1 and every
    other position's share is unchanged."""
    from attnmetrics.testing.reference import (
        _embeddings,
        _loop_layers,
        _rollout_loop,
        alti_sentence_matrices,
        layer_loop,
    )

    tokens, lengths = gpt_inputs
    ids = tokens[0].tolist()
    n = len(ids)
    with torch.no_grad():
        row = LOOPS["value_zeroing"](gpt_model, ids)
        matrices = alti_sentence_matrices(gpt_model, ids)
        layer, x = _loop_layers(gpt_model)[0], _embeddings(gpt_model, ids)
        plain, zeroed = layer_loop(layer, x)["out"], layer_loop(layer, x, zeroed=4)["out"]
    assert abs(sum(row) - 1) < 1e-12
    assert all(torch.equal(plain[i], zeroed[i]) for i in range(4)) and not torch.equal(plain[4], zeroed[4])
    for c in matrices:
        assert all(c[i][j] == 0 for i in range(n) for j in range(i + 1, n))
        assert all(abs(sum(c[i]) - 1) < 1e-12 or (i == 0 and sum(c[i]) == 0) for i in range(n))
    assert any(sum(c[0]) == 0 for c in matrices[:-1])  # this model has such a row: the convention is tested
    alti_row = _rollout_loop(matrices, n - 1)
    repaired = _rollout_loop([[[1.0] + [0.0] * (n - 1), *c[1:]] for c in matrices], n - 1)
    assert sum(alti_row) < 1 and abs(sum(repaired) - 1) < 1e-12
    assert all(abs(a - b) < 1e-14 for a, b in zip(alti_row[1:], repaired[1:]))
    for name in ("alti", "value_zeroing"):
        got = METHODS[name](gpt_model, tokens, lengths)
        assert ((got >= 0) & (got <= 1)).all() and (got.sum(1) < 1).all()


def test_gpt_decompx_contributions_sum_to_the_logits(gpt_model, gpt_inputs):
    """DecompX's completeness on our GPT: no pooler, the decoder on <extract>'s state; every
    position's contributions (padding 0) sum to the model's logits, in the batch as in the loop."""
    tokens, lengths = gpt_inputs
    y = decompx_contributions(gpt_model, tokens, lengths, memory_budget=1)
    with torch.no_grad():
        logits, _ = gpt_model(tokens, lengths)
    torch.testing.assert_close(y.sum(1), logits, rtol=1e-8, atol=1e-8)
    assert (y[~token_mask(lengths, 9)] == 0).all()
    n = int(lengths[0])
    with torch.no_grad():
        loop = torch.tensor(decompx_sentence_contributions(gpt_model, tokens[0, :n].tolist()), dtype=F64)
    torch.testing.assert_close(y[0, :n], loop, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("labels", "seed"), [(1, 13), (3, 15)])
def test_gpt_chefer_and_decompx_explain_the_predicted_class(labels, seed):
    m = tiny_extract(layers=2, seed=seed, num_classes=labels)
    tokens, lengths = causal_batch("gpt", rows=8, width=8, seed=3)
    with torch.no_grad():
        logits, _ = m(tokens, lengths)
    predicted = set((logits[:, 0] > 0).long().tolist() if labels == 1 else logits.argmax(1).tolist())
    assert len(predicted) > 1
    for name in ("chefer", "decompx"):
        torch.testing.assert_close(
            METHODS[name](m, tokens, lengths), expected(name, m, tokens, lengths), rtol=1e-10, atol=1e-12
        )


def test_gpt_chefer_is_the_extract_row_of_the_identity_plus_clipped_products(gpt_model, gpt_inputs):
    tokens, lengths = gpt_inputs
    with torch.no_grad():
        row = LOOPS["chefer"](gpt_model, tokens[0].tolist())
    assert row[-1] >= 1 and min(row) >= 0  # <extract>'s own relevance, from the identity
    got = gradient_weighted_rollout(gpt_model, tokens, lengths)
    assert (got >= 0).all() and (got[0] > 0).any()


@pytest.mark.parametrize("name", DECOMPOSITIONS)
def test_gpt_with_an_attention_head_is_refused_with_the_reason(name, gpt_inputs):
    """The tanh head's decoder reads an attention-weighted sum of the real tokens' states, not
    <extract>'s, which the decompositions explain."""
    with pytest.raises(ValueError, match=f"{FUNCTION.get(name, name)}.*'tanh' attention head.*--attention extract"):
        METHODS[name](tiny_gpt(layers=1), *gpt_inputs)


def test_battery_runs_them_on_our_gpt_with_its_extract_read_out(gpt_model, gpt_inputs, gpt_references):
    from attnmetrics.app.battery import collect, registry

    tokens, lengths = gpt_inputs
    s = registry.Settings(options={name: True for name in BATTERY})
    chosen = {i.name: i for i in registry.chosen(gpt_model, s)}
    assert set(BATTERY) <= set(chosen)
    for name in BATTERY:
        torch.testing.assert_close(chosen[name].compute(gpt_model, tokens, lengths, s), gpt_references[name])
    chosen_run = dict(experiments=["flip", "kendall", "eraser"], orders=["attention"], progress=False)
    values, _ = collect(gpt_model, [(0, tokens, lengths)], options={name: True for name in BATTERY}, **chosen_run)
    for name in BATTERY:
        assert values[f"kendall/attention vs {name}/tau"].shape == (6,)
        assert values[f"eraser/{name}/comprehensiveness/aopc"].shape == (6,)


def test_gpt_chefer_leaves_no_gradients_and_needs_none_enabled(gpt_inputs, gpt_references):
    m = tiny_extract()
    for p in m.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        got = gradient_weighted_rollout(m, *gpt_inputs)
    torch.testing.assert_close(got, gpt_references["chefer"], rtol=1e-10, atol=1e-12)
    assert not got.requires_grad and all(p.grad is None and not p.requires_grad for p in m.parameters())
    m = tiny_extract()
    gradient_weighted_rollout(m, *gpt_inputs)
    assert all(p.grad is None and p.requires_grad for p in m.parameters())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", METHODS)
def test_gpt_cuda_equals_cpu(name, gpt_inputs, gpt_references):
    cuda = tiny_extract().cuda()
    got = METHODS[name](cuda, gpt_inputs[0].cuda(), gpt_inputs[1].cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), gpt_references[name], rtol=1e-9, atol=1e-11)
