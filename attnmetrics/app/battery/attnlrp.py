"""AttnLRP (Achtibat et al. 2024) of a Llama-layout decoder, fine-tuned or prompted
(:mod:`attnmetrics.llm.attnlrp`, ``lxt``'s efficient rules), with ``--attnlrp``: a Kendall τ partner, a
flip-search and an ERASER ordering, and a token-view row (not a per-head partner: it spans every layer)."""

from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.llm.attnlrp import attnlrp


def _enabled(model, s) -> bool:
    """Asked for, and the model a Llama-layout decoder (``HFClassifier`` of family "llama", ``PromptedLM``)."""
    return bool(s.option("attnlrp")) and (model is None or getattr(model, "family", None) == "llama")


IMPORTANCE = Importance(
    "attnlrp",
    lambda model, tokens, lengths, s: attnlrp(model, tokens, lengths, memory_budget=memory_budget(tokens.device)),
    _enabled,
    order=42,
    head_partner=False,
    option={
        "flags": ("--attnlrp",),
        "dest": "attnlrp",
        "action": "store_true",
        "default": False,
        "help": "also AttnLRP (Achtibat et al. 2024: layer-wise relevance propagation with attention-aware rules, "
        "lxt's efficient implementation; Llama-layout decoders, fine-tuned or prompted) for the predicted class's "
        "logit as a Kendall tau partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "attnlrp": "Achtibat et al. 2024 (ICML), as lxt's efficient implementation (Gradient x Input with modified "
        "backward passes): LRP-epsilon at epsilon -> 0 on linear layers (biases absorb), identity rule on RMSNorm's "
        "1/rms (held constant) and on SiLU, uniform rule on the gated MLP's product (1/2 each) and on both attention "
        "matrix products (values 1/2, queries and keys 1/4 each), the softmax by its own gradient (the paper's "
        "softmax rule); relevance of each token's input embedding summed over its dimensions, for the predicted "
        "class's logit (backward seeded with 1), signed, not normalised; a prompted model's template positions "
        "take relevance and are not scored"
    },
)
