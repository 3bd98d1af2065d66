"""ALTI (Ferrando et al. 2022)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics._validation import DEFAULT_MEMORY_BUDGET
from attnmetrics.attributions.layers import (
    _centred,
    _heads_map,
    _LayerStates,
    _rolled_out,
    _row_normalised,
    _run,
    _scale,
)
from attnmetrics.protocol import token_mask


def alti(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """ALTI (Ferrando et al. 2022, EMNLP, "Measuring the Mixing of Contextual Information in the
    Transformer", sec. 2-3): distance-based token-to-token contributions of each attention block,
    LayerNorm included, rolled out through the layers.

    Per layer, ``T_i(x_j) = LN_1'(z_ij)`` (the package docstring's ``z_ij``, through LayerNorm's
    linear part ``gamma_1 * (u - mean(u)) / s(i)``), so that the block's output is
    ``y_i = sum_j T_i(x_j) + LN_1'(b_O) + beta_1`` exactly; ``d_ij = ||y_i - T_i(x_j)||_1`` (eq. 8,
    the Manhattan distance), ``c_ij = max(0, ||y_i||_1 - d_ij)`` normalised to sum 1 over j (eq. 9-10;
    the authors' ``normalize_contributions(..., scaling='min_sum', resultant_norm=...)``). ALTI is
    the pooled row of ``C_{L-1} ... C_1 C_0`` (their ``compute_joint_attention``: no residual added,
    it is in ``z_ii``; the first layer's input is the embeddings' output).

    A row whose contributions are all 0 (every ``d_ij`` at least ``||y_i||_1``: the biases outweigh
    every token) stays 0, where the authors' normalisation would divide by 0. On a causal model
    (our GPT) the matrices are 0 above the diagonal (``T_i(x_j) = 0`` for j > i), and the first
    position, whose one contributor is itself, gets such a row whenever
    ``||y_0||_1 <= ||LN_1'(b_O) + beta_1||_1``: that only takes ``<start>``'s own share from the
    pooled row (nothing else reaches position 0), which the importance drops anyway.

    Where we differ (mt-upc/transformer-contributions ``src/contributions.py`` at 4f89039): their
    ``ln_std_coef`` (line 206) is ``1 / (pre_ln_states + eps).std(-1, unbiased=False)``, eps added to
    the states, where it changes nothing, rather than inside the root; ours is the model's own
    LayerNorm denominator ``sqrt(var(p_i) + eps)``, so ``y_i`` is the block's real output (theirs
    only within their assertion's tolerance; an earlier version used the unbiased std). Their
    distance (line 222) is ``F.pairwise_distance(..., p=1)``, which adds 1e-6 to every entry of the
    difference; ours is the exact L1 distance.

    Args, Raises: as :func:`attention_value_norm`.

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's share of the pooled position's last attention output, in [0, 1] (the shares of all
        positions, special tokens included, sum to 1), zero past each row's real tokens.
    """

    return _run(model, tokens, lengths, memory_budget, "alti", _rolled_out(model, _alti_layer))


def _alti_layer(layer, s: _LayerStates, queries, lengths) -> Tensor:
    """ALTI's contributions of one layer, rows normalised: ``[b, Q, T]`` (see :func:`alti`).

    ``T_i(x_j) = U_ij / s(i)`` with ``U_ij = sum_h A_h[i, j] phi_h(j) (+ psi_i at j = i)``,
    ``phi_h(j) = gamma_1 * centred(f_h(x_j))`` and ``psi_i = gamma_1 * centred(x_i)`` formed once
    per token (not per query), so ``d_ij = ||s(i) y_i - U_ij||_1 / s(i)``: one ``[Q, T, d]`` product
    and one distance pass."""
    ln = layer.ln_1
    rows = torch.arange(s.x.shape[0], device=s.x.device)[:, None]
    phi = torch.einsum("bhjk,hkd->bhjd", s.v, _heads_map(layer, lambda u: _centred(u) * ln.weight))  # [b, H, T, d]
    a = s.probs[rows, :, queries]  # [b, Q, H, T]
    u = torch.einsum("bqhj,bhjd->bqjd", a, phi)  # [b, Q, T, d], the residual not yet in
    scale = _scale(s.pre1[rows, queries], ln)  # [b, Q, 1]
    y = s.mid[rows, queries]  # [b, Q, d]: the block's output LN_1(p_i)
    target = y * scale
    distance = (target[:, :, None] - u).abs().sum(-1)
    psi = _centred(s.x[rows, queries]) * ln.weight  # [b, Q, d]
    own = u.gather(2, queries[:, :, None, None].expand(-1, -1, 1, u.shape[-1]))[:, :, 0]  # U_ii without psi_i
    distance = distance.scatter(-1, queries[..., None], (target - own - psi).abs().sum(-1, keepdim=True))
    distance = distance / scale
    c = (y.abs().sum(-1, keepdim=True) - distance).clamp_min(0)
    # a key no head attends to, other than i itself, adds T_i(x_j) = 0: its c_ij is 0 exactly (not
    # the rounding of ||y_i||_1 - ||y_i||_1, which a row whose own share is 0 would normalise)
    reached = (a != 0).any(2).scatter(-1, queries[..., None], True)
    c = c * reached.to(c.dtype)
    c = c * token_mask(lengths, c.shape[-1])[:, None].to(c.dtype)  # padded keys contribute nothing
    return _row_normalised(c)
