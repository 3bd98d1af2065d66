"""The layers of the post-LayerNorm transformers these methods read (BERT-like Hugging Face
classifiers, our GPT with its extract read-out), one forward's trace of them, and the driver that
runs a method over rows grouped by length (:func:`length_groups`), chunked to a memory budget."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnmetrics._deferred import deferred
from attnmetrics._validation import check_budget, check_logits, check_model_inputs
from attnmetrics.loo import CPU_PADDING, CPU_SMALL_CALL, call_budget, padded_calls
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
    """Half precision computed in float32 (the package docstring's Precision, attnmetrics.attributions): for the block, every
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

    def layer(self, index: int) -> _LayerStates:
        """Layer ``index``'s states of every row."""
        return _LayerStates(
            probs=self.probs[index],
            v=self.v[index],
            x=self.x[index],
            pre1=self.pre1[index],
            mid=self.mid[index],
            pre2=self.pre2[index],
            out=self.x[index + 1],
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
    small: int = CPU_SMALL_CALL,
) -> Tensor:
    """Check the inputs, then ``per_chunk(layers, tokens, lengths, trace)`` -> ``[b, width]`` over
    chunks of rows trimmed to their longest (one forward each), assembled into ``[B, T - lead]``.
    ``gradients``: each chunk's trace is recorded for autograd (``_Trace``'s ``gradients``) and
    ``per_chunk`` runs with gradients enabled. ``trailing``: ``per_chunk`` returns
    ``[b, width, *trailing]``; ``raw``: the assembled ``[B, T, *trailing]`` over every position is
    returned as it is (zero past the chunks' widths), not laid out over the real tokens. The rows run
    in :func:`length_groups` (``padding``, ``small``: how much padding a CPU group may take). A half
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
            small,
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
    lengths: list[int],
    row_bytes: Callable[[int], int],
    budget: int,
    padded: bool,
    padding: float = CPU_PADDING,
    small: int = CPU_SMALL_CALL,
) -> list[list[int]]:
    """The rows of ``lengths`` (host ints) sorted by length, shortest first, in consecutive groups
    that each run as one call trimmed to their longest row ``w``: a group holds at most ``budget``
    bytes at ``row_bytes(w)`` a row (a row that alone exceeds it is a group of its own). Where calls
    are not padded (``padded`` False: the CPU, :func:`attnmetrics.loo.padded_calls`, where a call's
    cost follows its positions), a group also takes a longer row only while its padded cost
    ``n w^2`` stays within ``padding`` of its rows' own ``sum w_b^2`` (these methods' cost grows
    about as the square of a row's width, per layer), or, while the group holds at most ``small``
    padded positions ``n w``, within twice their own (a call's fixed cost outweighs a few short rows'
    padding: 3 rows of 8-10 ids ran 30 % faster as one call than as two): so a batch costs about what
    its rows cost one by one, in fewer, larger calls. On a GPU (``padded``), the budget alone bounds a
    group."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups: list[list[int]] = []
    own = 0
    for b in order:
        w = lengths[b]
        group = groups[-1] if groups else None
        if group is not None:
            n = len(group) + 1
            fits = n * row_bytes(w) <= budget
            cost, real = n * w * w, own + w * w
            little_padded = padded or cost <= (1 + padding) * real or (n * w <= small and cost <= 2 * real)
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


def _row_normalised(c: Tensor) -> Tensor:
    """Rows divided by their sums over the last dimension; a row summing to 0 stays 0."""
    total = c.sum(-1, keepdim=True)
    return torch.where(total > 0, c / total.clamp_min(torch.finfo(c.dtype).tiny), c)


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
