"""Chefer et al.'s gradient-weighted attention rollout (ICCV 2021) of a BERT-like Hugging Face
classifier, of our GPT classifier with its extract read-out (GPT-1's, ``--attention extract``) or of a
Llama-layout decoder, fine-tuned or prompted (:mod:`attnmetrics.llm`), with
``--chefer``: a Kendall τ partner, a flip-search and an ERASER ordering, and a token-view row (not a
per-head partner: it mixes every layer's heads)."""

from attnmetrics import llm
from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import gradient_weighted_rollout, supports


def _compute(model, tokens, lengths, s):
    """attnmetrics.llm's on a Llama-layout decoder (fine-tuned or prompted), else attnmetrics.attributions'."""
    method = llm.gradient_weighted_rollout if llm.supports(model) else gradient_weighted_rollout
    return method(model, tokens, lengths, memory_budget=memory_budget(tokens.device))


def _enabled(model, s) -> bool:
    return bool(s.option("chefer")) and (model is None or supports(model) or llm.supports(model))


IMPORTANCE = Importance(
    "chefer",
    _compute,
    _enabled,
    order=37,
    head_partner=False,
    option={
        "flags": ("--chefer",),
        "dest": "chefer",
        "action": "store_true",
        "default": False,
        "help": "also Chefer et al.'s gradient-weighted attention rollout (ICCV 2021: each layer's attention times "
        "its gradient for the predicted class's logit, clipped at 0, averaged over heads, accumulated as R + A R "
        "from the identity; BERT-like Hugging Face models, our GPT with --attention extract, Llama-layout decoders "
        "fine-tuned or prompted) as a Kendall tau "
        "partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "chefer": "Chefer, Gur & Wolf 2021 (ICCV, eqs. 5-6): R = I, per layer R <- R + mean_h[(dy/dA_h * A_h)^+] R, "
        "y the predicted class's logit, A_h the attention probabilities; the [CLS] row (its own column dropped), "
        "not normalised; a Llama-layout decoder (attnmetrics.llm): per query head, the deciding position's row (a "
        "fine-tuned decoder's last token keeps the identity's 1; a prompted model's answer position is the template's), "
        "y a prompted model's predicted label word's logit"
    },
)
