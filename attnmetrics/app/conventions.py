"""The prose results.json carries for the report: the battery's conventions (``conventions``) and,
for GPT-1's extract read-out, what the battery tests (``battery``)."""

from __future__ import annotations

from attnmetrics.app.config import RunConfig

#: results["battery"] of GPT-1's extract read-out: the procedures test the model's own attention
OWN_ATTENTION = (
    "GPT-1's own attention (--attention extract): the last layer's <extract> attention row, per head, over the "
    "real tokens; <start> and <extract> keep their weights, each head's real tokens are renormalised within "
    "their mass, tokens are removed and permuted in every head alike; orders and tau use the head mean "
    "(docs/definitions.md §15)"
)


def conventions(config: RunConfig) -> dict:
    """results.json's ``conventions``: how the battery computed what it reports."""
    return {
        "special_tokens": "<SOS>/<EOS> (gpt: <start>/<extract>) masked out of attention; statistics over real tokens only",
        "epoch_selection": "J&W: the epoch with the best dev ROC-AUC; among tied epochs the lowest dev loss",
        "renormalisation": "L1 over the remaining attention weights",
        "flip_ties": "equal scores removed lower index first",
        "flip_denominator": "number of real tokens (attention items)",
        "flip_max_removed": "L - 1 (the last item is never removed)",
        "never_flipped": "NaN, left out of fraction statistics"
        if config.never_flipped == "nan"
        else "fraction 1.0 (Mohankumar et al. 2020)",
        "gradient_importance": "J&W: |grad x input| summed over classes, attention detached, L1-normalised",
        "kendall": "tau-b, two-sided p as scipy.stats.kendalltau defaults",
        "leave_one_out": "token deleted (sequence shortened, re-encoded); TVD of output distributions (1/2 L1)",
        "permutation": f"{config.permutations} permutations among real tokens, median output TVD per instance",
        "adversarial": f"J&W: 5 candidates, {config.adversarial_steps} Adam steps lr 0.01, "
        "loss -JSD + 500 ReLU(TVD - 0.01) - pairwise JSD; max JSD among outputs with TVD <= 0.05",
        "single_removal": "one weight zeroed, rest renormalised; output JSD in nats; McNemar exact test",
        "divergences": "JSD in nats (natural log), symmetric; TVD = 1/2 sum |p - q|; sums over a test set are means",
        "single_token": "T&S 2020: each real token alone between the row's own special tokens; tau-b between attention "
        "and the alone-probability of the full input's predicted class; top-attention token (ties: "
        "lower index) alone gives the full decision",
        "regulariser": "T&S 2020: concat = hidden (+) embedding; residual = hidden + Linear(embedding); tying = weight * "
        "mean over real tokens of ||P h_t - e_t||^2 (P = identity if H == E, else a learned Linear; "
        "e_t detached); mlm = weight * CE of masked real tokens (p = 0.15, replaced by <UNK>) through "
        "a head whose output matrix is the embedding matrix",
        "consistent_adversary": "W&P 2019: loss sum over batch of TVD(y_adv, y_base) - lambda KL(a_adv || a_base), KL "
        "over real tokens (0 log 0 = 0), base frozen; same init, data and recipe as the base; "
        "epoch kept: lowest mean dev objective; test TVD of outputs, JSD of attention (means)",
        "diagnostic": "W&P 2019: average encoder (Linear + tanh per token) with imposed attention in training and "
        "testing; epoch kept: best dev ROC-AUC (ties: lowest dev loss)",
    }
