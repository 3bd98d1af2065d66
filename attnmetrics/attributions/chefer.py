"""Gradient-weighted attention rollout (Chefer, Gur & Wolf 2021, ICCV)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics._validation import DEFAULT_MEMORY_BUDGET
from attnmetrics.attributions.layers import _masked_rows, _pooled, _pooled_logits, _predicted_logit, _rollout_row, _run
from attnmetrics.protocol import token_mask


def gradient_weighted_rollout(
    model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> Tensor:
    """Gradient-weighted attention rollout (Chefer, Gur & Wolf 2021, ICCV, "Generic
    Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers",
    sec. 3, eqs. 5-6, the rule for self-attention encoders): each layer's attention weighted by
    its gradient, heads averaged, accumulated through the layers with the identity.

    With ``A_b`` ``[H, T, T]`` layer b's attention probabilities (after the softmax, as the model
    multiplies the values with them) and ``∇A_b = ∂y_t / ∂A_b`` the gradient of the predicted
    class's logit ``y_t`` (the class :func:`attnmetrics.outputs.decision` picks; a one-logit
    sigmoid model's class-0 logit is ``-z``, so ``y_t = ±z``), each ``A_b`` held as a free variable
    (the gradient is not taken through its softmax): ``R = I`` ``[T, T]``, then for
    ``b = 0 .. L-1`` ``Ā_b = E_h[(∇A_b ⊙ A_b)^+]`` (elementwise product, negatives clipped to 0,
    mean over heads) and ``R <- R + Ā_b R``, i.e. the pooled row of
    ``(I + Ā_{L-1}) ⋯ (I + Ā_1)(I + Ā_0)``. The importance of token j is ``R[p, j]``, p the pooled
    position (``[CLS]``; our GPT's ``<extract>``). This is the ICCV 2021 rule, not the same authors' CVPR 2021
    "Transformer Interpretability Beyond Attention Visualization", which weights LRP relevances of
    the attention, not the attention itself, by the gradients. The logit is the target as in the
    authors' code (a one-hot of the logits), not a probability; :func:`attnmetrics.gradient_importance`
    differentiates every class's probability and sums their absolute values, which this rule, whose
    clip needs the gradient's sign for one class, cannot take.

    As the other methods here, the returned layout drops the lead token's column, so ``R[p, p]``
    (the ``[CLS]`` self-relevance, at least 1 from the identity) is not in the result; ``[SEP]``
    and padding are 0 (our GPT: ``<start>`` dropped, and ``R[p, p]`` is ``<extract>``'s, 0 as the
    trailing token's). On a causal model each ``A_b`` is 0 above the diagonal, and so is ``Ā_b``.
    Padded keys and queries are masked out of every ``Ā_b`` and of ``I``, so a row's scores do not
    depend on the batch's padding. One forward and one backward per chunk of
    rows: the rows' target logits are summed (rows do not interact), and the gradient is taken with
    respect to every layer's probabilities at once; the product is taken in float64.

    Args:
        model, tokens, lengths, memory_budget: as :func:`attention_value_norm` (a chunk's
            differentiable trace is budgeted at about four times a plain one's).

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's relevance ``R[p, j]`` (non-negative, not normalised nor bounded, of no single unit:
        each ``Ā_b`` is in the logit's units, ``R`` sums products of them across layers), zero past
        each row's real tokens.

    Raises:
        TypeError, ValueError: as :func:`attention_value_norm`; also logits that are not
            ``[B, C]`` or not finite.
    """

    def per_chunk(layers, tokens, lengths, trace, budget):
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        pooled = _pooled(model, lengths)
        target = _predicted_logit(_pooled_logits(model, trace, rows, pooled))
        grads = torch.autograd.grad(target.sum(), trace.probs)
        width = tokens.shape[1]
        valid = token_mask(lengths, width)
        eye = torch.diag_embed(valid.to(trace.probs[0].dtype))  # I on each row's real positions
        matrices = []
        for index, (g, a) in enumerate(zip(grads, trace.probs)):
            if index == len(layers) - 1:  # only the pooled row of the last factor is read
                cam = (g[rows, :, pooled] * a[rows, :, pooled].detach()).clamp_min(0).mean(1)  # [b, T]
                matrices.append((eye[rows, pooled] + cam) * valid.to(cam.dtype))
            else:
                cam = (g * a.detach()).clamp_min(0).mean(1)  # [b, T, T]
                matrices.append(eye + _masked_rows(cam, lengths))
        return _rollout_row(matrices)

    return _run(model, tokens, lengths, memory_budget, "gradient_weighted_rollout", per_chunk, gradients=True)
