"""The prose results.json carries for the report: the battery's conventions (``conventions``) and,
for GPT-1's extract read-out, what the battery tests (``battery``)."""

from __future__ import annotations

from attnmetrics.app.battery import BatteryConfig, run_conventions

#: results["battery"]: what the procedures test where it is not the model's attention head but its own
#: attention (docs/definitions.md §15), by model: GPT-1's extract read-out, a Hugging Face classifier, any other
OWN_ATTENTION = {
    "gpt": "GPT-1's own attention (--attention extract): the last layer's <extract> attention row, per head, over "
    "the real tokens; <start> and <extract> keep their weights, each head's real tokens are renormalised within "
    "their mass, tokens are removed and permuted in every head alike; orders and tau use the head mean "
    "(docs/definitions.md §15)",
    "hf": "the model's own attention: the last layer's attention row of the pooled position ([CLS], or GPT-2's "
    "last token), per head, over the real tokens; special positions keep their weights, each head's real tokens "
    "are renormalised within their mass, tokens are removed and permuted in every head alike; orders and tau use "
    "the head mean (docs/definitions.md §15)",
    "own": "the model's own attention (its tested_attention), per head, over the real tokens; orders and tau use "
    "the head mean (docs/definitions.md §15)",
}

#: results["conventions"]["pair_task"]: what the battery perturbs on J&W's QA/NLI model (models/pair.py)
PAIR_TASK = (
    "J&W 2019 QA/NLI: attention over the passage conditioned on the question; every procedure explains and "
    "perturbs the passage's words only, the question held fixed (its state rides in every passage state, "
    "[h_t ; q]); softmax over the training split's answers (docs/definitions.md §21)"
)


def conventions(config: BatteryConfig) -> dict:
    """results.json's ``conventions``: how the run computed what it reports (the definitions every
    run shares, then each battery experiment's and importance's, from its module)."""
    return {
        "special_tokens": "<SOS>/<EOS> (gpt: <start>/<extract>) masked out of attention; statistics over real tokens only",
        "epoch_selection": "J&W: the epoch with the best dev ROC-AUC; among tied epochs the lowest dev loss",
        "divergences": "JSD in nats (natural log), symmetric; TVD = 1/2 sum |p - q|; sums over a test set are means",
        "regulariser": "T&S 2020: concat = hidden (+) embedding; residual = hidden + Linear(embedding); tying = weight * "
        "mean over real tokens of ||P h_t - e_t||^2 (P = identity if H == E, else a learned Linear; "
        "e_t detached); mlm = weight * CE of masked real tokens (p = 0.15, replaced by <UNK>) through "
        "a head whose output matrix is the embedding matrix",
        **run_conventions(config),
    }
