"""Wiegreffe & Pinter 2019's model-consistent adversary ("Attention is not not Explanation",
sec. 4.3-4.4): for each λ a new model of the base's configuration is trained from scratch to keep
the base's predictions while moving its attention away from the base's: loss
Σ_batch [½·TVD(ŷ_adv, ŷ_base) − λ·KL(α_adv ‖ α_base)] (:func:`consistent_adversaries`), the ½
being W&P's (their TVD is ½|Δp| of the positive class, half the TVD of the two-class
distribution), so that a λ means what it means in their code; and J&W's per-instance adversary
as a point beside them (:func:`jain_wallace_point`).

Their diagnostic MLPs are in :mod:`attnmetrics.app.diagnostic_mlps`; the uniform baseline
(sec. 3.2) is the ``uniform`` attention of the classifier zoo.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

import attnmetrics
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.text import EncodedSplit
from attnmetrics.models.training import (
    TrainConfig,
    classification_metrics,
    predict,
    train,
)
from attnmetrics.outputs import output_distribution

#: builds a freshly initialised model of a configuration (same seed and embeddings as the base)
ModelFactory = Callable[[ModelConfig], EncoderAttentionClassifier]

#: the factor on the output TVD in the adversary's loss, by name (docs/definitions.md §11):
#: ``"wiegreffe-pinter"`` ½ (sarahwie/attention common_code/metrics.py:12-13, ``batch_tvd`` = Σ ½|Δ|,
#: applied to the positive class's sigmoid at model/Binary_Classification.py:126: ½ of the
#: two-class TVD), ``"standard"`` 1 (the TVD itself, ½ Σ_c |Δp_c|: this library's loss before)
TVD_SCALES = {"wiegreffe-pinter": 0.5, "standard": 1.0}


def attention_kl(p: Tensor, q: Tensor) -> Tensor:
    """KL(p ‖ q) per row in nats, p, q [B, T] attention distributions; 0·log 0 = 0, so the
    positions where p is 0 (specials, padding) add nothing. q is floored at the dtype's
    smallest normal number where p > 0, so an underflowed base weight gives a large finite
    value rather than inf. Returns [B]."""
    tiny = torch.finfo(q.dtype).tiny
    return (torch.xlogy(p, p) - p * torch.log(q.clamp_min(tiny))).sum(-1)


def output_tvd(logits: Tensor, other: Tensor) -> Tensor:
    """TVD (½ L1) between the output distributions of two logit tensors [B, C] -> [B]."""
    return 0.5 * (output_distribution(logits) - output_distribution(other)).abs().sum(-1)


def check_tvd_scale(tvd_scale) -> float:
    """The factor of a :data:`TVD_SCALES` name; ValueError for anything else."""
    if not isinstance(tvd_scale, str) or tvd_scale not in TVD_SCALES:
        raise ValueError(f"tvd_scale must be one of {tuple(TVD_SCALES)}, got {tvd_scale!r}")
    return TVD_SCALES[tvd_scale]


class ConsistentAdversary:
    """W&P's model-consistent adversary objective (sec. 4.3, eq. 1) for :func:`training.train`.

    Training loss of a batch: Σ_i [s·TVD(ŷ_adv,i, ŷ_base,i) − λ·KL(α_adv,i ‖ α_base,i)], the
    base's outputs and attention computed on the fly under no_grad; ``s`` is ½ with
    ``tvd_scale="wiegreffe-pinter"`` (the default: W&P's code sums ½|Δp| of the positive
    class, which is ½ the two-class TVD, so λ means theirs; for C > 2 classes, where their code
    has no adversary, the same ½·TVD) and 1 with ``"standard"`` (the TVD itself: a λ here is
    then 2λ in their code). The epoch kept is the one with the lowest mean of that objective on
    the dev split. The history's ``tvd`` is the TVD itself, whatever the scale."""

    def __init__(self, base: EncoderAttentionClassifier, lam: float, tvd_scale: str = "wiegreffe-pinter"):
        if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
            raise ValueError(f"lambda must be a finite number >= 0, got {lam!r}")
        self.base, self.lam = base.eval(), float(lam)
        self.scale = check_tvd_scale(tvd_scale)

    def terms(self, model: EncoderAttentionClassifier, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(output TVD [B], attention KL [B]) of ``model`` against the base."""
        with torch.no_grad():
            base_logits, base_attention = self.base(tokens, lengths)
        logits, attention = model(tokens, lengths)
        return output_tvd(logits, base_logits), attention_kl(attention, base_attention)

    def loss(self, model, batch, attention):
        tvd, kl = self.terms(model, batch.tokens, batch.lengths)
        return (self.scale * tvd - self.lam * kl).sum()

    @torch.no_grad()
    def select(self, model, dev, source, batch_size):
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        tvds, kls = [], []
        for b in dev.batches(batch_size):
            tvd, kl = self.terms(model, b.tokens.to(device), b.lengths.to(device))
            tvds.append(tvd)
            kls.append(kl)
        model.train(was_training)
        tvd, kl = torch.cat(tvds).mean().item(), torch.cat(kls).mean().item()
        objective = self.scale * tvd - self.lam * kl
        return -objective, {"objective": objective, "tvd": tvd, "kl": kl}


def consistent_adversaries(
    base: EncoderAttentionClassifier,
    make: ModelFactory,
    train_data: EncodedSplit,
    dev_data: EncodedSplit,
    test_data: EncodedSplit,
    lambdas: Sequence[float],
    config: TrainConfig,
    tvd_scale: str = "wiegreffe-pinter",
) -> tuple[dict, dict, list[EncoderAttentionClassifier]]:
    """Train one model-consistent adversary per λ (W&P 2019, sec. 4.3-4.4) and score it on test.

    Args:
        base: the trained model (frozen here).
        make: builds a fresh model of a config (same initialisation recipe as the base).
        train_data, dev_data, test_data: the base's splits.
        lambdas: the λ sweep, each >= 0.
        config: the base's training recipe (epochs, batch size, lr, seed).
        tvd_scale: the factor on the TVD in the loss (:class:`ConsistentAdversary`):
            ``"wiegreffe-pinter"`` (½, their code's; default) or ``"standard"`` (1).

    Returns:
        (summary, instances, adversaries): summary ``{"tvd_scale", "per_lambda": [{"lambda",
        "tvd_mean", "jsd_mean", "accuracy", "macro_f1", "best_epoch", "history", "seconds"},
        ...]}`` (``tvd_mean``: the test outputs' TVD itself, ½ Σ_c |Δp_c|, whatever the scale);
        instances ``{"lambda": [...], "tvd": [[N floats] per λ], "jsd": [[N floats] per λ]}``
        (test split order; TVD of output distributions, JSD of attention, nats); the models.
    """
    if not lambdas:
        raise ValueError("lambdas must hold at least one value")
    check_tvd_scale(tvd_scale)
    reference = predict(base, test_data, config.eval_batch_size)
    per_lambda, instances, models = [], {"lambda": [], "tvd": [], "jsd": []}, []
    for lam in lambdas:
        adversary = make(base.config)
        objective = ConsistentAdversary(base, lam, tvd_scale)
        result = train(adversary, train_data, dev_data, config, objective=objective)
        p = predict(adversary, test_data, config.eval_batch_size)
        tvd = attnmetrics.tvd(output_distribution(p.logits), output_distribution(reference.logits))
        jsd = attnmetrics.jsd(p.attention, reference.attention)
        metrics = classification_metrics(p.logits, p.labels)
        per_lambda.append(
            {
                "lambda": float(lam),
                "tvd_mean": float(tvd.mean()),
                "jsd_mean": float(jsd.mean()),
                "accuracy": metrics["accuracy"],
                "macro_f1": metrics["macro_f1"],
                "best_epoch": result.best_epoch,
                "history": result.history,
                "seconds": result.seconds,
            }
        )
        instances["lambda"].append(float(lam))
        instances["tvd"].append(tvd.tolist())
        instances["jsd"].append(jsd.tolist())
        models.append(adversary.eval())
    return {"tvd_scale": tvd_scale, "per_lambda": per_lambda}, instances, models


def jain_wallace_point(results: dict) -> dict | None:
    """J&W's per-instance adversary as one (mean output TVD, mean max JSD) point for the
    TVD-vs-JSD plot, from the battery's ``adversarial`` summary in ``results`` (instances with
    at least 2 tokens, as there); None when the battery did not run it."""
    adv = results.get("adversarial")
    if not adv:
        return None
    return {"tvd_mean": adv["output_tvd"]["mean"], "jsd_mean": adv["overall"]["mean"]}
