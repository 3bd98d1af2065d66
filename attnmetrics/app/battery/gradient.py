"""J&W 2019's gradient importance (sec. 4.1), always beside attention: a Kendall τ partner and an
ERASER ordering (the flip search has it as its order "gradient" already). On a pair task the
predicted class's probability alone is differentiated, as J&W's question-answering code does."""

from attnmetrics.app.battery.registry import Importance
from attnmetrics.importance import gradient_importance
from attnmetrics.models.pair import is_pair_model


def _classes(model) -> str:
    """``"predicted"`` on J&W's QA/NLI model (their ``Question_Answering.gradient_mem``), else every class."""
    return "predicted" if is_pair_model(model) else "all"


IMPORTANCE = Importance(
    "gradient",
    lambda model, tokens, lengths, s: gradient_importance(model, tokens, lengths, classes=_classes(model)),
    lambda model, s: True,
    order=10,
    flip_order=False,
    conventions={
        "gradient_importance": "J&W: |grad x input| summed over classes (a pair task: of the predicted class's "
        "probability only, as J&W's QA code), attention detached, L1-normalised"
    },
)
