"""Input checks shared by the public API: clear ValueErrors before any kernel runs, and the one
default memory budget of every chunked op.

Checks of values read the device once per check (one small tensor copied back), so CUDA
inputs wait for their stream once rather than once per condition.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics._decoder import is_plain_linear
from attnmetrics._deferred import defer, deferring
from attnmetrics.keyed import check_keyed
from attnmetrics.protocol import missing_members, token_mask

FLOAT_DTYPES = (torch.float32, torch.float64)

#: Default bound, in bytes, on what one chunk of an op holds (its copies, contexts and
#: model activations); every ``memory_budget`` argument defaults to it.
DEFAULT_MEMORY_BUDGET = 256 * 2**20


def check_float(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type == "meta":  # no data: every check and kernel would fail inside torch
        raise ValueError(f"{name} is on device 'meta' (a tensor without data); expected a CPU or CUDA tensor")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32 or float64, got {x.dtype}")


def check_int(name: str, value, low: int) -> int:
    """``value`` if it is an int (not a bool) >= ``low``, else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def check_same_device(**tensors: Tensor) -> None:
    devices = {n: t.device for n, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"inputs must be on one device, got {devices}")


def check_generator(generator, device: torch.device | None = None):
    """``generator`` if it is None, a :class:`attnmetrics.KeyedRows` (any device) or a
    ``torch.Generator`` (on ``device`` when given), else TypeError (none of these) or
    ValueError (on another device; a KeyedRows out of range)."""
    if generator is None or check_keyed(generator) is not None:
        return generator
    if not isinstance(generator, torch.Generator):
        shown = repr(generator)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise TypeError(
            f"generator must be a torch.Generator, an attnmetrics.KeyedRows or None, got {type(generator).__name__} {shown}"
        )
    if device is not None and not same_device(generator.device, device):
        raise ValueError(f"generator is on {generator.device}, attention on {device}; they must match")
    return generator


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one, a device without an index meaning the current one of its
    type (``torch.Generator("cuda").device`` is ``cuda``, a tensor's is ``cuda:0``)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.index == b.index or a.type == "cpu":
        return True
    return _device_index(a) == _device_index(b)


def _device_index(device: torch.device) -> int | None:
    """device's index, the current device's of its type when it has none."""
    if device.index is not None:
        return device.index
    if device.type == "cuda":
        return torch.cuda.current_device()
    return None


def check_lengths(lengths: Tensor | None, batch: int, width: int, device: torch.device) -> Tensor:
    """Valid-prefix lengths [B] int64 in [0, T]; ``None`` means every row is full."""
    if lengths is None:
        return torch.full((batch,), width, dtype=torch.int64, device=device)
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths, device=device)  # a list goes where the inputs are
    if lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths must be an integer tensor, got {lengths.dtype}")
    if lengths.shape != (batch,):
        raise ValueError(f"lengths must have shape [B] = [{batch}], got {list(lengths.shape)}")
    if lengths.device != device:
        raise ValueError(f"lengths is on {lengths.device}, expected {device} like the other inputs")
    if batch:
        low, high = torch.stack(torch.aminmax(lengths)).tolist()
        if low < 0 or high > width:
            raise ValueError(f"lengths must lie in [0, T] = [0, {width}], got min {low}, max {high}")
    return lengths.to(torch.int64).contiguous()


#: Sum-to-1 tolerance per item and unit roundoff: a row of L items in a dtype of machine
#: epsilon eps may miss 1 by ``SUM_TOLERANCE * eps * L`` (at least ``atol``). Measured: the
#: worst |sum - 1| of torch.softmax in float32 (CPU) over random logits (normal and uniform,
#: scales 0 to 100, with a spike or a shifted half) for L from 10 to 10**6 was 0.0145 eps L
#: (1.6e-3 at L = 10**6); 1/16 leaves a margin of about 4, and in float32 it stays below 0.01
#: up to L = 10**6 (7.5e-3), so a row summing to 1.01 is still rejected there.
SUM_TOLERANCE = 1 / 16


def sum_tolerance(lengths: Tensor, dtype: torch.dtype, atol: float = 1e-4) -> Tensor:
    """[B] float64: how far each row of ``lengths[b]`` items in ``dtype`` may sum from 1,
    ``max(atol, SUM_TOLERANCE * eps(dtype) * L)``, capped at 0.5 (a row must keep a positive sum)."""
    per_item = SUM_TOLERANCE * torch.finfo(dtype).eps
    return (lengths.to(torch.float64) * per_item).clamp(min=atol, max=0.5)


