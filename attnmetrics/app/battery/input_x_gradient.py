"""The whole model's gradient x input (Shrikumar et al. 2016) of the predicted class through Captum,
with ``--input-x-gradient``: a Kendall τ partner, a flip-search and an ERASER ordering, and a
token-view row."""

from attnmetrics.app.battery.registry import Importance
from attnmetrics.importance import input_x_gradient

IMPORTANCE = Importance(
    "input_x_gradient",
    lambda model, tokens, lengths, s: input_x_gradient(
        # --attribution-aggregation (app/faithfulness.py's importance_options): |sum_e|, l2 or mean_abs
        model,
        tokens,
        lengths,
        aggregation=s.options.get("attribution_aggregation", "sum"),
    ),
    lambda model, s: bool(s.option("input_x_gradient")),
    order=50,
    option={
        "flags": ("--input-x-gradient",),
        "dest": "input_x_gradient",
        "action": "store_true",
        "default": False,
        "help": "also the whole model's gradient x input of the predicted class (Captum) as a Kendall tau partner, "
        "flip-search and ERASER ordering, and token-view row",
    },
    package=("captum", "Captum"),
)
