"""Side by side with the peers (issue 32, item 3): ferret's leave-one-out and comprehensiveness /
sufficiency, and Captum's integrated gradients, against ours on the same Hugging Face model, the same
sentences and the same scores, the values checked equal first, then the times.

Run (one thread; the ferret case needs ferret's own virtual environment, below):

    ATTNMETRICS_FERRET_PYTHON=.venv-ferret/bin/python OMP_NUM_THREADS=1 \\
        python -m pytest benchmarks/test_bench_peers.py --benchmark-only -q

ferret-xai 0.4.2 pins transformers < 5, captum < 0.8 and numpy < 2, so it cannot share our
environment; it runs in a virtual environment of its own, which one command creates (from the
checkout's root; pyarrow < 21 because ferret's ``datasets`` import reaches pyarrow, whose newer
releases refuse numpy 1):

    python -m venv .venv-ferret && .venv-ferret/bin/pip install torch==2.13.0 ferret-xai==0.4.2 \\
        "transformers<5" "numpy<2" "pyarrow<21"

``ATTNMETRICS_FERRET_PYTHON`` names that environment's python; unset, or pointing at a python
without ferret, the ferret case skips with the reason. The benchmark saves the model and its
tokenizer to a temporary folder and runs ``benchmarks/peers/ferret_worker.py`` with that python
as a subprocess; the worker calls ferret's evaluators one sentence at a time, as a ferret user does,
and returns values and times as JSON.

Model: a random ``BertForSequenceClassification`` (4 layers, d = 256, 4 heads, FFN 1,024, two
classes, float32; 2 layers, d = 32 in CI's ``--benchmark-disable`` smoke run) with a WordPiece
tokenizer over a small English vocabulary (whole words, some plural ``##s`` pieces, punctuation),
offline; both sides load it from the same folder. Inputs: 64 SST-like sentences of 10–55 words
(``make_sentences``), one random normal score per real token (some negative: ferret's rationales
keep positive scores only).

- **leave-one-out**: ferret's ``TauLOO_Evaluation.compute_leave_one_out_occlusion`` (each real token
  deleted; p(ŷ) after minus before) against ``leave_one_out(mode="delete")`` (the TVD, which for two
  classes is |Δp(ŷ)|);
- **comprehensiveness + sufficiency**: ferret's ``AOPC_Comprehensiveness_Evaluation`` and
  ``AOPC_Sufficiency_Evaluation`` (defaults: 10 %, ..., 100 %, positive scores only, deletion)
  against ours with ``variant="ferret"`` and :data:`attnmetrics.eraser.FERRET_FRACTIONS`, per row's AOPC.

ferret decodes each perturbed id list to text and tokenises the text again; the values are compared
on the rows where every such round trip gives back the same ids (the worker records them), and
``extra_info`` says how many rows did not. ferret's time excludes its imports, model loading and the
one batched forward that finds each sentence's predicted class (reported apart, ``ferret_target_s``);
ours includes finding the classes.

- **integrated gradients**: ``attnmetrics.importance.integrated_gradients`` against Captum's
  ``IntegratedGradients`` as a user calls it on the same model (loaded from the folder by
  transformers, its default attention): the input embeddings, baseline zero on every real token
  (``[CLS]``, ``[SEP]`` and padding kept), the predicted class's probability, the same steps and
  Captum's default Gauss–Legendre rule; a token's score ``|sum_e|``, L1-normalised over the real
  tokens. Two users: one ``attribute`` over the padded batch with ``internal_batch_size`` =
  :data:`IG_INTERNAL_BATCH` (stock), and one call per length (rows cut to their length, about that
  many rows a forward). Skipped without Captum.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.measure import encoder_macs, floor_info, median_seconds, rounds_beside_rate, timed

transformers = pytest.importorskip("transformers", reason="transformers is optional")

from attnmetrics import comprehensiveness, leave_one_out, sufficiency  # noqa: E402
from attnmetrics.eraser import FERRET_FRACTIONS  # noqa: E402
from attnmetrics.models.hf import HFClassifier  # noqa: E402

WORKER = Path(__file__).parent / "peers" / "ferret_worker.py"
FERRET_PYTHON = "ATTNMETRICS_FERRET_PYTHON"
#: integration points of the integrated-gradients case (both sides)
IG_STEPS = 20
#: the Captum user's ``internal_batch_size``: rows (row x step) a forward holds
IG_INTERNAL_BATCH = 64

_WORDS = (
    "the a and of to is in it that this with as for its but film movie story cast plot director "
    "script scene scenes character characters performance actor actress audience moment ending "
    "comedy drama thriller music camera good great moving funny fine warm bad dull awful flat weak "
    "cold very too so not never often quite rather best worst most least more less new old long "
    "short little big real true smart silly clever tired fresh familiar strange"
).split()
#: nouns that also come plural (WordPiece: the noun, then ``##s``)
_PLURALS = ("film", "movie", "story", "plot", "director", "actor", "moment", "ending", "camera")


def make_sentences(rows: int, low: int, high: int, seed: int = 0) -> list[str]:
    """SST-like sentences of ``low``–``high`` words: random words of :data:`_WORDS`, some nouns
    plural, a comma now and then, a full stop at the end."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        words = []
        for _ in range(rng.randint(low, high) - 1):
            w = rng.choice(_WORDS)
            if w in _PLURALS and rng.random() < 0.5:
                w += "s"
            words.append(w)
            if rng.random() < 0.06:
                words.append(",")
        out.append(" ".join(words) + " .")
    return out


