"""J&W 2019's gradient importance (sec. 4.1), always beside attention: a Kendall τ partner and an
ERASER ordering (the flip search has it as its order "gradient" already)."""

from attnmetrics.app.battery.registry import Importance
from attnmetrics.importance import gradient_importance

IMPORTANCE = Importance(
    "gradient",
    lambda model, tokens, lengths, s: gradient_importance(model, tokens, lengths),
    lambda model, s: True,
    order=10,
    flip_order=False,
    conventions={"gradient_importance": "J&W: |grad x input| summed over classes, attention detached, L1-normalised"},
)
