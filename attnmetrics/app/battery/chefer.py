"""Chefer et al.'s gradient-weighted attention rollout (ICCV 2021) of a BERT-like Hugging Face
classifier or of our GPT classifier with its extract read-out (GPT-1's, ``--attention extract``), with
``--chefer``: a Kendall τ partner, a flip-search and an ERASER ordering, and a token-view row (not a
per-head partner: it mixes every layer's heads)."""

from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import gradient_weighted_rollout, supports

IMPORTANCE = Importance(
    "chefer",
    lambda model, tokens, lengths, s: gradient_weighted_rollout(
        model, tokens, lengths, memory_budget=memory_budget(tokens.device)
    ),
    lambda model, s: bool(s.option("chefer")) and (model is None or supports(model)),
    order=37,
    head_partner=False,
    option={
        "flags": ("--chefer",),
        "dest": "chefer",
        "action": "store_true",
        "default": False,
        "help": "also Chefer et al.'s gradient-weighted attention rollout (ICCV 2021: each layer's attention times "
        "its gradient for the predicted class's logit, clipped at 0, averaged over heads, accumulated as R + A R "
        "from the identity; BERT-like Hugging Face models and our GPT with --attention extract) as a Kendall tau "
        "partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "chefer": "Chefer, Gur & Wolf 2021 (ICCV, eqs. 5-6): R = I, per layer R <- R + mean_h[(dy/dA_h * A_h)^+] R, "
        "y the predicted class's logit, A_h the attention probabilities; the [CLS] row (its own column dropped), "
        "not normalised"
    },
)
