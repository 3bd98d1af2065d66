"""Gradient-based token importance of Jain & Wallace 2019 (sec. 4.1): grad x input of the
output distribution with respect to the input embeddings, the attention held fixed.

Model-agnostic, over the protocol (:class:`attnmetrics.AttentionClassifier`); per-token
results cover the real tokens only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics._validation import check_logits, check_model_inputs
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
        lengths: [B] integer positions per row, special tokens included, in
            ``[lead + trail, T]``.

    Returns:
        [B, T - lead] importance in the same float dtype as the model's embeddings:
        non-negative, summing to 1 over each row's real tokens (0 on padding; a row
        whose gradients all vanish is left at 0).

    Raises:
        TypeError: ``model`` does not implement the protocol; tokens/lengths not tensors.
        ValueError: the input checks of :func:`attnmetrics.leave_one_out` (same messages):
            tokens not ``[B, T]`` int64 or with negative ids, an empty batch, lengths not
            ``[B]`` integers in ``[lead + trail, T]`` or on another device, ``model.lead``
            or ``model.trail`` not an int >= 0; embeddings or logits that are not finite
            (or logits not ``[B, C]``); an importance that is not finite (NaN or inf
            gradients w.r.t. the embeddings), each naming the first bad row.
    """
    lengths = check_model_inputs(model, tokens, lengths)
    was_training = model.training if hasattr(model, "training") else False
    if hasattr(model, "eval"):
        model.eval()
    try:
        embedded = model.embed(tokens).detach().requires_grad_(True)
        valid = token_mask(lengths, tokens.shape[1])
        _check_rows(
            torch.isfinite(embedded.detach()).flatten(2).all(2) | ~valid,
            "model.embed returned NaN or infinite embeddings in row {row}",
        )
        with torch.enable_grad():
            hidden = model.encode(embedded, lengths)
            attention = model.attend(hidden, lengths).detach()
            logits = model.decoder(torch.einsum("bt,bth->bh", attention, hidden))
            logits = check_logits(
                logits, tokens.shape[0], source="model", inputs="the input rows", on=" on the input rows"
            )
            probs = output_distribution(logits)
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
    _check_rows(
        torch.isfinite(score).all(1, keepdim=True) & torch.isfinite(total),
        "gradient importance is not finite in row {row}: the gradients of the output probabilities "
        "w.r.t. the embeddings, times the embeddings, hold NaN or inf, or overflow",
    )
    return torch.where(total > 0, score / total.clamp_min(torch.finfo(score.dtype).tiny), score)


def _check_rows(ok: Tensor, what: str) -> None:
    """ValueError ``what``, its ``{row}`` the first row of ``ok`` [B, ...] (bool) with a False entry."""
    bad = ~ok.flatten(1).all(1)
    if bad.any():
        raise ValueError(what.format(row=int(bad.nonzero()[0])))
