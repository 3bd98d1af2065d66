"""Statistics across instances and seeds: McNemar's paired test (S&S 2019, sec. 3), bootstrap
confidence intervals over instances, and W&P 2019's seed variance (sec. 3.3)."""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import torch


class McNemar(NamedTuple):
    """McNemar's exact test: discordant counts and the two-sided p-value.

    b01: instances where ``a`` is False and ``b`` True.
    b10: instances where ``a`` is True and ``b`` False.
    pvalue: two-sided exact binomial p-value of b01 among the b01 + b10 discordant
        pairs under p = ½; 1.0 when there are none.
    """

    b01: int
    b10: int
    pvalue: float


def _as_bool(name: str, x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.size == 0 and arr.ndim == 1:  # [] has no dtype to check
        arr = arr.astype(np.bool_)
    if arr.dtype != np.bool_:
        raise ValueError(f"{name} must hold booleans, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional [N], got shape {list(arr.shape)}")
    return arr


def mcnemar(a, b) -> McNemar:
    """McNemar's exact test on paired boolean outcomes (as S&S 2019, sec. 3, use it to
    compare decision flips after removing the top weight vs a random weight on the same
    instances).

    Only the discordant pairs count: under the null hypothesis that both outcomes are
    equally likely to be the one that is True, b01 ~ Binomial(b01 + b10, ½); the p-value
    is ``scipy.stats.binomtest(b01, b01 + b10, 0.5)`` (two-sided).

    Args:
        a, b: ``[N]`` booleans (torch tensors, numpy arrays or sequences), paired by index.

    Returns:
        :class:`McNemar` ``(b01, b10, pvalue)``.

    Raises:
        ValueError: inputs that are not one-dimensional booleans or differ in length.

    Example:
        >>> mcnemar([True, True, True, False], [False, False, False, False])
        McNemar(b01=0, b10=3, pvalue=0.25)
    """
    x, y = _as_bool("a", a), _as_bool("b", b)
    if x.shape != y.shape:
        raise ValueError(f"a and b must have one length, got {x.shape[0]} and {y.shape[0]}")
    b01 = int(np.count_nonzero(~x & y))
    b10 = int(np.count_nonzero(x & ~y))
    if b01 + b10 == 0:
        return McNemar(b01, b10, 1.0)
    from scipy.stats import binomtest

    return McNemar(b01, b10, float(binomtest(b01, b01 + b10, 0.5).pvalue))


#: Resamples ``scipy.stats.bootstrap`` evaluates at a time: the same draws and intervals as all
#: at once, in bounded memory (M rows x 100 x N values, not x 9,999) and 2-3x less time
_BATCH = 100


def bootstrap_ci(
    data, statistic, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval over instances, through ``scipy.stats.bootstrap``.

    Args:
        data: one array or a tuple of arrays, each ``[..., N]`` with the instances on the last
            axis; with several arrays the instances are resampled together (paired).
        statistic: ``statistic(*arrays, axis=-1)`` -> the statistic along ``axis`` (vectorised,
            e.g. ``np.nanmean``).
        confidence: confidence level of the two-sided interval.
        n_resamples: bootstrap resamples.
        seed: seed of the resampling (``numpy.random.default_rng``), so reports are reproducible.

    Returns:
        ``(low, high)``; ``(nan, nan)`` with fewer than 2 instances. Constant data gives ``(c, c)``.
    """
    from scipy.stats import bootstrap

    data = tuple(np.asarray(d) for d in (data if isinstance(data, tuple) else (data,)))
    if data[0].shape[-1] < 2:
        return float("nan"), float("nan")
    res = bootstrap(
        data,
        statistic,
        n_resamples=n_resamples,
        confidence_level=confidence,
        paired=len(data) > 1,
        vectorized=True,
        axis=-1,
        method="percentile",
        rng=np.random.default_rng(seed),
        batch=_BATCH,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_ci_rows(
    rows, statistic, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0
) -> list[tuple[float, float]]:
    """:func:`bootstrap_ci` of each row of ``rows`` ``[M, N]`` (M quantities over the same N
    instances) in one ``scipy.stats.bootstrap`` call: every row is resampled with the same
    instance draws (a paired comparison of the rows), M times faster than M calls.
    ``statistic(x, axis=-1)`` as :func:`bootstrap_ci`'s. Returns ``[(low, high)] * M``."""
    from scipy.stats import bootstrap

    rows = np.asarray(rows, dtype=float)
    if rows.ndim != 2:
        raise ValueError(f"rows must be [M, N], got shape {list(rows.shape)}")
    if rows.shape[1] < 2:
        return [(float("nan"), float("nan"))] * rows.shape[0]
    res = bootstrap(
        (rows,),
        statistic,
        n_resamples=n_resamples,
        confidence_level=confidence,
        vectorized=True,
        axis=-1,
        method="percentile",
        rng=np.random.default_rng(seed),
        batch=_BATCH,
    )
    low, high = np.atleast_1d(res.confidence_interval.low), np.atleast_1d(res.confidence_interval.high)
    return [(float(a), float(b)) for a, b in zip(low, high)]


class SeedInstanceCI(NamedTuple):
    """An estimate over seeds and instances and its interval (:func:`seed_instance_ci`)."""

    estimate: float  # the statistic on the data as observed
    low: float
    high: float


def seed_instance_ci(
    data,
    statistic,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
    chunk: int = 256,
) -> SeedInstanceCI:
    """A statistic over seeds and test instances, with a percentile bootstrap interval that
    resamples both: the seeds (with replacement), then the instances (with replacement; one draw
    for every seed of a resample, since every seed is tested on the same instances, which keeps
    them paired). With one seed it is the ordinary bootstrap over instances.

    The estimate is the statistic the interval bootstraps, on the data as observed: the mean over
    seeds of each seed's ``statistic`` over the instances (seeds where it is NaN left out), so
    the interval is about the number reported (Davison & Hinkley 1997, sec. 3.8, for resampling
    both levels of a two-level design).

    Args:
        data: ``[S, N]`` float (seeds x instances; NaN where an instance is undefined), or a tuple
            of arrays each ``[..., N]`` with the seeds on the first axis where they differ
            (e.g. ``(labels [N], predicted [S, N])``): resampled together.
        statistic: ``statistic(*arrays, axis=-1)`` -> the per-seed statistic along the instances,
            vectorised over leading axes (e.g. ``np.nanmean``).
        confidence: confidence level of the two-sided interval.
        n_resamples: bootstrap resamples.
        seed: seed of the resampling (``numpy.random.default_rng``), so reports are reproducible.
        chunk: resamples drawn at a time (memory: ``chunk * S * N`` values).

    Returns:
        ``(estimate, low, high)``; the interval is ``(nan, nan)`` with fewer than 2 instances.
    """
    arrays = tuple(np.asarray(d) for d in (data if isinstance(data, tuple) else (data,)))
    seeded = [a.ndim > 1 for a in arrays]
    seeds = max((a.shape[0] for a, s in zip(arrays, seeded) if s), default=1)
    n = arrays[0].shape[-1]

    def per_seed(parts, seed_index, instance_index):  # [R, S] statistic per resample and seed
        picked = []
        for a, s in zip(parts, seeded):
            if s:  # [S, N] -> [R, S, N]: the resample's seeds, then its instances
                a = a[seed_index]
                picked.append(np.take_along_axis(a, np.broadcast_to(instance_index[:, None, :], a.shape), -1))
            else:  # [N] -> [R, 1, N]: the same for every seed
                picked.append(a[instance_index][:, None, :])
        return statistic(*picked, axis=-1)

    whole = per_seed(arrays, np.arange(seeds)[None, :], np.arange(n)[None, :])
    estimate = float(_nanmean_quiet(whole[0]))
    if n < 2:
        return SeedInstanceCI(estimate, float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    if statistic is nanmean and len(arrays) == 1:  # a mean: the resampled instances as counts, one matmul
        per_seed = _counted_nanmean(arrays[0].reshape(seeds, n))
    draws = []
    for start in range(0, n_resamples, chunk):
        r = min(chunk, n_resamples - start)
        seed_index = rng.integers(seeds, size=(r, seeds)) if seeds > 1 else np.zeros((r, 1), dtype=np.int64)
        draws.append(_nanmean_quiet(per_seed(arrays, seed_index, rng.integers(n, size=(r, n))), axis=-1))
    draws = np.concatenate(draws)
    draws = draws[np.isfinite(draws)]
    if not draws.size:
        return SeedInstanceCI(estimate, float("nan"), float("nan"))
    alpha = (1 - confidence) / 2
    low, high = np.quantile(draws, [alpha, 1 - alpha])
    return SeedInstanceCI(estimate, float(low), float(high))


def nanmean(x, axis=-1):
    """``np.nanmean`` along ``axis``, NaN (without a warning) where a slice is all NaN. Given as
    :func:`seed_instance_ci`'s statistic, the bootstrap takes its fast path (:func:`_counted_nanmean`)."""
    return _nanmean_quiet(x, axis=axis)


def _counted_nanmean(x: np.ndarray):
    """:func:`seed_instance_ci`'s ``per_seed`` for ``nanmean`` over ``x [S, N]``: a resample's instances
    as how often each is drawn, ``c [R, N]``, so each seed's mean is ``(c @ x₀ᵀ) / (c @ finiteᵀ)``
    (x₀: x with NaN as 0), then the resample's seeds picked from the ``[R, S]`` result: the same
    numbers as gathering ``[R, S, N]`` and averaging (to rounding), at one matrix product's cost."""
    finite = np.isfinite(x)
    filled, weights = np.where(finite, x, 0.0).astype(np.float64).T, finite.astype(np.float64).T  # [N, S]
    n = x.shape[1]

    def per_seed(_parts, seed_index, instance_index):  # [R, S]
        r = instance_index.shape[0]
        counts = np.bincount((instance_index + n * np.arange(r)[:, None]).ravel(), minlength=r * n)
        counts = counts.reshape(r, n).astype(np.float64)
        sums, kept = counts @ filled, counts @ weights  # [R, S] over every seed
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(kept > 0, sums / np.where(kept > 0, kept, 1.0), np.nan)
        return np.take_along_axis(means, np.broadcast_to(seed_index, (r, seed_index.shape[1])), -1)

    return per_seed


def _nanmean_quiet(x, axis=None):
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: NaN, on purpose
        return np.nanmean(x, axis=axis)


def macro_f1(labels, predicted, num_classes: int, axis: int = -1) -> np.ndarray:
    """Macro-averaged F1 along ``axis``, vectorised over the other axes (for bootstrapping);
    equals ``sklearn.metrics.f1_score(average="macro", labels=range(num_classes), zero_division=0)``.

    Args:
        labels, predicted: broadcastable int arrays of class indices.
        num_classes: C; every class counts in the average, an absent one with F1 = 0.
    """
    labels, predicted = np.asarray(labels), np.asarray(predicted)
    f1 = []
    for c in range(num_classes):
        tp = np.sum((predicted == c) & (labels == c), axis=axis)
        wrong = np.sum((predicted == c) != (labels == c), axis=axis)  # FP + FN
        denom = 2 * tp + wrong
        f1.append(np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0))
    return np.mean(f1, axis=0)


class SeedVariance(NamedTuple):
    """Per-instance seed variance (W&P 2019, sec. 3.3): ``median_jsd`` [N], the median over the
    other seeds of JSD(base attention, seed attention) in nats; ``mean_tvd`` [N], the mean over the
    other seeds of the TVD between the base's and the seed's output distributions."""

    median_jsd: np.ndarray
    mean_tvd: np.ndarray


def seed_variance(attention, logits) -> SeedVariance:
    """How much attention and output move between models trained with different seeds on the
    same data (Wiegreffe & Pinter 2019, sec. 3.3), the first model being the base.

    Args:
        attention: ``[S, N, T]`` float, S >= 2 models' attention on the same N instances, each
            row a distribution (zero past its length).
        logits: ``[S, N, C]`` float decoder logits (``C == 1``: one sigmoid output).

    Returns:
        :class:`SeedVariance` of float64 ``[N]`` arrays.

    Raises:
        ValueError: fewer than 2 models or mismatched shapes.
    """
    from attnmetrics.distances import jsd, tvd
    from attnmetrics.outputs import output_distribution

    a = torch.as_tensor(np.asarray(attention), dtype=torch.float64)
    z = torch.as_tensor(np.asarray(logits), dtype=torch.float64)
    if a.dim() != 3 or z.dim() != 3 or a.shape[0] < 2 or a.shape[:2] != z.shape[:2]:
        raise ValueError(
            f"attention must be [S, N, T] and logits [S, N, C] with S >= 2 and one S, N; "
            f"got {list(a.shape)} and {list(z.shape)}"
        )
    p = torch.stack([output_distribution(zs) for zs in z])
    jsds = jsd(a[:1].expand_as(a[1:]), a[1:])  # [S - 1, N]
    tvds = tvd(p[:1].expand_as(p[1:]), p[1:])
    return SeedVariance(np.median(jsds.numpy(), axis=0), tvds.mean(0).numpy())
