"""The Llama layer as the attention-derived attributions read it on a pre-RMSNorm decoder
(docs/definitions.md §20, "On a pre-RMSNorm decoder").

A Llama-layout layer (``transformers``' Llama, Qwen2, Mistral) maps its input ``x`` ``[T, d]`` (the
residual stream; the token embeddings for the first layer) to

- ``u_j = RMSNorm_1(x_j) = gamma_1 * x_j / rms(x_j)``, ``rms(x) = sqrt(mean(x^2) + eps)``, each
  token by its own scale;
- the attention block: query head h (of H) reads key/value head ``g(h) = h // (H / H_kv)``
  (grouped-query attention); its value of token j is ``v_h(x_j) = u_j W_V^{g(h)} + b_V^{g(h)}``
  (Qwen2's bias; 0 for Llama), through its slice of the output projection
  ``f_h(x_j) = v_h(x_j) W_O^h`` (``b_O``, Llama's ``attention_bias``, not in f); the rotary
  positions act on queries and keys only, so ``f_h`` is position-free;
- ``m_i = x_i + sum_h sum_j A_h[i, j] f_h(x_j) + b_O`` (the residual stream after attention,
  :attr:`Trace.mid`), then the layer's output ``m_i + down(act(gate(w_i)) * up(w_i))``,
  ``w_i = RMSNorm_2(m_i)``.

After the last layer the final RMSNorm and the decoder (a fine-tuned head's ``score``, a
prompted model's label words' rows of ``lm_head``) give the logits at the deciding position p.

RMSNorm's linear part at the model's own scale, ``v -> gamma * v / rms(u)`` for a fixed state u
(:func:`rms_linear`), is what a decomposition sends each part of u through; it needs no centring
(RMSNorm has none) and no bias (it has none), so it maps a sum of parts to the sum of their images
exactly.

:class:`Trace` is one forward of the model's own (its attention function hands over each layer's
probabilities and values: ``eager_attention``'s ``_attnmetrics_hook``; forward pre-hooks on the
norms hand over the states), over the whole input: for a prompted model the template around the
text, for a fine-tuned classifier the text alone. :func:`run` checks the inputs, chunks the rows
to a memory budget and lays each method's scores over the whole input out over the items (the
text's tokens).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnmetrics._deferred import deferred
from attnmetrics._validation import DEFAULT_MEMORY_BUDGET, check_budget, check_logits, check_model_inputs
from attnmetrics.attributions.layers import _chunks, _in_float32, _predicted_logit, length_groups
from attnmetrics.loo import padded_calls
from attnmetrics.outputs import decision
from attnmetrics.protocol import eval_mode, token_mask

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "LlamaLayer",
    "Trace",
    "heads_out",
    "llama_layers",
    "mixing",
    "per_query",
    "rms_linear",
    "rms_scale",
    "run",
    "supports",
    "target_values",
]

#: the parts of a Llama-layout decoder layer the methods read
_PARTS = ("self_attn.v_proj", "self_attn.o_proj", "input_layernorm", "post_attention_layernorm", "mlp")


@dataclass(frozen=True)
class LlamaLayer:
    """One Llama-layout decoder layer as the methods read it: ``heads`` query heads,
    ``kv_heads`` key/value heads of ``head_dim``; ``norm_1`` (``input_layernorm``), ``value``
    (``v_proj``), ``out`` (``o_proj``), ``norm_2`` (``post_attention_layernorm``), ``mlp``."""

    heads: int
    kv_heads: int
    head_dim: int
    norm_1: nn.Module
    value: nn.Linear
    out: nn.Linear
    norm_2: nn.Module
    mlp: nn.Module

    def after_attention(self, mid: Tensor) -> Tensor:
        """The layer's output from the residual stream after attention: ``m + mlp(RMSNorm_2(m))``."""
        return mid + self.mlp(self.norm_2(mid))


def _get(module: nn.Module, path: str):
    for name in path.split("."):
        module = getattr(module, name, None)
        if module is None:
            return None
    return module


def _is_llama(model) -> bool:
    """A fine-tuned Llama-layout classifier (the adapter's family ``"llama"``) or a prompted one
    (family ``"llama"`` too, ``prefix_ids``/``suffix_ids``): by structure, not by class."""
    return getattr(model, "family", None) == "llama" and isinstance(getattr(model, "hf", None), nn.Module)


