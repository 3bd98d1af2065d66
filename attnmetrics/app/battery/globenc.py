"""GlobEnc (Modarressi et al. 2022) of a BERT-like Hugging Face classifier or of our GPT classifier with
its extract read-out (GPT-1's, ``--attention extract``), with ``--globenc``: a Kendall τ partner, a
flip-search and an ERASER ordering, and a token-view row (not a per-head partner: it mixes every layer's
heads). Not on a Llama-layout decoder: its ``enabled`` leaves it out there, and
:data:`attnmetrics.llm.globenc.REASON` says why (no norm on a pre-norm layer's summed stream).
"""

from attnmetrics import llm
from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import globenc, supports


def _compute(model, tokens, lengths, s):
    """attnmetrics.attributions' GlobEnc; on a Llama-layout decoder attnmetrics.llm's refusal (ValueError)."""
    method = llm.globenc if llm.supports(model) else globenc
    return method(model, tokens, lengths, memory_budget=memory_budget(tokens.device))


IMPORTANCE = Importance(
    "globenc",
    _compute,
    lambda model, s: bool(s.option("globenc")) and (model is None or supports(model)),
    order=34,
    head_partner=False,
    option={
        "flags": ("--globenc",),
        "dest": "globenc",
        "action": "store_true",
        "default": False,
        "help": "also GlobEnc (Modarressi et al. 2022: norms of the attention, residual and both LayerNorms, rolled "
        "out; BERT-like Hugging Face models and our GPT with --attention extract) as a Kendall tau partner, "
        "flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "globenc": "Modarressi et al. 2022: per layer ||LN2'(LN1'(sum_h A_h[i, j] f_h(x_j) + [i = j] x_i))||, "
        "raw norms multiplied through the layers (no residual added, no renormalisation), the [CLS] row; not on a "
        "Llama-layout decoder (no norm on a pre-norm layer's summed stream: the raw norms' product overflows)"
    },
)
