"""ALTI-Logit (Ferrando et al. 2023) on a pre-RMSNorm Llama-layout decoder."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics.llm.alti import alti_layer
from attnmetrics.llm.layers import (
    DEFAULT_MEMORY_BUDGET,
    decoder_matrix,
    heads_out,
    per_query,
    rms_linear,
    rms_scale,
    run,
    target_values,
)


def _contributions_chunk(model):
    """A ``run`` chunk function: ALTI-Logit's ``[b, w, C]`` (every class's logit, every position)."""

    def per_chunk(layers, trace, budget):
        final = trace.final
        state = trace.x[-1][trace.rows, trace.pooled]  # the final norm's input at p [b, d]
        scale = rms_scale(state, final)[:, None]  # [b, 1, 1]
        head = decoder_matrix(model, state)  # [d, C]
        total, rolled = None, None  # rolled: M^{l-1} = C_{l-1} ... C_0, float64
        for index, layer in enumerate(layers):
            f = heads_out(layer, trace.v[index])  # [b, H, w, d]
            g = torch.einsum("bhj,bhjd->bjd", trace.pooled_row(index), f)  # token j's share of p's attention output
            delta = (rms_linear(g, final, scale) @ head).double()  # its logits through the final norm's linear part
            total = delta if rolled is None else total + torch.einsum("bjs,bjc->bsc", rolled, delta)
            if index < len(layers) - 1:
                c = per_query(layers, trace, index, False, budget, alti_layer).double()
                rolled = c if rolled is None else torch.bmm(c, rolled)
        return total

    return per_chunk


def alti_logit_contributions(
    model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> Tensor:
    """ALTI-Logit's contributions to every class's logit (:func:`alti_logit`): ``[B, T, C]`` in the
    model's float dtype, ``[b, t, c]`` item t's contribution to logit c, zero past each row's length.
    Args and errors as :func:`alti_logit`."""
    classes = _classes(model)
    return run(model, tokens, lengths, memory_budget, "alti_logit", _contributions_chunk(model), trailing=(classes,))


def _classes(model) -> int:
    """The decoder's number of logits C."""
    d = model.base.get_input_embeddings().weight
    with torch.no_grad():
        return int(model.decoder(torch.zeros(1, d.shape[1], dtype=d.dtype, device=d.device)).shape[-1])


def alti_logit(
    model, tokens: Tensor, lengths: Tensor, *, target: str = "logit", memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> Tensor:
    """ALTI-Logit (Ferrando, Gállego, Tsiamas & Costa-jussà 2023, ACL, "Explaining How Transformers Use
    Context to Build Predictions", sec. 3, eqs. 9-12; their code mt-upc/logit-explanations,
    ``ModelWrapper.get_logit_contributions`` and ``track2input_tokens``): each layer's attention
    block's direct update of the decision's logit, split over the tokens it reads, and tracked back
    to the input tokens through ALTI's rolled-out contributions of the layers below; summed over the
    layers.

    With p the deciding position (a fine-tuned decoder's last real token; a prompted model's answer
    position), ``f_h(x_j) = (RMSNorm_1(x_j) W_V^{g(h)} + b_V^{g(h)}) W_O^h`` (grouped values: query
    head h reads key/value head g(h)) and ``x`` each layer's input:

    - layer l's logit update by token j (the paper's "∆logit^l_{w<-j}", their ``aff_x_j``, the affine
      version with ``b_V`` that the paper reports): ``D_l[j, c] = (gamma_f * g_l[j] / rms(x^L_p)) . W_c``
      with ``g_l[j] = sum_h A^l_h[p, j] f_h(x^l_j)`` (no residual, no ``b_O``), ``gamma_f`` and
      ``rms(x^L_p)`` the final RMSNorm's weight and the model's own scale at p (its linear part at the
      final state: exact, since RMSNorm has no centring and no bias), ``W_c`` the decoder's row of
      class c (a fine-tuned head's ``score``; a prompted model's label word's row of ``lm_head``);
    - tracked to the input (the paper's eq. 12, ``track2input_tokens``): ``R[s, c] = D_0[s, c] +
      sum_{l >= 1} sum_j D_l[j, c] M^{l-1}[j, s]`` with ``M^{l-1} = C_{l-1} ... C_0`` the product of
      ALTI's per-layer contribution matrices of the layers below (:func:`attnmetrics.llm.alti`:
      residual included, rows normalised), taken in float64.

    The predicted class's ``R[s, t]`` (``target="logit"``, the default) or its difference to the
    runner-up's, ``R[s, t] - R[s, r]`` (``target="difference"``; t the predicted class, r the class
    of the next largest logit). Why the logit by default: the paper explains a contrastive pair
    (the correct token against a foil the task gives, e.g. the wrong agreement) by the logit
    difference; a classifier has no given foil (the runner-up is itself decided by the input), and
    the battery's other logit targets (Chefer's rollout, DecompX) explain the predicted class's
    logit, so ALTI-Logit is compared with them on the same target. The difference removes what
    raises every label word alike (in a prompted model, "a sentiment word comes next"), which the
    softmax ignores: use ``target="difference"`` to explain the decision's margin. With one sigmoid
    logit z both are ``±z``'s (class 0's logit is -z).

    Not in R (as in the paper, where they are separate terms): the decision position's own
    embedding on the residual path, the feed-forward networks' updates, ``b_O`` and the decoder's
    bias; so the items' R do not sum to the logit. Template positions of a prompted model take part
    (their updates and mixing are computed) and are not scored. Where we differ from the authors'
    code: their distances are ``F.pairwise_distance(p=1)`` (1e-6 added to each entry) and their LN's
    scale is a LayerNorm's; ours are exact and RMSNorm's (the code covers GPT-2, OPT and BLOOM only).

    Args:
        model, tokens, lengths, memory_budget: as :func:`attnmetrics.llm.attention_value_norm`.
        target: ``"logit"`` or ``"difference"`` (above).

    Returns:
        ``[B, T]`` in the model's float dtype: each item's signed contribution (logit units, not
        normalised; positive where it raises the target), zero past each row's length.
    """
    if target not in ("logit", "difference"):
        raise ValueError(f"target must be 'logit' or 'difference', got {target!r}")
    contributions = _contributions_chunk(model)

    def per_chunk(layers, trace, budget):
        return target_values(trace.logits, contributions(layers, trace, budget), target)

    return run(model, tokens, lengths, memory_budget, "alti_logit", per_chunk)
