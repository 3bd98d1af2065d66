"""What the procedures share about the decoder (the layers after attention): its type, the test
for a plain ``nn.Linear`` (which unlocks the closed-form kernels), and the values projected
through it, chunked to a memory budget."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

#: maps contexts [N, H] to logits [N, C]
Decoder = Callable[[Tensor], Tensor]


def is_plain_linear(decoder) -> bool:
    """An nn.Linear whose call is exactly x @ W.T + b: no overridden forward, no hooks."""
    return (
        isinstance(decoder, nn.Linear)
        and type(decoder).forward is nn.Linear.forward
        and not (decoder._forward_hooks or decoder._forward_pre_hooks)
    )


def rows_per_chunk(row_bytes: int, budget: int) -> int:
    """Rows of ``row_bytes`` each that fit in ``budget`` bytes (at least one)."""
    return max(1, budget // max(1, row_bytes))


def project(values: Tensor, weight: Tensor, lengths: Tensor, budget: int) -> Tensor:
    """values @ W.T as [B, T, C] on each valid prefix, zero on padding (the ``project_prefix``
    kernel; padding is never read). Non-contiguous values are copied in row chunks of about
    ``budget`` bytes. ValueError if a projected value on a valid prefix is not finite."""
    from attnmetrics._ops import ops  # the extension is built on first use

    batch, width, hidden = values.shape
    weight = weight.detach().contiguous()
    if values.is_contiguous():
        out = ops.project_prefix(values, weight, lengths)
    else:
        out = values.new_empty(batch, width, weight.shape[0])
        rows = rows_per_chunk(width * hidden * values.element_size(), budget)
        for s in range(0, batch, rows):
            chunk = values[s : s + rows].contiguous()
            out[s : s + rows] = ops.project_prefix(chunk, weight, lengths[s : s + rows])
    if not torch.isfinite(out).all():
        raise ValueError("values must be finite on each row's valid prefix")
    return out
