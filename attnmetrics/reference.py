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
