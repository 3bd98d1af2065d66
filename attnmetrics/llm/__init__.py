"""Attention-derived attributions on pre-RMSNorm Llama-layout decoders (docs/definitions.md §20, "On a
pre-RMSNorm decoder"): attention × value norm (Kobayashi et al. 2020), ALTI (Ferrando et al. 2022,
as Ferrando et al. 2023 apply it to decoders), ALTI-Logit (Ferrando et al. 2023), Chefer et al.'s
gradient-weighted rollout (2021) and Value Zeroing (Mohebbi et al. 2023) carried over, AttnLRP
(Achtibat et al. 2024: lxt's rules, :mod:`attnmetrics.llm.attnlrp`); GlobEnc and DecompX refused
(their modules' ``REASON``).

Each ``f(model, tokens, lengths, *, memory_budget) -> [B, T]`` gives every item's importance for
the deciding position's decision, zero past each row's length, on

- an ``HFClassifier`` of family ``"llama"`` (``LlamaForSequenceClassification``, Qwen2, Mistral):
  the items are all the row's tokens, the deciding position its last real token;
- a ``PromptedLM``: the items are the text's tokens, at positions ``first .. first + L - 1`` of the
  whole input (``model.sequence``), the deciding position the answer position; the template's
  positions take part in every computation and are not scored.

:mod:`attnmetrics.llm.layers` reads the layers (RMSNorm, grouped values, output projection) and runs
the traced forward; one module per method. Batched over rows (padding masked), chunked to a memory
budget, device-agnostic; the references are the plain per-sentence loops of
``attnmetrics/testing/llm_reference.py``.
"""

from attnmetrics.llm.alti import alti
from attnmetrics.llm.alti_logit import alti_logit, alti_logit_contributions
from attnmetrics.llm.chefer import gradient_weighted_rollout
from attnmetrics.llm.decompx import decompx
from attnmetrics.llm.globenc import globenc
from attnmetrics.llm.layers import supports
from attnmetrics.llm.value_norm import attention_value_norm
from attnmetrics.llm.value_zeroing import value_zeroing

#: the methods by the battery's names for them (``--importances NAME``); GlobEnc's and DecompX's refuse
METHODS = {
    "value_norm": attention_value_norm,
    "globenc": globenc,
    "alti": alti,
    "alti_logit": alti_logit,
    "value_zeroing": value_zeroing,
    "chefer": gradient_weighted_rollout,
    "decompx": decompx,
}

__all__ = [
    "METHODS",
    "alti",
    "alti_logit",
    "alti_logit_contributions",
    "attention_value_norm",
    "decompx",
    "globenc",
    "gradient_weighted_rollout",
    "supports",
    "value_zeroing",
]
