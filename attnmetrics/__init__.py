"""attnmetrics: does a model's attention explain its decision?

Tensor metrics and model-agnostic faithfulness procedures from Jain & Wallace 2019,
Wiegreffe & Pinter 2019, Serrano & Smith 2019 and Tutek & Snajder 2020, on a C++ core
that is JIT-compiled on first import.
"""

from attnmetrics.distances import jsd, tvd
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.protocol import AttentionClassifier
from attnmetrics.ranking import KendallTau, kendall_tau
from attnmetrics.removal import FlipResult, attention_gradient, flip_fraction
from attnmetrics.adversarial import AdversarialResult, adversarial_attention

__version__ = "0.1.0"

__all__ = [
    "AttentionClassifier",
    "FlipResult",
    "KendallTau",
    "attention_gradient",
    "decision",
    "flip_fraction",
    "jsd",
    "kendall_tau",
    "output_distribution",
    "tvd",
    "AdversarialResult",
    "adversarial_attention",
]
