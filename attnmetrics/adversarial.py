"""Adversarial attention search (J&W 2019, sec. 4.3; docs/definitions.md §10).

For each instance, K candidate attention distributions over its real tokens are
optimised with Adam, the model frozen, to be far (JSD) from the original attention
and from each other while keeping the output within a TVD margin of the original.
The batch is optimised at once: one ``[rows, K, T]`` logit tensor and one Adam
optimizer per chunk of rows. The loss is a sum over instances and Adam is
element-wise, so every instance follows the trajectory it would follow alone.
"""

from __future__ import annotations

import bisect
import math
from typing import NamedTuple

import torch
from torch import Tensor

from attnmetrics._decoder import Decoder, check_values_finite, is_plain_linear, project
from attnmetrics._deferred import defer, deferred
from attnmetrics._ops import ops
from attnmetrics._validation import (
    DEFAULT_MEMORY_BUDGET,
    check_budget,
    check_decoder,
    check_factored,
    check_generator,
    check_inputs,
    check_int,
    check_logits,
)
from attnmetrics.keyed import KeyedRows, normal
from attnmetrics.outputs import output_distribution
from attnmetrics.protocol import FactoredValues, token_mask


class AdversarialResult(NamedTuple):
    """Per-row outcome of :func:`adversarial_attention`.

    max_jsd: ``[B]`` JSD (nats, in ``[0, ln 2]``) between the reported attention and the
        original; 0 when no candidate met the output constraint or L <= 1.
    attention: ``[B, T]`` the reported adversarial attention (the original where
        ``max_jsd`` is 0), a distribution over each row's prefix, zero on padding.
    output_tvd: ``[B]`` TVD between the output distribution under ``attention`` and the
        original output distribution (0 where the original is reported).
    """

    max_jsd: Tensor
    attention: Tensor
    output_tvd: Tensor


# ---- validation ---------------------------------------------------------------------------


