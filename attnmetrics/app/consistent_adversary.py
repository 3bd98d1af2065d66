"""Wiegreffe & Pinter 2019's experiments that train models ("Attention is not not Explanation").

- :func:`consistent_adversaries` (sec. 4.3-4.4): for each λ a new model of the base's
  configuration is trained from scratch to keep the base's predictions while moving its
  attention away from the base's: loss Σ_batch [TVD(ŷ_adv, ŷ_base) − λ·KL(α_adv ‖ α_base)].
- :func:`diagnostic_mlps` (sec. 4.2): the per-token MLP (the ``average`` encoder, no context)
  trained and tested with attention imposed from elsewhere: uniform, its own learned one, the
  base model's, an adversary's. Attention that helps a context-free model carries
  information about which tokens matter.

The uniform baseline (sec. 3.2) is the ``uniform`` attention of the classifier zoo.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

import attnmetrics
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.text import EncodedSplit
from attnmetrics.models.training import (
    AttentionSource,
    TrainConfig,
    classification_metrics,
    predict,
    train,
)
from attnmetrics.outputs import output_distribution

#: builds a freshly initialised model of a configuration (same seed and embeddings as the base)
ModelFactory = Callable[[ModelConfig], EncoderAttentionClassifier]


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


def attention_of(model: EncoderAttentionClassifier) -> AttentionSource:
    """The attention ``model`` (frozen, eval mode) gives a batch, as an :data:`AttentionSource`."""
    model.eval()
    return lambda tokens, lengths: model(tokens, lengths)[1]


class ConsistentAdversary:
    """W&P's model-consistent adversary objective (sec. 4.3, eq. 1) for :func:`training.train`.

    Training loss of a batch: Σ_i [TVD(ŷ_adv,i, ŷ_base,i) − λ·KL(α_adv,i ‖ α_base,i)], the
    base's outputs and attention computed on the fly under no_grad. The epoch kept is the one
    with the lowest mean of that objective on the dev split."""

    def __init__(self, base: EncoderAttentionClassifier, lam: float):
        if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
            raise ValueError(f"lambda must be a finite number >= 0, got {lam!r}")
        self.base, self.lam = base.eval(), float(lam)

    def terms(self, model: EncoderAttentionClassifier, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(output TVD [B], attention KL [B]) of ``model`` against the base."""
        with torch.no_grad():
            base_logits, base_attention = self.base(tokens, lengths)
        logits, attention = model(tokens, lengths)
        return output_tvd(logits, base_logits), attention_kl(attention, base_attention)

    def loss(self, model, batch, attention):
        tvd, kl = self.terms(model, batch.tokens, batch.lengths)
        return (tvd - self.lam * kl).sum()

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
        objective = tvd - self.lam * kl
        return -objective, {"objective": objective, "tvd": tvd, "kl": kl}


def consistent_adversaries(
    base: EncoderAttentionClassifier,
    make: ModelFactory,
    train_data: EncodedSplit,
    dev_data: EncodedSplit,
    test_data: EncodedSplit,
    lambdas: Sequence[float],
    config: TrainConfig,
) -> tuple[dict, dict, list[EncoderAttentionClassifier]]:
    """Train one model-consistent adversary per λ (W&P 2019, sec. 4.3-4.4) and score it on test.

    Args:
        base: the trained model (frozen here).
        make: builds a fresh model of a config (same initialisation recipe as the base).
        train_data, dev_data, test_data: the base's splits.
        lambdas: the λ sweep, each >= 0.
        config: the base's training recipe (epochs, batch size, lr, seed).

    Returns:
        (summary, instances, adversaries): summary ``{"per_lambda": [{"lambda", "tvd_mean",
        "jsd_mean", "accuracy", "macro_f1", "best_epoch", "history", "seconds"}, ...]}``;
        instances ``{"lambda": [...], "tvd": [[N floats] per λ], "jsd": [[N floats] per λ]}``
        (test split order; TVD of output distributions, JSD of attention, nats); the models.
    """
    if not lambdas:
        raise ValueError("lambdas must hold at least one value")
    reference = predict(base, test_data, config.eval_batch_size)
    per_lambda, instances, models = [], {"lambda": [], "tvd": [], "jsd": []}, []
    for lam in lambdas:
        adversary = make(base.config)
        result = train(adversary, train_data, dev_data, config, objective=ConsistentAdversary(base, lam))
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
    return {"per_lambda": per_lambda}, instances, models


def diagnostic_mlps(
    base: EncoderAttentionClassifier,
    make: ModelFactory,
    train_data: EncodedSplit,
    dev_data: EncodedSplit,
    test_data: EncodedSplit,
    config: TrainConfig,
    adversary: EncoderAttentionClassifier | None = None,
) -> tuple[dict, dict]:
    """W&P 2019's diagnostic MLPs (sec. 4.2): the ``average`` encoder (per-token Linear + tanh)
    with imposed attention, trained and tested with it.

    Variants: ``uniform`` (1/L, frozen), ``trained`` (the MLP learns its own attention, of the
    base's kind; ``tanh`` when the base is uniform), ``base`` (the base model's attention per
    instance), ``adversary`` (``adversary``'s attention; only when given). Each is built by
    ``make`` with the base's embedding and hidden sizes and trained with ``config``, keeping
    the epoch with the best dev ROC-AUC under the same imposed attention.

    Returns (summary, instances): summary ``{variant: {"accuracy", "macro_f1", "roc_auc",
    "best_epoch"}}``; instances ``{variant: {"predicted": [N ints]}}`` in test split order.
    """
    mlp = replace(base.config, encoder="average", regulariser="none", attention="uniform")
    own = base.config.attention if base.config.attention != "uniform" else "tanh"
    variants: dict[str, tuple[ModelConfig, AttentionSource | None]] = {
        "uniform": (mlp, None),
        "trained": (replace(mlp, attention=own), None),
        "base": (mlp, attention_of(base)),  # the imposed attention replaces the (parameter-free) uniform one
    }
    if adversary is not None:
        variants["adversary"] = (mlp, attention_of(adversary))
    summary, instances = {}, {}
    for name, (cfg, source) in variants.items():
        model = make(cfg)
        result = train(model, train_data, dev_data, config, attention_source=source)
        p = predict(model, test_data, config.eval_batch_size, attention_source=source)
        summary[name] = {**classification_metrics(p.logits, p.labels), "best_epoch": result.best_epoch}
        instances[name] = {"predicted": attnmetrics.decision(p.logits).tolist()}
    return summary, instances


def jain_wallace_point(results: dict) -> dict | None:
    """J&W's per-instance adversary as one (mean output TVD, mean max JSD) point for the
    TVD-vs-JSD plot, from the battery's ``adversarial`` summary in ``results`` (instances with
    at least 2 tokens, as there); None when the battery did not run it."""
    adv = results.get("adversarial")
    if not adv:
        return None
    return {"tvd_mean": adv["output_tvd"]["mean"], "jsd_mean": adv["overall"]["mean"]}
