"""Attention-derived token attributions of a post-LayerNorm transformer classifier (docs/definitions.md
§20): attention × value norm (Kobayashi et al. 2020), GlobEnc (Modarressi et al. 2022), ALTI
(Ferrando et al. 2022), Value Zeroing (Mohebbi et al. 2023), gradient-weighted attention
rollout (Chefer et al. 2021, ICCV), DecompX (Modarressi et al. 2023, ACL) and attention flow (Abnar &
Zuidema 2020, ACL), each the importance of every real token for the pooled position's (``[CLS]``'s;
our GPT's ``<extract>``) decision. Attention flow needs the layers' attention alone and runs on
every model attention rollout runs on (our GPT classifier, whatever its read-out, and GPT-2-like
Hugging Face classifiers too: see :func:`attention_flow`).

Every other function takes a model on the protocol that is one of:

- a post-LayerNorm BERT encoder classifier as its ``hf`` attribute
  (``BertForSequenceClassification``: BERT, MiniLM, ...; the adapter
  ``attnmetrics.models.hf.HFClassifier`` is one), whose layers' attention probabilities are read
  from the module's own forward (forward hooks on the self-attention modules: the model's attention
  implementation must return its probabilities, as eager attention and the adapter's do);
- our GPT classifier (``models/gpt_classifier.py`` ``GPTClassifier``: post-LayerNorm blocks as
  BERT's, causal attention, one ``qkv`` Linear, GELU's tanh approximation) with GPT-1's read-out
  (``attention="extract"``, ``--attention extract``), whose decoder classifies the pooled position's
  (``<extract>``'s, each row's last) final state, the state these methods explain. Its blocks are
  run one by one, the probabilities those ``CausalSelfAttention.attention`` makes (0 on later and
  padded keys). A GPT classifier with an attention head (``tanh``, ``dot``, ``uniform``) is refused:
  its decoder reads an attention-weighted sum of the real tokens' states, not ``<extract>``'s, so
  the pooled state's decomposition would not explain its decision.

Each layer is read through :class:`LayerParts` (value and output projections, the two LayerNorms,
the feed-forward network), so one implementation of each method serves both; what the methods
need is recomputed from those weights. Batched over rows (padding masked: padded keys carry no
attention, padded queries are zeroed), chunked to a memory budget, device-agnostic. GPT-2-like
(pre-LayerNorm) classifiers are refused: the authors' decompositions of residual and LayerNorm do
not apply to them.

Precision: a float16 or bfloat16 model is run in float32, its forward included. For the call, its
half parameters and buffers hold their values as float32 (the same numbers; its own tensors are put
back after, also on an error), so every method returns, in float32, exactly what it returns for the
same weights converted to float32. In the half dtype the decompositions are differences of nearly
equal numbers (ALTI's ``||y_i||_1 - d_ij``, Value Zeroing's distances between a state and its
altered self, DecompX's and Chefer's logits): a random width-256 BERT's ALTI was 95 % off its
float32 value in bfloat16. The float32 copies hold twice the half weights' bytes for the call,
outside the chunks' memory budget; the model must not be used elsewhere meanwhile.

The layer notation of the first four: layer ``l`` maps its input ``x`` ``[T, d]`` (the embeddings'
output for ``l = 0``) through heads ``h`` with attention ``A_h`` ``[T, T]`` and values
``v_h(x_j) = x_j W_V^h + b_V^h``; ``f_h(x_j) = v_h(x_j) W_O^h`` is head h's value through its slice
of the output projection (``b_V`` included, ``b_O`` not: Kobayashi et al. 2020, sec. 3, and every
author's code). The attention block's pre-LayerNorm state is
``p_i = sum_j z_ij + b_O`` with ``z_ij = sum_h A_h[i, j] f_h(x_j) + [i = j] x_i`` (the residual
belongs to the token itself), its output ``a_i = LN_1(p_i)``, and the layer's output
``LN_2(FFN(a_i) + a_i)``.
"""

from __future__ import annotations

from attnmetrics.attributions.alti import alti
from attnmetrics.attributions.chefer import gradient_weighted_rollout
from attnmetrics.attributions.decompx import decompx, decompx_contributions
from attnmetrics.attributions.flow import FLOW_SCALE, attention_flow
from attnmetrics.attributions.globenc import globenc
from attnmetrics.attributions.layers import LayerParts, bert_layers, length_groups, supports
from attnmetrics.attributions.value_norm import attention_value_norm
from attnmetrics.attributions.value_zeroing import value_zeroing

#: The attention-derived attributions by the battery's names for them (``--importances NAME``)
METHODS = {
    "value_norm": attention_value_norm,
    "globenc": globenc,
    "alti": alti,
    "value_zeroing": value_zeroing,
    "chefer": gradient_weighted_rollout,
    "decompx": decompx,
    "attention_flow": attention_flow,
}

__all__ = [
    "FLOW_SCALE",
    "LayerParts",
    "METHODS",
    "_in_float32",
    "alti",
    "attention_flow",
    "attention_value_norm",
    "bert_layers",
    "decompx",
    "decompx_contributions",
    "globenc",
    "gradient_weighted_rollout",
    "length_groups",
    "supports",
    "value_zeroing",
]
