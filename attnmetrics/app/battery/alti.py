"""ALTI (Ferrando et al. 2022) of a BERT-like Hugging Face classifier, of our GPT classifier with its
extract read-out (GPT-1's, ``--attention extract``) or of a Llama-layout decoder, fine-tuned or prompted
(:mod:`attnmetrics.llm`: Ferrando et al. 2023's pre-norm contributions), with ``--alti``: a Kendall τ partner, a flip-search
and an ERASER ordering, and a token-view row (not a per-head partner: it mixes every layer's heads)."""

from attnmetrics import llm
from attnmetrics.app.battery.registry import Importance, memory_budget
from attnmetrics.attributions import alti, supports


def _compute(model, tokens, lengths, s):
    """attnmetrics.llm's on a Llama-layout decoder (fine-tuned or prompted), else attnmetrics.attributions'."""
    method = llm.alti if llm.supports(model) else alti
    return method(model, tokens, lengths, memory_budget=memory_budget(tokens.device))


def _enabled(model, s) -> bool:
    return bool(s.option("alti")) and (model is None or supports(model) or llm.supports(model))


IMPORTANCE = Importance(
    "alti",
    _compute,
    _enabled,
    order=35,
    head_partner=False,
    option={
        "flags": ("--alti",),
        "dest": "alti",
        "action": "store_true",
        "default": False,
        "help": "also ALTI (Ferrando et al. 2022: L1-distance contributions of each attention block, LayerNorm "
        "included, rolled out; BERT-like Hugging Face models, our GPT with --attention extract, Llama-layout decoders "
        "fine-tuned or prompted) as a Kendall tau "
        "partner, flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "alti": "Ferrando et al. 2022: per layer max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1) normalised over j, "
        "T_i(x_j) through LayerNorm's linear part at the model's own denominator, rolled out without residual, "
        "the [CLS] row; a Llama-layout decoder (attnmetrics.llm, Ferrando et al. 2023): T_i(x_j) = "
        "sum_h A_h[i, j] f_h(RMSNorm_1(x_j)) + [i = j] x_i against the residual stream after attention (no norm on the "
        "sum), the deciding position's row"
    },
)
