"""Attention × value norm (Kobayashi et al. 2020, sec. 3) of a BERT-like Hugging Face classifier, of
our GPT classifier with its extract read-out (GPT-1's, ``--attention extract``) or of a Llama-layout
decoder, fine-tuned or prompted (:mod:`attnmetrics.llm`), with ``--value-norm``: a Kendall τ partner, a
flip-search and an ERASER ordering, and a token-view row."""

from attnmetrics import llm
from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import attention_value_norm, supports


def _compute(model, tokens, lengths, s):
    """attnmetrics.llm's on a Llama-layout decoder (fine-tuned or prompted), else attnmetrics.attributions'."""
    method = llm.attention_value_norm if llm.supports(model) else attention_value_norm
    return method(model, tokens, lengths, memory_budget=memory_budget(tokens.device))


def _enabled(model, s) -> bool:
    return bool(s.option("value_norm")) and (model is None or supports(model) or llm.supports(model))


IMPORTANCE = Importance(
    "value_norm",
    _compute,
    _enabled,
    order=33,
    option={
        "flags": ("--value-norm",),
        "dest": "value_norm",
        "action": "store_true",
        "default": False,
        "help": "also the attention x value norm ||sum_h alpha_h f_h(x_j)|| of the last layer's pooled row ([CLS], "
        "our GPT's <extract>) (Kobayashi et al. 2020; BERT-like Hugging Face models, our GPT with --attention "
        "extract, Llama-layout decoders fine-tuned or prompted) as a Kendall tau partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "value_norm": "Kobayashi et al. 2020: ||sum_h A_h[CLS, j] (x_j W_V^h + b_V^h) W_O^h||_2 at the last layer, "
        "b_O left out, not normalised; a Llama-layout decoder (attnmetrics.llm): x_j through its own RMSNorm_1, "
        "query head h reading key/value head h // (H / H_kv), the deciding position's row"
    },
)
