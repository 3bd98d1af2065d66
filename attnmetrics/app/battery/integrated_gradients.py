"""Integrated gradients (Sundararajan et al. 2017, sec. 3) through Captum, with ``--integrated-gradients
STEPS``: a Kendall τ partner, a flip-search and an ERASER ordering, and a token-view row."""

from attnmetrics.app.argtypes import int_between
from attnmetrics.app.battery.registry import Importance
from attnmetrics.importance import MAX_IG_STEPS, integrated_gradients

IMPORTANCE = Importance(
    "ig",
    lambda model, tokens, lengths, s: integrated_gradients(
        model,
        tokens,
        lengths,
        steps=s.option("integrated_gradients"),
        # --attribution-aggregation (app/faithfulness.py's importance_options): |sum_e|, l2 or mean_abs
        aggregation=s.options.get("attribution_aggregation", "sum"),
    ),
    lambda model, s: s.option("integrated_gradients") > 0,
    order=40,
    option={
        "flags": ("--integrated-gradients",),
        "dest": "integrated_gradients",
        "type": int_between(0, MAX_IG_STEPS, " (Gauss-Legendre nodes cost O(STEPS^3))"),
        "default": 0,
        "metavar": "STEPS",
        "help": "also integrated gradients (Captum, pip install captum) with STEPS integration points as a Kendall "
        "tau partner, flip-search and ERASER ordering, and token-view row (Captum's default: 50; at most "
        f"{MAX_IG_STEPS}); 0: off",
    },
    package=("captum", "Captum"),
    on=50,  # --importances integrated_gradients: Captum's default number of steps
)
