"""Attention flow (Abnar & Zuidema 2020) of a BERT-like Hugging Face classifier, with
``--attention-flow``: a Kendall τ partner, a flip-search and an ERASER ordering, and a token-view
row (not a per-head partner: it mixes every layer's heads). Its max flows run on the CPU."""

from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import attention_flow, supports

IMPORTANCE = Importance(
    "attention_flow",
    lambda model, tokens, lengths, s: attention_flow(
        model, tokens, lengths, memory_budget=memory_budget(tokens.device)
    ),
    lambda model, s: bool(s.option("attention_flow")) and (model is None or supports(model)),
    order=39,
    head_partner=False,
    option={
        "flags": ("--attention-flow",),
        "dest": "attention_flow",
        "action": "store_true",
        "default": False,
        "help": "also Abnar & Zuidema's attention flow (ACL 2020: the maximum flow from each input token to the "
        "[CLS] node of the last layer through the layers' attention graph, each layer's capacities rollout's "
        "0.5 mean-head attention + 0.5 I, rows renormalised; max flows on the CPU; BERT-like Hugging Face models "
        "only) as a Kendall tau partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "attention_flow": "Abnar & Zuidema 2020 (ACL, sec. 3): nodes (layer 0..L, position), edge (l, k) -> "
        "(l+1, i) of capacity A_l[i, k] = rows renormalised 0.5 mean_h A_h + 0.5 I (rollout's); each token's max "
        "flow from (0, j) to (L, [CLS]), in [0, 1], [CLS] dropped, not normalised (the authors' code divides by "
        "the row's sum over every position)"
    },
)