def save_model(folder: Path, small: bool) -> Path:
    """A random BERT classifier and its WordPiece tokenizer, saved in ``folder`` (offline)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", ".", "##s", *_WORDS]
    tokenizer = transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    tokenizer.save_pretrained(folder)
    shape = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    if small:
        shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    config = transformers.BertConfig(vocab_size=len(vocab), num_labels=2, max_position_embeddings=128, **shape)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def load(folder: Path):
    """(the tokenizer, our adapter over the model, the bare transformers model a user loads)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ours = HFClassifier(transformers.BertForSequenceClassification.from_pretrained(folder)).eval()
    user = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    return tokenizer, ours, user


def batch(id_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[B, T]`` int64 tokens (pad 0) and ``[B]`` lengths."""
    lengths = torch.tensor([len(ids) for ids in id_lists])
    tokens = torch.zeros(len(id_lists), int(lengths.max()), dtype=torch.int64)
    for i, ids in enumerate(id_lists):
        tokens[i, : len(ids)] = torch.tensor(ids)
    return tokens, lengths


@pytest.fixture(scope="module")
def setup(tmp_path_factory, request):
    """(folder, sentences, tokenizer, our model, the user's model, tokens, lengths, small)."""
    small = request.config.getoption("benchmark_disable", False)
    folder = save_model(tmp_path_factory.mktemp("peers-bert"), small)
    sentences = make_sentences(4, 5, 10) if small else make_sentences(64, 10, 55)
    tokenizer, ours, user = load(folder)
    tokens, lengths = batch(tokenizer(sentences)["input_ids"])
    return folder, sentences, tokenizer, ours, user, tokens, lengths, small


def ferret_python() -> str:
    """The ferret environment's python, or a skip saying why there is none."""
    python = os.environ.get(FERRET_PYTHON)
    if not python:
        pytest.skip(f"{FERRET_PYTHON} is unset: it names the python of ferret's own venv (see this module's docstring)")
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec('ferret') is None)"
    try:
        found = subprocess.run([python, "-c", check], capture_output=True, timeout=120).returncode == 0
    except OSError as e:
        pytest.skip(f"{FERRET_PYTHON}={python} cannot run: {e}")
    if not found:
        pytest.skip(f"{FERRET_PYTHON}={python} has no ferret (pip install ferret-xai==0.4.2 there)")
    return python


def run_ferret(python: str, folder: Path, sentences: list[str], scores: list[list[float]], tmp: Path) -> dict:
    job, out = tmp / "ferret-in.json", tmp / "ferret-out.json"
    job.write_text(json.dumps(dict(folder=str(folder), sentences=sentences, scores=scores, threads=1)))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)  # ferret's environment sees none of ours
    done = subprocess.run([python, str(WORKER), str(job), str(out)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"ferret's worker failed:\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


def test_ferret_side_by_side(benchmark, setup, tmp_path):
    """ferret's leave-one-out and AOPC comprehensiveness / sufficiency in its own process, ours
    here, same model and rows; values compared on the rows that survive ferret's round trip."""
    python = ferret_python()
    folder, sentences, _, model, _, tokens, lengths, _ = setup
    real = (lengths - 2).tolist()
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(len(real), max(real), generator=g)
    scores = scores * (torch.arange(max(real)) < torch.tensor(real)[:, None])
    load_before = os.getloadavg()[0]
    ferret = run_ferret(python, folder, sentences, [scores[i, :n].tolist() for i, n in enumerate(real)], tmp_path)
    rows = ferret["rows"]

    def our_loo():
        return leave_one_out(model, tokens, lengths)

    def our_eraser():
        kwargs = dict(fractions=FERRET_FRACTIONS, variant="ferret")
        return (
            comprehensiveness(model, tokens, lengths, scores, **kwargs),
            sufficiency(model, tokens, lengths, scores, **kwargs),
        )

    benchmark.group = "peers-ferret"
    loo = benchmark.pedantic(our_loo, rounds=1)
    loo_s = median_seconds(benchmark, our_loo)
    (comp, suff), eraser_s = timed(our_eraser)

    same_ids = [r["ids"] == tokens[i, : lengths[i]].tolist() for i, r in enumerate(rows)]
    assert all(same_ids), "ferret's tokenizer gave other ids than ours for the same sentence"
    loo_rows = [i for i, r in enumerate(rows) if r["loo_round_trip"]]
    eraser_rows = [i for i, r in enumerate(rows) if r["eraser_round_trip"]]
    targets = torch.tensor([r["target"] for r in rows])
    assert torch.equal(targets, comp.predicted), "ferret's predicted classes differ from ours"
    for i in loo_rows:
        theirs = torch.tensor(rows[i]["loo"]).abs()
        torch.testing.assert_close(loo[i, : real[i]], theirs, rtol=1e-3, atol=2e-5)
    counted = {}
    for name, result in (("comprehensiveness", comp), ("sufficiency", suff)):
        theirs = torch.tensor([rows[i][name] for i in eraser_rows])
        mine = result.aopc[eraser_rows]
        finite = torch.isfinite(mine)  # ours NaN where no fraction counts; ferret then says 0 / 1
        counted[name] = int(finite.sum())
        torch.testing.assert_close(mine[finite], theirs[finite], rtol=1e-3, atol=2e-5)
        expected_empty = 0.0 if name == "comprehensiveness" else 1.0
        assert (theirs[~finite] == expected_empty).all()
    benchmark.extra_info.update(
        model="random BertForSequenceClassification " + str(model.hf.config.hidden_size),
        rows=len(rows),
        mean_length=float(lengths.double().mean()),
        deletions=int(sum(real)),
        loo_rows_compared=len(loo_rows),
        loo_rows_failing_round_trip=len(rows) - len(loo_rows),
        eraser_rows_compared=len(eraser_rows),
        eraser_rows_failing_round_trip=len(rows) - len(eraser_rows),
        eraser_rows_with_a_counted_fraction=counted,
        threads=torch.get_num_threads(),
        ferret_threads=ferret["threads"],
        ferret_versions=ferret["versions"],
        load_average_before=load_before,
        leave_one_out_s=loo_s,
        ferret_loo_s=ferret["loo_s"],
        loo_speedup=ferret["loo_s"] / loo_s,
        eraser_s=eraser_s,
        ferret_eraser_s=ferret["eraser_s"],
        eraser_speedup=ferret["eraser_s"] / eraser_s,
        ferret_target_s=ferret["target_s"],
        ferret_import_s=ferret["import_s"],
        load_average_after=os.getloadavg()[0],
    )


def captum_ig(captum_attr, user, tokens, lengths, internal_batch_size, steps=IG_STEPS):
    """Integrated gradients as a Captum user computes them on a transformers model: ``[B, T - 1]``
    normalised |sum_e| per real token (entry k is real token k + 1), laid out as ours."""
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    mask = positions < lengths[:, None]
    real = mask & (positions >= 1) & (positions < (lengths - 1)[:, None])
    embedded = user.get_input_embeddings()(tokens).detach()
    with torch.no_grad():
        target = user(input_ids=tokens, attention_mask=mask.long()).logits.argmax(-1)

    def probability(x, attention_mask):
        return user(inputs_embeds=x, attention_mask=attention_mask).logits.softmax(-1)

    attribution = captum_attr.IntegratedGradients(probability).attribute(
        embedded,
        baselines=embedded.masked_fill(real[..., None], 0),
        target=target,
        additional_forward_args=(mask.long(),),
        n_steps=steps,
        internal_batch_size=internal_batch_size,
    )
    score = attribution.detach().sum(-1).abs().masked_fill(~real, 0)[:, 1:]
    return score / score.sum(1, keepdim=True)


def captum_ig_bucketed(captum_attr, user, tokens, lengths, internal_batch_size=IG_INTERNAL_BATCH, steps=IG_STEPS):
    """:func:`captum_ig` per group of rows of one length, cut to that length."""
    out = torch.zeros(tokens.shape[0], tokens.shape[1] - 1, device=tokens.device)
    for n in lengths.unique().tolist():
        rows = torch.nonzero(lengths == n).squeeze(1)
        out[rows, : n - 1] = captum_ig(captum_attr, user, tokens[rows, :n], lengths[rows], internal_batch_size, steps)
    return out


def test_integrated_gradients_vs_captum(benchmark, setup):
    """Ours against Captum's ``IntegratedGradients`` as a user calls it, stock and length-bucketed,
    same model, rows, steps, baseline and target; values checked equal first."""
    captum_attr = pytest.importorskip("captum.attr", reason="Captum is optional: pip install captum")
    from attnmetrics.importance import integrated_gradients

    _, _, _, model, user, tokens, lengths, small = setup
    steps = 4 if small else IG_STEPS
    load_before = os.getloadavg()[0]

    def ours():
        return integrated_gradients(model, tokens, lengths, steps=steps)

    benchmark.group = "peers-integrated-gradients"
    mine, ours_s, rates = rounds_beside_rate(benchmark, ours)  # warm: Captum, thread pools
    stock, stock_s = timed(lambda: captum_ig(captum_attr, user, tokens, lengths, IG_INTERNAL_BATCH, steps))
    torch.testing.assert_close(mine, stock, rtol=1e-3, atol=1e-5)
    if small:
        bucketed, bucketed_s = stock, float("nan")
    else:
        bucketed, bucketed_s = timed(lambda: captum_ig_bucketed(captum_attr, user, tokens, lengths))
        torch.testing.assert_close(mine, bucketed, rtol=1e-3, atol=1e-5)
    benchmark.extra_info.update(
        model="random BertForSequenceClassification " + str(model.hf.config.hidden_size),
        rows=int(lengths.shape[0]),
        mean_length=float(lengths.double().mean()),
        steps=steps,
        captum_internal_batch_size=IG_INTERNAL_BATCH,
        threads=torch.get_num_threads(),
        load_average_before=load_before,
        integrated_gradients_s=ours_s,
        captum_stock_s=stock_s,
        captum_bucketed_s=bucketed_s,
        speedup_vs_stock=stock_s / ours_s,
        speedup_vs_bucketed=bucketed_s / ours_s,
        max_abs_diff_vs_captum=float((mine - stock).abs().max()),
        # the floor: per step a forward and the backward to the inputs (at least one more
        # forward's multiply-adds), each row at its own length
        **floor_info(sum(2 * steps * encoder_macs(model.hf.config, n) for n in lengths.tolist()), ours_s, rates),
        numpy=np.__version__,
        python=sys.version.split()[0],
        load_average_after=os.getloadavg()[0],
    )