def _norm_eps(norm: nn.Module) -> float | None:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return eps if isinstance(eps, float) else None


#: the norm modules :func:`_is_rms_norm` has probed, and its answer (the formula does not change with the weights)
_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _is_rms_norm(norm: nn.Module) -> bool:
    """Whether ``norm`` computes ``gamma * u / sqrt(mean(u^2) + eps)`` (Llama's, Qwen2's, Mistral's
    RMSNorm; not Gemma's ``(1 + gamma)``), checked once per module on a probe of two states (to
    float32's rounding; a half precision norm's to its own)."""
    if norm in _PROBED:
        return _PROBED[norm]
    weight, eps = getattr(norm, "weight", None), _norm_eps(norm)
    if not isinstance(weight, Tensor) or weight.dim() != 1 or eps is None:
        return False
    g = torch.Generator().manual_seed(0)
    u = torch.randn(2, weight.shape[0], generator=g).to(weight)
    with torch.no_grad():
        w, v = weight.float(), u.float()
        expected = w * v * torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)
        got = norm(u)
    rtol = 1e-4 if weight.element_size() >= 4 else 2e-2
    answer = got.shape == expected.shape and bool(torch.allclose(got.float(), expected, rtol=rtol, atol=rtol / 10))
    _PROBED[norm] = answer
    return answer


def llama_layers(model, method: str) -> tuple[list[LlamaLayer], nn.Module]:
    """The layers and the final RMSNorm of a Llama-layout decoder on the protocol, or a ValueError
    naming what the model lacks.

    Raises:
        TypeError: ``model`` is not a Llama-layout decoder (no ``hf``, or another family).
        ValueError: a layer without the parts the methods read, or whose norms are not RMSNorm.
    """
    if not _is_llama(model):
        raise TypeError(
            f"{method} (attnmetrics.llm) needs a Llama-layout decoder on the protocol (HFClassifier of family 'llama', "
            f"or a PromptedLM), got {type(model).__name__}"
            + (f" of family {model.family!r}" if isinstance(getattr(model, "family", None), str) else "")
        )
    base = model.base
    layers, norm = getattr(base, "layers", None), getattr(base, "norm", None)
    name = type(model.hf).__name__
    if not isinstance(layers, nn.ModuleList) or not len(layers) or not isinstance(norm, nn.Module):
        raise ValueError(f"{method}: {name} has no decoder layers and final norm (model.layers, model.norm)")
    parts = []
    for layer in layers:
        if not all(isinstance(_get(layer, p), nn.Module) for p in _PARTS) or hasattr(
            layer, "pre_feedforward_layernorm"
        ):
            raise ValueError(
                f"{method}: {name}'s decoder layers are not Llama's layout (x + attn(norm(x)), then x + mlp(norm(x)))"
            )
        if not all(_is_rms_norm(n) for n in (layer.input_layernorm, layer.post_attention_layernorm)):
            raise ValueError(f"{method}: {name}'s layer norms are not RMSNorm (gamma * u / rms(u))")
        attn = layer.self_attn
        heads = int(attn.config.num_attention_heads)
        kv = int(attn.config.num_key_value_heads)
        parts.append(
            LlamaLayer(
                heads=heads,
                kv_heads=kv,
                head_dim=int(attn.head_dim),
                norm_1=layer.input_layernorm,
                value=attn.v_proj,
                out=attn.o_proj,
                norm_2=layer.post_attention_layernorm,
                mlp=layer.mlp,
            )
        )
    if not _is_rms_norm(norm):
        raise ValueError(f"{method}: {name}'s final norm is not RMSNorm (gamma * u / rms(u))")
    return parts, norm


def supports(model) -> bool:
    """Whether the methods of :mod:`attnmetrics.llm` apply to ``model``: a Llama-layout decoder on the
    protocol (a fine-tuned ``HFClassifier`` of family ``"llama"`` or a ``PromptedLM``)."""
    try:
        llama_layers(model, "")
    except (TypeError, ValueError):
        return False
    return True


# ---- RMSNorm and the heads ------------------------------------------------------------------------


def rms_scale(u: Tensor, norm: nn.Module) -> Tensor:
    """``1 / rms(u) = 1 / sqrt(mean(u^2) + eps)`` over the last dimension, ``[..., 1]``, in u's dtype
    (``eps`` the norm's own)."""
    return torch.rsqrt(u.square().mean(-1, keepdim=True) + _norm_eps(norm))


