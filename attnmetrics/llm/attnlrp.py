"""AttnLRP (Achtibat et al. 2024, ICML, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
Transformers") on a pre-RMSNorm Llama-layout decoder, as ``lxt``'s efficient implementation computes it
(``lxt.efficient``, its ``attnLRP`` patch maps for ``modeling_llama`` and ``modeling_qwen2``).

LRP in its Gradient × Input form (Arras et al. 2025, "Close Look at Decomposition-based XAI-Methods for
Transformer Language Models", whose formulation ``lxt`` implements): every operation's backward pass is
replaced by the one whose Gradient × Input is the operation's LRP rule, so that one backward pass from
the explained logit gives every input's relevance as ``input * gradient``. The rules, per operation of
a Llama layer (``lxt/efficient/patches.py``, ``rules.py``):

- linear layers (the projections, the head): their own gradient, so ``input * gradient`` is the
  LRP-ε rule at ε → 0 (LRP-0; a bias, Qwen2's q/k/v ones, keeps its share of the relevance);
- RMSNorm ``gamma * u / rms(u)``: the identity rule on the division, ``1 / rms(u)`` held constant
  (detached from the graph), so the norm is a linear map of ``u`` in the backward pass;
- the gated MLP ``down(act(gate(u)) * up(u))``: the identity rule on the element-wise ``act`` (SiLU:
  the gradient ``act(z) / (z + 1e-10)``, relevance passed through unchanged), the uniform rule on the
  element-wise product (the gradient halved: each factor gets half the product's relevance);
- attention ``softmax(q k^T / sqrt(d)) v``: the uniform rule on both matrix products (the probability
  matrix and the values each get half of the output's relevance; the queries and keys each half of
  the scores'), the softmax by its own gradient (the paper's softmax rule, Prop. 3.1:
  ``R_in = z * (R_out - s * sum(R_out))``, its Taylor decomposition whose bias absorbs the rest). In
  the gradient: the values' gradient halved, the queries' and keys' quartered, at the projections'
  outputs (the rotary positions, a linear map, pass it on unchanged);
- residual additions, the embeddings, the rotary positions: their own gradient (the sum rule).

The relevance of a token is its input embedding's ``sum_k e_k * dR/de_k`` (the paper's and ``lxt``'s
convention: the relevances of the embedding's dimensions summed), for the predicted class's logit (a
fine-tuned head's class; a prompted model's predicted label word's next-token logit; one sigmoid
logit z: ±z), its backward seeded with 1 (so the output's relevance is the logit itself). The rules
conserve relevance except where a bias or a softmax absorbs some (``tests/test_attnlrp.py`` checks
that: on a bias-free model the relevances of all positions sum to the logit less what the
softmaxes absorb).

``lxt`` itself patches the ``transformers`` classes' methods process-wide (every ``LlamaRMSNorm``,
``LlamaMLP`` and the module's attention functions, until the process ends), and ``lxt`` 2.1 does not
import beside ``transformers`` 5 (its BERT module imports ``find_pruneable_heads_and_indices``,
removed from ``transformers.pytorch_utils``); so the rules are applied here, to one model's modules
and for one call (:func:`rules`), each equal to ``lxt``'s. ``tests/fixtures/attnlrp_lxt.json`` holds
``lxt``'s relevances on tiny random models (written by ``benchmarks/peers/attnlrp_lxt.py`` in an
environment of ``lxt`` 2.1 and ``transformers`` 4.53), which the tests compare with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from attnmetrics._deferred import deferred
from attnmetrics._validation import DEFAULT_MEMORY_BUDGET, check_budget, check_logits, check_model_inputs
from attnmetrics.attributions.layers import _in_float32, _predicted_logit, length_groups
from attnmetrics.llm.layers import _norm_eps, _sequence, llama_layers
from attnmetrics.loo import padded_calls
from attnmetrics.protocol import eval_mode, token_mask

__all__ = ["FACTORS", "attnlrp", "divide_gradient", "identity_rule", "rules"]

#: ``lxt``'s stabiliser of the identity rule's ratio ``act(z) / (z + eps)``
IDENTITY_EPS = 1e-10


class _DivideGradient(torch.autograd.Function):
    """The identity forward, the gradient divided by ``factor`` (``lxt``'s ``divide_gradient_fn``)."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad / ctx.factor, None


class _IdentityRule(torch.autograd.Function):
    """``fn(z)`` forward, the gradient ``fn(z) / (z + eps)`` (``lxt``'s ``identity_rule_implicit_fn``):
    an element-wise function passes its output's relevance to its input unchanged."""

    @staticmethod
    def forward(ctx, fn, z: Tensor) -> Tensor:
        out = fn(z)
        ctx.save_for_backward(out / (z + IDENTITY_EPS))
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (ratio,) = ctx.saved_tensors
        return None, ratio * grad


def divide_gradient(x: Tensor, factor: float) -> Tensor:
    """``x``, its gradient divided by ``factor`` in the backward pass (the uniform rule's share)."""
    return _DivideGradient.apply(x, factor)


def identity_rule(fn, z: Tensor) -> Tensor:
    """``fn(z)`` for an element-wise ``fn``, with the identity rule's gradient ``fn(z) / (z + 1e-10)``."""
    return _IdentityRule.apply(fn, z)


def _rms_norm_forward(norm: nn.Module):
    """RMSNorm ``gamma * u / rms(u)`` with ``1 / rms(u)`` detached (the identity rule on the division;
    ``lxt``'s ``rms_norm_forward``). Computed in float32, or in the input's dtype where it is wider
    (``transformers``' own RMSNorm computes a float64 input in float32)."""
    eps = _norm_eps(norm)

    def forward(u: Tensor) -> Tensor:
        x = u.to(torch.promote_types(u.dtype, torch.float32))
        scale = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps).detach()
        return norm.weight * (x * scale).to(u.dtype)

    return forward