def check_attention(attention: Tensor, lengths: Tensor, atol: float = 1e-4, heads: int | None = None) -> None:
    """Attention [B, T]: finite, non-negative, each non-empty row summing to 1 over its prefix,
    within :func:`sum_tolerance` (which grows with the row's length and the dtype's epsilon).

    Rows that do not sum to 1 are rejected, not renormalised: a silently rescaled
    distribution would change the very quantity being measured. ``heads``: the rows are a
    multi-head batch [B, heads, T] flattened to [B * heads, T]; messages name row and head.
    """
    check_float("attention", attention)
    if attention.dim() != 2:
        raise ValueError(f"attention must have shape [B, T], got {list(attention.shape)}")
    if attention.shape[0] == 0:
        raise ValueError("attention is an empty batch (B = 0)")
    mask = token_mask(lengths, attention.shape[1])
    real = attention.masked_fill(~mask, 0)
    sums = real.sum(1, dtype=torch.float64)
    tolerance = sum_tolerance(lengths, attention.dtype, atol)
    bad = (lengths > 0) & ((sums - 1).abs() > tolerance)
    not_finite, negative, unnormalised = torch.stack(
        [~torch.isfinite(real).all(), (real < 0).any(), bad.any()]
    ).tolist()
    if not_finite:
        raise ValueError("attention contains NaN or infinite values")
    if negative:
        raise ValueError(f"attention must be non-negative, got min {float(real.min()):.4g}")
    if unnormalised:
        i = int(bad.nonzero()[0])
        row = f"row {i}" if heads is None else f"row {i // heads}, head {i % heads},"
        raise ValueError(
            f"attention rows must sum to 1 over their first lengths[b] items "
            f"(rejected, not renormalised): {row} sums to {float(sums[i]):.6g}, beyond the tolerance "
            f"{float(tolerance[i]):.3g} for {int(lengths[i])} {attention.dtype} items"
        )


def check_inputs(attention: Tensor, values: Tensor, lengths: Tensor | None) -> Tensor:
    """Validate attention [B, T] with values [B, T, H], or multi-head attention [B, heads, T]
    with values [B, heads, T, H] (each head's row checked as :func:`check_attention` checks a
    row, messages naming row and head); return lengths [B] int64."""
    check_float("attention", attention)
    check_float("values", values)
    if attention.dim() not in (2, 3):
        raise ValueError(
            f"attention must have shape [B, T] (or [B, heads, T], multi-head), got {list(attention.shape)}"
        )
    multi = attention.dim() == 3
    names = "[B, heads, T, H]" if multi else "[B, T, H]"
    if values.dim() != attention.dim() + 1 or values.shape[:-1] != attention.shape:
        sizes = ", ".join(str(n) for n in attention.shape)
        raise ValueError(f"values must have shape {names} = [{sizes}, H] like attention, got {list(values.shape)}")
    if values.shape[-1] == 0:
        raise ValueError(f"values must have H >= 1 features (shape {names}), got H = 0: shape {list(values.shape)}")
    if multi and attention.shape[1] == 0:
        raise ValueError(f"attention must have heads >= 1, got shape {list(attention.shape)}")
    if values.dtype != attention.dtype:
        raise ValueError(f"values dtype {values.dtype} differs from attention dtype {attention.dtype}")
    check_same_device(attention=attention, values=values)
    batch, width = attention.shape[0], attention.shape[-1]
    if multi and batch == 0:
        raise ValueError(f"attention is an empty batch (B = 0, shape {list(attention.shape)})")
    lengths = check_lengths(lengths, batch, width, attention.device)
    if multi:
        heads = attention.shape[1]
        check_attention(attention.flatten(0, 1), lengths.repeat_interleave(heads), heads=heads)
    else:
        check_attention(attention, lengths)
    return lengths


