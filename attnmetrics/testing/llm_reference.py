"""Plain per-sentence loops of the attention-derived attributions on a Llama-layout decoder
(``attnmetrics.llm``): one sentence at a time, every state recomputed from the model's own weights
(token embeddings, RMSNorms, the q/k/v/o projections with their biases, the gated MLP, the final
norm and the decoder's rows), token by token and head by head, each query head reading its
key/value head ``h // (H / H_kv)`` by index; the causal softmax by ``math.exp``; RMSNorm as
``gamma * u / sqrt(sum(u_k^2) / d + eps)``. The rotary positions' cos/sin table is read from the
model's ``rotary_emb`` (the model's position encoding, as the BERT loops read its position
embeddings). :func:`states_loop` checks the loop's final states and logits against the model's own
forward, so a loop that drifts from the model fails there.

A fine-tuned classifier (``model.hf.score``) is read on its item ids; a prompted model
(``prefix_ids``, ``suffix_ids``, ``label_ids``, ``hf.lm_head``) on ``prefix + ids + suffix``, its
items at positions ``len(prefix) ..``; the deciding position is the whole input's last. Never
imports the library's implementation (:mod:`attnmetrics.llm`) or the models.

Deliberately slow and obvious: lists of vectors, Python loops.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "alti_logit_reference",
    "alti_reference",
    "attention_value_norm_reference",
    "gradient_weighted_rollout_reference",
    "layer_loop",
    "states_loop",
    "value_zeroing_reference",
]


def _whole(model, ids: list[int]) -> tuple[list[int], int]:
    """One row's whole input and its first item's position: a prompted model's template around the
    ids (its ``prefix_ids``, ``suffix_ids``), a fine-tuned classifier's ids alone."""
    if hasattr(model, "prefix_ids"):
        prefix, suffix = model.prefix_ids.tolist(), model.suffix_ids.tolist()
        return prefix + list(ids) + suffix, len(prefix)
    return list(ids), 0


def _zeros_if_none(bias, size, like):
    return torch.zeros(size, dtype=like.dtype, device=like.device) if bias is None else bias


