"""Total variation and Jensen-Shannon distances between distributions (J&W 2019, sec. 4).

Both reduce one dimension of broadcastable tensors ``p`` and ``q`` and run on the C++
kernels (``attnmetrics::tvd_checked`` / ``attnmetrics::jsd_checked``: the distance and the
checks for NaN, infinite and negative entries in one call), which take contiguous ``[..., K]``
rows: this layer broadcasts, moves ``dim`` last and copies to that layout in row chunks, so
the extra memory stays within ``memory_budget`` however large the batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from attnmetrics._ops import ops
from attnmetrics._validation import DEFAULT_MEMORY_BUDGET, check_budget, check_float, check_same_device


def tvd(p: Tensor, q: Tensor, dim: int = -1, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """Total variation distance ``½ Σ |p - q|`` along ``dim`` (J&W 2019, sec. 4).

    Args:
        p, q: non-negative, finite float32 or float64 tensors of one dtype and device,
            broadcastable to a common shape ``S``. Rows along ``dim`` are distributions
            (not renormalised here).
        dim: the dimension to reduce (of the broadcast shape).
        memory_budget: bound in bytes on the temporary contiguous copies; large
            inputs are processed in chunks of rows.

    Returns:
        ``S`` with ``dim`` removed, in the inputs' dtype (accumulated in float64).
        For distributions the value lies in ``[0, 1]``. Differentiable: with inputs that
        require grad, ``d tvd / d p = ½ sign(p - q)`` (0 where ``p == q``) and
        ``d tvd / d q = -½ sign(p - q)``, taken on the inputs as given (no renormalisation);
        the backward pass holds a few tensors of shape ``S`` (not chunked).

    Raises:
        TypeError: an input is not a tensor.
        ValueError: an input on the ``meta`` device, wrong dtype, mismatched dtypes or
            devices, shapes that do not
            broadcast, ``dim`` out of range, an empty input, NaN, infinite or
            negative entries, or a ``memory_budget`` that is not a positive int (a bool
            is refused).

    Example:
        >>> import torch
        >>> from attnmetrics import tvd
        >>> tvd(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.5, 0.5]))
        tensor(0.5000)
    """
    return _distance("tvd", p, q, dim, memory_budget)


def jsd(p: Tensor, q: Tensor, dim: int = -1, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """Jensen-Shannon divergence along ``dim``, in nats (J&W 2019, sec. 4).

    ``JSD(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m)`` with ``m = (p + q) / 2``, natural log and
    ``0 · log 0 = 0``. This is the divergence, not the distance:
    ``scipy.spatial.distance.jensenshannon(p, q)`` returns its square root (and
    renormalises ``p`` and ``q`` first, which this function does not).

    Args:
        p, q: non-negative, finite float32 or float64 tensors of one dtype and device,
            broadcastable to a common shape ``S``. Rows along ``dim`` are distributions.
        dim: the dimension to reduce (of the broadcast shape).
        memory_budget: bound in bytes on the temporary contiguous copies; large
            inputs are processed in chunks of rows.

    Returns:
        ``S`` with ``dim`` removed, in the inputs' dtype (accumulated in float64).
        For distributions the value lies in ``[0, ln 2]``. Differentiable: with inputs
        that require grad, ``d jsd / d p = ½ log(p / m)`` (natural log; 0 where
        ``p == 0``, where the one-sided derivative is -inf) and symmetrically for ``q``,
        taken on the inputs as given (no renormalisation); the backward pass holds a few
        tensors of shape ``S`` (not chunked).

    Raises:
        TypeError: an input is not a tensor.
        ValueError: an input on the ``meta`` device, wrong dtype, mismatched dtypes or
            devices, shapes that do not
            broadcast, ``dim`` out of range, an empty input, NaN, infinite or
            negative entries, or a ``memory_budget`` that is not a positive int (a bool
            is refused).

    Example:
        >>> import torch
        >>> from attnmetrics import jsd
        >>> jsd(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))  # ln 2
        tensor(0.6931)
    """
    return _distance("jsd", p, q, dim, memory_budget)


def _distance(kind: str, p: Tensor, q: Tensor, dim: int, memory_budget: int) -> Tensor:
    """The kernel's value; through :class:`_Distance` when autograd needs its gradient."""
    op = ops.tvd_checked if kind == "tvd" else ops.jsd_checked
    if torch.is_grad_enabled() and any(isinstance(x, Tensor) and x.requires_grad for x in (p, q)):
        return _Distance.apply(kind, p, q, dim, memory_budget)
    return _rowwise(op, p, q, dim, memory_budget)


class _Distance(torch.autograd.Function):
    """tvd/jsd with their gradients in plain torch (the kernels have no backward)."""

    @staticmethod
    def forward(ctx, kind: str, p: Tensor, q: Tensor, dim: int, memory_budget: int) -> Tensor:
        out = _rowwise(ops.tvd_checked if kind == "tvd" else ops.jsd_checked, p, q, dim, memory_budget)  # validates
        ctx.kind, ctx.dim = kind, dim % max(1, out.dim() + 1)
        ctx.save_for_backward(p, q)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        p, q = ctx.saved_tensors
        g = grad.unsqueeze(ctx.dim)
        if ctx.kind == "tvd":
            half_sign = 0.5 * torch.sign(p - q)
            dp, dq = g * half_sign, g * -half_sign
        else:
            m = (p + q) / 2

            def half_log_ratio(x: Tensor) -> Tensor:  # ½ log(x / m), 0 where x == 0 (then m may be 0)
                positive = x > 0
                return torch.where(positive, 0.5 * torch.log(x / torch.where(positive, m, 1)), 0)

            dp, dq = g * half_log_ratio(p), g * half_log_ratio(q)
        return (
            None,
            dp.sum_to_size(p.shape) if ctx.needs_input_grad[1] else None,
            dq.sum_to_size(q.shape) if ctx.needs_input_grad[2] else None,
            None,
            None,
        )


