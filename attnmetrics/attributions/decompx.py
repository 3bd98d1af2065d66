"""DecompX (Modarressi et al. 2023, ACL)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnmetrics._validation import DEFAULT_MEMORY_BUDGET
from attnmetrics.attributions.layers import (
    _chunks,
    _ln_linear,
    _pooled,
    _pooled_logits,
    _predicted_logit,
    _run,
    _scale,
    _stack,
    _Trace,
)
from attnmetrics.protocol import token_mask

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
