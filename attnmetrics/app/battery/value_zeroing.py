"""Value Zeroing (Mohebbi et al. 2023) of a BERT-like Hugging Face classifier, of our GPT classifier
with its extract read-out (GPT-1's, ``--attention extract``) or of a Llama-layout decoder, fine-tuned or
prompted (:mod:`attnmetrics.llm`), with ``--value-zeroing``: a Kendall τ
partner, a flip-search and an ERASER ordering, and a token-view row (not a per-head partner: it mixes
every layer's heads)."""

from attnmetrics import llm
from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import supports, value_zeroing


def _compute(model, tokens, lengths, s):
    """attnmetrics.llm's on a Llama-layout decoder (fine-tuned or prompted), else attnmetrics.attributions'."""
    method = llm.value_zeroing if llm.supports(model) else value_zeroing
    return method(model, tokens, lengths, memory_budget=memory_budget(tokens.device))


def _enabled(model, s) -> bool:
    return bool(s.option("value_zeroing")) and (model is None or supports(model) or llm.supports(model))


IMPORTANCE = Importance(
    "value_zeroing",
    _compute,
    _enabled,
    order=36,
    head_partner=False,
    option={
        "flags": ("--value-zeroing",),
        "dest": "value_zeroing",
        "action": "store_true",
        "default": False,
        "help": "also Value Zeroing (Mohebbi et al. 2023: cosine distance of each layer's outputs with one token's "
        "values zeroed, rows normalised, rolled out; BERT-like Hugging Face models, our GPT with --attention "
        "extract, Llama-layout decoders fine-tuned or prompted) as a Kendall tau partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "value_zeroing": "Mohebbi et al. 2023: per layer 1 - cos(h_i, h_i with v(x_j) zeroed in every head), "
        "rows normalised over j, rolled out without residual, the [CLS] row; a Llama-layout decoder (attnmetrics.llm): "
        "the values zeroed in every key/value head, the layer's output the residual stream (the last layer's before the "
        "final norm), the deciding position's row"
    },
)