def check_factored(attention: Tensor, values):
    """Validate factored multi-head values (:class:`~attnmetrics.protocol.FactoredValues`) for
    attention [B, heads, T]: ``per_head [B, heads, T, E]``, ``projection [heads, E, H]``,
    ``offset [B, heads, H]``, float32/float64 of attention's dtype on its device, projection and
    offset finite (``per_head`` is checked on each row's prefix where it is used); return them."""
    check_float("attention", attention)
    if attention.dim() != 3:
        raise ValueError(
            f"factored values are for multi-head attention [B, heads, T], got attention of shape {list(attention.shape)}"
        )
    parts = {"values.per_head": values.per_head, "values.projection": values.projection, "values.offset": values.offset}
    for name, x in parts.items():
        check_float(name, x)
        if x.dtype != attention.dtype or x.device != attention.device:
            raise ValueError(
                f"{name} is {x.dtype} on {x.device}, attention is {attention.dtype} on {attention.device}; they must match"
            )
    per_head, projection, offset = values.per_head, values.projection, values.offset
    if per_head.dim() != 4 or per_head.shape[:3] != attention.shape or per_head.shape[3] == 0:
        sizes = ", ".join(str(n) for n in attention.shape)
        raise ValueError(
            f"values.per_head must have shape [B, heads, T, E] = [{sizes}, E >= 1] like attention, "
            f"got {list(per_head.shape)}"
        )
    batch, heads, _, e = per_head.shape
    if projection.dim() != 3 or projection.shape[:2] != (heads, e) or projection.shape[2] == 0:
        raise ValueError(
            f"values.projection must have shape [heads, E, H] = [{heads}, {e}, H >= 1] (values.per_head is "
            f"{list(per_head.shape)}), got {list(projection.shape)}"
        )
    if offset.shape != (batch, heads, projection.shape[2]):
        raise ValueError(
            f"values.offset must have shape [B, heads, H] = [{batch}, {heads}, {projection.shape[2]}], "
            f"got {list(offset.shape)}"
        )
    finite = torch.stack([torch.isfinite(projection).all(), torch.isfinite(offset).all()]).tolist()  # one read back
    for name, ok in zip(("values.projection", "values.offset"), finite):
        if not ok:
            raise ValueError(f"{name} must be finite, got NaN or infinite entries")
    return values


def check_decoder(decoder, values: Tensor) -> None:
    """A callable [N, H] -> [N, C]; a plain ``nn.Linear`` must match values' H, dtype and device,
    have out_features = C >= 1, and its weight and bias must be finite (the closed forms never
    call the decoder, so no logits check would catch them)."""
    if not callable(decoder):
        raise TypeError(f"decoder must be callable [N, H] -> [N, C], got {type(decoder).__name__}")
    if is_plain_linear(decoder):
        h = values.shape[-1]
        if decoder.in_features != h:
            raise ValueError(f"decoder is an nn.Linear with in_features {decoder.in_features}, but values have H = {h}")
        if decoder.out_features < 1:
            raise ValueError(
                f"decoder is an nn.Linear with out_features {decoder.out_features}; it must give C >= 1 classes "
                f"(out_features >= 1)"
            )
        w = decoder.weight
        if w.dtype != values.dtype or w.device != values.device:
            raise ValueError(
                f"decoder weight is {w.dtype} on {w.device}, values are {values.dtype} on "
                f"{values.device}; they must match"
            )
        params = {"decoder.weight": w} if decoder.bias is None else {"decoder.weight": w, "decoder.bias": decoder.bias}
        finite = torch.stack([torch.isfinite(p.detach()).all() for p in params.values()]).tolist()  # one read back
        for (name, p), ok in zip(params.items(), finite):
            if not ok:
                bad = p.detach().flatten()[~torch.isfinite(p.detach().flatten())][:3].tolist()
                raise ValueError(
                    f"{name} must be finite (the nn.Linear decoder's parameters), got non-finite entries such as {bad}"
                )


