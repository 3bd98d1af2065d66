"""J&W 2019's leave-one-out importance (sec. 4.1): the output TVD when each token is deleted. An
experiment of its own (``--skip loo``) that runs within Kendall's step, as a τ partner and an
ERASER ordering; never a flip order, as in S&S."""

from attnmetrics.app.battery.registry import Experiment, Importance
from attnmetrics.loo import leave_one_out

IMPORTANCE = Importance(
    "loo",
    lambda model, tokens, lengths, s: leave_one_out(model, tokens, lengths),
    lambda model, s: "loo" in s.experiments,
    order=20,
    flip_order=False,
    experiment="loo",
    conventions={
        "leave_one_out": "token deleted (sequence shortened, re-encoded); TVD of output distributions (1/2 L1)"
    },
)

EXPERIMENT = Experiment("loo", order=25, within="kendall")
