"""attnmetrics: does a model's attention explain its decision?

Tensor metrics and model-agnostic faithfulness procedures from Jain & Wallace 2019,
Wiegreffe & Pinter 2019, Serrano & Smith 2019, Tutek & Snajder 2020 and ERASER (DeYoung et al. 2020), on a C++ core
that is JIT-compiled on first import.
"""

from attnmetrics.adversarial import AdversarialResult, adversarial_attention
from attnmetrics.attributions import (
    alti,
    attention_flow,
    attention_value_norm,
    decompx,
    globenc,
    gradient_weighted_rollout,
    value_zeroing,
)
from attnmetrics.distances import jsd, tvd
from attnmetrics.eraser import (
    EraserResult,
    FullRows,
    comprehensiveness,
    comprehensiveness_and_sufficiency,
    full_rows,
    sufficiency,
)
from attnmetrics.flip import FlipResult, attention_gradient, flip_fraction
from attnmetrics.importance import gradient_importance, input_x_gradient, integrated_gradients
from attnmetrics.kendall import KendallTau, kendall_tau
from attnmetrics.keyed import KeyedRows
from attnmetrics.loo import leave_one_out
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.permutation import PermutationResult, permutation_test
from attnmetrics.protocol import AttentionClassifier, is_attention_classifier
from attnmetrics.rollout import attention_rollout
from attnmetrics.single_removal import SingleRemovalResult, single_removal
from attnmetrics.single_token import SingleTokenResult, single_token_test

__version__ = "0.1.0"

__all__ = [
    "adversarial_attention",
    "AdversarialResult",
    "alti",
    "attention_flow",
    "attention_gradient",
    "attention_rollout",
    "attention_value_norm",
    "AttentionClassifier",
    "comprehensiveness",
    "comprehensiveness_and_sufficiency",
    "decision",
    "decompx",
    "EraserResult",
    "FullRows",
    "full_rows",
    "flip_fraction",
    "gradient_importance",
    "gradient_weighted_rollout",
    "input_x_gradient",
    "integrated_gradients",
    "is_attention_classifier",
    "FlipResult",
    "globenc",
    "jsd",
    "kendall_tau",
    "KeyedRows",
    "KendallTau",
    "leave_one_out",
    "output_distribution",
    "permutation_test",
    "PermutationResult",
    "single_removal",
    "SingleRemovalResult",
    "single_token_test",
    "SingleTokenResult",
    "sufficiency",
    "tvd",
    "value_zeroing",
]
