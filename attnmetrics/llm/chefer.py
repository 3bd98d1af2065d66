"""Chefer et al.'s gradient-weighted attention rollout (ICCV 2021) on a pre-RMSNorm Llama-layout decoder."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics.attributions.layers import _predicted_logit, _rollout_row
from attnmetrics.llm.layers import DEFAULT_MEMORY_BUDGET, run


def gradient_weighted_rollout(
    model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> Tensor:
    """Gradient-weighted attention rollout (Chefer, Gur & Wolf 2021, ICCV, sec. 3, eqs. 5-6) on a
    pre-RMSNorm decoder, the rule of :func:`attnmetrics.gradient_weighted_rollout` unchanged.

    With ``A_b`` ``[H, T, T]`` layer b's attention probabilities per query head (the softmax's
    output, as the model multiplies its grouped values with them; read through the adapter's
    ``_attnmetrics_hook``) and ``∇A_b = ∂y_t/∂A_b`` the gradient of the predicted class's logit
    (a fine-tuned head's class; a prompted model's predicted label word's next-token logit; one
    sigmoid logit z: ±z), each ``A_b`` an intermediate of the model's own forward (the gradient
    runs through every later layer, not through ``A_b``'s own softmax): ``R = I``, then for
    ``b = 0 .. L-1`` ``R <- R + E_h[(∇A_b ⊙ A_b)^+] R``; the importance of item j is ``R[p, j]``, p
    the deciding position (a prompted model: the answer position, the template's positions in
    ``R`` but not scored).

    What the decoder changes: nothing in the rule; every ``A_b`` is causal (0 above the diagonal, and
    so is each factor), so ``R[p, j]`` sums over paths from j forward to p. The query heads are
    averaged, not the key/value heads (each query head has its own probabilities). ``R[p, p]``
    holds the identity's 1: in a fine-tuned decoder p is the last item, whose score includes it
    (BERT's ``[CLS]``, which held it, is not an item); a prompted model's p is the template's.

    Args, Raises: as :func:`attnmetrics.llm.attention_value_norm` (a chunk's differentiable trace
    is budgeted at about four times a plain one's).

    Returns:
        ``[B, T]`` in the model's float dtype: each item's relevance ``R[p, j]`` (non-negative, not
        normalised), zero past each row's length.
    """

    def per_chunk(layers, trace, budget):
        rows, pooled = trace.rows, trace.pooled
        target = _predicted_logit(trace.logits)
        grads = torch.autograd.grad(target.sum(), trace.probs)
        keep = trace.valid.to(trace.probs[0].dtype)
        eye = torch.diag_embed(keep)
        both = keep[:, :, None] * keep[:, None, :]
        matrices = []
        for index, (g, a) in enumerate(zip(grads, trace.probs)):
            if index == len(layers) - 1:  # only the deciding row of the last factor is read
                cam = (g[rows, :, pooled] * a[rows, :, pooled].detach()).clamp_min(0).mean(1)  # [b, w]
                matrices.append((eye[rows, pooled] + cam) * keep)
            else:
                cam = (g * a.detach()).clamp_min(0).mean(1)  # [b, w, w]
                matrices.append(eye + cam * both)
        return _rollout_row(matrices)

    return run(model, tokens, lengths, memory_budget, "gradient_weighted_rollout", per_chunk, gradients=True)