def _head(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's rows ``[C, d]`` and bias ``[C]``: a prompted model's label words' rows of
    ``lm_head``, a fine-tuned classifier's ``score``."""
    if hasattr(model, "label_ids"):
        lm = model.hf.lm_head
        ids = list(model.label_ids)
        return lm.weight[ids], _zeros_if_none(None if lm.bias is None else lm.bias[ids], len(ids), lm.weight)
    score = model.hf.score
    return score.weight, _zeros_if_none(score.bias, score.weight.shape[0], score.weight)


def _layer_weights(model) -> list[dict]:
    """Each layer's weights read from its modules: ``g1, e1`` (input_layernorm's gamma and eps),
    ``Wq, bq, Wk, bk, Wv, bv, Wo, bo`` ([out, in]; the biases 0 where the model has none), ``g2, e2``
    (post_attention_layernorm), ``Wg, Wu, Wd, act`` (the gated MLP), ``H, Hkv, dh``."""
    config = model.hf.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    out = []
    for layer in model.hf.model.layers:
        a, m = layer.self_attn, layer.mlp
        dh = a.q_proj.weight.shape[0] // heads
        out.append(
            dict(
                g1=layer.input_layernorm.weight, e1=layer.input_layernorm.variance_epsilon,
                Wq=a.q_proj.weight, bq=_zeros_if_none(a.q_proj.bias, heads * dh, a.q_proj.weight),
                Wk=a.k_proj.weight, bk=_zeros_if_none(a.k_proj.bias, kv * dh, a.k_proj.weight),
                Wv=a.v_proj.weight, bv=_zeros_if_none(a.v_proj.bias, kv * dh, a.v_proj.weight),
                Wo=a.o_proj.weight, bo=_zeros_if_none(a.o_proj.bias, a.o_proj.weight.shape[0], a.o_proj.weight),
                g2=layer.post_attention_layernorm.weight, e2=layer.post_attention_layernorm.variance_epsilon,
                Wg=m.gate_proj.weight, Wu=m.up_proj.weight, Wd=m.down_proj.weight, act=m.act_fn,
                H=heads, Hkv=kv, dh=dh,
            )
        )  # fmt: skip
    return out


def _rms(u, gamma, eps):
    """RMSNorm by plain sums: (``gamma * u / r``, ``r = sqrt(sum(u_k^2) / d + eps)``)."""
    r = math.sqrt(sum(float(u[k]) ** 2 for k in range(len(u))) / len(u) + eps)
    return gamma * u / r, r


def _rms_graph(u, gamma, eps):
    """:func:`_rms`'s output kept in autograd's graph (the scale a tensor of the graph, not a float)."""
    return gamma * u / torch.sqrt(sum(u[k] * u[k] for k in range(len(u))) / len(u) + eps)


def _rotary(model, n: int, dtype):
    """The model's rotary table for positions 0 .. n-1: (cos, sin), each ``[n, dh]``."""
    base = model.hf.model
    device = base.embed_tokens.weight.device
    x = torch.zeros(1, n, 1, dtype=dtype, device=device)
    cos, sin = base.rotary_emb(x, torch.arange(n, device=device)[None])
    return cos[0], sin[0]


def _rotate(q, cos, sin):
    """Rotary positions on one head's vector: ``q * cos + rotate_half(q) * sin``, ``rotate_half(q) =
    (-q[half:], q[:half])``."""
    half = len(q) // 2
    return q * cos + torch.cat([-q[half:], q[:half]]) * sin


def layer_loop(w: dict, x: list, cos, sin, zeroed: int | None = None) -> dict:
    """One layer (:func:`_layer_weights`' ``w``) on token states ``x`` (a list of ``[d]``), causal;
    ``zeroed``: that token's value vectors set to 0 in every key/value head (Value Zeroing). Returns
    ``A[h][i][j]`` (per query head), ``f[h][j]`` (head h's value of token j through its slice of
    W_O, b_V in, b_O out), the residual stream after attention ``mid`` and the layer's outputs."""
    n, heads, dh = len(x), w["H"], w["dh"]
    group = heads // w["Hkv"]
    u = [_rms(x[i], w["g1"], w["e1"])[0] for i in range(n)]
    A, f = [], []
    for h in range(heads):
        g = h // group  # the key/value head query head h reads
        rq, rk = slice(h * dh, (h + 1) * dh), slice(g * dh, (g + 1) * dh)
        q = [_rotate(w["Wq"][rq] @ u[i] + w["bq"][rq], cos[i], sin[i]) for i in range(n)]
        k = [_rotate(w["Wk"][rk] @ u[j] + w["bk"][rk], cos[j], sin[j]) for j in range(n)]
        v = [w["Wv"][rk] @ u[j] + w["bv"][rk] for j in range(n)]
        if zeroed is not None:
            v[zeroed] = torch.zeros_like(v[zeroed])
        rows = []
        for i in range(n):
            s = [float(q[i] @ k[j]) / math.sqrt(dh) for j in range(i + 1)]
            top = max(s)
            e = [math.exp(sj - top) for sj in s]
            rows.append([ej / sum(e) for ej in e] + [0.0] * (n - i - 1))
        A.append(rows)
        f.append([w["Wo"][:, rq] @ v[j] for j in range(n)])
    mid, out = [], []
    for i in range(n):
        m = x[i] + w["bo"]
        for h in range(heads):
            for j in range(i + 1):
                m = m + A[h][i][j] * f[h][j]
        u2 = _rms(m, w["g2"], w["e2"])[0]
        mid.append(m)
        out.append(m + w["Wd"] @ (w["act"](w["Wg"] @ u2) * (w["Wu"] @ u2)))
    return dict(A=A, f=f, mid=mid, out=out)


def states_loop(model, ids: list[int], tolerance: float = 1e-9):
    """One row's whole input through every layer by :func:`layer_loop`: ``(layers, final, logits,
    first)`` with ``layers`` ``[(w, x, result), ...]`` (each layer's weights, input and results),
    ``final`` the last layer's outputs (the final norm's inputs), ``logits`` ``[C]`` at the
    deciding (last) position and ``first`` the first item's position. The final-normed states and
    the logits are checked against the model's own forward (``tolerance``, relative and absolute)."""
    whole, first = _whole(model, ids)
    base = model.hf.model
    table = base.embed_tokens.weight
    x = [table[t] for t in whole]
    cos, sin = _rotary(model, len(whole), table.dtype)
    layers = []
    for w in _layer_weights(model):
        r = layer_loop(w, x, cos, sin)
        layers.append((w, x, r))
        x = r["out"]
    norm = base.norm
    normed = [_rms(x[i], norm.weight, norm.variance_epsilon)[0] for i in range(len(x))]
    W, b = _head(model)
    logits = W @ normed[-1] + b
    with torch.no_grad():
        device = table.device
        own = base(input_ids=torch.tensor([whole], device=device)).last_hidden_state[0]
        own_logits = model(torch.tensor([list(ids)], device=device), torch.tensor([len(ids)], device=device))[0][0]
    torch.testing.assert_close(torch.stack(normed), own, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(logits, own_logits, rtol=tolerance, atol=tolerance)
    return layers, x, logits, first


def _rollout_loop(matrices, p: int):
    """Row p of ``C_{L-1} ... C_1 C_0`` by plain sums (the last matrix full)."""
    n = len(matrices[0])
    rolled = [row[:] for row in matrices[0]]
    for c in matrices[1:]:
        rolled = [[sum(c[i][k] * rolled[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    return rolled[p]


def _mixing(r: dict, x: list, i: int, j: int):
    """``T_i(x_j) = sum_h A_h[i, j] f_h(x_j) + [i = j] x_i``."""
    z = sum(r["A"][h][i][j] * r["f"][h][j] for h in range(len(r["A"])))
    return z + x[i] if i == j else z


def _alti_matrix(w, x, r, tolerance):
    """One layer's ALTI matrix by plain sums; checks ``sum_j T_i(x_j) + b_O`` against ``mid_i``."""
    n, rows = len(x), []
    for i in range(n):
        t = [_mixing(r, x, i, j) for j in range(n)]
        y = r["mid"][i]
        torch.testing.assert_close(sum(t) + w["bo"], y, rtol=tolerance, atol=tolerance)
        c = [max(0.0, float(y.abs().sum()) - float((y - t[j]).abs().sum())) for j in range(n)]
        rows.append([cj / sum(c) if sum(c) > 0 else 0.0 for cj in c])
    return rows


def _decision(logits) -> tuple[int, int | None]:
    """(the predicted class, the runner-up) of one row's logits (one sigmoid logit: class z > 0, None)."""
    values = [float(v) for v in logits]
    if len(values) == 1:
        return int(values[0] > 0), None
    best = max(range(len(values)), key=lambda c: (values[c], -c))
    rest = [c for c in range(len(values)) if c != best]
    return best, max(rest, key=lambda c: (values[c], -c))


def _target(per_class, logits, target: str):
    """One position's value of the target from its per-class values (a list over C)."""
    predicted, runner = _decision(logits)
    if len(per_class) == 1:
        return per_class[0] if predicted == 1 else -per_class[0]
    if target == "logit":
        return per_class[predicted]
    return per_class[predicted] - per_class[runner]


# ---- the methods, one sentence -------------------------------------------------------------------


def attention_value_norm_sentence(model, ids):
    """Kobayashi et al. 2020: ``||sum_h A_h[p, j] f_h(x_j)||`` in the last layer, per whole position."""
    layers, _, _, first = states_loop(model, ids)
    _, x, r = layers[-1]
    n, p = len(x), len(x) - 1
    scores = [float(torch.linalg.vector_norm(sum(r["A"][h][p][j] * r["f"][h][j] for h in range(len(r["A"])))))
              for j in range(n)]  # fmt: skip
    return scores, first


def alti_sentence(model, ids, tolerance=1e-10):
    """ALTI on a pre-norm decoder: per layer ``c_ij = max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)``,
    ``y_i`` the residual stream after attention, rows normalised, rolled out; the last row."""
    layers, final, _, first = states_loop(model, ids)
    matrices = [_alti_matrix(w, x, r, tolerance) for w, x, r in layers]
    return _rollout_loop(matrices, len(final) - 1), first


def alti_logit_sentence(model, ids, target="logit", tolerance=1e-10):
    """ALTI-Logit (Ferrando et al. 2023, eq. 12): ``R[s] = D_0[s] + sum_{l>=1} sum_j D_l[j] M^{l-1}[j, s]``
    with ``D_l[j, c] = W_c . (gamma_f * g_l[j] / r_f)``, ``g_l[j] = sum_h A_h[p, j] f_h(x_j)``, ``r_f``
    the final RMSNorm's scale at p, ``M^{l-1}`` the ALTI matrices of the layers below multiplied
    by plain sums; then the target (predicted class's logit, or minus the runner-up's)."""
    layers, final, logits, first = states_loop(model, ids)
    n, p = len(final), len(final) - 1
    norm = model.hf.model.norm
    _, r_f = _rms(final[p], norm.weight, norm.variance_epsilon)
    W, _ = _head(model)
    classes = W.shape[0]
    R = [[0.0] * classes for _ in range(n)]
    M = None
    for index, (w, x, r) in enumerate(layers):
        heads = len(r["A"])
        D = []
        for j in range(n):
            g = sum(r["A"][h][p][j] * r["f"][h][j] for h in range(heads))
            D.append([float(W[c] @ (norm.weight * g / r_f)) for c in range(classes)])
        for s in range(n):
            for c in range(classes):
                if M is None:
                    R[s][c] += D[s][c]
                else:
                    R[s][c] += sum(D[j][c] * M[j][s] for j in range(n))
        if index < len(layers) - 1:
            C = _alti_matrix(w, x, r, tolerance)
            M = C if M is None else [[sum(C[i][k] * M[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    return [_target(R[s], logits, target) for s in range(n)], first


def _cosine_distance(a, b) -> float:
    """``max(0, 1 - cos(a, b))`` as ``sin^2 / (1 + cos)`` with ``|a|^2 |b|^2 sin^2 = 1/2 sum_{k,l} (a_k b_l -
    a_l b_k)^2`` (Lagrange's identity) where cos > 0: ``1 - cos`` itself loses every digit of a distance
    below float64's 1e-16 (a pre-norm model's residual stream barely turns when one token's values are
    zeroed: on SmolLM2 the plain form's rounding decided the rolled-out shares), this form keeps them."""
    na, nb = float(a.norm()), float(b.norm())
    if na == 0 or nb == 0:
        return 1.0
    cos = float(a @ b) / (na * nb)
    if cos <= 0:
        return 1 - cos
    m = torch.outer(a, b) - torch.outer(b, a)
    return float((m * m).sum()) / 2 / (na * na * nb * nb) / (1 + cos)


def value_zeroing_sentence(model, ids):
    """Value Zeroing: per layer and token j the layer recomputed with j's values zeroed in every
    key/value head; ``max(0, 1 - cos)`` of each token's outputs (:func:`_cosine_distance`), rows
    normalised, rolled out; the last row."""
    layers, final, _, first = states_loop(model, ids)
    n = len(final)
    cos_table, sin_table = _rotary(model, n, final[0].dtype)
    matrices = []
    for w, x, r in layers:
        distance = [[0.0] * n for _ in range(n)]
        for j in range(n):
            changed = layer_loop(w, x, cos_table, sin_table, zeroed=j)["out"]
            for i in range(n):
                distance[i][j] = _cosine_distance(changed[i].double(), r["out"][i].double())
        matrices.append([[d / sum(row) if sum(row) > 0 else 0.0 for d in row] for row in distance])
    return _rollout_loop(matrices, n - 1), first


def _differentiable_layer(w: dict, x: list, cos, sin):
    """:func:`layer_loop` kept in autograd's graph: each query head's probabilities as one ``[n, n]``
    softmax of its scores (later keys' scores -inf), stacked ``[H, n, n]``; returns (A, outputs)."""
    n, heads, dh = len(x), w["H"], w["dh"]
    group = heads // w["Hkv"]
    u = [_rms_graph(x[i], w["g1"], w["e1"]) for i in range(n)]
    probs, f = [], []
    for h in range(heads):
        g = h // group
        rq, rk = slice(h * dh, (h + 1) * dh), slice(g * dh, (g + 1) * dh)
        q = [_rotate(w["Wq"][rq] @ u[i] + w["bq"][rq], cos[i], sin[i]) for i in range(n)]
        k = [_rotate(w["Wk"][rk] @ u[j] + w["bk"][rk], cos[j], sin[j]) for j in range(n)]
        v = [w["Wv"][rk] @ u[j] + w["bv"][rk] for j in range(n)]
        scores = torch.stack(
            [
                torch.stack([q[i] @ k[j] / math.sqrt(dh) if j <= i else q[i].new_tensor(-math.inf) for j in range(n)])
                for i in range(n)
            ]
        )
        probs.append(torch.softmax(scores, -1))
        f.append([w["Wo"][:, rq] @ v[j] for j in range(n)])
    A = torch.stack(probs)
    out = []
    for i in range(n):
        m = x[i] + w["bo"]
        for h in range(heads):
            for j in range(i + 1):
                m = m + A[h, i, j] * f[h][j]
        u2 = _rms_graph(m, w["g2"], w["e2"])
        out.append(m + w["Wd"] @ (w["act"](w["Wg"] @ u2) * (w["Wu"] @ u2)))
    return A, out


def gradient_weighted_rollout_sentence(model, ids):
    """Chefer et al. 2021: the loop's forward kept in autograd's graph, the gradient of the
    predicted class's logit with respect to each layer's probabilities, ``R = I``,
    ``R <- R + mean_h (grad * A)^+ R`` by plain sums; the last row."""
    expected = states_loop(model, ids)[2]  # the loop checked against the model's forward
    whole, first = _whole(model, ids)
    base = model.hf.model
    table = base.embed_tokens.weight
    n = len(whole)
    cos, sin = _rotary(model, n, table.dtype)
    with torch.enable_grad():
        x = [table[t].detach() for t in whole]
        As = []
        for w in _layer_weights(model):
            A, x = _differentiable_layer(w, x, cos, sin)
            As.append(A)
        norm = base.norm
        W, b = _head(model)
        logits = W @ _rms_graph(x[-1], norm.weight, norm.variance_epsilon) + b
        torch.testing.assert_close(logits.detach(), expected, rtol=1e-12, atol=1e-12)
        predicted, _ = _decision(logits.detach())
        y = logits[predicted] if len(logits) > 1 else (logits[0] if predicted == 1 else -logits[0])
        grads = torch.autograd.grad(y, As)
    R = [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
    for A, G in zip(As, grads):
        heads = A.shape[0]
        cam = [
            [sum(max(0.0, float(G[h, i, j]) * float(A[h, i, j])) for h in range(heads)) / heads for j in range(n)]
            for i in range(n)
        ]
        R = [[R[i][j] + sum(cam[i][k] * R[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    return R[n - 1], first


# ---- batches: one row at a time -------------------------------------------------------------------


def _rows(sentence, model, tokens, lengths, **kwargs) -> torch.Tensor:
    """``[B, T]`` float64: each row's items' scores (the whole input's positions ``first ..``), zero
    past each row's length."""
    out = torch.zeros(tokens.shape, dtype=torch.float64)
    with torch.no_grad():
        for b in range(tokens.shape[0]):
            n = int(lengths[b])
            scores, first = sentence(model, tokens[b, :n].tolist(), **kwargs)
            out[b, :n] = torch.tensor(scores[first : first + n], dtype=torch.float64)
    return out


def attention_value_norm_reference(model, tokens, lengths):
    return _rows(attention_value_norm_sentence, model, tokens, lengths)


def alti_reference(model, tokens, lengths):
    return _rows(alti_sentence, model, tokens, lengths)


def alti_logit_reference(model, tokens, lengths, target="logit"):
    return _rows(alti_logit_sentence, model, tokens, lengths, target=target)


def value_zeroing_reference(model, tokens, lengths):
    return _rows(value_zeroing_sentence, model, tokens, lengths)


def gradient_weighted_rollout_reference(model, tokens, lengths):
    return _rows(gradient_weighted_rollout_sentence, model, tokens, lengths)
