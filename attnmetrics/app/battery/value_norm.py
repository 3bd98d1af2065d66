"""Attention × value norm (Kobayashi et al. 2020, sec. 3) of a BERT-like Hugging Face classifier or of
our GPT classifier with its extract read-out (GPT-1's, ``--attention extract``), with ``--value-norm``:
a Kendall τ partner, a flip-search and an ERASER ordering, and a token-view row."""

from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import attention_value_norm, supports

IMPORTANCE = Importance(
    "value_norm",
    lambda model, tokens, lengths, s: attention_value_norm(
        model, tokens, lengths, memory_budget=memory_budget(tokens.device)
    ),
    lambda model, s: bool(s.option("value_norm")) and (model is None or supports(model)),
    order=33,
    option={
        "flags": ("--value-norm",),
        "dest": "value_norm",
        "action": "store_true",
        "default": False,
        "help": "also the attention x value norm ||sum_h alpha_h f_h(x_j)|| of the last layer's pooled row ([CLS], "
        "our GPT's <extract>) (Kobayashi et al. 2020; BERT-like Hugging Face models and our GPT with --attention "
        "extract) as a Kendall tau partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "value_norm": "Kobayashi et al. 2020: ||sum_h A_h[CLS, j] (x_j W_V^h + b_V^h) W_O^h||_2 at the last layer, "
        "b_O left out, not normalised"
    },
)
