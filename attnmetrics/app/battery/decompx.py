"""DecompX (Modarressi et al. 2023) of a BERT-like Hugging Face classifier or of our GPT classifier with
its extract read-out (GPT-1's, ``--attention extract``), with ``--decompx``: a Kendall τ partner, a
flip-search and an ERASER ordering, and a token-view row (not a per-head partner: it decomposes every
layer, the feed-forward networks and the classification head). Not on a Llama-layout decoder: its
``enabled`` leaves it out there, and :data:`attnmetrics.llm.decompx.REASON` says why (the gated MLP)."""

from attnmetrics import llm
from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import decompx, supports


def _compute(model, tokens, lengths, s):
    """attnmetrics.attributions' DecompX; on a Llama-layout decoder attnmetrics.llm's refusal (ValueError)."""
    method = llm.decompx if llm.supports(model) else decompx
    return method(model, tokens, lengths, memory_budget=memory_budget(tokens.device))


IMPORTANCE = Importance(
    "decompx",
    _compute,
    lambda model, s: bool(s.option("decompx")) and (model is None or supports(model)),
    order=38,
    head_partner=False,
    option={
        "flags": ("--decompx",),
        "dest": "decompx",
        "action": "store_true",
        "default": False,
        "help": "also DecompX (Modarressi et al. 2023: every layer's states decomposed into per-token vectors "
        "propagated through attention, LayerNorm, the feed-forward networks and the classification head, to each "
        "token's signed contribution to the predicted class's logit; BERT-like Hugging Face models and our GPT with "
        "--attention extract; not Llama-layout decoders, whose gated MLP it has no rule for) as a Kendall tau partner, "
        "flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "decompx": "Modarressi et al. 2023 (ACL, eqs. 1-14): x_{i<-k} from the embeddings' output, biases split by "
        "AbsDot, LayerNorm per component at the model's own denominator, FFN activation and pooler tanh linearised "
        "by act(z)/z at each token's pre-activation; the predicted class's logit contribution of each token "
        "(signed, summing over [CLS], the tokens and [SEP] to the logit), [CLS] dropped, not normalised; not on a "
        "Llama-layout decoder (its gated MLP multiplies two linear maps of the decomposed state: no DecompX rule)"
    },
)
