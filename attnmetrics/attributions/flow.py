"""Attention flow (Abnar & Zuidema 2020, ACL)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from attnmetrics._ops import ops
from attnmetrics._validation import DEFAULT_MEMORY_BUDGET, check_budget, check_model_inputs
from attnmetrics.attributions.layers import _chunks, _in_float32, _pooled, _real, _row_bytes, _stack, supports
from attnmetrics.protocol import eval_mode

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

    A prompted decoder (``models/prompted.py``, no ``layer_attentions`` but ``whole_attentions``):
    the graph spans the whole input, template included, and the flows run from each text token
    ``(0, j)`` to the answer position ``(L, p)`` (the prompt's last token); only the text's tokens
    are scored, ``[B, T]`` over them.

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
    cast to the model's float dtype (float32 for a half precision model: the package docstring).

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

    if getattr(model, "layer_attentions", None) is None and callable(getattr(model, "whole_attentions", None)):
        return _whole_input_flow(model, tokens, lengths, memory_budget)
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


def _whole_input_flow(model, tokens: Tensor, lengths: Tensor, memory_budget: int) -> Tensor:
    """Attention flow of a prompted model (``models/prompted.py``: ``whole_attentions`` over the
    whole input, ``sequence``, ``prefix_ids``, ``suffix_ids``): the graph of :func:`attention_flow`
    over every position of the whole input, the template's included (they mix like any token), the
    sources the text's tokens at layer 0 and the sink the answer position (the prompt's last token)
    at the last layer; ``[B, T]`` over the text's tokens, zero past each row's length. The template's
    own flows are not scored (docs/definitions.md §15)."""
    from attnmetrics.rollout import layer_matrices

    lengths = check_model_inputs(model, tokens, lengths)
    budget = check_budget(memory_budget)
    batch, width = tokens.shape
    prefix, suffix = len(model.prefix_ids), len(model.suffix_ids)
    with _in_float32(model), eval_mode(model), torch.no_grad():
        seq = model.sequence(tokens, lengths)
        probe = model.whole_attentions(tokens[:1], lengths[:1])  # a row's bytes: its probabilities and graphs
        row_bytes = 2 * (probe.numel() * probe.element_size() + probe[:, :, 0].numel() * 8)
        out = torch.zeros(batch, width, dtype=probe.dtype, device=tokens.device)
        for rows in _chunks(batch, row_bytes, budget // 2):
            n = seq.lengths[rows]
            graphs = layer_matrices(model.whole_attentions(tokens[rows], lengths[rows]), n).cpu().contiguous()
            flows = ops.attention_flow(graphs, n.cpu(), seq.pooled[rows].cpu(), prefix, suffix)  # [b, P + T + S]
            out[rows] = flows[:, prefix : prefix + width].to(out.device, out.dtype)
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
