"""Attention rollout (Abnar & Zuidema 2020, sec. 3) over ragged batches, on the C++ kernel
``attnmetrics::attention_rollout``: each row's chain of L x L products, rows in parallel."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnmetrics._ops import ops
from attnmetrics._validation import check_float, check_lengths
from attnmetrics.protocol import token_mask


def attention_rollout(attentions: Tensor, lengths: Tensor | None = None, residual: float = 0.5) -> Tensor:
    """Attention rollout: how much each position's final representation draws on each input token.

    For row ``b`` with ``L = lengths[b]`` valid positions and every layer ``l``, the head
    mean ``Ā_l = mean_h attentions[b, l, h, :L, :L]`` is mixed with the residual
    connection, ``M_l = (1 − residual) · Ā_l + residual · I``, each row of ``M_l`` is
    divided by its sum, and the rollout is the product through the layers,
    ``R = M_{n−1} ⋯ M_1 M_0`` (Abnar & Zuidema 2020, sec. 3, with their residual 0.5;
    docs/definitions.md §17). ``R[i, j]`` is the share of position i's last-layer
    representation traced back to input token j; row i of a model's pooled position
    (``[CLS]``, GPT's extract token) is the importance score. The renormalisation makes
    rows that do not sum to 1 on the valid block legal (e.g. attention that leaked mass
    to padding); a row summing to 0 stays 0.

    Args:
        attentions: ``[B, layers, heads, T, T]`` float32 or float64, the attention
            probabilities of every layer (query × key), as Hugging Face models return
            them with ``output_attentions=True`` (stack them on dim 1). Only each row's
            valid ``L × L`` block is read; it must be finite and non-negative. Any strides.
            B, layers, heads ≥ 1.
        lengths: ``[B]`` integer valid-prefix lengths in ``[0, T]``; ``None`` means T.
        residual: weight of the identity (the residual connection), in ``[0, 1]``;
            0 rolls out the raw attention, 1 gives the identity.

    Returns:
        ``[B, T, T]`` in attentions' dtype and device: each row's rollout on its
        ``L × L`` block (its rows sum to 1 unless a mixed row summed to 0), zero elsewhere.
        The CPU and CUDA results agree to rounding, not bit for bit: the layers' products
        run through BLAS on the CPU and cuBLAS on the GPU, which sum in different orders
        (one layer multiplies nothing and is the same bits on both).

    Raises:
        TypeError: ``attentions`` is not a tensor.
        ValueError: wrong dtype, shape, device (meta) or empty batch; bad ``lengths``;
            ``residual`` outside [0, 1]; NaN, infinite or negative attention in a valid
            block; an input that requires grad (the kernel has no backward: detach it);
            float64 values so large that the head and row sums would overflow (float32 values
            past float32's such limit are rolled out in float64, then cast back).

    Example:
        >>> import torch
        >>> from attnmetrics import attention_rollout
        >>> a = torch.tensor([[0.5, 0.5], [0.5, 0.5]]).expand(1, 2, 1, 2, 2)  # 2 layers, 1 head
        >>> attention_rollout(a)
        tensor([[[0.6250, 0.3750],
                 [0.3750, 0.6250]]])
    """
    check_float("attentions", attentions)
    if attentions.dim() != 5 or attentions.shape[3] != attentions.shape[4]:
        raise ValueError(f"attentions must have shape [B, layers, heads, T, T], got {list(attentions.shape)}")
    batch, layers, heads, width = attentions.shape[:4]
    if batch == 0:
        raise ValueError(f"attentions is an empty batch (B = 0, shape {list(attentions.shape)}); expected B >= 1")
    if layers == 0 or heads == 0:
        raise ValueError(f"attentions must have layers >= 1 and heads >= 1, got shape {list(attentions.shape)}")
    if attentions.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "attentions requires grad, but attention_rollout's kernel has no backward "
            "(detach the input, e.g. attentions.detach())"
        )
    if isinstance(residual, bool) or not isinstance(residual, (int, float)) or not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be a number in [0, 1], got {residual!r}")
    lengths = check_lengths(lengths, batch, width, attentions.device)
    if _overflows(attentions, lengths, attentions.dtype):
        if attentions.dtype == torch.float64 or _overflows(attentions, lengths, torch.float64):
            limit = _largest_safe(attentions, torch.float64)
            raise ValueError(
                f"attentions holds values up to {_valid_max(attentions, lengths):g} in its valid blocks: the head "
                f"and row sums would overflow float64 (at most {limit:g}); expected attention probabilities"
            )
        return attention_rollout(attentions.double(), lengths, residual).to(attentions.dtype)
    # The kernel checks the attention values as it reads them (finite, non-negative, in
    # valid blocks only) and names the first bad row, layer and head.
    try:
        return ops.attention_rollout(attentions.contiguous(), lengths, float(residual))
    except RuntimeError as error:
        if "attentions contains" in str(error):
            raise ValueError(str(error).splitlines()[0]) from None
        raise


def _largest_safe(attentions: Tensor, dtype: torch.dtype) -> float:
    """The largest attention value whose head sums and row sums (heads x T of them, with the
    residual's share) stay finite in ``dtype``."""
    heads, width = attentions.shape[2], attentions.shape[3]
    return torch.finfo(dtype).max / (2.0 * heads * max(width, 1))


def _valid_max(attentions: Tensor, lengths: Tensor) -> float:
    """The largest value in the rows' valid ``L x L`` blocks (padding is never read)."""
    keys = torch.arange(attentions.shape[3], device=attentions.device)
    inside = keys[None, :] < lengths[:, None]
    block = (inside[:, :, None] & inside[:, None, :])[:, None, None]
    return float(attentions.masked_fill(~block, 0).amax())


def _overflows(attentions: Tensor, lengths: Tensor, dtype: torch.dtype) -> bool:
    """Whether a valid block holds a value past :func:`_largest_safe` in ``dtype`` (a float32
    ``torch.full(..., 3e38)`` gave all NaN, or all zeros). The whole tensor's maximum first (no
    copy); the valid blocks alone only when that one is past the limit or NaN."""
    limit = _largest_safe(attentions, dtype)
    if float(attentions.amax()) <= limit:
        return False
    largest = _valid_max(attentions, lengths)
    return math.isfinite(largest) and largest > limit  # NaN and infinity: the kernel names the row


def layer_matrices(attentions: Tensor, lengths: Tensor | None = None, residual: float = 0.5) -> Tensor:
    """Rollout's per-layer matrices before the product, in float64: ``[B, layers, T, T]`` with
    ``M_l = (1 − residual) · mean_h attentions[b, l, h] + residual · I`` on each row's valid
    ``L × L`` block, each row divided by its sum (a row summing to 0 stays 0), zero elsewhere
    (docs/definitions.md §17). :func:`attention_rollout` forms the same matrices in its kernel and
    multiplies them; attention flow (:func:`attnmetrics.attention_flow`) takes them as its graph's
    capacities. ``attentions`` as :func:`attention_rollout`'s, read as they are (no value checks:
    the caller's); ``lengths`` ``[B]`` integers (None: T)."""
    batch, layers, heads, width = attentions.shape[:4]
    lengths = torch.full((batch,), width, device=attentions.device) if lengths is None else lengths
    valid = token_mask(lengths, width)
    block = (valid[:, :, None] & valid[:, None, :]).to(torch.float64)
    eye = torch.diag_embed(valid.to(torch.float64))
    mixed = []
    for layer in range(layers):  # one layer at a time: the heads' mean in float64, no float64 copy of them
        m = (1.0 - residual) * (attentions[:, layer].mean(1, dtype=torch.float64) * block) + residual * eye
        total = m.sum(-1, keepdim=True)
        mixed.append(torch.where(total > 0, m / total.clamp_min(torch.finfo(m.dtype).tiny), m))
    return torch.stack(mixed, 1)


def layer_attentions(model, method: str):
    """``model.layer_attentions``: the callable ``(tokens, lengths) -> [B, layers, heads, T, T]``
    every layer's attention probabilities (what the models' ``rollout`` rolls out: our GPT
    classifier, BERT-like and GPT-2-like Hugging Face classifiers), or a TypeError naming the model
    and why ``method`` does not apply to it."""
    get = getattr(model, "layer_attentions", None)
    if not callable(get):
        raise TypeError(
            f"{method} needs a transformer's attention layers (model.layer_attentions, as attention rollout: our "
            f"GPT classifier, BERT-like or GPT-2-like Hugging Face classifiers), got {type(model).__name__}: it "
            "has no attention layers to roll out"
        )
    return get
