"""Wiegreffe & Pinter 2019's diagnostic MLPs ("Attention is not not Explanation", sec. 4.2): the
per-token MLP (the ``average`` encoder, no context) trained and tested with attention imposed from
elsewhere: uniform, its own learned one, the base model's, an adversary's
(:mod:`attnmetrics.app.consistent_adversary`). Attention that helps a context-free model carries
information about which tokens matter.
"""

from __future__ import annotations

from dataclasses import replace

import attnmetrics
from attnmetrics.app.consistent_adversary import ModelFactory
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.text import EncodedSplit
from attnmetrics.models.training import AttentionSource, TrainConfig, classification_metrics, predict, train


def attention_of(model: EncoderAttentionClassifier) -> AttentionSource:
    """The attention ``model`` (frozen, eval mode) gives a batch, as an :data:`AttentionSource`."""
    model.eval()
    return lambda tokens, lengths: model(tokens, lengths)[1]


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
