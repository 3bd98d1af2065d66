"""Value Zeroing (Mohebbi et al. 2023) of a BERT-like Hugging Face classifier or of our GPT classifier
with its extract read-out (GPT-1's, ``--attention extract``), with ``--value-zeroing``: a Kendall τ
partner, a flip-search and an ERASER ordering, and a token-view row (not a per-head partner: it mixes
every layer's heads)."""

from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import supports, value_zeroing

IMPORTANCE = Importance(
    "value_zeroing",
    lambda model, tokens, lengths, s: value_zeroing(model, tokens, lengths, memory_budget=memory_budget(tokens.device)),
    lambda model, s: bool(s.option("value_zeroing")) and (model is None or supports(model)),
    order=36,
    head_partner=False,
    option={
        "flags": ("--value-zeroing",),
        "dest": "value_zeroing",
        "action": "store_true",
        "default": False,
        "help": "also Value Zeroing (Mohebbi et al. 2023: cosine distance of each layer's outputs with one token's "
        "values zeroed, rows normalised, rolled out; BERT-like Hugging Face models and our GPT with --attention "
        "extract) as a Kendall tau partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "value_zeroing": "Mohebbi et al. 2023: per layer 1 - cos(h_i, h_i with v(x_j) zeroed in every head), "
        "rows normalised over j, rolled out without residual, the [CLS] row"
    },
)