def rms_linear(v: Tensor, norm: nn.Module, scale: Tensor) -> Tensor:
    """RMSNorm's linear part at a fixed state's scale: ``gamma * v * scale`` (``scale`` from
    :func:`rms_scale` of that state)."""
    return norm.weight * v * scale


def heads_out(layer: LlamaLayer, v: Tensor) -> Tensor:
    """``f_h(x_j) = v_h(x_j) W_O^h``: per query head values ``[..., H, T, dh]`` (each its group's)
    -> ``[..., H, T, d]`` (no ``b_O``)."""
    w = layer.out.weight  # [d, H * dh] (out, in)
    return torch.einsum("...hsk,dhk->...hsd", v, w.view(w.shape[0], layer.heads, layer.head_dim))


def mixing(probs: Tensor, f: Tensor, x: Tensor, queries: Tensor) -> Tensor:
    """``T_i(x_j) = sum_h A_h[i, j] f_h(x_j) + [i = j] x_i`` ``[b, Q, T, d]`` for the queries
    ``[b, Q]``: probs ``[b, H, T, T]``, f ``[b, H, T, d]``, x ``[b, T, d]`` (the residual belongs to
    token i itself)."""
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    a = probs[rows, :, queries]  # [b, Q, H, T]
    z = torch.einsum("bqhj,bhjd->bqjd", a, f)
    own = torch.nn.functional.one_hot(queries, probs.shape[-1]).to(x.dtype)  # [b, Q, T]
    return z + own[..., None] * x[rows, queries][:, :, None]


# ---- the trace ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _attention_hooks(modules: list[nn.Module], hook) -> Iterator[None]:
    """``eager_attention``'s ``_attnmetrics_hook`` on each attention module for the block."""
    taken = [m for m in modules if getattr(m, "_attnmetrics_hook", None) is not None]
    if taken:
        raise RuntimeError("an attention module already has an _attnmetrics_hook (a procedure inside another)")
    for m in modules:
        m._attnmetrics_hook = hook
    try:
        yield
    finally:
        for m in modules:
            del m._attnmetrics_hook


class Trace:
    """One forward of the model over a chunk of whole inputs ``ids [b, w]`` (lengths ``n [b]``,
    deciding positions ``pooled [b]``): per layer its input ``x[l]`` ``[b, w, d]`` (``x[L]`` the last
    layer's output, the final norm's input), the residual stream after attention ``mid[l]``, the
    attention probabilities ``probs[l]`` ``[b, H, w, w]`` per query head and the values ``v[l]``
    ``[b, H, w, dh]`` per query head (its key/value head's, ``b_V`` included), as the model's own
    forward computes them; ``logits`` ``[b, C]`` at the deciding positions; ``valid`` ``[b, w]``.

    ``gradients``: the forward starts from word embeddings that require gradients (detached from
    the table), so that every probability is in autograd's graph whatever the parameters'
    ``requires_grad``; the caller enables gradients."""

    def __init__(self, model, layers: list[LlamaLayer], final: nn.Module, ids, n, pooled, gradients=False):
        base = model.base
        self.pooled, self.n, self.final = pooled, n, final
        self.rows = torch.arange(ids.shape[0], device=ids.device)
        self.valid = token_mask(n, ids.shape[1])
        words = base.get_input_embeddings()(ids)
        if gradients:
            words = words.detach().requires_grad_(True)
        self.x, self.mid, self.probs, self.v = [], [], [], []
        final_in = []
        handles = []
        for module in base.layers:
            handles.append(module.input_layernorm.register_forward_pre_hook(lambda m, a: self.x.append(a[0])))
            handles.append(
                module.post_attention_layernorm.register_forward_pre_hook(lambda m, a: self.mid.append(a[0]))
            )
        handles.append(final.register_forward_pre_hook(lambda m, a: final_in.append(a[0])))

        def hook(query, key, value, probs, scaling):
            self.v.append(value)
            self.probs.append(probs)
            return probs

        try:
            with _attention_hooks([layer.self_attn for layer in base.layers], hook):
                out = base(inputs_embeds=words, attention_mask=self.valid.long())
        finally:
            for h in handles:
                h.remove()
        count = len(layers)
        if len(self.probs) != count or len(self.x) != count or len(self.mid) != count or len(final_in) != 1:
            raise ValueError(
                f"the layers' attention probabilities: {type(model.hf).__name__}'s attention implementation "
                f"({getattr(model.hf.config, '_attn_implementation', '?')}) hands over none; set it back with "
                "model.hf.set_attn_implementation('attnmetrics')"
            )
        self.x.append(final_in[0])
        self.logits = check_logits(
            model.decoder(out.last_hidden_state[self.rows, pooled]), len(ids), source="model",
            inputs="the input rows", on=" on the input rows",
        )  # fmt: skip

    def f(self, layers: list[LlamaLayer], index: int) -> Tensor:
        """Layer ``index``'s ``f_h(x_j)`` ``[b, H, w, d]``."""
        return heads_out(layers[index], self.v[index])

    def pooled_row(self, index: int) -> Tensor:
        """Layer ``index``'s attention row of the deciding position ``[b, H, w]``."""
        return self.probs[index][self.rows, :, self.pooled]


