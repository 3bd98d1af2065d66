"""Attention flow (Abnar & Zuidema 2020) of a transformer, wherever attention rollout applies (our
GPT classifier, BERT-like and GPT-2-like Hugging Face classifiers), with ``--attention-flow``: a
Kendall τ partner, a flip-search and an ERASER ordering, and a token-view row (not a per-head
partner: it mixes every layer's heads). Its max flows run on the CPU."""

from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import attention_flow
from attnmetrics.protocol import capability


def _applies(model) -> bool:
    """Where rollout's importance applies (the model rolls out its attention) and the model hands
    over its layers' attention (``layer_attentions``, what rollout rolls out; a prompted model's
    ``whole_attentions``, over the template too)."""
    hands_over = any(callable(getattr(model, name, None)) for name in ("layer_attentions", "whole_attentions"))
    return capability(model, "rollout") is not None and hands_over


IMPORTANCE = Importance(
    "attention_flow",
    lambda model, tokens, lengths, s: attention_flow(
        model, tokens, lengths, memory_budget=memory_budget(tokens.device)
    ),
    lambda model, s: bool(s.option("attention_flow")) and (model is None or _applies(model)),
    order=39,
    head_partner=False,
    option={
        "flags": ("--attention-flow",),
        "dest": "attention_flow",
        "action": "store_true",
        "default": False,
        "help": "also Abnar & Zuidema's attention flow (ACL 2020: the maximum flow from each input token to the "
        "pooled node of the last layer ([CLS], or a causal model's last real token) through the layers' attention "
        "graph, each layer's capacities rollout's 0.5 mean-head attention + 0.5 I, rows renormalised; max flows on "
        "the CPU; wherever attention rollout applies: our GPT classifier, BERT-like and GPT-2-like Hugging Face "
        "models) as a Kendall tau partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "attention_flow": "Abnar & Zuidema 2020 (ACL, sec. 3): nodes (layer 0..L, position), edge (l, k) -> "
        "(l+1, i) of capacity A_l[i, k] = rows renormalised 0.5 mean_h A_h + 0.5 I (rollout's; a causal model's "
        "only to earlier or equal positions); each token's max flow from (0, j) to (L, p), p rollout's pooled "
        "position ([CLS], or a causal model's last real token), in [0, 1], the special tokens dropped, not "
        "normalised (the authors' code divides by the row's sum over every position)"
    },
)
