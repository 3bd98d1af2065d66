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

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnmetrics._deferred import deferred
from attnmetrics._ops import ops
from attnmetrics._validation import DEFAULT_MEMORY_BUDGET, check_budget, check_logits, check_model_inputs
from attnmetrics.loo import CPU_PADDING, call_budget, padded_calls
from attnmetrics.outputs import decision
from attnmetrics.protocol import EXTRACT_READOUT, causal_mask, eval_mode, token_mask

#: the layer parts every method reads of a BERT-like model (BertLayer's attribute paths)
_PARTS = (
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate",
    "output.dense",
    "output.LayerNorm",
)


# ---- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerParts:
    """One post-LayerNorm transformer layer as the methods read it, whatever the model's attribute
    paths: ``x -> a = LN_1(x + attention(x) W_O + b_O) -> LN_2(a + act(a W_1 + b_1) W_2 + b_2)``.

    ``value_weight`` ``[d, d]`` (out, in) and ``value_bias`` ``[d]``: the values' projection
    ``W_V``, ``b_V`` (head h's the h-th slice of d / heads outputs); ``out``: the attention's output
    projection ``W_O``, ``b_O``; ``ln_1``, ``ln_2``: the two LayerNorms; ``fc``, ``act``, ``proj``:
    the feed-forward network's first Linear, activation and second Linear."""

    heads: int
    value_weight: Tensor
    value_bias: Tensor
    out: nn.Linear
    ln_1: nn.LayerNorm
    fc: nn.Linear
    act: Callable[[Tensor], Tensor]
    proj: nn.Linear
    ln_2: nn.LayerNorm

    def ffn(self, a: Tensor) -> Tensor:
        """The feed-forward network ``act(a W_1 + b_1) W_2 + b_2``."""
        return self.proj(self.act(self.fc(a)))


@dataclass(frozen=True)
class _Stack:
    """A supported model's layers: ``family`` (``"bert"``: a BERT-like Hugging Face classifier;
    ``"gpt"``: our GPT classifier), its layer modules (``BertLayer`` or ``Block``, which the trace
    runs) and their :class:`LayerParts`."""

    family: str
    modules: nn.ModuleList
    parts: list[LayerParts]


def _gelu_tanh(u: Tensor) -> Tensor:
    """Our GPT's feed-forward activation (models/gpt.py ``MLP``: GELU, tanh approximation)."""
    return F.gelu(u, approximate="tanh")


def bert_layers(model, method: str) -> nn.ModuleList:
    """The encoder layers of ``model.hf``, a post-LayerNorm BERT-like classifier, or an error
    naming the model class and why ``method`` does not apply to it.

    Raises:
        TypeError: ``model`` has no Hugging Face model (``model.hf``), e.g. our BiLSTM.
        ValueError: ``model.hf`` is not BERT-like (GPT-2: pre-LayerNorm blocks, whose decomposition
            these methods do not define), or a layer lacks the parts the methods read.
    """
    hf = getattr(model, "hf", None)
    if not isinstance(hf, nn.Module):
        raise TypeError(
            f"{method} needs a post-LayerNorm transformer classifier (a Hugging Face BERT-like classifier: "
            "attnmetrics.models.hf.HFClassifier over BertForSequenceClassification; or our GPT classifier with "
            f"--attention extract), got {type(model).__name__}: it decomposes a transformer's attention layers, which "
            "this model does not have"
        )
    name = type(hf).__name__
    encoder = getattr(getattr(hf, "bert", None), "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(
            f"{method} is defined for post-LayerNorm BERT-like encoders (BertForSequenceClassification: BERT, "
            f"MiniLM, ...), got {name}"
            + (
                " (a pre-LayerNorm decoder: the authors' decomposition of residual and LayerNorm does not apply)"
                if "GPT" in name
                else ""
            )
        )
    for part in _PARTS:
        if not all(_has(layer, part) for layer in layers):
            raise ValueError(f"{method}: {name}'s encoder layers have no {part} (expected a BertLayer)")
    return layers


def _bert_parts(layer: nn.Module) -> LayerParts:
    sa, so = layer.attention.self, layer.attention.output
    return LayerParts(
        heads=sa.num_attention_heads,
        value_weight=sa.value.weight,
        value_bias=sa.value.bias,
        out=so.dense,
        ln_1=so.LayerNorm,
        fc=layer.intermediate.dense,
        act=layer.intermediate.intermediate_act_fn,
        proj=layer.output.dense,
        ln_2=layer.output.LayerNorm,
    )


def _gpt_parts(block: nn.Module) -> LayerParts:
    """A ``models/gpt.py`` ``Block`` (``x = ln_1(x + attn.proj(attention(qkv(x))))``,
    ``x = ln_2(x + mlp.proj(gelu_tanh(mlp.fc(x))))``): the values are the last third of ``qkv``'s
    outputs (``CausalSelfAttention._split``: queries, keys, values, each heads × d / heads)."""
    attn, d = block.attn, block.attn.proj.weight.shape[0]
    return LayerParts(
        heads=attn.n_head,
        value_weight=attn.qkv.weight[2 * d :],
        value_bias=attn.qkv.bias[2 * d :],
        out=attn.proj,
        ln_1=block.ln_1,
        fc=block.mlp.fc,
        act=_gelu_tanh,
        proj=block.mlp.proj,
        ln_2=block.ln_2,
    )


#: the parts of our GPT's block (models/gpt.py ``Block``) the methods read, by attribute path
_GPT_PARTS = ("attn.qkv", "attn.proj", "ln_1", "mlp.fc", "mlp.proj", "ln_2")


def _gpt_blocks(model, method: str) -> nn.ModuleList | None:
    """Our GPT classifier's blocks (None for a model without ``model.gpt.blocks``), or a
    ValueError where its read-out is not the pooled position's state or a block lacks the parts
    the methods read. By structure, not by class (the core imports no model): a GPT classifier
    (``models/gpt_classifier.py``) has ``attention_name``, ``gpt.blocks`` of post-LayerNorm
    ``Block`` s (``block(x, causal_mask) -> (x, probabilities)``) and ``embed``."""
    blocks = getattr(getattr(model, "gpt", None), "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        return None
    name = getattr(model, "attention_name", None)
    if name != EXTRACT_READOUT or getattr(model, "attention", None) is not None:
        raise ValueError(
            f"{method} explains the pooled position's (<extract>'s) last state, which this GPT classifier's "
            f"{name!r} attention head does not classify from (its decoder reads an attention-weighted "
            "sum of the real tokens' last states, <extract> not among them): it applies to a GPT classifier with "
            f"GPT-1's read-out, --attention {EXTRACT_READOUT}"
        )
    if len(blocks) == 0 or not all(_has(block, part) for block in blocks for part in _GPT_PARTS):
        raise ValueError(f"{method}: {type(model).__name__}'s blocks are not models/gpt.py's post-LayerNorm Block")
    return blocks


def _stack(model, method: str) -> _Stack:
    """The layers of a supported model (our GPT classifier with its extract read-out, or a
    BERT-like Hugging Face classifier), or the error of :func:`bert_layers` / the GPT read-out's."""
    blocks = _gpt_blocks(model, method)
    if blocks is not None:
        return _Stack("gpt", blocks, [_gpt_parts(block) for block in blocks])
    layers = bert_layers(model, method)
    return _Stack("bert", layers, [_bert_parts(layer) for layer in layers])


def supports(model) -> bool:
    """Whether the decompositions of this module apply to ``model`` (a BERT-like Hugging Face
    classifier, or our GPT classifier with GPT-1's extract read-out); the battery's capability
    check for all but attention flow, which applies wherever rollout does
    (``model.layer_attentions``)."""
    try:
        _stack(model, "")
    except (TypeError, ValueError):
        return False
    return True


def _has(module: nn.Module, path: str) -> bool:
    for name in path.split("."):
        module = getattr(module, name, None)
        if not isinstance(module, nn.Module):
            return False
    return True


@contextlib.contextmanager
def _in_float32(model) -> Iterator[None]:
    """Half precision computed in float32 (the module docstring's Precision): for the block, every
    parameter and buffer of ``model`` in a float dtype narrower than float32 (float16, bfloat16)
    holds its values as float32 (exactly the same numbers), then its own tensor again when the block
    closes, also when it raises; the parameters stay the same ``nn.Parameter`` objects (tied ones
    stay tied). Holds the float32 copies beside the originals: three times the half weights' bytes.
    An object that is not an ``nn.Module`` is left alone."""
    narrow = []
    if isinstance(model, nn.Module):
        tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}.values()
        narrow = [(t, t.data) for t in tensors if t.is_floating_point() and t.element_size() < 4]
    try:
        for t, data in narrow:
            t.data = data.float()
        yield
    finally:
        for t, data in narrow:
            t.data = data