def decoder_matrix(model, like: Tensor) -> Tensor:
    """The decoder's linear part ``[d, C]`` (the final-normed state to the logits, bias left out):
    ``decoder(I) - decoder(0)``, in the dtype and on the device of ``like``."""
    d = like.shape[-1]
    eye = torch.eye(d, dtype=like.dtype, device=like.device)
    return model.decoder(eye) - model.decoder(torch.zeros_like(eye[:1]))


def target_values(logits: Tensor, values: Tensor, target: str) -> Tensor:
    """Each row's entries of ``values [B, ..., C]`` for its decision on ``logits [B, C]``:
    ``"logit"``, the predicted class's (one sigmoid logit z: class 1's z, class 0's -z);
    ``"difference"``, the predicted class's minus the runner-up's (the class of the next largest
    logit, the lower index on ties; one sigmoid logit: the same as ``"logit"``, ``±z`` being the
    difference to the fixed 0 of the other class)."""
    if target not in ("logit", "difference"):
        raise ValueError(f"target must be 'logit' or 'difference', got {target!r}")
    chosen = _predicted_logit(logits, values)
    if target == "logit" or logits.shape[1] == 1:
        return chosen
    predicted = decision(logits.detach())
    others = logits.detach().scatter(1, predicted[:, None], float("-inf"))
    runner = others.argmax(1).view(-1, *(1,) * (values.dim() - 2))
    return chosen - values.gather(-1, runner[..., None].expand(*values.shape[:-1], 1))[..., 0]


def per_query(layers: list[LlamaLayer], trace: Trace, index: int, pooled: bool, budget: int, score) -> Tensor:
    """Layer ``index``'s token-to-token matrix ``[b, w, w]`` (``[b, w]``: the deciding position's row,
    when ``pooled``) from ``score(probs, f, x, mid, queries [n, Q], valid [n, w]) -> [n, Q, w]`` on
    chunks of rows, and of queries where one row's exceed the budget (the mixing vectors
    ``[n, Q, w, d]`` are what it holds). Padded queries' rows and padded keys' columns are 0."""
    probs, f, x, mid = trace.probs[index], heads_out(layers[index], trace.v[index]), trace.x[index], trace.mid[index]
    batch, heads, width = probs.shape[:3]
    d = x.shape[-1]
    size = x.element_size()
    fixed = size * (heads * width * d + 2 * width * d)
    per_q = size * 4 * width * d  # the mixing vectors and their images
    span = 1 if pooled else width
    parts = []
    for rows in _chunks(batch, fixed + span * per_q, budget):
        n = rows.stop - rows.start
        args = (probs[rows], f[rows], x[rows], mid[rows])
        valid = trace.valid[rows]
        if pooled:
            parts.append(score(*args, trace.pooled[rows, None], valid)[:, 0])
            continue
        pieces = []
        for qs in _chunks(width, per_q, max(budget - fixed, per_q)):
            q = torch.arange(qs.start, qs.stop, device=x.device).expand(n, -1)
            pieces.append(score(*args, q, valid))
        parts.append(torch.cat(pieces, 1))
    c = torch.cat(parts)
    keep = trace.valid.to(c.dtype)
    if pooled:
        return c * keep
    return c * keep[:, :, None] * keep[:, None, :]


