"""Value Zeroing (Mohebbi et al. 2023) on a pre-RMSNorm Llama-layout decoder."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnmetrics.attributions.layers import _chunks, _rollout_row, _row_normalised
from attnmetrics.attributions.value_zeroing import _cosine_distance
from attnmetrics.llm.layers import DEFAULT_MEMORY_BUDGET, heads_out, rms_scale, run


def value_zeroing(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """Value Zeroing (Mohebbi et al. 2023, EACL, "Quantifying Context Mixing in Transformers",
    sec. 2) on a pre-RMSNorm decoder, the rule of :func:`attnmetrics.value_zeroing` carried over.

    Per layer l and token j: token j's value vectors are set to 0 in every key/value head of layer
    l (so in every query head that reads them: grouped-query attention shares them; Qwen2's ``b_V``
    included, the whole vector), layer l is recomputed on its original input with the same
    attention weights (the values do not enter the weights), the MLP block included, and
    ``S[i, j] = 1 - cos(h_i, h_i^(-j))`` between token i's original and altered layer outputs, the
    residual stream after the layer (the last layer's before the final norm: the norm is not part of
    the layer); each row of S divided by its sum, the deciding position's row of ``S_{L-1} ... S_0``.

    Computed as for BERT: zeroing ``v(x_j)`` moves query i's residual stream after attention by
    ``-sum_h A_h[i, j] f_h(x_j)``, so each altered layer runs from there
    (``m + mlp(RMSNorm_2(m))``) as one batch of (row, j) pairs chunked to the budget; the last
    layer at the deciding query only. Causal attention: zeroing j changes only queries at or after
    j (the others' distances are 0, up to rounding), as recomputing under the causal mask would. What
    the pre-norm changes: the layer's output keeps the whole residual stream (no LayerNorm after the
    sum), so the distances are those of a vector that carries its input along, smaller than BERT's;
    the row normalisation takes the scale out. Template positions of a prompted model are zeroed and
    mixed like any token, and not scored.

    Args, Raises: as :func:`attnmetrics.llm.attention_value_norm`.

    Returns:
        ``[B, T]`` in the model's float dtype: each item's share of the deciding position in [0, 1],
        zero past each row's length.
    """

    def per_chunk(layers, trace, budget):
        return _rollout_row([_zeroed_layer(layers, trace, index, budget) for index in range(len(layers))])

    return run(model, tokens, lengths, memory_budget, "value_zeroing", per_chunk)


def _zeroed_layer(layers, trace, index: int, budget: int) -> Tensor:
    """Value Zeroing's row-normalised distances of layer ``index``, ``[b, w, w]`` (the last layer's:
    the deciding row ``[b, w]``).

    Zeroing token j's values moves query i's residual stream after attention by
    ``-sum_h A_h[i, j] f_h(x_j)``; on a causal model only the queries i >= j read token j, so token
    j's altered states are those of queries ``j .. w - 1`` (one product for all the rows of a call;
    the others' distances are 0). A gated MLP (``down(act(gate(w)) * up(w))``: Llama's, Qwen2's,
    Mistral's) is factored where that is cheaper (more positions than twice the heads; not the
    last layer, one query): with ``w = RMSNorm_2(m_i - sum_h A_h[i, j] f_h(x_j)) = s_ij * gamma *
    (m_i - ...)``, ``gate(w) = s_ij * (G m_i - sum_h A_h[i, j] G f_h(x_j)) + b`` (G the gate's
    weight times ``gamma``: the products ``G m_i`` and ``G f_h(x_j)`` once per token and head), the
    same for ``up``; only ``down`` runs per (i, j)."""
    layer = layers[index]
    probs, mid, out = trace.probs[index], trace.mid[index], trace.x[index + 1]
    f = heads_out(layer, trace.v[index])  # [b, H, w, d]
    batch, width, d = mid.shape
    valid = trace.valid
    if index == len(layers) - 1:
        return _deciding_row(layer, trace, probs, mid, out, f, budget)
    mlp = layer.mlp
    gated = all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))
    factored = gated and callable(getattr(mlp, "act_fn", None)) and width > 2 * layer.heads
    inter = max(w.shape[0] for w in mlp.parameters() if w.dim() == 2)
    if factored:
        inter = mlp.gate_proj.out_features
        # the gate's and the up projection's weights times gamma, applied to m_i and to every f_h(x_j)
        gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]) * layer.norm_2.weight  # [2 inter, d]
        m_gu, f_gu = mid @ gu.T, f @ gu.T  # [b, w, 2 inter], [b, H, w, 2 inter]
        bias = [p.bias if p.bias is not None else gu.new_zeros(inter) for p in (mlp.gate_proj, mlp.up_proj)]
        bias = torch.cat(bias)
    # what a row holds for one token j: its queries' altered states, products and MLP states
    per_row = mid.element_size() * width * (3 * d + (2 * inter if factored else 0) + 4 * inter)
    scores = torch.zeros(batch, width, width, dtype=mid.dtype, device=mid.device)
    for rows in _chunks(batch, per_row, budget):
        for j in range(width):
            a = probs[rows, :, j:, j].transpose(1, 2)  # [n, w - j, H]: queries j .. w - 1
            altered = torch.baddbmm(mid[rows, j:], a, f[rows, :, j], alpha=-1)  # [n, w - j, d]
            if factored:
                pre = torch.baddbmm(m_gu[rows, j:], a, f_gu[rows, :, j], alpha=-1)
                gate, up = pre.mul_(rms_scale(altered, layer.norm_2)).add_(bias).split(inter, -1)
                new = altered + mlp.down_proj(mlp.act_fn(gate) * up)
            else:
                new = layer.after_attention(altered)
            scores[rows, j:, j] = _cosine_distance(new, out[rows, j:])
    pair = valid[:, :, None] & valid[:, None, :]
    return _row_normalised(torch.where(pair, scores, torch.zeros_like(scores)))


def _deciding_row(layer, trace, probs, mid, out, f, budget: int) -> Tensor:
    """The last layer's distances at the deciding query p only, ``[b, w]``: each token j <= p
    zeroed in turn, the layer rerun from its residual stream after attention."""
    batch, width, d = mid.shape
    rows = torch.arange(batch, device=mid.device)
    p = trace.pooled
    a = probs[rows, :, p].transpose(1, 2)  # [b, w, H]: the deciding query's row
    inter = max(w.shape[0] for w in layer.mlp.parameters() if w.dim() == 2)
    per_row = mid.element_size() * width * (3 * d + 4 * inter)
    scores = torch.zeros(batch, width, dtype=mid.dtype, device=mid.device)
    for part in _chunks(batch, per_row, budget):
        r = rows[part]
        moved = mid[r, p[part]][:, None] - torch.einsum("bjh,bhjd->bjd", a[part], f[part])  # [n, w, d]
        scores[part] = _cosine_distance(layer.after_attention(moved), out[r, p[part]][:, None])
    keep = trace.valid & (torch.arange(width, device=mid.device) <= p[:, None])
    return _row_normalised(torch.where(keep, scores, torch.zeros_like(scores)))
