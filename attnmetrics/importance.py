"""Gradient-based token importance of Jain & Wallace 2019 (sec. 4.1): grad x input of the
output distribution with respect to the input embeddings, the attention held fixed.

Model-agnostic, over the protocol (:class:`attnmetrics.AttentionClassifier`); per-token
results cover the real tokens only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics.outputs import output_distribution
from attnmetrics.protocol import AttentionClassifier, real_tokens, token_mask


def gradient_importance(model: AttentionClassifier, tokens: Tensor, lengths: Tensor) -> Tensor:
    """Gradient-based token importance of Jain & Wallace 2019 (sec. 4.1, "Gradient").

    For every output class c, the gradient of p_c with respect to the input embeddings,
    with the attention weights detached (held fixed), times the embedding and summed
    over the embedding dimension (grad x input); the absolute values are summed over
    classes and L1-normalised over each row's real tokens.

    Args:
        model: any :class:`attnmetrics.AttentionClassifier`.
        tokens: [B, T] int64 token ids, special tokens included.
        lengths: [B] int64 positions per row, special tokens included.

    Returns:
        [B, T_real] importance in the same float dtype as the model's embeddings:
        non-negative, summing to 1 over each row's real tokens (0 on padding; a row
        whose gradients all vanish is left at 0).
    """
    was_training = model.training if hasattr(model, "training") else False
    if hasattr(model, "eval"):
        model.eval()
    try:
        embedded = model.embed(tokens).detach().requires_grad_(True)
        with torch.enable_grad():
            hidden = model.encode(embedded, lengths)
            attention = model.attend(hidden, lengths).detach()
            probs = output_distribution(model.decoder(torch.einsum("bt,bth->bh", attention, hidden)))
            score = torch.zeros(embedded.shape[:2], dtype=embedded.dtype, device=embedded.device)
            for c in range(probs.shape[1]):
                (grad,) = torch.autograd.grad(probs[:, c].sum(), embedded, retain_graph=c + 1 < probs.shape[1])
                score += (grad * embedded).sum(-1).abs()
    finally:
        if was_training:
            model.train()
    score, real = real_tokens(score.detach(), lengths, model)
    mask = token_mask(real, score.shape[1])
    score = score.masked_fill(~mask, 0)
    total = score.sum(1, keepdim=True)
    return torch.where(total > 0, score / total.clamp_min(torch.finfo(score.dtype).tiny), score)
