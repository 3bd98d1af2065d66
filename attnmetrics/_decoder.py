"""What the procedures share about the decoder (the layers after attention): its type, the test
for a plain ``nn.Linear`` (which unlocks the closed-form kernels), and the values projected
through it, chunked to a memory budget."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnmetrics.protocol import token_mask

#: maps contexts [N, H] to logits [N, C]
Decoder = Callable[[Tensor], Tensor]


def is_plain_linear(decoder) -> bool:
    """An nn.Linear whose call is exactly x @ W.T + b: no overridden forward, no hooks."""
    return (
        isinstance(decoder, nn.Linear)
        and type(decoder).forward is nn.Linear.forward
        and not (decoder._forward_hooks or decoder._forward_pre_hooks)
    )


def non_finite_parameter(decoder) -> str | None:
    """The name (``decoder.<name>``) of the first parameter of an ``nn.Module`` decoder that
    holds NaN or inf; None if all are finite or the decoder is not a module."""
    if isinstance(decoder, nn.Module):
        for name, param in decoder.named_parameters():
            if not torch.isfinite(param.detach()).all():
                return f"decoder.{name}"
    return None


def check_values_finite(values: Tensor, lengths: Tensor, rows: int | Tensor = 0) -> None:
    """ValueError naming the first row whose valid prefix of ``values`` [n, T, H] (or multi-head
    [n, heads, T, H]: row and head) holds NaN or inf.

    ``values`` may be a chunk of the batch: ``rows`` is the batch index of its row 0 (an int)
    or of each of its rows (an [n] tensor), so the message names the row of the whole batch."""
    if torch.isfinite(values.sum()):  # one pass: a NaN or inf anywhere (padding too) makes the sum so
        return
    mask = token_mask(lengths, values.shape[-2])
    bad = ~torch.isfinite(values).all(-1) & (mask if values.dim() == 3 else mask[:, None, :])
    if bad.any():
        first = bad.flatten(1).any(1).nonzero()[0]
        row = int(first)
        row = rows + row if isinstance(rows, int) else int(rows[row])
        head = "" if values.dim() == 3 else f", head {int(bad[int(first)].any(-1).nonzero()[0])}"
        raise ValueError(
            f"values must be finite on each row's valid prefix, got NaN or infinite values in row {row}{head}"
        )


def rows_per_chunk(row_bytes: int, budget: int) -> int:
    """Rows of ``row_bytes`` each that fit in ``budget`` bytes (at least one)."""
    return max(1, budget // max(1, row_bytes))


def project(values: Tensor, weight: Tensor, lengths: Tensor, budget: int) -> Tensor:
    """values @ W.T as [B, T, C] on each valid prefix, zero on padding (the ``project_prefix``
    kernel; padding is never read). Non-contiguous values are copied in row chunks of about
    ``budget`` bytes. ValueError if a projected value on a valid prefix is not finite, naming
    the cause: values not finite, the weight not finite, or a product that overflowed the dtype."""
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
    # a NaN or inf anywhere makes the sum so (one pass, not isfinite's four); a finite sum's
    # overflow is told apart by the exact check
    if not torch.isfinite(out.sum()) and not torch.isfinite(out).all():  # find the cause (error path only)
        check_values_finite(values, lengths)
        if not torch.isfinite(weight).all():
            raise ValueError("decoder.weight must be finite, got NaN or infinite entries")
        row = int((~torch.isfinite(out)).flatten(1).any(1).nonzero()[0])
        raise ValueError(
            f"the projection W·h (values @ decoder.weight.T) overflowed {values.dtype} in row {row}: "
            f"values and decoder.weight are finite but their product is not representable; rescale "
            f"them or use float64"
        )
    return out