def _gated_mlp_forward(mlp: nn.Module):
    """``down(act(gate(u)) * up(u))`` with the identity rule on ``act`` and the product's gradient
    halved (``lxt``'s ``gated_mlp_forward``)."""

    def forward(u: Tensor) -> Tensor:
        gate = identity_rule(mlp.act_fn, mlp.gate_proj(u))
        return mlp.down_proj(divide_gradient(gate * mlp.up_proj(u), 2))

    return forward


def _scaled_output(factor: float):
    def hook(module, args, output):
        return divide_gradient(output, factor)

    return hook


#: the uniform rule's divisors of the attention projections' gradients: the values get half of the output's
#: relevance (A v), the queries and keys each half of the probabilities' half (q k^T inside the softmax)
FACTORS = {"q": 4, "k": 4, "v": 2}

#: the parts of the gated MLP the rule reads
_MLP = ("gate_proj", "up_proj", "down_proj", "act_fn")


@contextlib.contextmanager
def rules(model, method: str = "attnlrp") -> Iterator[None]:
    """AttnLRP's backward rules on the Llama-layout decoder ``model`` (an ``HFClassifier`` of family
    ``"llama"`` or a ``PromptedLM``) for the block: every RMSNorm (the layers' two and the final one)
    and every gated MLP runs its rule's forward (the same values up to rounding), and the attention's
    query, key and value projections' outputs pass a quarter, a quarter and half of their gradient.
    Only this model's modules change, and only for the block (also when it raises). The block runs
    the forward and backward passes: ``input * gradient`` is then each input's relevance.

    Raises:
        TypeError: not a Llama-layout decoder on the protocol.
        ValueError: a layer whose norms are not RMSNorm, or without a gated MLP (gate_proj, up_proj,
            down_proj, act_fn) or q/k/v projections.
    """
    llama_layers(model, method)  # the layout and the RMSNorms checked
    base = model.base
    name = type(model.hf).__name__
    for layer in base.layers:
        if not all(hasattr(layer.mlp, part) for part in _MLP):
            raise ValueError(f"{method}: {name}'s MLP is not gated ({', '.join(_MLP)})")
        if not all(isinstance(getattr(layer.self_attn, f"{p}_proj", None), nn.Module) for p in "qkv"):
            raise ValueError(f"{method}: {name}'s attention has no q_proj, k_proj, v_proj")
    norms = [n for layer in base.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    forwards = [(n, _rms_norm_forward(n)) for n in (*norms, base.norm)]
    forwards += [(layer.mlp, _gated_mlp_forward(layer.mlp)) for layer in base.layers]
    scaled = [(getattr(layer.self_attn, f"{p}_proj"), FACTORS[p]) for layer in base.layers for p in "qkv"]
    own = [(module, module.__dict__.get("forward")) for module, _ in forwards]  # an instance's own forward, kept
    handles = []
    try:
        for module, forward in forwards:
            module.forward = forward
        handles = [module.register_forward_hook(_scaled_output(factor)) for module, factor in scaled]
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module, forward in own:
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward


def _row_bytes(model, width: int, itemsize: int) -> int:
    """About what one row's forward keeps for the backward pass: per layer the attention's scores and
    probabilities, and its states (residual, normed, q/k/v, MLP)."""
    config = model.hf.config
    heads, d = int(config.num_attention_heads), int(config.hidden_size)
    inter = int(config.intermediate_size)
    per_layer = 3 * heads * width * width + width * (10 * d + 5 * inter)
    return itemsize * int(config.num_hidden_layers) * per_layer


def attnlrp(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """AttnLRP's relevance (Achtibat et al. 2024, ICML; the module docstring's rules, ``lxt``'s
    efficient implementation) of each item's input embedding for the predicted class's logit, its
    embedding dimensions summed.

    One forward and one backward pass per chunk of rows, over the whole input (a prompted model's
    template around the text, whose positions take relevance too and are not scored; a fine-tuned
    decoder's text alone). Each row's relevance is its own (rows do not mix: causal attention,
    padding masked, rows' logits summed before the backward pass).

    Args:
        model: a Llama-layout decoder on the protocol: ``HFClassifier`` of family ``"llama"``
            (Llama, Qwen2, Mistral ``...ForSequenceClassification``), or a ``PromptedLM``.
        tokens: ``[B, T]`` int64 item ids, right-padded.
        lengths: ``[B]`` lengths, at least 1.
        memory_budget: bytes a chunk of rows may hold (default 256 MiB).

    Returns:
        ``[B, T]`` in the model's float dtype (float32 for a half-precision one, which runs in
        float32): each item's relevance, signed, in units of the logit, zero past each row's length.

    Raises:
        TypeError: not a Llama-layout decoder on the protocol.
        ValueError: bad inputs, a layout the rules do not fit (:func:`rules`), a relevance that is not
            finite.
    """
    method = "attnlrp"
    with _in_float32(model), eval_mode(model):
        llama_layers(model, method)
        lengths = check_model_inputs(model, tokens, lengths)
        budget = check_budget(memory_budget)
        if int(lengths.min()) < 1:
            raise ValueError(f"{method}: every row needs at least one token, got a length of {int(lengths.min())}")
        with torch.no_grad():
            ids, full, first, pooled = _sequence(model, tokens, lengths)
        base = model.base
        embeddings = base.get_input_embeddings()
        dtype = embeddings.weight.dtype
        batch, width = tokens.shape
        host_full = full.tolist()
        itemsize = torch.finfo(dtype).bits // 8
        groups = length_groups(
            host_full, lambda w: _row_bytes(model, w, itemsize), budget, padded_calls(tokens.device)
        )  # by length, as the other methods (attributions.length_groups)
        out = torch.zeros(batch, width, dtype=dtype, device=tokens.device)
        columns = torch.arange(width, device=tokens.device)
        with deferred(), rules(model, method):  # the groups' logits checked once, at the end
            for group in groups:
                w = host_full[group[-1]]
                rows = torch.tensor(group, device=tokens.device)
                n = full[rows]
                index = torch.arange(len(n), device=tokens.device)
                with torch.no_grad():
                    words = embeddings(ids[rows, :w])
                words.requires_grad_(True)
                with torch.enable_grad():
                    hidden = base(inputs_embeds=words, attention_mask=token_mask(n, w).long(), use_cache=False)
                    logits = model.decoder(hidden.last_hidden_state[index, pooled[rows]])
                    check_logits(logits, len(n), source="model", inputs="the input rows", on=" on the input rows")
                    (gradient,) = torch.autograd.grad(_predicted_logit(logits).sum(), words)
                relevance = (words.detach() * gradient).sum(-1)  # [b, w]
                items = relevance.gather(1, (first[rows, None] + columns).clamp_max(w - 1))
                out[rows] = torch.where(token_mask(lengths[rows], width), items, torch.zeros_like(items))
    bad = ~torch.isfinite(out).all(1)
    if bad.any():
        raise ValueError(
            f"{method} is not finite in row {int(bad.nonzero()[0])}: the model's states hold NaN or inf, or the "
            "backward pass overflowed"
        )
    return out