def check_logits(
    logits,
    n: int | None = None,
    classes: int | None = None,
    *,
    source: str = "decoder",
    inputs: str = "contexts [N, H]",
    on: str = "",
    hint: str = "",
    dtype: torch.dtype | None = None,
    finite: bool = True,
) -> Tensor:
    """The one logits check: ``logits`` if they are [N, C] (N = ``n`` and C = ``classes`` when
    given) and finite, else ValueError. ``source`` (decoder, model) and ``inputs`` name what
    was called on what; ``on`` and ``hint`` extend the messages. With ``n=None`` only the shape
    is checked (logits given by a user, not returned by a call); otherwise the logits must also
    be float32 or float64 (``dtype``, the attention's, is named in the message when given).
    The one check that reads the device (whether every logit is finite) waits, inside a
    procedure's :func:`attnmetrics._deferred.deferred` scope, for the scope's one read;
    ``finite=False`` leaves it out, for a caller that checks what the logits become."""
    if n is None:
        if not isinstance(logits, Tensor) or logits.dim() != 2 or logits.shape[1] < 1:
            got = list(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(f"{source} must return logits of shape [N, C] with C >= 1, got {got}")
        return logits
    if not isinstance(logits, Tensor) or logits.dim() != 2 or logits.shape[0] != n or logits.shape[1] < 1:
        got = list(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"{source} must map {inputs} to logits [N, C] with N = {n}, got {got}")
    if logits.dtype not in FLOAT_DTYPES:
        like = "" if dtype is None else f" (the attention's dtype is {dtype})"
        raise ValueError(f"{source} must return float32 or float64 logits{like}, got {logits.dtype}{on}")
    if classes is not None and logits.shape[1] != classes:
        raise ValueError(f"{source} returned C = {logits.shape[1]} classes{on}, earlier C = {classes}")
    if finite:
        defer(torch.isfinite(logits).all(), lambda: nonfinite_logits(source, on, hint))
    return logits


def checked_ids(tokens: Tensor, vocab_size: int) -> Tensor:
    """``tokens`` if every id lies in ``[0, vocab_size)``, else ValueError naming the extremes (an
    embedding lookup would fail deep inside torch, or assert on a GPU). Inside a procedure's
    :func:`~attnmetrics._deferred.deferred` scope the check waits for the scope's read and the ids
    come back clamped, so the lookup stays in bounds until the error is raised."""
    if not tokens.numel():
        return tokens
    low, high = torch.aminmax(tokens)
    defer(
        (low >= 0) & (high < vocab_size),
        lambda: ValueError(
            f"tokens must be ids in [0, vocab_size) = [0, {vocab_size}), got min {int(low)}, max {int(high)}"
        ),
    )
    return tokens.clamp(0, vocab_size - 1) if deferring() else tokens


def nonfinite_logits(source: str = "decoder", on: str = "", hint: str = "") -> ValueError:
    """check_logits' error for logits that are not finite."""
    return ValueError(f"{source} returned NaN or infinite logits{on}{hint}")


def check_budget(memory_budget) -> int:
    """A positive int number of bytes."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget <= 0:
        raise ValueError(f"memory_budget must be a positive int (bytes), got {memory_budget!r}")
    return memory_budget


def check_model_inputs(model, tokens: Tensor, lengths: Tensor) -> Tensor:
    """The checks every procedure over a protocol model shares (leave_one_out,
    gradient_importance): ``model`` implements :class:`AttentionClassifier` with int
    ``lead``/``trail`` >= 0, ``tokens`` are [B, T] int64 ids (B >= 1, non-negative within
    each row's length) and ``lengths`` [B] integers in ``[lead + trail, T]`` on the tokens'
    device. Returns lengths as int64."""
    missing = missing_members(model)
    if missing:
        raise TypeError(
            "model must implement attnmetrics.AttentionClassifier (embed, encode, attend, decoder, "
            f"lead, trail), got {type(model).__name__} without {', '.join(missing)}"
        )
    lead, trail = model.lead, model.trail
    for name, v in (("lead", lead), ("trail", trail)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"model.{name} must be an int >= 0, got {v!r}")
    if not isinstance(tokens, Tensor):
        raise TypeError(f"tokens must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be int64 token ids, got {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"tokens must have shape [B, T], got {list(tokens.shape)}")
    batch, width = tokens.shape
    if batch == 0:
        raise ValueError("tokens is an empty batch (B = 0)")
    if not isinstance(lengths, Tensor):
        raise TypeError(f"lengths must be a torch.Tensor, got {type(lengths).__name__}")
    if lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths must be an integer tensor, got {lengths.dtype}")
    if lengths.shape != (batch,):
        raise ValueError(f"lengths must have shape [B] = [{batch}], got {list(lengths.shape)}")
    if lengths.device != tokens.device:
        raise ValueError(f"lengths is on {lengths.device}, tokens on {tokens.device}; they must match")
    low, high = int(lengths.min()), int(lengths.max())
    if low < lead + trail or high > width:
        raise ValueError(
            f"lengths must lie in [lead + trail, T] = [{lead + trail}, {width}] (special tokens "
            f"included), got min {low}, max {high}"
        )
    # Padding is never read (leave_one_out re-pads with 0), so only the rows' ids count.
    valid = torch.arange(width, device=tokens.device) < lengths[:, None]
    low_id = int(tokens.masked_fill(~valid, 0).min()) if tokens.numel() else 0
    if low_id < 0:
        raise ValueError(f"tokens must be non-negative ids within each row's length, got min {low_id}")
    return lengths.to(torch.int64)
