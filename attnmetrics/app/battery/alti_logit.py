"""ALTI-Logit (Ferrando et al. 2023) of a Llama-layout decoder, fine-tuned or prompted
(:mod:`attnmetrics.llm`), with ``--alti-logit``: a Kendall τ partner, a flip-search and an ERASER
ordering, and a token-view row (not a per-head partner: it mixes every layer's heads)."""

from attnmetrics import llm
from attnmetrics.app.battery.registry import Importance, memory_budget

IMPORTANCE = Importance(
    "alti_logit",
    lambda model, tokens, lengths, s: llm.alti_logit(
        model, tokens, lengths, memory_budget=memory_budget(tokens.device)
    ),
    lambda model, s: bool(s.option("alti_logit")) and (model is None or llm.supports(model)),
    order=41,
    head_partner=False,
    option={
        "flags": ("--alti-logit",),
        "dest": "alti_logit",
        "action": "store_true",
        "default": False,
        "help": "also ALTI-Logit (Ferrando et al. 2023: each layer's attention update of the predicted class's logit "
        "through the final norm, split over the tokens it reads and tracked to the input by ALTI's rolled-out "
        "contributions of the layers below; Llama-layout decoders, fine-tuned or prompted) as a Kendall tau partner, "
        "flip-search and ERASER ordering, and token-view row",
    },
    conventions={
        "alti_logit": "Ferrando et al. 2023 (ACL, eq. 12): R[s] = D_0[s] + sum_{l>=1} sum_j D_l[j] M^{l-1}[j, s], "
        "D_l[j] = W_t . (gamma_f * sum_h A^l_h[p, j] f_h(RMSNorm_1(x_j)) / rms(x^L_p)) the attention block's direct "
        "update of the predicted class's logit (not the logit difference; no residual, b_O, MLP or decoder bias), "
        "M^{l-1} ALTI's rolled-out pre-norm contributions of the layers below; signed, logit units, not normalised"
    },
)