def _check_distribution(name: str, x: Tensor) -> None:
    check_float(name, x)
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension, got a 0-d tensor")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {list(x.shape)}); expected at least one entry")


def _raise_for_values(p: Tensor, q: Tensor) -> None:
    """The error for inputs the kernels flagged (NaN, infinite or negative entries), naming the
    input and its extremes: one min/max reduction per input (no full-size temporary; min/max
    propagate NaN). Only called once the flags say something is wrong."""
    extremes = torch.stack([v.double() for t in (p, q) for v in torch.aminmax(t)]).tolist()
    for name, (low, high) in (("p", extremes[:2]), ("q", extremes[2:])):
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"{name} must be finite, got NaN or infinite values")
        if low < 0:
            raise ValueError(f"{name} must be non-negative, got min {low:.4g}")
    raise ValueError("p and q must be finite and non-negative")  # the flags said so; not reached


def _rowwise(op, p: Tensor, q: Tensor, dim: int, memory_budget: int) -> Tensor:
    _check_distribution("p", p)
    _check_distribution("q", q)
    if p.device != q.device:  # the message's dict costs more than the comparison
        check_same_device(p=p, q=q)
    if p.dtype != q.dtype:
        raise ValueError(f"p and q must have one dtype, got p {p.dtype} and q {q.dtype}")
    shape = p.shape
    if q.shape != shape:  # views of the broadcast shape (torch.broadcast_shapes alone costs 4x this)
        try:
            p, q = torch.broadcast_tensors(p, q)
        except RuntimeError:
            raise ValueError(f"p and q must be broadcastable, got shapes {list(p.shape)} and {list(q.shape)}") from None
        shape = p.shape
    if not -len(shape) <= dim < len(shape):
        raise ValueError(f"dim must lie in [{-len(shape)}, {len(shape) - 1}] for shape {list(shape)}, got {dim}")
    check_budget(memory_budget)  # a positive int: True is refused too

    # Views only: the kernels read rows a fixed stride apart in place (a contiguous input, one
    # row expanded over the batch); any other input is copied below, chunk by chunk. The kernels
    # check the values in the same pass (value_flags' bits, ORed over the chunks): the call
    # reads the device once, at the end.
    if dim % len(shape) != len(shape) - 1:
        p, q = p.movedim(dim, -1), q.movedim(dim, -1)
    batch, width = p.shape[:-1], p.shape[-1]
    flags = p.new_zeros(1, dtype=torch.int32)
    # Per row: a contiguous copy of p and of q, plus the output.
    max_rows = max(1, memory_budget // ((2 * width + 1) * p.element_size()))
    if math.prod(batch) <= max_rows:  # one block: the kernels take [..., K], so no reshapes
        out = op(_in_place_rows(p), _in_place_rows(q), flags)
    else:
        out = torch.empty(batch, dtype=p.dtype, device=p.device)
        flat = out.view(-1)
        start = 0
        for index in _row_blocks(tuple(batch), max_rows):
            block = op(_in_place_rows(p[index]), _in_place_rows(q[index]), flags).view(-1)
            flat[start : start + block.numel()] = block
            start += block.numel()
    if int(flags):
        _raise_for_values(p, q)
    return out


def _in_place_rows(x: Tensor) -> Tensor:
    """``x`` [..., K] itself when the distance kernels read it in place (unit stride along K and
    its rows a fixed stride apart once the batch dims are flattened, size-1 dims ignored: a
    contiguous tensor, or one row expanded over the batch, which they read from cache), else a
    contiguous copy. The rule of ``row_stride`` in ``csrc/checks.h``."""
    sizes, strides = x.shape, x.stride()
    if x.numel() and sizes[-1] > 1 and strides[-1] != 1:
        return x.contiguous()
    span = None  # stride * size of the batch dim inside this one
    for size, stride in zip(reversed(sizes[:-1]), reversed(strides[:-1])):
        if size == 1:
            continue
        if span is not None and stride != span:
            return x.contiguous()
        span = stride * size
    return x


def _row_blocks(batch: tuple[int, ...], max_rows: int, prefix: tuple = ()) -> Iterator[tuple]:
    """Indices into the batch dims, each selecting <= max_rows rows that are
    consecutive in row-major order, together covering the batch in order."""
    if not batch:
        yield prefix
        return
    inner = math.prod(batch[1:])
    if inner <= max_rows:
        step = max_rows // inner
        for i in range(0, batch[0], step):
            yield prefix + (slice(i, i + step),)
    else:
        for i in range(batch[0]):
            yield from _row_blocks(batch[1:], max_rows, prefix + (i,))
