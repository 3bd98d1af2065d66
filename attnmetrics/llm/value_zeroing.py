"""Value Zeroing (Mohebbi et al. 2023) on a pre-RMSNorm Llama-layout decoder."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics.attributions.layers import _chunks, _rollout_row, _row_normalised
from attnmetrics.attributions.value_zeroing import _cosine_distance
from attnmetrics.llm.layers import DEFAULT_MEMORY_BUDGET, heads_out, run


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
    the deciding row ``[b, w]``)."""
    layer = layers[index]
    probs, mid, out = trace.probs[index], trace.mid[index], trace.x[index + 1]
    f = heads_out(layer, trace.v[index])  # [b, H, w, d]
    batch, width, d = mid.shape
    last = index == len(layers) - 1
    if last:  # only the deciding query
        rows, p = trace.rows, trace.pooled
        probs = probs[rows, :, p][:, :, None]  # [b, H, 1, w]
        mid, out = mid[rows, p][:, None], out[rows, p][:, None]  # [b, 1, d]
    queries = mid.shape[1]
    inter = max(w.shape[0] for w in layer.mlp.parameters() if w.dim() == 2)
    pairs = trace.valid.nonzero()  # (row, zeroed token j)
    per_pair = mid.element_size() * queries * (6 * d + 3 * inter)
    scores = torch.zeros(batch, queries, width, dtype=mid.dtype, device=mid.device)
    for part in _chunks(pairs.shape[0], per_pair, budget):
        b, j = pairs[part, 0], pairs[part, 1]
        altered = mid[b] - torch.einsum("nhq,nhd->nqd", probs[b, :, :, j], f[b, :, j])  # [n, Q, d]
        scores[b, :, j] = _cosine_distance(layer.after_attention(altered), out[b])
    if last:
        return _row_normalised(scores[:, 0])
    keep = trace.valid.to(scores.dtype)
    return _row_normalised(scores * keep[:, :, None] * keep[:, None, :])
