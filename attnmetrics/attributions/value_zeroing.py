"""Value Zeroing (Mohebbi et al. 2023)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics._validation import DEFAULT_MEMORY_BUDGET
from attnmetrics.attributions.layers import (
    _centred,
    _chunks,
    _heads_map,
    _heads_out,
    _masked_rows,
    _pooled,
    _rollout_row,
    _row_normalised,
    _run,
    _scale,
)
from attnmetrics.protocol import token_mask


def value_zeroing(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """Value Zeroing (Mohebbi et al. 2023, EACL, "Quantifying Context Mixing in Transformers",
    sec. 2): how much each layer's outputs change when one token's value vectors are zeroed,
    rolled out through the layers.

    Per layer l and token j: zero ``v_h(x_j)`` in every head of layer l (value bias included: the
    whole value vector, as the authors' ``customized_modeling_bert.py`` ``zero_value_index``),
    recompute layer l on its original input (attention weights unchanged, then ``b_O``, residual,
    ``LN_1``, the feed-forward network and ``LN_2``), and score ``S[i, j] = 1 - cos(h_i, h_i^(-j))``
    between token i's original and altered outputs (clipped at 0, as scikit-learn's
    ``cosine_distances`` that their ``scoring/value_zeroing.py`` calls); each row of ``S`` is
    divided by its sum over j (j = i included), and Value Zeroing is the pooled row of
    ``S_{L-1} ... S_1 S_0`` (their ``compute_joint_attention(score_matrix, res=False)``: no
    residual added; the first layer's input is the embeddings' output).

    All tokens of all rows at once: zeroing ``v(x_j)`` changes query i's pre-LayerNorm state by
    ``-sum_h A_h[i, j] f_h(x_j)`` (the weights do not depend on the values), so every altered
    layer runs from there (``LN_1``, feed-forward, ``LN_2``) as one batch of (row, j) pairs,
    chunked to the memory budget; the last layer only at the pooled position, the one its row of
    the product reads. On a causal model (our GPT) the weights are 0 on later keys, so zeroing
    token j changes only the queries at or after j (the others' distances are 0, up to rounding),
    as recomputing the layer under its causal mask would.

    Args, Raises: as :func:`attention_value_norm`.

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's share of the pooled position in [0, 1] (the shares of all positions, special tokens
        included, sum to 1 unless a layer's row of distances was all 0), zero past each row's real
        tokens.
    """

    maps: dict[int, Tensor] = {}  # per layer, once a call has enough positions (_zeroed_layer)
    seen = [0]

    def per_chunk(layers, tokens, lengths, trace, budget):
        pooled = _pooled(model, lengths)
        seen[0] += sum(trace.host_lengths)
        mapped = seen[0] * (layers[0].heads - 1) > layers[0].out.weight.shape[0]
        matrices = [
            _zeroed_layer(
                layer, trace, index, lengths, pooled if index == len(layers) - 1 else None, budget, maps, mapped
            )
            for index, layer in enumerate(layers)
        ]
        return _rollout_row(matrices)

    # rows of one length a group on the CPU: every (row, token) pair recomputes the layer for each
    # of the group's queries, padded ones included, so padding costs in full
    return _run(model, tokens, lengths, memory_budget, "value_zeroing", per_chunk, padding=0.0, small=0)


def _zeroed_layer(layer, trace, index, lengths, pooled, budget, maps=None, mapped=False) -> Tensor:
    """Value Zeroing's row-normalised distances of one layer, ``[b, T, T]`` (``[b, T]``: the pooled
    rows when ``pooled`` is given).

    Zeroing token j's values takes ``delta_ij = sum_h A_h[i, j] f_h(x_j)`` from query i's
    pre-LayerNorm state ``p_i``; ``LN_1`` is affine at the altered state's own denominator
    ``s_ij``, so the feed-forward network's first product is
    ``LN_1(p_i - delta_ij) W_1 = (P_i - sum_h A_h[i, j] F_h(j)) / s_ij + beta_1 W_1`` with
    ``P_i = (gamma_1 * centred(p_i)) W_1`` and ``F_h(j) = (gamma_1 * centred(f_h(x_j))) W_1``, each
    formed once per token. Where a row has more queries than heads, that costs
    ``H T d d_ff + Q T H d_ff`` multiply-adds a layer instead of the altered states' own
    ``Q T d d_ff``; the activation and the second product are per (query, token) pair either way.
    ``mapped``: ``F_h(j) = v_h(x_j) Z_h`` with ``Z_h = (W_O^h`` centred and scaled by ``gamma_1) W_1``
    ``[H, dh, d_ff]`` formed once a call (``maps[index]``: ``d^2 d_ff`` multiply-adds, which a call's
    rows repay once they hold more than ``d / (H - 1)`` positions), ``T d d_ff`` a row, not
    ``H T d d_ff``."""
    s = trace.layer(index)
    probs, v, x, out = s.probs, s.v, s.x, s.out
    batch, heads, width, dh = v.shape
    d = x.shape[-1]
    inter = layer.fc.weight.shape[0]
    pre = s.pre1  # [b, T, d], the block's pre-LayerNorm states
    f = _heads_out(layer, v)  # [b, H, T, d]
    if pooled is not None:  # only the pooled query
        rows = torch.arange(batch, device=x.device)
        probs = probs[rows, :, pooled][:, :, None]  # [b, H, 1, T]
        pre, out = pre[rows, pooled][:, None], out[rows, pooled][:, None]  # [b, 1, d]
    queries = pre.shape[1]
    ln = layer.ln_1
    factored = queries > heads
    if factored:  # the first product by token, not by pair
        w1 = layer.fc.weight.T
        if mapped:
            if index not in maps:
                maps[index] = _heads_map(layer, lambda u: _centred(u) * ln.weight) @ w1  # Z_h [H, dh, d_ff]
            heads_w1 = v @ maps[index]  # F_h(j) [b, H, T, d_ff]
        else:
            heads_w1 = (_centred(f) * ln.weight) @ w1  # F_h(j) [b, H, T, d_ff]
        pre_w1 = (_centred(pre) * ln.weight) @ w1  # P_i [b, Q, d_ff]
        bias_w1 = layer.fc(ln.bias)  # beta_1 W_1 + b_1
    pairs = token_mask(lengths, width).nonzero()  # (row, zeroed token j), every real position of a row
    per_pair = x.element_size() * queries * (6 * d + 3 * inter)
    scores = torch.zeros(batch, queries, width, dtype=x.dtype, device=x.device)
    for part in _chunks(pairs.shape[0], per_pair, budget):
        b, j = pairs[part, 0], pairs[part, 1]
        # minus what token j's values added to every query i of its row through W_O:
        # sum_h A_h[i, j] f_h(x_j) (the attention weights do not depend on the values)
        a = probs[b, :, :, j]  # [n, H, Q]
        altered = pre[b] - torch.einsum("nhq,nhd->nqd", a, f[b, :, j])  # [n, Q, d]
        mid = ln(altered)
        if factored:
            hidden = (pre_w1[b] - torch.einsum("nhq,nhe->nqe", a, heads_w1[b, :, j])) / _scale(altered, ln)
            ffn = layer.proj(layer.act(hidden + bias_w1))
        else:
            ffn = layer.ffn(mid)
        changed = layer.ln_2(ffn + mid)
        scores[b, :, j] = _cosine_distance(changed, out[b])
    if pooled is not None:
        return _row_normalised(scores[:, 0])
    return _row_normalised(_masked_rows(scores, lengths))


def _cosine_distance(a: Tensor, b: Tensor) -> Tensor:
    """``1 - cos(a, b)`` over the last dimension, as ``||a/|a| - b/|b|||^2 / 2`` (the same number,
    without the cancellation of ``1 - cos`` when the vectors nearly agree: float32 keeps about
    ``eps / sqrt(distance)`` relative precision instead of ``eps / distance``), so never below 0
    (scikit-learn's cosine_distances clips at 0); a zero vector has cosine 0 with anything. NaN
    where either norm is not finite (a state holding NaN or inf, or whose norm overflows), so that
    :func:`_real` names the row instead of counting the distance as a zero vector's 1."""
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    tiny = torch.finfo(a.dtype).tiny
    half = 0.5 * (a / na[..., None].clamp_min(tiny) - b / nb[..., None].clamp_min(tiny)).square().sum(-1)
    distance = torch.where((na == 0) | (nb == 0), torch.ones_like(half), half)
    return torch.where(torch.isfinite(na) & torch.isfinite(nb), distance, torch.full_like(half, float("nan")))
