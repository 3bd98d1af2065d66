"""GlobEnc (Modarressi et al. 2022) of a BERT-like Hugging Face classifier or of our GPT classifier with
its extract read-out (GPT-1's, ``--attention extract``), with ``--globenc``: a Kendall τ partner, a
flip-search and an ERASER ordering, and a token-view row (not a per-head partner: it mixes every layer's
heads)."""

from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import globenc, supports

IMPORTANCE = Importance(
    "globenc",
    lambda model, tokens, lengths, s: globenc(model, tokens, lengths, memory_budget=memory_budget(tokens.device)),
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
        "raw norms multiplied through the layers (no residual added, no renormalisation), the [CLS] row"
    },
)
