"""A transformer's attention rollout (Abnar & Zuidema 2020), where the model offers it: a Kendall τ
partner, a flip-search and an ERASER ordering (not a per-head partner: it mixes every layer's heads)."""

from attnmetrics.app.battery.registry import Importance
from attnmetrics.protocol import capability

IMPORTANCE = Importance(
    "rollout",
    lambda model, tokens, lengths, s: model.rollout(tokens, lengths),
    lambda model, s: capability(model, "rollout") is not None,
    order=30,
    head_partner=False,
)
