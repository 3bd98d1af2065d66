"""GlobEnc (Modarressi et al. 2022) of a BERT-like Hugging Face classifier, of our GPT classifier with
its extract read-out (GPT-1's, ``--attention extract``) or, carried over, of a Llama-layout decoder,
fine-tuned or prompted (:mod:`attnmetrics.llm`), with ``--globenc``: a Kendall τ partner, a
flip-search and an ERASER ordering, and a token-view row (not a per-head partner: it mixes every layer's
heads)."""

from attnmetrics import llm
from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import globenc, supports


def _compute(model, tokens, lengths, s):
    """attnmetrics.llm's on a Llama-layout decoder (fine-tuned or prompted), else attnmetrics.attributions'."""
    method = llm.globenc if llm.supports(model) else globenc
    return method(model, tokens, lengths, memory_budget=memory_budget(tokens.device))


def _enabled(model, s) -> bool:
    return bool(s.option("globenc")) and (model is None or supports(model) or llm.supports(model))


IMPORTANCE = Importance(
    "globenc",
    _compute,
    _enabled,
    order=34,
    head_partner=False,
    option={
        "flags": ("--globenc",),
        "dest": "globenc",
        "action": "store_true",
        "default": False,
        "help": "also GlobEnc (Modarressi et al. 2022: norms of the attention, residual and both LayerNorms, rolled "
        "out; BERT-like Hugging Face models, our GPT with --attention extract, Llama-layout decoders fine-tuned or "
        "prompted) as a Kendall tau partner, "
        "flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "globenc": "Modarressi et al. 2022: per layer ||LN2'(LN1'(sum_h A_h[i, j] f_h(x_j) + [i = j] x_i))||, "
        "raw norms multiplied through the layers (no residual added, no renormalisation), the [CLS] row; a Llama-layout "
        "decoder (attnmetrics.llm): ||sum_h A_h[i, j] f_h(RMSNorm_1(x_j)) + [i = j] x_i|| (no norm acts on the "
        "summed stream of a pre-norm layer, so both LayerNorm factors drop out), the deciding position's row"
    },
)
