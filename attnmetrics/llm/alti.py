"""ALTI (Ferrando et al. 2022) on a pre-RMSNorm Llama-layout decoder: the per-layer contributions
that Ferrando et al. 2023 use for decoder LMs (their ``M``), rolled out."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics.attributions.layers import _rollout_row, _row_normalised
from attnmetrics.llm.layers import DEFAULT_MEMORY_BUDGET, mixing, per_query, run


def alti_layer(probs, f, x, mid, queries, valid) -> Tensor:
    """One layer's ALTI contributions ``[n, Q, w]``, rows normalised (see :func:`alti`)."""
    t = mixing(probs, f, x, queries)  # [n, Q, w, d]
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    y = mid[rows, queries]  # [n, Q, d]: the residual stream after attention
    distance = (y[:, :, None] - t).abs().sum(-1)
    c = (y.abs().sum(-1, keepdim=True) - distance).clamp_min(0)
    c = c * valid[:, None].to(c.dtype)  # padded keys contribute nothing
    return _row_normalised(c)


def alti_matrices(layers, trace, budget: int, last: bool = True) -> list[Tensor]:
    """Every layer's ALTI matrix ``[b, w, w]`` (the last layer's: the deciding row ``[b, w]``;
    ``last=False``: every layer but the last)."""
    count = len(layers) if last else len(layers) - 1
    return [per_query(layers, trace, index, index == len(layers) - 1, budget, alti_layer) for index in range(count)]


def alti(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """ALTI (Ferrando et al. 2022, EMNLP, sec. 2-3) on a pre-RMSNorm decoder, as Ferrando et al. 2023
    (ACL, "Explaining How Transformers Use Context to Build Predictions", sec. 3; their code
    mt-upc/logit-explanations ``src/contributions.py``) apply it to decoder LMs: the distance-based
    contributions of each layer's attention block, residual included, rolled out through the layers;
    the deciding position's row.

    Per layer, ``T_i(x_j) = sum_h A_h[i, j] f_h(x_j) + [i = j] x_i`` with ``f_h(x_j) =
    (RMSNorm_1(x_j) W_V^{g(h)} + b_V^{g(h)}) W_O^h`` (query head h reads key/value head g(h)), so that
    ``y_i = sum_j T_i(x_j) + b_O`` is the residual stream after the attention block exactly (their
    ``attn_res_output``; ``b_O`` is 0 in Llama and Qwen2); ``c_ij = max(0, ||y_i||_1 -
    ||y_i - T_i(x_j)||_1)``, each row divided by its sum (a row of zeros stays 0); the importance of
    token j is the deciding position p's row of ``C_{L-1} ... C_0`` at j.

    What the pre-norm changes from BERT's ALTI (:func:`attnmetrics.alti`): there the block's output is
    ``LN_1`` of the sum, so every ``T_i(x_j)`` goes through LayerNorm's linear part at i's scale; here
    no norm acts on the sum (RMSNorm_1 acts on each token j before its values, exactly, inside
    ``f_h``), so ``T_i(x_j)`` is the raw vector that token j (and, for j = i, the residual) adds to
    i's residual stream, and the residual, whose norm grows with depth, usually dominates the row.
    The feed-forward network is not decomposed (as in both papers). Template positions of a prompted
    model take part in the product (they mix like any token) and are not scored.

    Args, Raises: as :func:`attnmetrics.llm.attention_value_norm`.

    Returns:
        ``[B, T]`` in the model's float dtype: each item's share of the deciding position's residual
        stream after the last attention block, in [0, 1] (the shares of all positions, template
        included, sum to 1), zero past each row's length.
    """

    def per_chunk(layers, trace, budget):
        return _rollout_row(alti_matrices(layers, trace, budget))

    return run(model, tokens, lengths, memory_budget, "alti", per_chunk)