@contextlib.contextmanager
def _layer_norm_hooks(parts: list[LayerParts], trace) -> Iterator[None]:
    """For the block: every layer's LayerNorm inputs (and the first's output) recorded into
    ``trace.pre1``, ``trace.mid``, ``trace.pre2`` as the forward calls them; removed after."""

    def first(index):
        def hook(module, args, output):
            trace.pre1[index], trace.mid[index] = args[0], output

        return hook

    def second(index):
        def hook(module, args, output):
            trace.pre2[index] = args[0]

        return hook

    handles = []
    try:
        for index, layer in enumerate(parts):
            handles.append(layer.ln_1.register_forward_hook(first(index)))
            handles.append(layer.ln_2.register_forward_hook(second(index)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class _LayerStates:
    """One layer's states of a chunk of rows (``_Trace.layer``): probabilities ``[b, H, T, T]``,
    values ``[b, H, T, dh]``, the layer's input ``x``, its LayerNorm states ``pre1``, ``mid``,
    ``pre2`` and its output ``out``, each ``[b, T, d]``."""

    probs: Tensor
    v: Tensor
    x: Tensor
    pre1: Tensor
    mid: Tensor
    pre2: Tensor
    out: Tensor

    def rows(self, rows) -> _LayerStates:
        return _LayerStates(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))


class _Trace:
    """One forward of a chunk of rows: every layer's input ``x[l]`` ``[B, T, d]`` (``x[L]`` the last
    layer's output), attention probabilities ``probs[l]`` ``[B, H, T, T]`` and values ``v[l]``
    ``[B, H, T, dh]`` (``x W_V + b_V``, split into heads).

    A BERT-like model: its own forward, the probabilities from forward hooks on its self-attention
    modules. Our GPT: its blocks run one by one as ``GPTClassifier.encode`` runs them (the
    probabilities those of ``CausalSelfAttention.attention``: zero on later and padded keys, a
    padded query's row all 0), the values its ``heads``' (``qkv`` split).

    ``gradients``: the forward runs from word embeddings that require gradients (detached from the
    embedding table), so that every state and probability is in an autograd graph whatever the
    parameters' ``requires_grad``; the caller enables gradients. ``host_lengths``: the rows'
    lengths as a list, for chunk functions that plan on the host (default: read here).

    Also each layer's LayerNorm states as the model computed them (forward hooks on the two
    LayerNorms of every :class:`LayerParts`, for the forward only): ``pre1[l]`` the attention block's
    pre-LayerNorm state ``p = ctx W_O + b_O + x``, ``mid[l] = LN_1(p)`` and ``pre2[l]`` the
    feed-forward block's ``FFN(a) + a``, each ``[B, T, d]``; so no method recomputes a layer."""

    def __init__(
        self,
        model,
        stack: _Stack,
        tokens: Tensor,
        lengths: Tensor,
        method: str,
        gradients: bool = False,
        host_lengths: list[int] | None = None,
    ):
        self.host_lengths = lengths.tolist() if host_lengths is None else host_lengths
        count = len(stack.parts)
        self.pre1, self.mid, self.pre2 = [None] * count, [None] * count, [None] * count
        with _layer_norm_hooks(stack.parts, self):
            if stack.family == "gpt":
                self._gpt(model, stack.modules, tokens, lengths, gradients)
            else:
                self._bert(model, stack.modules, tokens, lengths, method, gradients)
        if any(s is None for s in (*self.pre1, *self.pre2)):
            raise ValueError(f"{method}: a layer's LayerNorms were not called by the model's forward")

    def layer(self, index: int, rows=slice(None), width: int | None = None) -> _LayerStates:
        """Layer ``index``'s states of the rows ``rows`` (a slice or indices), their first ``width``
        positions (default all)."""
        w = slice(None) if width is None else slice(0, width)
        return _LayerStates(
            probs=self.probs[index][rows][:, :, w, w],
            v=self.v[index][rows][:, :, w],
            x=self.x[index][rows][:, w],
            pre1=self.pre1[index][rows][:, w],
            mid=self.mid[index][rows][:, w],
            pre2=self.pre2[index][rows][:, w],
            out=self.x[index + 1][rows][:, w],
        )

    def _gpt(self, model, blocks: nn.ModuleList, tokens: Tensor, lengths: Tensor, gradients: bool):
        mask = causal_mask(lengths, tokens.shape[1])
        x = model.embed(tokens)  # token + position embeddings (dropout off in eval mode)
        if gradients:
            x = x.detach().requires_grad_(True)
        self.x, self.probs, self.v = [x], [], []
        for block in blocks:
            self.v.append(block.attn.heads(x)[2])
            x, probs = block(x, mask)
            self.x.append(x)
            self.probs.append(probs)

    def _bert(self, model, layers: nn.ModuleList, tokens: Tensor, lengths: Tensor, method: str, gradients: bool):
        # transformers' own output_attentions: the probabilities each layer's attention function
        # returns (our adapter's returns them whenever transformers collects them)
        mask = token_mask(lengths, tokens.shape[1]).long()
        kwargs = dict(attention_mask=mask, output_hidden_states=True, output_attentions=True)
        # the word embeddings of the ids, checked against the vocabulary (ValueError naming tokens);
        # positions and token types are added by the model, as from input_ids
        words = model.embed(tokens)
        if gradients:
            words = words.detach().requires_grad_(True)
        out = model.hf.bert(inputs_embeds=words, **kwargs)
        probs = list(out.attentions or ())
        if len(probs) != len(layers) or any(p is None for p in probs):
            raise ValueError(
                f"{method} reads each layer's attention probabilities, but {type(model.hf).__name__}'s attention "
                f"implementation ({getattr(model.hf.config, '_attn_implementation', '?')}) returns none: use "
                "attnmetrics.models.hf.HFClassifier or model.set_attn_implementation('eager')"
            )
        self.x = list(out.hidden_states)
        self.probs = probs
        self.v = []
        for x, layer in zip(self.x, layers):
            heads = layer.attention.self.num_attention_heads
            v = layer.attention.self.value(x)
            self.v.append(v.view(*v.shape[:2], heads, -1).transpose(1, 2))


def _heads_out(layer: LayerParts, v: Tensor) -> Tensor:
    """``f_h(x_j) = v_h(x_j) W_O^h``: values ``[..., H, T, dh]`` -> ``[..., H, T, d]`` (no ``b_O``)."""
    w = layer.out.weight  # [d, d] (out, in)
    heads, dh = v.shape[-3], v.shape[-1]
    return torch.einsum("...hsk,dhk->...hsd", v, w.view(-1, heads, dh))


def _scale(pre: Tensor, ln: nn.LayerNorm) -> Tensor:
    """LayerNorm's denominator ``sqrt(var(pre) + eps)`` (biased variance, as nn.LayerNorm) ``[..., 1]``."""
    return (pre.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt()


def _ln_linear(u: Tensor, ln: nn.LayerNorm, scale: Tensor) -> Tensor:
    """LayerNorm's linear part at a fixed denominator: ``gamma * (u - mean(u)) / scale`` (no beta)."""
    return ln.weight * (u - u.mean(-1, keepdim=True)) / scale


# ---- chunking and aggregation -------------------------------------------------------------------


def _chunks(n: int, per_item: int, budget: int) -> Iterator[slice]:
    """Slices of ``range(n)`` holding about ``budget`` bytes each at ``per_item`` bytes an item
    (at least one item a slice)."""
    step = max(1, budget // max(per_item, 1))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def _row_bytes(layers: list[LayerParts], width: int, itemsize: int) -> int:
    """About what a row's trace holds: every layer's probabilities, inputs, values and LayerNorm
    states, and one layer's per-head products by the feed-forward weights (Value Zeroing's)."""
    heads, d = layers[0].heads, layers[0].out.weight.shape[0]
    inter = layers[0].fc.weight.shape[0]
    per_layer = heads * width * width + 6 * width * d + width * inter
    return itemsize * (len(layers) * per_layer + width * d + heads * width * inter)


def _rollout_row(matrices: list[Tensor]) -> Tensor:
    """The pooled row of ``C_{L-1} ... C_1 C_0`` (Abnar & Zuidema's product, no residual added: each
    method puts its own in ``C``): matrices ``[B, T, T]`` per layer, the last one only its pooled
    rows ``[B, T]``. Multiplied in float64 (GlobEnc's raw norms grow with every layer)."""
    rolled = matrices[0].double()
    for c in matrices[1:-1]:
        rolled = torch.bmm(c.double(), rolled)
    last = matrices[-1].double()
    return last if len(matrices) == 1 else torch.einsum("bk,bkj->bj", last, rolled)


def _real(score: Tensor, lengths: Tensor, model, method: str) -> Tensor:
    """``[B, T]`` over every position -> ``[B, T - lead]`` over the real tokens, zero past each row's
    (special tokens dropped, not renormalised: rollout's layout); ValueError naming the first row
    that is not finite."""
    real = token_mask(lengths, score.shape[1], model.lead, model.trail)
    score = score.masked_fill(~real, 0)
    bad = ~torch.isfinite(score).all(1)
    if bad.any():
        raise ValueError(
            f"{method} is not finite in row {int(bad.nonzero()[0])}: the model's states hold NaN or inf, or the "
            "product through the layers overflowed"
        )
    return score[:, model.lead :]


#: a differentiable trace's bytes a row against a plain one's: autograd keeps every layer's scores,
#: probabilities, queries, keys, feed-forward states and LayerNorm inputs, and the backward adds a
#: gradient the size of the probabilities
_GRADIENT_ROW_FACTOR = 4


def _run(
    model,
    tokens,
    lengths,
    memory_budget,
    method,
    per_chunk,
    gradients: bool = False,
    trailing: tuple = (),
    raw=False,
    padding: float = CPU_PADDING,
) -> Tensor:
    """Check the inputs, then ``per_chunk(layers, tokens, lengths, trace)`` -> ``[b, width]`` over
    chunks of rows trimmed to their longest (one forward each), assembled into ``[B, T - lead]``.
    ``gradients``: each chunk's trace is recorded for autograd (``_Trace``'s ``gradients``) and
    ``per_chunk`` runs with gradients enabled. ``trailing``: ``per_chunk`` returns
    ``[b, width, *trailing]``; ``raw``: the assembled ``[B, T, *trailing]`` over every position is
    returned as it is (zero past the chunks' widths), not laid out over the real tokens. The rows run
    in :func:`length_groups` (``padding``: how much padding a CPU group may take). A half
    precision model runs in float32 (:func:`_in_float32`; its parts read inside, so our GPT's value
    weights, a slice of ``qkv``'s, are float32 too), and so does everything after its forward."""
    with _in_float32(model), eval_mode(model), torch.no_grad():
        stack = _stack(model, method)
        layers = stack.parts
        lengths = check_model_inputs(model, tokens, lengths)
        budget = check_budget(memory_budget)
        batch, width = tokens.shape
        dtype = layers[0].out.weight.dtype
        host_lengths = lengths.tolist()  # one read: the groups' widths and plans
        out = torch.zeros(batch, width, *trailing, dtype=dtype, device=tokens.device)
        itemsize = torch.finfo(dtype).bits // 8
        factor = _GRADIENT_ROW_FACTOR if gradients else 1
        groups = length_groups(
            host_lengths,
            lambda w: _row_bytes(layers, w, itemsize) * factor,
            budget // 2,
            padded_calls(tokens.device),
            padding,
        )
        # what a method's own steps hold at a time: on the CPU at most loo.CPU_CALL_BYTES, whose
        # products stay in the cache (Value Zeroing's (row, token) pairs ran 10-20 % slower in
        # 128 MiB chunks than one row at a time)
        work = call_budget(tokens.device, budget // 2)
        with deferred():  # the groups' logits checked once, at the end
            for group in groups:
                w = host_lengths[group[-1]]  # the group's longest row: its positions past w are padding
                rows = torch.tensor(group, device=tokens.device)
                t, n = tokens[rows, :w], lengths[rows]
                with torch.enable_grad() if gradients else contextlib.nullcontext():
                    trace = _Trace(model, stack, t, n, method, gradients, [host_lengths[b] for b in group])
                    score = per_chunk(layers, t, n, trace, work)
                out[rows, :w] = score.detach().to(dtype)
    return out if raw else _real(out, lengths, model, method)


def length_groups(
    lengths: list[int], row_bytes: Callable[[int], int], budget: int, padded: bool, padding: float = CPU_PADDING
) -> list[list[int]]:
    """The rows of ``lengths`` (host ints) sorted by length, shortest first, in consecutive groups
    that each run as one call trimmed to their longest row ``w``: a group holds at most ``budget``
    bytes at ``row_bytes(w)`` a row (a row that alone exceeds it is a group of its own). Where calls
    are not padded (``padded`` False: the CPU, :func:`attnmetrics.loo.padded_calls`, where a call's
    cost follows its positions), a group also takes a longer row only while its padded cost
    ``n w^2`` stays within ``padding`` of its rows' own ``sum w_b^2`` (these methods' cost grows
    about as the square of a row's width, per layer): so a batch costs about what its rows cost one
    by one, in fewer, larger calls. On a GPU (``padded``), the budget alone bounds a group."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups: list[list[int]] = []
    own = 0
    for b in order:
        w = lengths[b]
        group = groups[-1] if groups else None
        if group is not None:
            n = len(group) + 1
            fits = n * row_bytes(w) <= budget
            little_padded = padded or n * w * w <= (1 + padding) * (own + w * w)
            if fits and little_padded:
                group.append(b)
                own += w * w
                continue
        groups.append([b])
        own = w * w
    return groups


def _masked_rows(c: Tensor, lengths: Tensor) -> Tensor:
    """``[B, T, T]`` with padded queries and keys zeroed."""
    valid = token_mask(lengths, c.shape[-1])
    return c * (valid[:, :, None] & valid[:, None, :]).to(c.dtype)


def _pooled(model, lengths: Tensor) -> Tensor:
    return model.pooled(lengths) if hasattr(model, "pooled") else torch.zeros_like(lengths)


# ---- the methods --------------------------------------------------------------------------------


def attention_value_norm(
    model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> Tensor:
    """Attention × value norm (Kobayashi et al. 2020, EMNLP, "Attention is Not Only a Weight",
    sec. 3, eq. 6, "||Σαf(x)||") at the last layer, for the pooled position p (``[CLS]``; our GPT's
    ``<extract>``).

    ``score_j = || sum_h A_h[p, j] f_h(x_j) ||_2`` with ``f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h``:
    the norm of what token j adds to p's multi-head attention output (the value bias ``b_V`` in
    ``f``, the output bias ``b_O`` left out, as the paper's sec. 3 and its code's
    ``transformed_layer``; no residual, no LayerNorm). ``x`` is the last layer's input.

    Args:
        model: a protocol model whose ``hf`` is a BERT-like ``BertForSequenceClassification``
            (e.g. ``attnmetrics.models.hf.HFClassifier``), or our ``GPTClassifier`` with the extract
            read-out; in eval mode for the call, and in float32 if it is float16 or bfloat16
            (module docstring, Precision).
        tokens: ``[B, T]`` int64 ids, ``[CLS] ... [SEP]`` (``<start> ... <extract>``) then padding.
        lengths: ``[B]`` integer lengths, special tokens included, in ``[lead + trail, T]``.
        memory_budget: bytes a chunk of rows may hold (default 256 MiB).

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's norm, in the units of the hidden states (non-negative, not normalised), zero past
        each row's real tokens.

    Raises:
        TypeError: the model is neither our GPT classifier nor has a Hugging Face model
            (``model.hf``; e.g. the BiLSTM); tokens or lengths not tensors.
        ValueError: a Hugging Face model that is not BERT-like (GPT-2, ...), our GPT classifier with
            an attention head instead of the extract read-out, an attention implementation that
            returns no probabilities, the input checks of :func:`attnmetrics.gradient_importance`,
            a bad ``memory_budget``, or a score that is not finite.
    """

    def per_chunk(layers, tokens, lengths, trace, budget):
        layer, probs, v = layers[-1], trace.probs[-1], trace.v[-1]
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        a = probs[rows, :, _pooled(model, lengths)]  # [b, H, T]
        f = _heads_out(layer, v)  # [b, H, T, d]
        return torch.einsum("bhj,bhjd->bjd", a, f).norm(dim=-1)

    return _run(model, tokens, lengths, memory_budget, "attention_value_norm", per_chunk)


def globenc(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """GlobEnc (Modarressi et al. 2022, NAACL, sec. 3): norm-based token-to-token attributions of
    each whole encoder layer but its feed-forward network, rolled out through the layers.

    Per layer, ``N[i, j] = || LN_2'(LN_1'(z_ij)) ||_2`` with ``z_ij`` the module docstring's (each
    head's ``A_h[i, j] f_h(x_j)`` summed, plus the residual ``x_i`` when ``j = i``) and
    ``LN_k'(u) = gamma_k * (u - mean(u)) / s_k(i)`` each LayerNorm's linear part at the model's own
    denominator ``s_k(i) = sqrt(var(pre-LN state of i) + eps)`` (biases ``b_O``, ``beta_1``,
    ``beta_2`` left out; the FFN enters only through ``s_2``): "N_Enc", the authors'
    ``modeling_bert.py`` ``BertNormOutput`` (post_ln_layer) then ``BertLayer`` (post_ln2_norm).
    GlobEnc is the pooled row of ``N_{L-1} ... N_1 N_0``, the raw norms multiplied without
    residual or renormalisation, as their ``AttentionRollout.compute_joint_attention`` (the first
    layer's input is the embeddings' output).

    Args, Raises: as :func:`attention_value_norm`.

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's GlobEnc score (non-negative, the product of norms: not normalised), zero past each
        row's real tokens.
    """

    def per_chunk(layers, tokens, lengths, trace, budget):
        pooled = _pooled(model, lengths)
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        matrices = [_masked_rows(_norm_enc(layer, trace.layer(index)), lengths) for index, layer in enumerate(layers)]
        matrices[-1] = matrices[-1][rows, pooled]  # only the pooled row of the last factor is read
        return _rollout_row(matrices)

    return _run(model, tokens, lengths, memory_budget, "globenc", per_chunk)


def alti(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """ALTI (Ferrando et al. 2022, EMNLP, "Measuring the Mixing of Contextual Information in the
    Transformer", sec. 2-3): distance-based token-to-token contributions of each attention block,
    LayerNorm included, rolled out through the layers.

    Per layer, ``T_i(x_j) = LN_1'(z_ij)`` (the module docstring's ``z_ij``, through LayerNorm's
    linear part ``gamma_1 * (u - mean(u)) / s(i)``), so that the block's output is
    ``y_i = sum_j T_i(x_j) + LN_1'(b_O) + beta_1`` exactly; ``d_ij = ||y_i - T_i(x_j)||_1`` (eq. 8,
    the Manhattan distance), ``c_ij = max(0, ||y_i||_1 - d_ij)`` normalised to sum 1 over j (eq. 9-10;
    the authors' ``normalize_contributions(..., scaling='min_sum', resultant_norm=...)``). ALTI is
    the pooled row of ``C_{L-1} ... C_1 C_0`` (their ``compute_joint_attention``: no residual added,
    it is in ``z_ii``; the first layer's input is the embeddings' output).

    A row whose contributions are all 0 (every ``d_ij`` at least ``||y_i||_1``: the biases outweigh
    every token) stays 0, where the authors' normalisation would divide by 0. On a causal model
    (our GPT) the matrices are 0 above the diagonal (``T_i(x_j) = 0`` for j > i), and the first
    position, whose one contributor is itself, gets such a row whenever
    ``||y_0||_1 <= ||LN_1'(b_O) + beta_1||_1``: that only takes ``<start>``'s own share from the
    pooled row (nothing else reaches position 0), which the importance drops anyway.

    Where we differ (mt-upc/transformer-contributions ``src/contributions.py`` at 4f89039): their
    ``ln_std_coef`` (line 206) is ``1 / (pre_ln_states + eps).std(-1, unbiased=False)``, eps added to
    the states, where it changes nothing, rather than inside the root; ours is the model's own
    LayerNorm denominator ``sqrt(var(p_i) + eps)``, so ``y_i`` is the block's real output (theirs
    only within their assertion's tolerance; an earlier version used the unbiased std). Their
    distance (line 222) is ``F.pairwise_distance(..., p=1)``, which adds 1e-6 to every entry of the
    difference; ours is the exact L1 distance.

    Args, Raises: as :func:`attention_value_norm`.

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's share of the pooled position's last attention output, in [0, 1] (the shares of all
        positions, special tokens included, sum to 1), zero past each row's real tokens.
    """

    return _run(model, tokens, lengths, memory_budget, "alti", _rolled_out(model, _alti_layer))


def _rolled_out(model, layer_scores):
    """A ``_run`` chunk function: each layer's token-to-token matrix by ``layer_scores(layer,
    ...)`` (the last layer's at the pooled position only), multiplied through the layers."""

    def per_chunk(layers, tokens, lengths, trace, budget):
        pooled = _pooled(model, lengths)
        matrices = [
            _per_query(
                layer,
                trace,
                index,
                lengths,
                pooled if index == len(layers) - 1 else None,
                budget,
                lambda *a, layer=layer: layer_scores(layer, *a),
            )
            for index, layer in enumerate(layers)
        ]
        return _rollout_row(matrices)

    return per_chunk


def _per_query(layer, trace, index, lengths, pooled, budget, score) -> Tensor:
    """One layer's ``[b, T, T]`` matrix (``[b, T]``: the pooled queries' rows, when ``pooled`` is
    given), with ``score(states, queries [n, Q], lengths)`` -> ``[n, Q, T]`` (``states``: the layer's
    :class:`_LayerStates` of n rows) on chunks of rows, and of queries where one row's exceeds the
    budget."""
    states = trace.layer(index)
    x = states.x
    batch, heads, width = states.probs.shape[:3]
    d = x.shape[-1]
    size = x.element_size()
    fixed = size * (heads * width * d + 4 * width * d)  # f_h(x_j) and the blocks' states
    per_query = size * 5 * width * d  # z and its LayerNorm images
    span = 1 if pooled is not None else width
    parts = []
    for rows in _chunks(batch, fixed + span * per_query, budget):
        n = rows.stop - rows.start
        part = states.rows(rows)
        if pooled is not None:
            parts.append(score(part, pooled[rows, None], lengths[rows]))
            continue
        pieces = []
        for qs in _chunks(width, per_query, max(budget - fixed, per_query)):
            q = torch.arange(qs.start, qs.stop, device=x.device).expand(n, -1)
            pieces.append(score(part, q, lengths[rows]))
        parts.append(torch.cat(pieces, 1))
    c = torch.cat(parts)
    if pooled is not None:
        return c[:, 0] * token_mask(lengths, width).to(c.dtype)
    return _masked_rows(c, lengths)


def _centred(u: Tensor) -> Tensor:
    """``u - mean(u)`` over the last dimension."""
    return u - u.mean(-1, keepdim=True)


def _heads_map(layer: LayerParts, k: Callable[[Tensor], Tensor]) -> Tensor:
    """``W_O^h`` followed by a map ``k`` that acts on each d-vector alone and linearly (centring,
    scaling: applied to W_O's rows), per head: ``[H, dh, d]`` such that ``v_h(x_j) @ out[h] =
    k(f_h(x_j))`` -- ``d^2`` elements mapped once instead of ``T H d`` per row."""
    heads = layer.heads
    return k(layer.out.weight.T).view(heads, -1, layer.out.weight.shape[0])


def _norm_enc(layer, s: _LayerStates) -> Tensor:
    """GlobEnc's N_Enc of one layer, every query: ``[b, T (i), T (j)]`` (see :func:`globenc`).

    ``LN_2'(LN_1'(z)) = K z / (s_1 s_2)`` with ``K`` the fixed linear map "centre, times gamma_1,
    centre, times gamma_2" (elementwise: no matrix is formed), so with ``g_h(j) = K f_h(x_j)`` and
    ``a_h = A_h[i, j]``, ``||K z_ij||^2 = a^T G_j a`` (``G_j`` the heads' Gram matrix of the
    ``g_h(j)``, ``[H, H]``), plus ``2 a . <g_h(i), K x_i> + ||K x_i||^2`` at ``j = i`` (the
    residual): ``T H^2 d + T^2 H^2`` multiply-adds a layer and row instead of the ``[T, T, d]``
    vectors' ``T^2 H d``, and no state larger than the values' ``[T, H, d]``."""
    ln1, ln2 = layer.ln_1, layer.ln_2

    def k(u):
        return _centred(_centred(u) * ln1.weight) * ln2.weight

    g = torch.einsum("bhjk,hkd->bjhd", s.v, _heads_map(layer, k))  # g_h(j) = K f_h(x_j) [b, T (j), H, d]
    gram = g @ g.transpose(-1, -2)  # [b, T (j), H, H]
    a = s.probs.permute(0, 3, 2, 1)  # [b, T (j), T (i), H]
    squared = ((a @ gram) * a).sum(-1).transpose(1, 2)  # [b, T (i), T (j)]
    kx = k(s.x)  # K x_i [b, T, d]
    cross = (g @ kx[..., None])[..., 0]  # <g_h(i), K x_i> [b, T, H]
    own = 2 * (s.probs.diagonal(dim1=-2, dim2=-1).transpose(1, 2) * cross).sum(-1) + kx.square().sum(-1)
    squared = squared + torch.diag_embed(own)
    scale = _scale(s.pre1, ln1) * _scale(s.pre2, ln2)  # [b, T, 1]
    return squared.clamp_min(0).sqrt() / scale


def _alti_layer(layer, s: _LayerStates, queries, lengths) -> Tensor:
    """ALTI's contributions of one layer, rows normalised: ``[b, Q, T]`` (see :func:`alti`).

    ``T_i(x_j) = U_ij / s(i)`` with ``U_ij = sum_h A_h[i, j] phi_h(j) (+ psi_i at j = i)``,
    ``phi_h(j) = gamma_1 * centred(f_h(x_j))`` and ``psi_i = gamma_1 * centred(x_i)`` formed once
    per token (not per query), so ``d_ij = ||s(i) y_i - U_ij||_1 / s(i)``: one ``[Q, T, d]`` product
    and one distance pass."""
    ln = layer.ln_1
    rows = torch.arange(s.x.shape[0], device=s.x.device)[:, None]
    phi = torch.einsum("bhjk,hkd->bhjd", s.v, _heads_map(layer, lambda u: _centred(u) * ln.weight))  # [b, H, T, d]
    a = s.probs[rows, :, queries]  # [b, Q, H, T]
    u = torch.einsum("bqhj,bhjd->bqjd", a, phi)  # [b, Q, T, d], the residual not yet in
    scale = _scale(s.pre1[rows, queries], ln)  # [b, Q, 1]
    y = s.mid[rows, queries]  # [b, Q, d]: the block's output LN_1(p_i)
    target = y * scale
    distance = (target[:, :, None] - u).abs().sum(-1)
    psi = _centred(s.x[rows, queries]) * ln.weight  # [b, Q, d]
    own = u.gather(2, queries[:, :, None, None].expand(-1, -1, 1, u.shape[-1]))[:, :, 0]  # U_ii without psi_i
    distance = distance.scatter(-1, queries[..., None], (target - own - psi).abs().sum(-1, keepdim=True))
    distance = distance / scale
    c = (y.abs().sum(-1, keepdim=True) - distance).clamp_min(0)
    # a key no head attends to, other than i itself, adds T_i(x_j) = 0: its c_ij is 0 exactly (not
    # the rounding of ||y_i||_1 - ||y_i||_1, which a row whose own share is 0 would normalise)
    reached = (a != 0).any(2).scatter(-1, queries[..., None], True)
    c = c * reached.to(c.dtype)
    c = c * token_mask(lengths, c.shape[-1])[:, None].to(c.dtype)  # padded keys contribute nothing
    return _row_normalised(c)


def _row_normalised(c: Tensor) -> Tensor:
    """Rows divided by their sums over the last dimension; a row summing to 0 stays 0."""
    total = c.sum(-1, keepdim=True)
    return torch.where(total > 0, c / total.clamp_min(torch.finfo(c.dtype).tiny), c)


def value_zeroing(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """Value Zeroing (Mohebbi et al. 2023, EACL, "Quantifying Context Mixing in Transformers",
    sec. 2): how much each layer's outputs change when one token's value vectors are zeroed,
    rolled out through the layers.

    Per layer l and token j: zero ``v_h(x_j)`` in every head of layer l (value bias included: the
    whole value vector, as the authors' ``customized_modeling_bert.py`` ``zero_value_index``),
    recompute layer l on its original input (attention weights unchanged, then ``b_O``, residual,
    ``LN_1``, the feed-forward network and ``LN_2``), and score ``S[i, j] = 1 - cos(h_i, h_i^(-j))``
    between token i's original and altered outputs (clipped at 0, as scikit-learn's
    ``cosine_distances`` that their ``scoring/value_zeroing.py`` calls); each row of ``S`` is
    divided by its sum over j (j = i included), and Value Zeroing is the pooled row of
    ``S_{L-1} ... S_1 S_0`` (their ``compute_joint_attention(score_matrix, res=False)``: no
    residual added; the first layer's input is the embeddings' output).

    All tokens of all rows at once: zeroing ``v(x_j)`` changes query i's pre-LayerNorm state by
    ``-sum_h A_h[i, j] f_h(x_j)`` (the weights do not depend on the values), so every altered
    layer runs from there (``LN_1``, feed-forward, ``LN_2``) as one batch of (row, j) pairs,
    chunked to the memory budget; the last layer only at the pooled position, the one its row of
    the product reads. On a causal model (our GPT) the weights are 0 on later keys, so zeroing
    token j changes only the queries at or after j (the others' distances are 0, up to rounding),
    as recomputing the layer under its causal mask would.

    Args, Raises: as :func:`attention_value_norm`.

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's share of the pooled position in [0, 1] (the shares of all positions, special tokens
        included, sum to 1 unless a layer's row of distances was all 0), zero past each row's real
        tokens.
    """

    maps: dict[int, Tensor] = {}  # per layer, once a call has enough positions (_zeroed_layer)
    seen = [0]

    def per_chunk(layers, tokens, lengths, trace, budget):
        pooled = _pooled(model, lengths)
        seen[0] += sum(trace.host_lengths)
        mapped = seen[0] * (layers[0].heads - 1) > layers[0].out.weight.shape[0]
        matrices = [
            _zeroed_layer(
                layer, trace, index, lengths, pooled if index == len(layers) - 1 else None, budget, maps, mapped
            )
            for index, layer in enumerate(layers)
        ]
        return _rollout_row(matrices)

    # rows of one length a group on the CPU: every (row, token) pair recomputes the layer for each
    # of the group's queries, padded ones included, so padding costs in full
    return _run(model, tokens, lengths, memory_budget, "value_zeroing", per_chunk, padding=0.0)


def _zeroed_layer(layer, trace, index, lengths, pooled, budget, maps=None, mapped=False) -> Tensor:
    """Value Zeroing's row-normalised distances of one layer, ``[b, T, T]`` (``[b, T]``: the pooled
    rows when ``pooled`` is given).

    Zeroing token j's values takes ``delta_ij = sum_h A_h[i, j] f_h(x_j)`` from query i's
    pre-LayerNorm state ``p_i``; ``LN_1`` is affine at the altered state's own denominator
    ``s_ij``, so the feed-forward network's first product is
    ``LN_1(p_i - delta_ij) W_1 = (P_i - sum_h A_h[i, j] F_h(j)) / s_ij + beta_1 W_1`` with
    ``P_i = (gamma_1 * centred(p_i)) W_1`` and ``F_h(j) = (gamma_1 * centred(f_h(x_j))) W_1``, each
    formed once per token. Where a row has more queries than heads, that costs
    ``H T d d_ff + Q T H d_ff`` multiply-adds a layer instead of the altered states' own
    ``Q T d d_ff``; the activation and the second product are per (query, token) pair either way.
    ``mapped``: ``F_h(j) = v_h(x_j) Z_h`` with ``Z_h = (W_O^h`` centred and scaled by ``gamma_1) W_1``
    ``[H, dh, d_ff]`` formed once a call (``maps[index]``: ``d^2 d_ff`` multiply-adds, which a call's
    rows repay once they hold more than ``d / (H - 1)`` positions), ``T d d_ff`` a row, not
    ``H T d d_ff``."""
    s = trace.layer(index)
    probs, v, x, out = s.probs, s.v, s.x, s.out
    batch, heads, width, dh = v.shape
    d = x.shape[-1]
    inter = layer.fc.weight.shape[0]
    pre = s.pre1  # [b, T, d], the block's pre-LayerNorm states
    f = _heads_out(layer, v)  # [b, H, T, d]
    if pooled is not None:  # only the pooled query
        rows = torch.arange(batch, device=x.device)
        probs = probs[rows, :, pooled][:, :, None]  # [b, H, 1, T]
        pre, out = pre[rows, pooled][:, None], out[rows, pooled][:, None]  # [b, 1, d]
    queries = pre.shape[1]
    ln = layer.ln_1
    factored = queries > heads
    if factored:  # the first product by token, not by pair
        w1 = layer.fc.weight.T
        if mapped:
            if index not in maps:
                maps[index] = _heads_map(layer, lambda u: _centred(u) * ln.weight) @ w1  # Z_h [H, dh, d_ff]
            heads_w1 = v @ maps[index]  # F_h(j) [b, H, T, d_ff]
        else:
            heads_w1 = (_centred(f) * ln.weight) @ w1  # F_h(j) [b, H, T, d_ff]
        pre_w1 = (_centred(pre) * ln.weight) @ w1  # P_i [b, Q, d_ff]
        bias_w1 = layer.fc(ln.bias)  # beta_1 W_1 + b_1
    pairs = token_mask(lengths, width).nonzero()  # (row, zeroed token j), every real position of a row
    per_pair = x.element_size() * queries * (6 * d + 3 * inter)
    scores = torch.zeros(batch, queries, width, dtype=x.dtype, device=x.device)
    for part in _chunks(pairs.shape[0], per_pair, budget):
        b, j = pairs[part, 0], pairs[part, 1]
        # minus what token j's values added to every query i of its row through W_O:
        # sum_h A_h[i, j] f_h(x_j) (the attention weights do not depend on the values)
        a = probs[b, :, :, j]  # [n, H, Q]
        altered = pre[b] - torch.einsum("nhq,nhd->nqd", a, f[b, :, j])  # [n, Q, d]
        mid = ln(altered)
        if factored:
            hidden = (pre_w1[b] - torch.einsum("nhq,nhe->nqe", a, heads_w1[b, :, j])) / _scale(altered, ln)
            ffn = layer.proj(layer.act(hidden + bias_w1))
        else:
            ffn = layer.ffn(mid)
        changed = layer.ln_2(ffn + mid)
        scores[b, :, j] = _cosine_distance(changed, out[b])
    if pooled is not None:
        return _row_normalised(scores[:, 0])
    return _row_normalised(_masked_rows(scores, lengths))


def _cosine_distance(a: Tensor, b: Tensor) -> Tensor:
    """``1 - cos(a, b)`` over the last dimension, as ``||a/|a| - b/|b|||^2 / 2`` (the same number,
    without the cancellation of ``1 - cos`` when the vectors nearly agree: float32 keeps about
    ``eps / sqrt(distance)`` relative precision instead of ``eps / distance``), so never below 0
    (scikit-learn's cosine_distances clips at 0); a zero vector has cosine 0 with anything. NaN
    where either norm is not finite (a state holding NaN or inf, or whose norm overflows), so that
    :func:`_real` names the row instead of counting the distance as a zero vector's 1."""
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    tiny = torch.finfo(a.dtype).tiny
    half = 0.5 * (a / na[..., None].clamp_min(tiny) - b / nb[..., None].clamp_min(tiny)).square().sum(-1)
    distance = torch.where((na == 0) | (nb == 0), torch.ones_like(half), half)
    return torch.where(torch.isfinite(na) & torch.isfinite(nb), distance, torch.full_like(half, float("nan")))


def gradient_weighted_rollout(
    model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> Tensor:
    """Gradient-weighted attention rollout (Chefer, Gur & Wolf 2021, ICCV, "Generic
    Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers",
    sec. 3, eqs. 5-6, the rule for self-attention encoders): each layer's attention weighted by
    its gradient, heads averaged, accumulated through the layers with the identity.

    With ``A_b`` ``[H, T, T]`` layer b's attention probabilities (after the softmax, as the model
    multiplies the values with them) and ``∇A_b = ∂y_t / ∂A_b`` the gradient of the predicted
    class's logit ``y_t`` (the class :func:`attnmetrics.outputs.decision` picks; a one-logit
    sigmoid model's class-0 logit is ``-z``, so ``y_t = ±z``), each ``A_b`` held as a free variable
    (the gradient is not taken through its softmax): ``R = I`` ``[T, T]``, then for
    ``b = 0 .. L-1`` ``Ā_b = E_h[(∇A_b ⊙ A_b)^+]`` (elementwise product, negatives clipped to 0,
    mean over heads) and ``R <- R + Ā_b R``, i.e. the pooled row of
    ``(I + Ā_{L-1}) ⋯ (I + Ā_1)(I + Ā_0)``. The importance of token j is ``R[p, j]``, p the pooled
    position (``[CLS]``; our GPT's ``<extract>``). This is the ICCV 2021 rule, not the same authors' CVPR 2021
    "Transformer Interpretability Beyond Attention Visualization", which weights LRP relevances of
    the attention, not the attention itself, by the gradients. The logit is the target as in the
    authors' code (a one-hot of the logits), not a probability; :func:`attnmetrics.gradient_importance`
    differentiates every class's probability and sums their absolute values, which this rule, whose
    clip needs the gradient's sign for one class, cannot take.

    As the other methods here, the returned layout drops the lead token's column, so ``R[p, p]``
    (the ``[CLS]`` self-relevance, at least 1 from the identity) is not in the result; ``[SEP]``
    and padding are 0 (our GPT: ``<start>`` dropped, and ``R[p, p]`` is ``<extract>``'s, 0 as the
    trailing token's). On a causal model each ``A_b`` is 0 above the diagonal, and so is ``Ā_b``.
    Padded keys and queries are masked out of every ``Ā_b`` and of ``I``, so a row's scores do not
    depend on the batch's padding. One forward and one backward per chunk of
    rows: the rows' target logits are summed (rows do not interact), and the gradient is taken with
    respect to every layer's probabilities at once; the product is taken in float64.

    Args:
        model, tokens, lengths, memory_budget: as :func:`attention_value_norm` (a chunk's
            differentiable trace is budgeted at about four times a plain one's).

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's relevance ``R[p, j]`` (non-negative, not normalised nor bounded, of no single unit:
        each ``Ā_b`` is in the logit's units, ``R`` sums products of them across layers), zero past
        each row's real tokens.

    Raises:
        TypeError, ValueError: as :func:`attention_value_norm`; also logits that are not
            ``[B, C]`` or not finite.
    """

    def per_chunk(layers, tokens, lengths, trace, budget):
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        pooled = _pooled(model, lengths)
        target = _predicted_logit(_pooled_logits(model, trace, rows, pooled))
        grads = torch.autograd.grad(target.sum(), trace.probs)
        width = tokens.shape[1]
        valid = token_mask(lengths, width)
        eye = torch.diag_embed(valid.to(trace.probs[0].dtype))  # I on each row's real positions
        matrices = []
        for index, (g, a) in enumerate(zip(grads, trace.probs)):
            if index == len(layers) - 1:  # only the pooled row of the last factor is read
                cam = (g[rows, :, pooled] * a[rows, :, pooled].detach()).clamp_min(0).mean(1)  # [b, T]
                matrices.append((eye[rows, pooled] + cam) * valid.to(cam.dtype))
            else:
                cam = (g * a.detach()).clamp_min(0).mean(1)  # [b, T, T]
                matrices.append(eye + _masked_rows(cam, lengths))
        return _rollout_row(matrices)

    return _run(model, tokens, lengths, memory_budget, "gradient_weighted_rollout", per_chunk, gradients=True)


def _pooled_logits(model, trace, rows: Tensor, pooled: Tensor) -> Tensor:
    """The checked logits ``[b, C]`` of the traced rows, from the last layer's pooled states."""
    return check_logits(
        model.decoder(trace.x[-1][rows, pooled]), len(rows), source="model", inputs="the input rows",
        on=" on the input rows",
    )  # fmt: skip


def _predicted_logit(logits: Tensor, values: Tensor | None = None) -> Tensor:
    """Each row's entries of its predicted class (``decision`` of ``logits`` ``[B, C]``) in
    ``values`` ``[B, ..., C]`` (default the logits: ``[B]``, the predicted class's logit); with
    one sigmoid logit ``z``, class 1's is ``z`` and class 0's ``-z`` (``sigmoid(-z) = 1 - sigmoid(z)``)."""
    predicted = decision(logits.detach())
    values = logits if values is None else values
    predicted = predicted.view(-1, *(1,) * (values.dim() - 2))
    if logits.shape[1] == 1:
        return torch.where(predicted == 1, values[..., 0], -values[..., 0])
    return values.gather(-1, predicted[..., None].expand(*values.shape[:-1], 1))[..., 0]


# ---- DecompX (Modarressi et al. 2023) -------------------------------------------------------------


def decompx(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """DecompX (Modarressi, Fayyaz, Aghazadeh, Yaghoobzadeh & Pilehvar 2023, ACL, "DecompX:
    Explaining Transformers Decisions by Propagating Token Decomposition", sec. 3, eqs. 1-14): each
    real token's additive contribution to the predicted class's logit, from a decomposition of
    every layer's states into per-input-token vectors propagated through the whole network,
    feed-forward networks, pooler and classifier included.

    Every state of token i is kept as ``x_i = sum_k x_{i<-k}``, starting from the embeddings' output
    (BERT: after the embeddings' LayerNorm; our GPT: token + position embeddings):
    ``x_{i<-k} = [i = k] x_i``. Layer by layer, for every query i
    and input token k (sec. 3.1-3.3):

    - attention (eqs. 3-6): ``z_{i<-k} = sum_h sum_j A_h[i, j] x_{j<-k} W_V^h W_O^h``, the biases
      folded into ``b_Att = sum_h b_V^h W_O^h + b_O`` (appendix A.1: each head's attention row sums
      to 1), which is split by AbsDot (eq. 5): ``z_{i<-k} += w_k b_Att`` with
      ``w_k = |b_Att . z_{i<-k}| / sum_k' |b_Att . z_{i<-k'}|`` over the bias-free terms;
    - residual (eq. 7): ``z_{i<-k} + x_{i<-k}``;
    - LayerNorm (eq. 8, Kobayashi et al. 2021): each component centred by its own mean, divided by
      the whole vector's denominator ``s(i) = sqrt(var(pre-LN state of i) + eps)`` (the model's
      own), scaled by gamma; beta split by AbsDot over those terms;
    - feed-forward network (eqs. 9-11): ``zeta_{i<-k} = z~_{i<-k} W_1`` plus its AbsDot share of
      ``b_1``; the activation linearised at the token's own pre-activation ``zeta_i`` (the model's
      ``z~_i W_1 + b_1``) by the zero-intercept ratio ``theta = act(zeta_i) / zeta_i`` elementwise
      (eq. 10, the authors' "GeLU_ZO"; 0 where ``zeta_i = 0``, which changes no sum since act(0) =
      0), the same ``theta`` applied to every component; then ``W_2`` and ``b_2`` by AbsDot;
      residual and the second LayerNorm as above;
    - head (eqs. 13-14), at the pooled position p (``[CLS]``) of the last layer: the pooler's
      ``W_pool`` and ``b_pool`` (AbsDot), its tanh linearised by the same ratio rule (``theta = 0``
      where the pre-activation is 0, as for the FFN, not tanh's limit 1), then the classifier's
      ``W_cls`` and ``b_cls`` (AbsDot): ``y_c = sum_k y_{c<-k}`` for every class c. Our GPT's extract
      read-out has no pooler: its ``decoder`` (``W_cls``, ``b_cls``, AbsDot) on ``<extract>``'s
      last state, the pooled position p, is the whole head (the classifier's dropout is off in
      eval mode).

    The ratio rule makes every step exact, not an approximation of the sum: ``sum_k`` of the
    components is the model's state at every layer and ``sum_k y_{c<-k}`` its logit (every bias
    assigned to the tokens by AbsDot; a bias whose AbsDot weights are all 0 would be dropped, as
    the authors' ``+ 1e-12`` drops it). The importance of token k is ``y_{t<-k}``, t the class
    :func:`attnmetrics.outputs.decision` predicts (with one sigmoid logit z, class 0's logit is
    ``-z``, so its contributions are ``-z_{<-k}``): signed, in the logit's units, positive where the
    token supports the predicted class. :func:`decompx_contributions` gives every class's
    contributions at every position.

    As the other methods here, ``[CLS]``'s (``<start>``'s) own contribution is dropped with the
    lead token's column and ``[SEP]``'s (``<extract>``'s) is zeroed (both are in
    :func:`decompx_contributions`, whose positions sum to the logits); padded positions are masked
    out of every component and of the attention, so a row's scores do not depend on the batch's
    padding. Per chunk of rows one forward, then
    the decomposition (``[b, T, T, d]`` per layer, its feed-forward states ``[b, Q, T, d_ff]`` a
    chunk of queries Q at a time; the last layer only at the pooled query), all sized to the
    memory budget.

    Where this differs from the authors' code (mohsenfayyaz/DecompX ``src/modeling_bert.py``,
    ``DecompXConfig`` defaults: AbsDot, GeLU_ZO, tanh ZO, vector aggregation): the paper's rule is
    applied in every layer, while their first layer splits the value bias by the attention weights
    (``A_h[i, j] b_V^h W_O^h`` to token j, only ``b_O`` by AbsDot) and their AbsDot weights of
    ``b_Att`` are taken after the residual is added (eq. 5 takes them from the attention terms);
    their ratios and weights add 1e-12 to the denominators, ours are exact.

    Args, Raises: as :func:`attention_value_norm`; also ValueError for a BERT-like model without a
        pooler (``hf.bert.pooler``), a classifier (our GPT's ``decoder``) that is not one
        ``nn.Linear``, or logits that are not ``[B, C]`` or not finite.

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's signed contribution to the predicted class's logit (logit units, not normalised),
        zero past each row's real tokens.
    """
    return _run(model, tokens, lengths, memory_budget, "decompx", _decompx_chunk(model, predicted=True))


def decompx_contributions(
    model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> Tensor:
    """DecompX's per-class decomposition of the logits (:func:`decompx`): ``[B, T, C]`` in the
    model's float dtype (float32 for a half precision model), ``y_{c<-k}`` for every position k of
    each row (``[CLS]`` and ``[SEP]`` included, padding 0) and every logit c, summing over k to the
    model's logits (every bias is assigned to the tokens). Args and errors as :func:`decompx`."""
    classes = _decompx_head(model, "decompx_contributions")[1].out_features
    return _run(
        model,
        tokens,
        lengths,
        memory_budget,
        "decompx_contributions",
        _decompx_chunk(model, predicted=False),
        trailing=(classes,),
        raw=True,
    )


def _decompx_head(model, method: str) -> tuple[nn.Module | None, nn.Linear]:
    """The pooler (``dense``, ``activation``) and the classifier ``nn.Linear`` of ``model.hf``; our
    GPT classifier's: no pooler, its ``decoder`` (the extract read-out classifies the pooled state
    itself)."""
    if _stack(model, method).family == "gpt":
        if not isinstance(model.decoder, nn.Linear):
            raise ValueError(
                f"{method} decomposes the classification head, but {type(model).__name__}'s decoder is "
                f"{type(model.decoder).__name__}, not one nn.Linear"
            )
        return None, model.decoder
    pooler, classifier = getattr(model.hf.bert, "pooler", None), getattr(model.hf, "classifier", None)
    if pooler is None or not isinstance(getattr(pooler, "dense", None), nn.Linear):
        raise ValueError(f"{method} decomposes the classification head, but {type(model.hf).__name__} has no pooler")
    if not isinstance(classifier, nn.Linear):
        raise ValueError(
            f"{method} decomposes the classification head, but {type(model.hf).__name__}'s classifier is "
            f"{type(classifier).__name__}, not one nn.Linear"
        )
    return pooler, classifier


def _absdot(parts: Tensor, bias: Tensor) -> Tensor:
    """DecompX's AbsDot (eq. 5): ``parts`` ``[..., K, e]`` (the bias-free terms of K tokens) plus
    the bias ``[e]`` (or ``[..., e]``, one per leading index) split over K by
    ``|bias . parts_k| / sum_k' |bias . parts_k'|``; all-zero weights (or no bias) assign nothing."""
    if bias is None:
        return parts
    if bias.dim() == 1:
        w = (parts @ bias).abs()
    else:
        w = torch.einsum("...ke,...e->...k", parts, bias).abs()
    total = w.sum(-1, keepdim=True)
    w = torch.where(total > 0, w / total.clamp_min(torch.finfo(w.dtype).tiny), torch.zeros_like(w))
    return parts + w[..., None] * bias[..., None, :]


def _ratio(act, pre: Tensor) -> Tensor:
    """The zero-intercept slope ``act(pre) / pre`` elementwise (eq. 10), 0 where ``pre = 0``."""
    nonzero = pre != 0
    return torch.where(nonzero, act(pre) / torch.where(nonzero, pre, torch.ones_like(pre)), torch.zeros_like(pre))


def _decompx_chunk(model, predicted: bool):
    """A ``_run`` chunk function: DecompX's ``[b, T, C]`` contributions (``[b, T]``: the predicted
    class's, when ``predicted``), rows and queries chunked to the budget."""

    def per_chunk(layers, tokens, lengths, trace, budget):
        pooler, classifier = _decompx_head(model, "decompx")
        batch, width = tokens.shape
        x = trace.x[0]
        d, inter = x.shape[-1], layers[0].fc.weight.shape[0]
        size = x.element_size()

        def fixed(w):  # a row's components in and out, their values and mixtures
            return size * 4 * w * w * d

        def per_query(w):  # a query's LayerNorm and feed-forward terms
            return size * w * (3 * inter + 8 * d)

        pooled = _pooled(model, lengths)
        y = torch.zeros(batch, width, classifier.out_features, dtype=x.dtype, device=x.device)
        # the rows longest first, in groups trimmed to their longest (the cost grows as T^2 per layer)
        lens = trace.host_lengths
        order = sorted(range(batch), key=lambda b: -lens[b])
        start = 0
        while start < batch:
            w = lens[order[start]]
            n = max(1, min(batch - start, budget // max(fixed(w) + w * per_query(w), 1)))
            group = torch.tensor(order[start : start + n], device=x.device)
            sub = _SubTrace(trace, group, w)
            y[group, :w] = _decompx_rows(
                layers, pooler, classifier, sub, lengths[group], pooled[group], n * fixed(w), n * per_query(w), budget
            )
            start += n
        if not predicted:
            return y
        rows = torch.arange(batch, device=tokens.device)
        return _predicted_logit(_pooled_logits(model, trace, rows, pooled), y)

    return per_chunk


class _SubTrace:
    """A ``_Trace``'s rows ``rows`` (indices) trimmed to their first ``width`` positions (padded keys
    carry no attention, so the real positions' states and probabilities are the same)."""

    def __init__(self, trace: _Trace, rows: Tensor, width: int):
        self.x = [x[rows, :width] for x in trace.x]
        self.probs = [p[rows, :, :width, :width] for p in trace.probs]
        self.v = [v[rows, :, :width] for v in trace.v]
        self.pre1 = [u[rows, :width] for u in trace.pre1]
        self.mid = [u[rows, :width] for u in trace.mid]
        self.pre2 = [u[rows, :width] for u in trace.pre2]


def _decompx_rows(layers, pooler, classifier, trace, lengths, pooled, fixed, per_query, budget) -> Tensor:
    """DecompX on a chunk of rows: ``[b, T, C]`` (see :func:`decompx`)."""
    x = trace.x[0]
    batch, width, d = x.shape
    valid = token_mask(lengths, width)
    keep = valid.to(x.dtype)
    rows = torch.arange(batch, device=x.device)
    # x_{i<-k} = [i = k] x_i on the real positions: [b, T (i), T (k), d]
    comps = torch.diag_embed((x * keep[:, :, None]).transpose(1, 2)).permute(0, 2, 3, 1)
    for index, layer in enumerate(layers):
        last = index == len(layers) - 1
        heads = layer.heads
        probs = trace.probs[index] * keep[:, None, None, :]  # padded keys carry nothing
        pre1, a = trace.pre1[index], trace.mid[index]  # the model's own, recorded by the trace
        values = (comps @ layer.value_weight.T).unflatten(-1, (heads, -1))  # [b, T (j), T (k), H, dh], no b_V
        b_att = layer.out.weight @ layer.value_bias + layer.out.bias
        if last:  # only the pooled query is read after the last layer
            query_sets = [pooled[:, None]]
        else:
            query_sets = [
                torch.arange(qs.start, qs.stop, device=x.device).expand(batch, -1)
                for qs in _chunks(width, per_query, max(budget - fixed, per_query))
            ]
        outs = []
        for queries in query_sets:
            r = rows[:, None]
            mixed = torch.einsum("bqhj,bjkhe->bqkhe", probs[r, :, queries], values).flatten(-2)
            z = _absdot(mixed @ layer.out.weight.T, b_att) + comps[r, queries]  # eqs. 4-7: [b, Q, T, d]
            ln1 = layer.ln_1
            t = _absdot(_ln_linear(z, ln1, _scale(pre1[r, queries], ln1)[:, :, None]), ln1.bias)  # eq. 8
            zeta = _absdot(t @ layer.fc.weight.T, layer.fc.bias)  # [b, Q, T, d_ff]
            aq = a[r, queries]
            hidden = layer.fc(aq)  # the FFN's pre-activation, once for theta and the state
            theta = _ratio(layer.act, hidden)  # [b, Q, d_ff]
            ffn = _absdot((theta[:, :, None] * zeta) @ layer.proj.weight.T, layer.proj.bias)
            pre2 = trace.pre2[index][r, queries]  # the FFN block's pre-LayerNorm state
            ln2 = layer.ln_2
            outs.append(_absdot(_ln_linear(t + ffn, ln2, _scale(pre2, ln2)[:, :, None]), ln2.bias))
        comps = torch.cat(outs, 1) * (
            keep[:, None, :, None] if last else (keep[:, :, None] * keep[:, None, :])[..., None]
        )
    q = comps[:, 0]  # the pooled query's components [b, T (k), d]
    if pooler is not None:  # BERT's pooler: dense, its activation by the ratio rule
        q = _absdot(q @ pooler.dense.weight.T, pooler.dense.bias)
        theta = _ratio(pooler.activation, pooler.dense(trace.x[-1][rows, pooled]))  # [b, d]
        q = theta[:, None] * q
    y = _absdot(q @ classifier.weight.T, classifier.bias)  # [b, T (k), C]
    return y * keep[:, :, None]


# ---- attention flow (Abnar & Zuidema 2020) --------------------------------------------------------

#: the fixed-point scale of attention flow's integer capacities (csrc/cpu/flow.cpp's kScale; scipy's
#: maximum_flow, which computed them before, takes int32): every capacity is at most 1 and every
#: flow at most the pooled node's in-capacity, 1, so no capacity, residual or flow passes 2^30
FLOW_SCALE = 2**30


def attention_flow(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """Attention flow (Abnar & Zuidema 2020, ACL, "Quantifying Attention Flow in Transformers",
    sec. 3): the maximum flow from each input token to the pooled position's last representation
    through the layers' attention graph.

    It needs the layers' attention alone, so it runs on every model whose attention rollout runs
    (our GPT classifier, BERT-like and GPT-2-like Hugging Face classifiers), reading what rollout
    reads: the model's ``layer_attentions(tokens, lengths)`` (every layer's probabilities
    ``[B, L, H, T, T]``), mixed into rollout's per-layer matrices by
    :func:`attnmetrics.rollout.layer_matrices`, and its pooled position ``model.pooled(lengths)``
    (``[CLS]``; a causal model's last real token; position 0 for a model without ``pooled``). A
    causal model's attention is 0 on later keys, so its graph only has edges to the same or later
    positions; nothing below changes.

    The graph of a row with n real positions (special tokens included, padding not) has a
    node ``(l, t)`` for every layer boundary ``l = 0 .. L`` (0 the embeddings, ``l + 1`` layer l's
    output) and position t, and an edge from ``(l, k)`` to ``(l + 1, i)`` of capacity
    ``Â_l[i, k]``: attention rollout's per-layer matrix (docs/definitions.md §17, the residual 0.5
    of the paper), ``Â_l = 0.5 · mean_h A_h + 0.5 · I`` on the row's n positions, each row divided
    by its sum, ``A_h`` layer l's attention probabilities as the model computes them. The
    importance of token j is the value of a maximum flow from ``(0, j)`` to ``(L, p)``, p the
    pooled position. It is at most 1 (the pooled node's in-capacity, one row of ``Â_{L-1}``) and
    at most token j's out-capacity ``sum_i Â_0[i, j]``; with one layer it is ``Â_0[p, j]``, with
    two ``sum_k min(Â_0[k, j], Â_1[p, k])`` (disjoint paths), both computed so, exactly.

    The flows are not normalised: the authors' code (samiraabnar/attention_flow,
    ``attention_graph_util.compute_flows``) divides each output node's flows by their sum over
    every input position, special tokens included, a positive constant per row that changes no
    order within a row. As rollout's importance, the lead special tokens' columns are dropped
    (``[CLS]``, ``<start>``) and the trailing ones (``[SEP]``, ``<extract>``) and padding are 0.

    Runs on the CPU, whatever the model's device: one forward per chunk of rows on the model's
    device (as the other methods), then the per-layer matrices in float64 move to the CPU, where
    the ``attention_flow`` op (``csrc/cpu/flow.cpp``, rows in parallel over torch's intra-op
    threads) builds each row's graph once and runs Dinic's algorithm once per real token. With
    ``L >= 3`` a row's graph has ``(L - 1) n + 2`` nodes and ``(L - 2) n^2 + 2n`` edges (the input
    layer reduced to the source, the last to the pooled node), so a row costs n max flows of at
    most ``O(V^2 E)`` each. Measured on one thread (random 12-head attention mixed into rollout's
    matrices): L = 6, 0.9 ms a row at n = 32 and 39 ms at n = 128; L = 12, 2.0 ms and 110 ms
    (scipy's ``maximum_flow`` on the same graphs, as this function called it before: 10-16x
    slower; benchmarks/test_bench_attributions.py).

    Precision: the max flow runs on integer capacities, so for ``L >= 3`` every capacity is
    rounded down to a multiple of ``2^-30`` (:data:`FLOW_SCALE`). Its maximum flow gives a
    minimum cut C of the rounded graph (the nodes its residual graph reaches from the source: the
    same set for every maximum flow, so the same cut scipy's Dinic finds), and the result is C's
    capacity in the exact float64 capacities: by max-flow/min-cut,
    ``F <= result < F + |C| 2^-30`` with F the exact max flow and ``|C|`` the cut's edges (at most
    ``(L - 2) n^2 + 2n``), and the result is F itself, up to float64 rounding of the cut's sum,
    whenever C is also a minimum cut of the exact graph, as it was in every test against networkx's
    float max flow (1e-12 relative on the tests' models and on random graphs with tied cuts). C can
    differ only where cuts come within ``|C| 2^-30`` of each other, e.g. through capacities below
    2^-30 that round to 0 (a random graph with such capacities: 4e-12 above F). The result is then
    cast to the model's float dtype (float32 for a half precision model: module docstring).

    Args: as :func:`attention_value_norm` (``memory_budget`` bounds the forward's chunks; the flows
    hold one row's graph at a time).

    Raises:
        TypeError: the model has no attention layers (no ``layer_attentions``, e.g. the BiLSTM:
            nothing to roll out either).
        ValueError: bad ``tokens``, ``lengths`` or ``memory_budget``; an attention implementation
            that returns no probabilities (``sdpa``); a row whose flows are not finite.
        RuntimeError: from the ``attention_flow`` op, a capacity outside ``[0, 1]`` (a model whose
            attention probabilities are negative), naming its row, layer and entry.

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's maximum flow to the pooled position, in [0, 1] (a share of the pooled node's
        in-capacity 1; the tokens' flows may sum past 1, each one is the most that token alone could
        send), zero past each row's real tokens.
    """

    from attnmetrics.rollout import layer_attentions, layer_matrices

    attentions = layer_attentions(model, "attention_flow")
    lengths = check_model_inputs(model, tokens, lengths)
    budget = check_budget(memory_budget)
    batch, width = tokens.shape
    used = int(lengths.max())  # one read: the columns past every row's length are padding
    pooled = _pooled(model, lengths)
    out = None
    with _in_float32(model), eval_mode(model), torch.no_grad():
        row_bytes = _flow_row_bytes(model, attentions, tokens[:1, :used], lengths[:1])
        for rows in _chunks(batch, row_bytes, budget // 2):
            n = lengths[rows]
            probs = attentions(tokens[rows, :used], n)
            if out is None:  # the model's float dtype (float32 for a half precision model)
                out = torch.zeros(batch, width, dtype=probs.dtype, device=tokens.device)
            graphs = layer_matrices(probs, n).cpu().contiguous()  # [b, L, T, T] float64
            flows = ops.attention_flow(graphs, n.cpu(), pooled[rows].cpu(), model.lead, model.trail)
            out[rows, :used] = flows.to(out.device, out.dtype)  # NaN in a row not finite: _real names it
    return _real(out, lengths, model, "attention_flow")


def _flow_row_bytes(model, attentions, tokens: Tensor, lengths: Tensor) -> int:
    """About what a row of attention flow's forward holds. A BERT-like model: :func:`_row_bytes` (its
    chunks as they always were); any other, a one-row probe of its attention: twice its
    probabilities and their float64 per-layer matrices (for the forward's activations)."""
    stack = _stack(model, "attention_flow") if supports(model) else None
    if stack is not None and stack.family == "bert":
        layers = stack.parts
        dtype = layers[0].out.weight.dtype
        return _row_bytes(layers, tokens.shape[1], torch.finfo(dtype).bits // 8)
    probs = attentions(tokens, lengths)
    return 2 * (probs.numel() * probs.element_size() + probs[:, :, 0].numel() * 8)


def _max_flows(m: np.ndarray, pooled: int, sources: np.ndarray) -> np.ndarray:
    """Max flow from ``(0, j)`` to ``(L, pooled)`` for every j of ``sources``: ``m`` ``[L, n, n]``
    float64, ``m[l, i, k]`` the capacity from ``(l, k)`` to ``(l + 1, i)`` (see
    :func:`attention_flow`); one row of the ``attention_flow`` op."""
    graphs = torch.from_numpy(np.ascontiguousarray(m, dtype=np.float64))[None]
    n = graphs.shape[-1]
    flows = ops.attention_flow(graphs, torch.tensor([n]), torch.tensor([pooled]), 0, 0)[0]
    return flows.numpy()[np.asarray(sources)]


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
