"""Plain-loop references of every op, written to follow the papers' descriptions step by step.

Tests compare the kernels against these; benchmarks time the kernels against the
approach the papers' own code takes. Deliberately slow and obvious: no vectorisation
beyond what the papers' code used.
"""

from __future__ import annotations

# ---- distances and rank correlation (J&W 2019) -------------------------------------------

import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


def tvd_reference(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """½ Σ |p - q| along ``dim``: the formula as written, in the inputs' dtype."""
    return 0.5 * (p - q).abs().sum(dim)


def jsd_reference(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """½ KL(p ‖ m) + ½ KL(q ‖ m), m = (p + q) / 2, in nats, 0 log 0 = 0 (xlogy), in the inputs' dtype."""
    m = 0.5 * (p + q)
    kl_pm = (torch.special.xlogy(p, p) - torch.special.xlogy(p, m)).sum(dim)
    kl_qm = (torch.special.xlogy(q, q) - torch.special.xlogy(q, m)).sum(dim)
    return 0.5 * (kl_pm + kl_qm)


def kendall_tau_reference(x: torch.Tensor, y: torch.Tensor, lengths: torch.Tensor | None = None):
    """One ``scipy.stats.kendalltau`` call per row on its valid prefix, as J&W's code does.

    Returns ``(tau, pvalue)``, each ``[B]`` in x's dtype; NaN where scipy gives NaN.
    """
    from scipy import stats

    xs = x.detach().cpu().numpy()
    ys = y.detach().cpu().numpy()
    lens = [x.shape[1]] * x.shape[0] if lengths is None else lengths.tolist()
    tau = np.empty(len(lens))
    pvalue = np.empty(len(lens))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on every row shorter than 2
        for b, n in enumerate(lens):
            res = stats.kendalltau(xs[b, :n], ys[b, :n])
            tau[b], pvalue[b] = res.statistic, res.pvalue
    return torch.from_numpy(tau).to(x.dtype), torch.from_numpy(pvalue).to(x.dtype)


# ---- removal and flip search (S&S 2019) ----------------------------------------------------

import math  # noqa: E402  (imports kept inside this section)

import torch  # noqa: E402

from attnmetrics.outputs import decision, output_distribution  # noqa: E402
from attnmetrics.removal import FlipResult  # noqa: E402


def _flip_result(removed, lengths, mass, dtype):
    removed = torch.as_tensor(removed, dtype=torch.int64)
    lengths = torch.as_tensor(lengths, dtype=torch.int64, device=removed.device)
    flipped = removed >= 0
    fraction = torch.where(flipped, removed.to(dtype) / lengths.to(dtype), math.nan)
    return FlipResult(removed, fraction, flipped, torch.as_tensor(mass, dtype=torch.float64).to(dtype))


def _reference_scores(order, attention, values, decoder, lengths):
    """[B, T] scores of an order, the gradient ones by autograd on each row's attention."""
    if not isinstance(order, str):
        return order
    if order == "attention":
        return attention
    if order == "reverse":
        return -attention
    if order not in ("gradient", "attn_grad", "sign_grad_attn"):
        raise ValueError(f"reference order must be a score tensor or a deterministic name, got {order!r}")
    grad = torch.zeros_like(attention)
    for b in range(attention.shape[0]):
        n = int(lengths[b])
        if n == 0:
            continue
        with torch.enable_grad():
            alpha = attention[b, :n].detach().clone().requires_grad_(True)
            context = (alpha[:, None] * values[b, :n].detach()).sum(0)
            logits = decoder(context[None])
            y = int(decision(logits.detach())[0])
            (g,) = torch.autograd.grad(output_distribution(logits)[0, y], alpha)
        grad[b, :n] = g
    if order == "gradient":
        return grad
    if order == "attn_grad":
        return attention * grad
    return torch.sign(grad) * attention


def flip_fraction_reference(attention, values, decoder, lengths, order="attention"):
    """S&S 2019 flip search, one row and one removal step at a time (DESIGN §4).

    For each row: sort its valid prefix by score (descending, ties to the lower index);
    for k = 1 .. L-1 zero the next weight, renormalise the rest to sum to 1 (a zero
    context if nothing is left), rebuild the context sum_t alpha'_t h_t, run the decoder
    on that one context and compare its decision with the one at k = 0.
    ``order``: "attention", "reverse", "gradient", "attn_grad", "sign_grad_attn" or a
    [B, T] score tensor (for random orders pass the scores). Returns a FlipResult.
    """
    scores = _reference_scores(order, attention, values, decoder, lengths)
    removed, mass = [], []
    with torch.no_grad():
        for b in range(attention.shape[0]):
            n = int(lengths[b])
            row_scores = [float(x) for x in scores[b, :n]]
            ranked = sorted(range(n), key=lambda i: -row_scores[i])  # stable: ties keep index order
            weights = attention[b, :n].clone()
            h = values[b, :n]

            def decide(w):
                total = w.sum()
                context = (w / total)[:, None].mul(h).sum(0) if total != 0 else torch.zeros_like(h[0])
                return int(decision(decoder(context[None]))[0])

            first, gone = -1, math.nan
            if n >= 2:
                original = decide(weights)
                for k in range(1, n):
                    weights[ranked[k - 1]] = 0
                    if decide(weights) != original:
                        first = k
                        gone = math.fsum(float(attention[b, i]) for i in ranked[:k])
                        break
            removed.append(first)
            mass.append(gone)
    return _flip_result(removed, lengths, mass, attention.dtype)


def flip_search_sequential(attention, values, decoder, lengths, order_scores="attention"):
    """The batch-level loop of S&S's code: at step k zero the k-th item of every row still
    searching, renormalise, re-run the decoder on the whole live batch, drop the rows whose
    decision flipped (or that have only one item left). Same result as
    :func:`flip_fraction_reference`; this is the approach the benchmarks time against.
    ``order_scores``: a [B, T] score tensor or an order name as in the reference above.
    """
    with torch.no_grad():
        batch, width = attention.shape
        device = attention.device  # runs where the inputs are, as S&S's code ran on the GPU
        lengths = torch.as_tensor(lengths, dtype=torch.int64, device=device)
        scores = _reference_scores(order_scores, attention, values, decoder, lengths)
        valid = torch.arange(width, device=device) < lengths[:, None]
        # ascending stable sort of -score = descending with ties to the lower index
        key = torch.where(valid, -scores.to(torch.float64), math.inf)
        order = torch.argsort(key, dim=1, stable=True)
        weights = attention.masked_fill(~valid, 0)

        def decide(w, h):
            total = w.sum(1, keepdim=True)
            norm = torch.where(total > 0, w / torch.where(total > 0, total, 1), 0)
            return decision(decoder(torch.bmm(norm.unsqueeze(1), h).squeeze(1)))

        original = decide(weights, values)
        removed = torch.full((batch,), -1, dtype=torch.int64, device=device)
        mass = torch.full((batch,), math.nan, dtype=torch.float64, device=device)
        rows = torch.nonzero(lengths >= 2).squeeze(1)
        w, h, o = weights[rows], values[rows], order[rows]
        n_items, base = lengths[rows], original[rows]
        gone = torch.zeros(rows.shape[0], dtype=torch.float64, device=device)
        live = torch.ones(rows.shape[0], dtype=torch.bool, device=device)
        k = 0
        while live.any():
            k += 1
            pos = o[:, k - 1 : k]
            gone += w.gather(1, pos).squeeze(1).to(torch.float64)
            w.scatter_(1, pos, 0)
            flip = live & (decide(w, h) != base)
            removed[rows[flip]] = k
            mass[rows[flip]] = gone[flip]
            live &= ~flip & (n_items - 1 > k)
            # Drop finished rows from the batch once a quarter of it is dead (copying the
            # batch on every step would cost as much as the decoder pass itself).
            if live.sum() < 0.75 * live.shape[0]:
                keep = torch.nonzero(live).squeeze(1)
                span = int(n_items[keep].max()) if keep.numel() else 0  # trim trailing padding
                rows, n_items, base, gone = rows[keep], n_items[keep], base[keep], gone[keep]
                w, h, o = w[keep, :span], h[keep, :span], o[keep, :span]
                live = live[keep]
    return _flip_result(removed, lengths, mass, attention.dtype)