def _check_real(name: str, value, *, positive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


# ---- the optimisation ---------------------------------------------------------------------

#: The candidates' logits on padding: softmax gives it exactly 0 (exp underflows), and
#: log-softmax a finite value, so no mask is needed per step and no 0 * inf arises.
PADDING_LOGIT = -1e30


def _row_bytes(width: int, k: int, pairs: int, out_width: int, item: int) -> int:
    """Working memory of one row of a chunk, as measured on CPU: logits, gradient and Adam
    moments (4 K T), a step's activations and their gradients (~16 K T + 12 P T), the
    outputs (~12 K out_width; out_width = C, or 2 H for contexts and a decoder's own)."""
    return item * (width * (20 * k + 12 * pairs) + 12 * k * out_width)


def _chunks(lens: list[int], row_bytes, budget: int):
    """Consecutive [s, e) over rows sorted by length: as many rows as fit the budget at
    the chunk's (largest, last) length; at least one row."""
    s, n = 0, len(lens)
    while s < n:
        fits = bisect.bisect_right(range(s + 1, n + 1), budget, key=lambda e: (e - s) * row_bytes(lens[e - 1]))
        e = max(s + 1, s + fits)
        yield s, e
        s = e


def _mix(a: Tensor, feats: Tensor, lift: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """The contexts [n, K, F] of attention a [n, K, heads, W] over feats [n, heads, W, F],
    the heads' contexts summed. With ``lift = (projection [heads * E, F], offset [n, F])``,
    feats are factored values' ``per_head`` [n, heads, W, E] (:class:`FactoredValues`): each
    head's mixed vectors, concatenated, through the projection, plus the rows' summed offsets."""
    if lift is not None:
        projection, offset = lift
        per_head = torch.einsum("nkhw,nhwe->nkhe", a, feats)
        return torch.matmul(per_head.flatten(2), projection).add_(offset[:, None])
    if feats.shape[-1] == 1:  # a sigmoid's projected values: a product and a sum beat n tiny matmuls
        return (a * feats[:, None, ..., 0]).sum((2, 3)).unsqueeze(-1)
    if a.shape[2] == 1:  # one head: a plain batched matmul
        return torch.bmm(a[:, :, 0], feats[:, 0])
    return torch.einsum("nkhw,nhwf->nkf", a, feats)


def _unmix(d_mixed: Tensor, feats: Tensor, lift: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """The gradient in a [n, K, heads, W] of contexts whose gradient is d_mixed [n, K, F] (:func:`_mix`)."""
    if lift is not None:
        n, k, _ = d_mixed.shape
        d_per_head = torch.matmul(d_mixed, lift[0].T).view(n, k, feats.shape[1], feats.shape[-1])
        return torch.einsum("nkhe,nhwe->nkhw", d_per_head, feats)
    if feats.shape[-1] == 1:
        return d_mixed[..., None] * feats[:, None, ..., 0]
    if feats.shape[1] == 1:
        return torch.bmm(d_mixed, feats[:, 0].transpose(1, 2)).unsqueeze(2)
    return torch.einsum("nkf,nhwf->nkhw", d_mixed, feats)


def _outputs(
    a: Tensor, feats: Tensor, decoder: Decoder | None, bias: Tensor | None, classes: list[int], lift=None
) -> Tensor:
    """Output distributions [n, K, C'] for attention a [n, K, heads, W] over feats
    [n, heads, W, F]: projected values plus bias (linear decoder) or decoder(contexts)."""
    return _decode(_mix(a, feats, lift), decoder, bias, classes)


def _nonfinite_candidates() -> ValueError:
    return ValueError("the adversarial candidates' outputs are not finite (the search overflowed the dtype)")


def _log_sum(p: Tensor, q: Tensor) -> Tensor:
    """log(p + q), clamped so it stays finite where p + q = 0 (padding, whose gradient the
    softmax's then zeroes: a = 0 there)."""
    return torch.add(p, q).clamp_min_(torch.finfo(p.dtype).tiny).log_()


def _gradient(z, alpha, y0, feats, decoder, bias, classes, penalty, margin, diversity, lift=None) -> Tensor:
    """The gradient in z of the objective summed over rows (a row's terms depend on its own
    candidates only), from candidate logits z [n, K, heads, W] (:data:`PADDING_LOGIT` on
    padding)::

        -mean_k JSD(a_k, alpha) + penalty * mean_k ReLU(TVD_k - margin) - diversity * mean_{i<j} JSD(a_i, a_j)

    a = softmax(z), and a JSD between multi-head candidates the mean over heads of the
    per-head JSDs. In closed form, not through autograd (with the search's other shortcuts,
    3.3x faster on J&W's SST battery, the same values up to rounding):
    dJSD(p, q)/dp_t = (log p_t - log m_t)/2 with m = (p + q)/2, so, per head, with
    P = K(K-1)/2 pairs,

        dL/da_k = -(log a_k - log m(a_k, alpha)) / (2 K heads)
                  - diversity * sum_{j != k} (log a_k - log m(a_k, a_j)) / (2 P heads)
                  + penalty / K * [TVD_k > margin] * dTVD_k/da_k,

    and dL/dz = a * (dL/da - sum_t a_t dL/da_t). Only the output term goes through autograd,
    on the [n, K, F] contexts (the decoder, or the projected values' sum)."""
    _, k, heads, _ = z.shape
    la = torch.log_softmax(z, -1)  # about PADDING_LOGIT on padding, where a is exactly 0
    a = torch.softmax(z, -1)  # not la.exp(): torch's exp ran 4x slower than softmax here
    far = -0.5 / (k * heads)  # the weights of the two distance terms
    apart = -0.5 * diversity / (k * (k - 1) // 2 * heads) if k > 1 else 0.0
    # log m = log(p + q) - log 2: the log 2s and log a_k of every term at once
    grad = torch.add(la, math.log(2)).mul_(far + apart * (k - 1))
    grad.sub_(_log_sum(a, alpha), alpha=far)
    if apart:
        for d in range(1, k):  # the pairs (i, i + d), as slices
            log_m = _log_sum(a[:, : k - d], a[:, d:])
            grad[:, : k - d].sub_(log_m, alpha=apart)
            grad[:, d:].sub_(log_m, alpha=apart)
    # the output hinge, through the contexts mixed = sum_h a_h @ feats_h
    with torch.enable_grad():
        mixed = _mix(a, feats, lift).requires_grad_(True)
        change = 0.5 * (_decode(mixed, decoder, bias, classes, finite=False) - y0).abs().sum(-1)
        hinge = torch.relu(change - margin).sum() * (penalty / k)
    if hinge.requires_grad:  # else a decoder that ignores its input: the output term is inert
        (d_mixed,) = torch.autograd.grad(hinge, [mixed])  # [n, K, F]
        grad += _unmix(d_mixed, feats, lift)
    # through the softmax
    return grad.sub_((a * grad).sum(-1, keepdim=True)).mul_(a)


def _decode(
    mixed: Tensor, decoder: Decoder | None, bias: Tensor | None, classes: list[int], finite: bool = True
) -> Tensor:
    """Output distributions [n, K, C'] from contexts mixed [n, K, F]: plus bias (linear
    decoder, projected values) or decoder(contexts). ``finite=False`` (the optimiser's steps)
    leaves out the decoder's one check that reads the device: a NaN there reaches the
    candidates, whose outputs after the last step are checked."""
    n, k, f = mixed.shape
    if decoder is None:
        logits = (mixed + bias).reshape(n * k, f)
    else:
        logits = check_logits(
            decoder(mixed.reshape(n * k, f)), n * k, classes[0] if classes else None, dtype=mixed.dtype, finite=finite
        )
        classes[:] = [logits.shape[1]]
    return output_distribution(logits).view(n, k, -1)


def adversarial_attention(
    attention: Tensor,
    values: Tensor | FactoredValues,
    decoder: Decoder,
    lengths: Tensor | None = None,
    *,
    candidates: int = 5,
    steps: int = 500,
    lr: float = 0.01,
    tvd_penalty: float = 500.0,
    diversity_weight: float = 1.0,
    tvd_margin: float = 0.01,
    tvd_threshold: float = 0.05,
    init_std: float = 3.0,
    amsgrad: bool = False,
    generator: torch.Generator | KeyedRows | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> AdversarialResult:
    """Most different attention that keeps the output (J&W 2019, sec. 4.3; docs/definitions.md §10).

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) the attention
    searched is over the passage's words and each passage state carries the question's (``[h_t ; q]``),
    so the question is held fixed (J&W's ``AdversaryMulti`` on ``P.hidden`` and ``Q.last_hidden``).

    Per row with L = ``lengths[b]`` >= 2 real tokens and original attention alpha:
    K = ``candidates`` logit vectors ``z_k`` start at ``log(1/L) + init_std * noise[b, k, :L]``
    where ``noise = torch.randn((B, K, T), generator=generator, dtype=attention.dtype,
    device=attention.device)`` is drawn once, before anything else. Candidate k is
    ``a_k = softmax(z_k)`` over the prefix. With the decoder and values frozen, ``steps``
    Adam steps (``lr``, ``amsgrad``) minimise the SUM over rows of::

        -mean_k JSD(a_k, alpha) + tvd_penalty * mean_k ReLU(TVD(y_k, y) - tvd_margin)
        - diversity_weight * mean_{i<j} JSD(a_i, a_j)

    with y / y_k the output distributions under alpha / a_k. A sum over rows and Adam's
    element-wise update make each row's trajectory the one it follows alone (up to
    rounding). After the last step, among the candidates with ``TVD(y_k, y) <=
    tvd_threshold`` and the original (JSD 0), the one of largest ``JSD(a_k, alpha)`` is
    reported (ties to the original, then the lower k). Rows with L <= 1 report the
    original. The reported JSD and TVD come from :func:`attnmetrics.jsd` /
    :func:`attnmetrics.tvd`.

    An ``nn.Linear`` decoder works on the projected values ``values @ W.T`` ([B, T, C]):
    each step costs O(K T C) per row instead of O(K T H). Any other decoder is called on
    the ``rows * K`` contexts ``a_k @ values`` of a chunk at once and must be
    differentiable in them (a decoder whose output ignores the context leaves the TVD
    penalty inert; the threshold still applies). The decoder must treat rows
    independently (eval mode); its parameters get no gradient.

    Multi-head attention ``[B, heads, T]`` with values ``[B, heads, T, H]`` (a transformer's;
    docs/definitions.md §15): each candidate is one distribution per head (logits
    ``[K, heads, L]``, noise ``torch.randn((B, K, heads, T))``), a JSD between multi-head
    attentions (from the original, and between candidates) is the mean over heads of the
    per-head JSDs, the output is decoded from the heads' summed contexts, and the
    reported ``attention`` is ``[B, heads, T]``. Multi-head values may come factored
    (:class:`attnmetrics.protocol.FactoredValues`, as a transformer computes them and
    ``TestedAttention.factored`` holds them): each step then mixes each head's own vectors
    and applies the output projection to the mixed ones, reading ``heads`` times less than
    the dense values; the same search up to rounding (an ``nn.Linear`` decoder takes the
    dense values, whose projection it computes once).

    Args:
        attention: ``[B, T]`` (or ``[B, heads, T]``) float32/float64; each row (each head's
            row) non-negative, finite and summing to 1 over its prefix (rejected otherwise).
            Any strides; padding is ignored.
        values: ``[B, T, H]`` (or ``[B, heads, T, H]``), same dtype and device: the vectors
            attention averages; or, multi-head, :class:`~attnmetrics.protocol.FactoredValues`
            (``per_head [B, heads, T, E]``, ``projection [heads, E, H]``, ``offset [B, heads, H]``).
        decoder: callable mapping contexts ``[N, H]`` to logits ``[N, C]``; C == 1 is a
            sigmoid output with distribution ``(1 - p, p)``.
        lengths: ``[B]`` integer valid-prefix lengths in ``[0, T]`` (default: all T).
        candidates: K >= 1 (5 in J&W). steps: Adam steps >= 0 (500). lr: > 0 (0.01).
        tvd_penalty: weight of the output hinge (500). tvd_margin: its margin (0.01).
        diversity_weight: weight of the candidates' mean pairwise JSD (1; J&W's code weighs
            it 6.25 times less, ``--protocol jain-wallace``: 0.16).
        tvd_threshold: largest output TVD a reported candidate may have (0.05).
        init_std: standard deviation of the initial logit noise (3).
        amsgrad: Adam's AMSGrad variant (J&W's code sets it; the paper says Adam).
        generator: ``torch.Generator`` on the inputs' device, or a
            :class:`attnmetrics.KeyedRows` (noise keyed by instance), for the initial noise
            (default: torch's global generator).
        memory_budget: approximate bytes of working memory per chunk of rows (a single
            row is always processed whole). Not counted: the noise ``[B, K, T]`` and, for a
            linear decoder, the projected values ``[B, T, C]``, both held for the batch.

    Returns:
        :class:`AdversarialResult` ``(max_jsd [B], attention [B, T], output_tvd [B])`` in
        the attention dtype.

    Raises:
        ValueError: invalid attention/values/lengths/decoder output (as in
            :func:`attnmetrics.flip_fraction`; logits that are not float32/float64 too);
            values not finite on a valid prefix (named ``values``, with the row, whatever
            the decoder); an ``nn.Linear`` decoder whose ``out_features`` is 0 or whose
            weight or bias is not finite (named ``decoder.weight``/``decoder.bias``); a
            hyper-parameter out of range; a generator on another device; factored values with
            single-head attention, or whose parts' shapes, dtypes or devices do not match, or
            whose projection or offset is not finite (named ``values.projection``/``values.offset``).
        TypeError: a decoder that is not callable; ``generator`` not a ``torch.Generator``
            (or None).

    Example:
        A decoder that ignores the context lets the adversary move all the attention.

        >>> att = torch.tensor([[0.97, 0.01, 0.01, 0.01]], dtype=torch.float64)
        >>> dec = torch.nn.Linear(3, 2).double()
        >>> _ = dec.weight.data.zero_()
        >>> res = adversarial_attention(att, torch.randn(1, 4, 3, dtype=torch.float64), dec,
        ...                             generator=torch.Generator().manual_seed(0))
        >>> bool(res.max_jsd[0] > 0.5), float(res.output_tvd[0])
        (True, 0.0)
    """
    lift = None
    if isinstance(values, FactoredValues):
        if is_plain_linear(decoder):  # the closed form projects the values once: dense is as cheap
            values = check_factored(attention, values).dense()
        else:
            lift, values = values, check_factored(attention, values).per_head
    lengths = check_inputs(attention, values, lengths)
    check_decoder(decoder, values)
    budget = check_budget(memory_budget)
    k = check_int("candidates", candidates, 1)
    steps = check_int("steps", steps, 0)
    lr = _check_real("lr", lr, positive=True)
    penalty = _check_real("tvd_penalty", tvd_penalty)
    diversity = _check_real("diversity_weight", diversity_weight)
    margin = _check_real("tvd_margin", tvd_margin)
    threshold = _check_real("tvd_threshold", tvd_threshold)
    init_std = _check_real("init_std", init_std)
    if not isinstance(amsgrad, bool):
        raise ValueError(f"amsgrad must be a bool, got {amsgrad!r}")
    check_generator(generator, attention.device)

    # One code path: a single-head call is the multi-head one with one head.
    multi = attention.dim() == 3
    att = attention.detach() if multi else attention.detach()[:, None]  # [B, heads, T]
    vals = values.detach() if multi else values.detach()[:, None]  # [B, heads, T, H]
    batch, heads, width, hidden = vals.shape
    dtype, device, item = attention.dtype, attention.device, values.element_size()
    noise = normal(generator, (batch, k, heads, width), dtype, device)

    mask = token_mask(lengths, width)
    out_att = att.masked_fill(~mask[:, None], 0.0)
    out_jsd = attention.new_zeros(batch)
    out_tvd = attention.new_zeros(batch)

    linear = is_plain_linear(decoder)
    if linear:
        with torch.no_grad():
            feats_all = project(vals.flatten(0, 1), decoder.weight, lengths.repeat_interleave(heads), budget)
        c = feats_all.shape[2]
        feats_all = feats_all.view(batch, heads, width, c)
        bias = decoder.bias.detach() if decoder.bias is not None else feats_all.new_zeros(c)
        head, out_width = None, c
    elif lift is not None:  # contexts are projection-wide; each head's mixed vectors besides
        feats_all, bias, head, out_width = vals, None, decoder, 2 * lift.projection.shape[-1] + heads * hidden
        projection, offset = lift.projection.reshape(heads * hidden, -1), lift.offset.sum(1)
    else:
        feats_all, bias, head, out_width = vals, None, decoder, 2 * hidden
    classes: list[int] = []

    rows = torch.nonzero(lengths >= 2).squeeze(1)
    rows = rows[torch.argsort(lengths[rows], stable=True)]  # short rows together: less padding
    lens = lengths[rows].tolist()

    def row_bytes(w):
        return heads * _row_bytes(w, k, k * (k - 1) // 2, out_width, item)

    if not linear:  # (projected values are checked) NaN contexts would be blamed on the decoder
        check_values_finite(feats_all if multi else feats_all[:, 0], torch.where(lengths >= 2, lengths, 0))
    with deferred():  # the chunks' checks read the device once, at the end
        for s, e in _chunks(lens, row_bytes, budget):
            idx, w = rows[s:e], lens[e - 1]
            valid = mask[idx, None, None, :w]  # [n, 1, 1, w]
            alpha = out_att[idx, None, :, :w]  # [n, 1, heads, w], zero on padding
            # padding of the features is zeroed: 0 * NaN would poison the products
            feats = feats_all[idx, :, :w].masked_fill(~mask[idx, None, :w, None], 0.0)  # [n, heads, w, F]
            chunk_lift = None if lift is None else (projection, offset[idx])
            with torch.no_grad():
                y0 = _outputs(alpha, feats, head, bias, classes, chunk_lift)  # [n, 1, C']
            start = -torch.log(lengths[idx].to(dtype))[:, None, None, None]
            z = (start + init_std * noise[idx, :, :, :w]).masked_fill(~valid, PADDING_LOGIT).requires_grad_(True)
            # fused: Adam's update in one pass over z (torch >= 2.4 on the CPU), not six
            opt = torch.optim.Adam([z], lr=lr, amsgrad=amsgrad, fused=True)
            with torch.no_grad():
                for _ in range(steps):
                    z.grad = _gradient(z, alpha, y0, feats, head, bias, classes, penalty, margin, diversity, chunk_lift)
                    opt.step()  # padding's gradient is exactly 0: its logits stay put

            with torch.no_grad():
                a = torch.softmax(z.detach().masked_fill(~valid, -math.inf), -1)  # [n, K, heads, w]
                # the outputs first: the decoder's logits are checked (deferred), which names the decoder
                # if a NaN reached the candidates; projected values plus bias are finite unless it did
                outputs = _outputs(a, feats, head, bias, classes, chunk_lift)  # [n, K, C']
                if head is None:
                    defer(torch.isfinite(outputs).all(), _nonfinite_candidates)
                # distributions checked above: the distance kernels unchecked, no device read
                change = ops.tvd(outputs.contiguous(), y0.expand_as(outputs).contiguous())
                far = ops.jsd(a.contiguous(), alpha.expand_as(a).contiguous()).mean(-1)  # [n, K]: mean over heads
                score = torch.where(change <= threshold, far, -1.0)
                best = score.argmax(1, keepdim=True)  # first of equal maxima
                take = score.gather(1, best).squeeze(1) > 0  # else the original (JSD 0)
                rows_n = torch.arange(len(idx), device=device)
                out_att[idx, :, :w] = torch.where(take[:, None, None], a[rows_n, best[:, 0]], out_att[idx, :, :w])
                out_jsd[idx] = torch.where(take, far.gather(1, best).squeeze(1), out_jsd[idx])
                out_tvd[idx] = torch.where(take, change.gather(1, best).squeeze(1), out_tvd[idx])
    return AdversarialResult(out_jsd, out_att if multi else out_att[:, 0], out_tvd)