# ---- the driver -----------------------------------------------------------------------------------

#: a differentiable trace's bytes a row against a plain one's (autograd's saved states, the gradient)
_GRADIENT_ROW_FACTOR = 4


def _row_bytes(layers: list[LlamaLayer], width: int, d: int, inter: int, itemsize: int) -> int:
    """About what a row's trace holds: every layer's probabilities, values, states and MLP states."""
    heads, dh = layers[0].heads, layers[0].head_dim
    per_layer = heads * width * width + heads * width * (dh + d) + 4 * width * d + 3 * width * inter
    return itemsize * len(layers) * per_layer


def _sequence(model, tokens: Tensor, lengths: Tensor):
    """The whole input ``(ids [B, Tf], lengths [B], first [B], pooled [B])``: a prompted model's
    (``model.sequence``: the template around the text), or a fine-tuned decoder's own rows (the
    first text position 0, pooled at the last real token). The ids are checked against the
    vocabulary (ValueError)."""
    if callable(getattr(model, "sequence", None)):
        seq = model.sequence(tokens, lengths)
        return seq.ids, seq.lengths, seq.first, seq.pooled
    model.embed(tokens)  # the ids checked against the vocabulary
    return tokens, lengths, torch.zeros_like(lengths), lengths - 1


def run(
    model,
    tokens: Tensor,
    lengths: Tensor,
    memory_budget: int,
    method: str,
    per_chunk: Callable[[list[LlamaLayer], Trace, int], Tensor],
    gradients: bool = False,
    trailing: tuple[int, ...] = (),
) -> Tensor:
    """Check the inputs, then ``per_chunk(layers, trace, budget)`` -> ``[b, w, *trailing]`` scores over
    the whole input's positions, one forward per group of rows by length (``attributions.length_groups``:
    trimmed to its longest whole input, little padded on the CPU), laid out over the items: ``[B, T, *trailing]``, item t of row b the score of position
    ``first[b] + t``, zero past each row's length. A half precision model runs in float32
    (``attributions._in_float32``)."""
    with _in_float32(model), eval_mode(model), torch.no_grad():
        layers, final = llama_layers(model, method)
        lengths = check_model_inputs(model, tokens, lengths)
        budget = check_budget(memory_budget)
        if int(lengths.min()) < 1:
            raise ValueError(f"{method}: every row needs at least one token, got a length of {int(lengths.min())}")
        ids, full, first, pooled = _sequence(model, tokens, lengths)
        batch, width = tokens.shape
        dtype = layers[0].out.weight.dtype
        d = layers[0].out.weight.shape[0]
        inter = max(p.shape[0] for p in layers[0].mlp.parameters() if p.dim() == 2)
        host_full = full.tolist()
        itemsize = torch.finfo(dtype).bits // 8
        factor = _GRADIENT_ROW_FACTOR if gradients else 1
        groups = length_groups(
            host_full, lambda w: _row_bytes(layers, w, d, inter, itemsize) * factor, budget // 2,
            padded_calls(tokens.device),
        )  # fmt: skip
        out = torch.zeros(batch, width, *trailing, dtype=dtype, device=tokens.device)
        columns = torch.arange(width, device=tokens.device)
        with deferred():  # the groups' logits checked once, at the end
            for group in groups:
                w = host_full[group[-1]]  # the group's longest whole input
                rows = torch.tensor(group, device=tokens.device)
                with torch.enable_grad() if gradients else contextlib.nullcontext():
                    trace = Trace(model, layers, final, ids[rows, :w], full[rows], pooled[rows], gradients)
                    score = per_chunk(layers, trace, budget // 2).detach()
                where = (first[rows, None] + columns).clamp_max(w - 1)
                where = where.view(*where.shape, *(1,) * len(trailing)).expand(-1, -1, *trailing)
                items = score.gather(1, where).to(dtype)
                keep = token_mask(lengths[rows], width).view(*where.shape[:2], *(1,) * len(trailing))
                out[rows] = torch.where(keep, items, torch.zeros_like(items))
    bad = ~torch.isfinite(out).flatten(1).all(1)
    if bad.any():
        raise ValueError(
            f"{method} is not finite in row {int(bad.nonzero()[0])}: the model's states hold NaN or inf, or the "
            "product through the layers overflowed"
        )
    return out
