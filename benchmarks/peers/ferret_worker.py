"""ferret's side of ``benchmarks/test_bench_peers.py``, run with the python of ferret's own virtual
environment (ferret-xai 0.4.2 pins transformers < 5, captum < 0.8 and numpy < 2, so it cannot share
attnmetrics' environment). It imports nothing of attnmetrics: it calls ferret's evaluators as a
ferret user does, on the Hugging Face model and tokenizer saved in a folder.

Usage: ``python ferret_worker.py IN.json OUT.json`` with IN holding ``folder`` (a saved
``BertForSequenceClassification`` and its tokenizer), ``sentences`` (texts) and ``scores`` (one list
per sentence: a score per real token, [CLS] and [SEP] left out). OUT gets, per sentence:

- ``ids``: ferret's tokenisation of the sentence (its ``ModelHelper._tokenize``), [CLS] ... [SEP];
- ``target``: the class ferret's model predicts on it (the class both metrics are measured for);
- ``loo``: ``TauLOO_Evaluation.compute_leave_one_out_occlusion`` (p(target | token deleted) −
  p(target | sentence), per real token: ferret's leave-one-out scores, which tau-LOO correlates);
- ``comprehensiveness``, ``sufficiency``: ``AOPC_Comprehensiveness_Evaluation`` /
  ``AOPC_Sufficiency_Evaluation`` of the given scores (ferret's defaults: fractions 10 %, ..., 100 %,
  positive scores only, tokens deleted);
- ``loo_round_trip``, ``eraser_round_trip``: whether every id list ferret decoded to text for this
  sentence re-tokenises to the same ids (its evaluators decode each perturbed id list and the model
  helper tokenises the text again; where that changes the ids, ferret measured another input than
  the one meant, and the row is not compared);

and the seconds each part took (``loo_s``, ``eraser_s``: the sum over sentences of the evaluator
calls, one sentence at a time as ferret runs them; ``target_s``; ``import_s``), threads and versions.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version


class Recording:
    """The tokenizer, passed through, recording every id list ferret decodes (to check afterwards,
    outside the timed calls, that the text re-tokenises to the same ids)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.decoded = []

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)

    def decode(self, ids, *args, **kwargs):
        text = self._tokenizer.decode(ids, *args, **kwargs)
        self.decoded.append(([int(i) for i in ids], text))
        return text

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def round_trips(tokenizer, decoded) -> bool:
    """Whether each decoded text tokenises back to [CLS] + its ids + [SEP]."""
    for ids, text in decoded:
        again = tokenizer(text, truncation=True)["input_ids"]
        if again != [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]:
            return False
    return True


def main(inp: str, out: str) -> None:
    start = time.perf_counter()
    import numpy as np
    import torch
    import transformers
    from ferret import (
        AOPC_Comprehensiveness_Evaluation,
        AOPC_Sufficiency_Evaluation,
        TauLOO_Evaluation,
    )
    from ferret.explainers.explanation import Explanation

    import_s = time.perf_counter() - start
    job = json.loads(open(inp).read())
    torch.set_num_threads(int(job.get("threads", 1)))
    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(job["folder"])
    model = transformers.AutoModelForSequenceClassification.from_pretrained(job["folder"]).eval()
    loo_eval = TauLOO_Evaluation(model, tokenizer)
    comp_eval = AOPC_Comprehensiveness_Evaluation(model, tokenizer)
    suff_eval = AOPC_Sufficiency_Evaluation(model, tokenizer)
    sentences, scores = job["sentences"], job["scores"]

    # the predicted class of each sentence, through ferret's model helper (batches of 8)
    start = time.perf_counter()
    _, logits = loo_eval.helper._forward(sentences, output_hidden_states=False)
    targets = logits.argmax(-1).tolist()
    target_s = time.perf_counter() - start

    rows = []
    loo_s = eraser_s = 0.0
    for text, score, target in zip(sentences, scores, targets):
        ids = loo_eval.helper._tokenize(text)["input_ids"][0].tolist()
        tokens = tokenizer.convert_ids_to_tokens(ids)
        row = dict(ids=ids, target=target)
        recording = Recording(tokenizer)
        loo_eval.helper.tokenizer = recording
        start = time.perf_counter()
        loo = loo_eval.compute_leave_one_out_occlusion(text, target=target)
        loo_s += time.perf_counter() - start
        row["loo"] = loo.tolist()
        row["loo_round_trip"] = round_trips(tokenizer, recording.decoded)

        recording = Recording(tokenizer)
        comp_eval.helper.tokenizer = suff_eval.helper.tokenizer = recording
        explanation = Explanation(text, tokens, np.array([0.0, *score, 0.0]), "given", target)
        start = time.perf_counter()
        comp = comp_eval.compute_evaluation(explanation, target=target)
        suff = suff_eval.compute_evaluation(explanation, target=target)
        eraser_s += time.perf_counter() - start
        row["comprehensiveness"], row["sufficiency"] = float(comp.score), float(suff.score)
        row["eraser_round_trip"] = round_trips(tokenizer, recording.decoded)
        rows.append(row)

    result = dict(
        rows=rows,
        loo_s=loo_s,
        eraser_s=eraser_s,
        target_s=target_s,
        import_s=import_s,
        threads=torch.get_num_threads(),
        versions=dict(
            ferret=version("ferret-xai"),
            torch=torch.__version__,
            transformers=transformers.__version__,
            numpy=np.__version__,
        ),
    )
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
