"""The faithfulness battery: one module per experiment and per importance, found by a registry.

- :mod:`~attnmetrics.app.battery.registry`: what a module declares (:class:`Experiment`,
  :class:`Importance`) and how the battery finds the declarations;
- :mod:`~attnmetrics.app.battery.runner`: :func:`collect` (every chosen experiment, block by
  block), :func:`merge` (ranks' shares as one) and :func:`summarise` (``results.json``);
- :mod:`~attnmetrics.app.battery.block`: one instance block as the experiments see it;
- the experiments: ``flip``, ``kendall``, ``loo``, ``heads``, ``permutation``, ``adversarial``,
  ``single_removal``, ``single_token``, ``eraser`` (and the report sections built outside a
  step: ``methods``, the importances side by side, from the others' values; W&P's trainings,
  ``consistent_adversary``, ``diagnostic``); the importances: ``gradient``, ``loo``,
  ``rollout``, ``value_norm``, ``globenc``, ``alti``, ``value_zeroing``, ``chefer``, ``decompx``,
  ``attention_flow``, ``integrated_gradients``, ``alti_logit`` and ``attnlrp`` (Llama-layout decoders
  only), ``input_x_gradient``.
"""

from attnmetrics.app.battery.block import tested_forward
from attnmetrics.app.battery.flip import DEFAULT_ORDERS
from attnmetrics.app.battery.registry import Settings, chosen, experiments, importances, missing_package
from attnmetrics.app.battery.runner import (
    EXPERIMENTS,
    BatteryConfig,
    battery_parts,
    collect,
    experiment_seeds,
    merge,
    run_conventions,
    summarise,
)

__all__ = [
    "DEFAULT_ORDERS",
    "EXPERIMENTS",
    "BatteryConfig",
    "Settings",
    "battery_parts",
    "chosen",
    "collect",
    "experiment_seeds",
    "experiments",
    "importances",
    "merge",
    "missing_package",
    "run_conventions",
    "summarise",
    "tested_forward",
]
