"""GlobEnc (Modarressi et al. 2022)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics._validation import DEFAULT_MEMORY_BUDGET
from attnmetrics.attributions.layers import (
    _centred,
    _heads_map,
    _LayerStates,
    _masked_rows,
    _pooled,
    _rollout_row,
    _run,
    _scale,
)


def globenc(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """GlobEnc (Modarressi et al. 2022, NAACL, sec. 3): norm-based token-to-token attributions of
    each whole encoder layer but its feed-forward network, rolled out through the layers.

    Per layer, ``N[i, j] = || LN_2'(LN_1'(z_ij)) ||_2`` with ``z_ij`` the package docstring's (each
    head's ``A_h[i, j] f_h(x_j)`` summed, plus the residual ``x_i`` when ``j = i``) and
    ``LN_k'(u) = gamma_k * (u - mean(u)) / s_k(i)`` each LayerNorm's linear part at the model's own
    denominator ``s_k(i) = sqrt(var(pre-LN state of i) + eps)`` (biases ``b_O``, ``beta_1``,
    ``beta_2`` left out; the FFN enters only through ``s_2``): "N_Enc", the authors'
    ``modeling_bert.py`` ``BertNormOutput`` (post_ln_layer) then ``BertLayer`` (post_ln2_norm).
    GlobEnc is the pooled row of ``N_{L-1} ... N_1 N_0``, the raw norms multiplied without
    residual or renormalisation, as their ``AttentionRollout.compute_joint_attention`` (the first
    layer's input is the embeddings' output).

    Args, Raises: as :func:`attention_value_norm`.

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's GlobEnc score (non-negative, the product of norms: not normalised), zero past each
        row's real tokens.
    """

    def per_chunk(layers, tokens, lengths, trace, budget):
        pooled = _pooled(model, lengths)
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        matrices = [_masked_rows(_norm_enc(layer, trace.layer(index)), lengths) for index, layer in enumerate(layers)]
        matrices[-1] = matrices[-1][rows, pooled]  # only the pooled row of the last factor is read
        return _rollout_row(matrices)

    return _run(model, tokens, lengths, memory_budget, "globenc", per_chunk)


def _norm_enc(layer, s: _LayerStates) -> Tensor:
    """GlobEnc's N_Enc of one layer, every query: ``[b, T (i), T (j)]`` (see :func:`globenc`).

    ``LN_2'(LN_1'(z)) = K z / (s_1 s_2)`` with ``K`` the fixed linear map "centre, times gamma_1,
    centre, times gamma_2" (elementwise: no matrix is formed), so with ``g_h(j) = K f_h(x_j)`` and
    ``a_h = A_h[i, j]``, ``||K z_ij||^2 = a^T G_j a`` (``G_j`` the heads' Gram matrix of the
    ``g_h(j)``, ``[H, H]``), plus ``2 a . <g_h(i), K x_i> + ||K x_i||^2`` at ``j = i`` (the
    residual): ``T H^2 d + T^2 H^2`` multiply-adds a layer and row instead of the ``[T, T, d]``
    vectors' ``T^2 H d``, and no state larger than the values' ``[T, H, d]``."""
    ln1, ln2 = layer.ln_1, layer.ln_2

    def k(u):
        return _centred(_centred(u) * ln1.weight) * ln2.weight

    g = torch.einsum("bhjk,hkd->bjhd", s.v, _heads_map(layer, k))  # g_h(j) = K f_h(x_j) [b, T (j), H, d]
    gram = g @ g.transpose(-1, -2)  # [b, T (j), H, H]
    a = s.probs.permute(0, 3, 2, 1)  # [b, T (j), T (i), H]
    squared = ((a @ gram) * a).sum(-1).transpose(1, 2)  # [b, T (i), T (j)]
    kx = k(s.x)  # K x_i [b, T, d]
    cross = (g @ kx[..., None])[..., 0]  # <g_h(i), K x_i> [b, T, H]
    own = 2 * (s.probs.diagonal(dim1=-2, dim2=-1).transpose(1, 2) * cross).sum(-1) + kx.square().sum(-1)
    squared = squared + torch.diag_embed(own)
    scale = _scale(s.pre1, ln1) * _scale(s.pre2, ln2)  # [b, T, 1]
    return squared.clamp_min(0).sqrt() / scale
