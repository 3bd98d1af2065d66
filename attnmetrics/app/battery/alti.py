"""ALTI (Ferrando et al. 2022) of a BERT-like Hugging Face classifier or of our GPT classifier with its
extract read-out (GPT-1's, ``--attention extract``), with ``--alti``: a Kendall τ partner, a flip-search
and an ERASER ordering, and a token-view row (not a per-head partner: it mixes every layer's heads)."""

from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import alti, supports

IMPORTANCE = Importance(
    "alti",
    lambda model, tokens, lengths, s: alti(model, tokens, lengths, memory_budget=memory_budget(tokens.device)),
    lambda model, s: bool(s.option("alti")) and (model is None or supports(model)),
    order=35,
    head_partner=False,
    option={
        "flags": ("--alti",),
        "dest": "alti",
        "action": "store_true",
        "default": False,
        "help": "also ALTI (Ferrando et al. 2022: L1-distance contributions of each attention block, LayerNorm "
        "included, rolled out; BERT-like Hugging Face models and our GPT with --attention extract) as a Kendall tau "
        "partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "alti": "Ferrando et al. 2022: per layer max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1) normalised over j, "
        "T_i(x_j) through LayerNorm's linear part at the model's own denominator, rolled out without residual, "
        "the [CLS] row"
    },
)
