"""Plain-loop references of every op, written to follow the papers' descriptions step by step.

Tests compare the kernels against these; benchmarks time the kernels against the
approach the papers' own code takes. Deliberately slow and obvious: no vectorisation
beyond what the papers' code used.
"""

from __future__ import annotations

# ---- distances and rank correlation (J&W 2019) -------------------------------------------
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


def tvd_reference(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """½ Σ |p - q| along ``dim``: the formula as written, in the inputs' dtype."""
    return 0.5 * (p - q).abs().sum(dim)


def jsd_reference(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """½ KL(p ‖ m) + ½ KL(q ‖ m), m = (p + q) / 2, in nats, 0 log 0 = 0 (xlogy), in the inputs' dtype."""
    m = 0.5 * (p + q)
    kl_pm = (torch.special.xlogy(p, p) - torch.special.xlogy(p, m)).sum(dim)
    kl_qm = (torch.special.xlogy(q, q) - torch.special.xlogy(q, m)).sum(dim)
    return 0.5 * (kl_pm + kl_qm)


def kendall_tau_reference(x: torch.Tensor, y: torch.Tensor, lengths: torch.Tensor | None = None):
    """One ``scipy.stats.kendalltau`` call per row on its valid prefix, as J&W's code does.

    Returns ``(tau, pvalue)``, each ``[B]`` in x's dtype; NaN where scipy gives NaN.
    """
    from scipy import stats

    xs = x.detach().cpu().numpy()
    ys = y.detach().cpu().numpy()
    lens = [x.shape[1]] * x.shape[0] if lengths is None else lengths.tolist()
    tau = np.empty(len(lens))
    pvalue = np.empty(len(lens))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on every row shorter than 2
        for b, n in enumerate(lens):
            res = stats.kendalltau(xs[b, :n], ys[b, :n])
            tau[b], pvalue[b] = res.statistic, res.pvalue
    return torch.from_numpy(tau).to(x.dtype), torch.from_numpy(pvalue).to(x.dtype)


# ---- removal and flip search (S&S 2019) ----------------------------------------------------

import math  # noqa: E402  (imports kept inside this section)

from attnmetrics.flip import FlipResult  # noqa: E402
from attnmetrics.outputs import decision, output_distribution  # noqa: E402


def _flip_result(removed, lengths, mass, dtype):
    removed = torch.as_tensor(removed, dtype=torch.int64)
    lengths = torch.as_tensor(lengths, dtype=torch.int64, device=removed.device)
    flipped = removed >= 0
    fraction = torch.where(flipped, removed.to(dtype) / lengths.to(dtype), math.nan)
    return FlipResult(removed, fraction, flipped, torch.as_tensor(mass, dtype=torch.float64).to(dtype))


def _reference_scores(order, attention, values, decoder, lengths):
    """[B, T] scores of an order, the gradient ones by autograd on each row's attention.
    Multi-head attention [B, heads, T]: the head mean of the per-head scores."""
    if not isinstance(order, str):
        return order
    multi = attention.dim() == 3
    if order in ("attention", "reverse"):
        scores = attention.mean(1) if multi else attention
        return scores if order == "attention" else -scores
    if order not in ("gradient", "attn_grad", "sign_grad_attn"):
        raise ValueError(f"reference order must be a score tensor or a deterministic name, got {order!r}")
    grad = torch.zeros_like(attention)
    for b in range(attention.shape[0]):
        n = int(lengths[b])
        if n == 0:
            continue
        with torch.enable_grad():
            alpha = attention[b, ..., :n].detach().clone().requires_grad_(True)
            context = (alpha[..., None] * values[b, ..., :n, :].detach()).sum(-2)  # per head: sum_t a_t h_t
            if multi:
                context = context.sum(0)  # the heads' outputs add up
            logits = decoder(context[None])
            y = int(decision(logits.detach())[0])
            (g,) = torch.autograd.grad(output_distribution(logits)[0, y], alpha)
        grad[b, ..., :n] = g
    if order == "gradient":
        scores = grad
    elif order == "attn_grad":
        scores = attention * grad
    else:
        scores = torch.sign(grad) * attention
    return scores.mean(1) if multi else scores


def flip_fraction_reference(attention, values, decoder, lengths, order="attention"):
    """S&S 2019 flip search, one row and one removal step at a time (docs/definitions.md §4).

    For each row: sort its valid prefix by score (descending, ties to the lower index);
    for k = 1 .. L-1 zero the next weight, renormalise the rest to sum to 1 (a zero
    context if nothing is left), rebuild the context sum_t alpha'_t h_t, run the decoder
    on that one context and compare its decision with the one at k = 0.
    Multi-head attention [B, heads, T] with values [B, heads, T, H] (docs/definitions.md §15):
    the token is zeroed in every head, each head renormalised on its own, the context is the
    sum over heads, and the removed mass is the head mean's.
    ``order``: "attention", "reverse", "gradient", "attn_grad", "sign_grad_attn" or a
    [B, T] score tensor (for random orders pass the scores). Returns a FlipResult.
    """
    scores = _reference_scores(order, attention, values, decoder, lengths)
    multi = attention.dim() == 3
    removed, mass = [], []
    with torch.no_grad():
        for b in range(attention.shape[0]):
            n = int(lengths[b])
            row_scores = [float(x) for x in scores[b, :n]]
            ranked = sorted(range(n), key=lambda i: -row_scores[i])  # stable: ties keep index order
            weights = attention[b, ..., :n].clone()
            if not multi:
                weights = weights[None]  # one head
            h = values[b, ..., :n, :] if multi else values[b, None, :n]

            def decide(w):
                context = torch.zeros_like(h[0, 0]) if n else torch.zeros(h.shape[-1], dtype=h.dtype)
                for head in range(w.shape[0]):
                    total = w[head].sum()
                    if total != 0:
                        context = context + (w[head] / total)[:, None].mul(h[head]).sum(0)
                return int(decision(decoder(context[None]))[0])

            first, gone = -1, math.nan
            if n >= 2:
                original = decide(weights)
                for k in range(1, n):
                    weights[:, ranked[k - 1]] = 0
                    if decide(weights) != original:
                        first = k
                        removed_weights = attention[b, ..., ranked[:k]]
                        if multi:
                            removed_weights = removed_weights.mean(0)
                        gone = math.fsum(float(w) for w in removed_weights)
                        break
            removed.append(first)
            mass.append(gone)
    return _flip_result(removed, lengths, mass, attention.dtype)


def flip_search_sequential(attention, values, decoder, lengths, order_scores="attention"):
    """The batch-level loop of S&S's code: at step k zero the k-th item of every row still
    searching, renormalise, re-run the decoder on the whole live batch, drop the rows whose
    decision flipped (or that have only one item left). Same result as
    :func:`flip_fraction_reference`; this is the approach the benchmarks time against.
    ``order_scores``: a [B, T] score tensor or an order name as in the reference above.
    """
    with torch.no_grad():
        batch, width = attention.shape
        device = attention.device  # runs where the inputs are, as S&S's code ran on the GPU
        lengths = torch.as_tensor(lengths, dtype=torch.int64, device=device)
        scores = _reference_scores(order_scores, attention, values, decoder, lengths)
        valid = torch.arange(width, device=device) < lengths[:, None]
        # ascending stable sort of -score = descending with ties to the lower index
        key = torch.where(valid, -scores.to(torch.float64), math.inf)
        order = torch.argsort(key, dim=1, stable=True)
        weights = attention.masked_fill(~valid, 0)

        def decide(w, h):
            total = w.sum(1, keepdim=True)
            norm = torch.where(total > 0, w / torch.where(total > 0, total, 1), 0)
            return decision(decoder(torch.bmm(norm.unsqueeze(1), h).squeeze(1)))

        original = decide(weights, values)
        removed = torch.full((batch,), -1, dtype=torch.int64, device=device)
        mass = torch.full((batch,), math.nan, dtype=torch.float64, device=device)
        rows = torch.nonzero(lengths >= 2).squeeze(1)
        w, h, o = weights[rows], values[rows], order[rows]
        n_items, base = lengths[rows], original[rows]
        gone = torch.zeros(rows.shape[0], dtype=torch.float64, device=device)
        live = torch.ones(rows.shape[0], dtype=torch.bool, device=device)
        k = 0
        while live.any():
            k += 1
            pos = o[:, k - 1 : k]
            gone += w.gather(1, pos).squeeze(1).to(torch.float64)
            w.scatter_(1, pos, 0)
            flip = live & (decide(w, h) != base)
            removed[rows[flip]] = k
            mass[rows[flip]] = gone[flip]
            live &= ~flip & (n_items - 1 > k)
            # Drop finished rows from the batch once a quarter of it is dead (copying the
            # batch on every step would cost as much as the decoder pass itself).
            if live.sum() < 0.75 * live.shape[0]:
                keep = torch.nonzero(live).squeeze(1)
                span = int(n_items[keep].max()) if keep.numel() else 0  # trim trailing padding
                rows, n_items, base, gone = rows[keep], n_items[keep], base[keep], gone[keep]
                w, h, o = w[keep, :span], h[keep, :span], o[keep, :span]
                live = live[keep]
    return _flip_result(removed, lengths, mass, attention.dtype)


# ---- adversarial attention (J&W 2019) ----------------------------------------------------

from attnmetrics.adversarial import AdversarialResult  # noqa: E402
from attnmetrics.keyed import normal  # noqa: E402


def adversarial_attention_reference(
    attention,
    values,
    decoder,
    lengths=None,
    *,
    candidates=5,
    steps=500,
    lr=0.01,
    tvd_penalty=500.0,
    tvd_margin=0.01,
    tvd_threshold=0.05,
    init_std=3.0,
    amsgrad=False,
    generator=None,
    diversity_weight=1.0,
):
    """J&W 2019 sec. 4.3 adversarial search, one instance at a time (docs/definitions.md §10).

    The initial noise is drawn for the whole batch first, ``torch.randn((B, K, T))`` from
    ``generator`` in the attention dtype, and row b takes ``noise[b, :, :L]``. For each row
    with L >= 2: K logit vectors ``log(1/L) + init_std * noise`` optimised by their own Adam
    for ``steps`` steps; each step softmaxes them, runs the decoder on the K contexts
    ``a_k @ h`` and minimises ``-mean_k JSD(a_k, alpha) + tvd_penalty * mean_k ReLU(TVD(y_k, y)
    - tvd_margin) - diversity_weight * mean_{i != j} JSD(a_i, a_j)``. Then the candidate of largest JSD among
    those with output TVD <= ``tvd_threshold`` wins (the original, JSD 0, on ties or if none).
    Multi-head attention [B, heads, T] (docs/definitions.md §15): noise ``(B, K, heads, T)``,
    one distribution per head, JSDs averaged over heads, the heads' contexts summed.
    Returns an AdversarialResult.
    """
    multi = attention.dim() == 3
    att = attention if multi else attention[:, None]  # [B, heads, T]
    vals = values if multi else values[:, None]  # [B, heads, T, H]
    batch, heads, width = att.shape
    lengths = torch.full((batch,), width) if lengths is None else lengths
    k = candidates
    noise = normal(generator, (batch, k, heads, width), attention.dtype, attention.device)
    max_jsd = torch.zeros(batch, dtype=attention.dtype)
    adv = torch.zeros_like(att)
    out_tvd = torch.zeros(batch, dtype=attention.dtype)

    def decode(a, h):  # a [K, heads, n], h [heads, n, H]: the heads' contexts summed
        return output_distribution(decoder(torch.einsum("khn,hnd->kd", a, h)))

    for b in range(batch):
        n = int(lengths[b])
        alpha = att[b, :, :n].detach()  # [heads, n]
        adv[b, :, :n] = alpha
        if n <= 1:
            continue
        h = vals[b, :, :n].detach()
        with torch.no_grad():
            y = decode(alpha[None], h)  # [1, C']
        z = (math.log(1.0 / n) + init_std * noise[b, :, :, :n]).clone().requires_grad_(True)
        optimizer = torch.optim.Adam([z], lr=lr, amsgrad=amsgrad)
        for _ in range(steps):
            with torch.enable_grad():
                a = torch.softmax(z, -1)  # [K, heads, n]
                y_new = decode(a, h)  # [K, C']
                far = jsd_reference(a, alpha[None]).mean(-1)  # mean over heads
                change = tvd_reference(y_new, y)
                loss = -far.mean() + tvd_penalty * torch.relu(change - tvd_margin).mean()
                if k > 1:  # every ordered pair i != j (the diagonal JSD(a_i, a_i) is 0)
                    pairs = jsd_reference(a[:, None], a[None]).mean(-1)
                    loss = loss - diversity_weight * pairs.sum() / (k * (k - 1))
                (z.grad,) = torch.autograd.grad(loss, [z])  # the model's parameters stay untouched
            optimizer.step()
        with torch.no_grad():
            a = torch.softmax(z, -1)
            far = jsd_reference(a, alpha[None]).mean(-1)
            change = tvd_reference(decode(a, h), y)
            best, best_jsd = None, 0.0
            for c in range(k):
                if change[c] <= tvd_threshold and far[c] > best_jsd:
                    best, best_jsd = c, far[c]
            if best is not None:
                max_jsd[b], adv[b, :, :n], out_tvd[b] = far[best], a[best], change[best]
    return AdversarialResult(max_jsd, adv if multi else adv[:, 0], out_tvd)


# ---- permutation (J&W 2019) ----------------------------------------------------------------

from attnmetrics.permutation import attention_permutations  # noqa: E402


def permutation_test_reference(attention, values, decoder, lengths, permutations, seed):
    """J&W 2019 (sec. 4.2) permutation loop: for each of the P permutations, permute every
    row's attention among its real tokens (the permutation ``attention_permutations`` gives
    row b for this seed), run the decoder once over the whole batch, and score the TVD of
    each output distribution from the unpermuted one; then ``np.median`` over the
    permutations per row (rows with L <= 1 count 0, as the definition gives them).

    Returns ``(median [B], tvd [B, P])`` in the attention dtype. This is the approach the
    benchmarks time against: one decoder pass per permutation.
    """
    multi = attention.dim() == 3  # [B, heads, T]: tokens permuted alike in every head, heads summed
    with torch.no_grad():
        batch, width = attention.shape[0], attention.shape[-1]
        lengths = torch.as_tensor(lengths, dtype=torch.int64)
        valid = torch.arange(width) < lengths[:, None]
        if multi:
            valid = valid[:, None, :]
        alpha = attention.masked_fill(~valid, 0)
        h = values.masked_fill(~valid[..., None], 0)  # padding never enters a context

        def decode(weights):
            context = (weights[..., None] * h).sum(-2)
            return output_distribution(decoder(context.sum(1) if multi else context))

        original = decode(alpha)
        tvds = torch.empty(batch, permutations, dtype=attention.dtype)
        for p in range(permutations):
            perm = attention_permutations(lengths, width, 1, seed, permutation_offset=p)[:, 0]
            if multi:
                perm = perm[:, None, :].expand(-1, attention.shape[1], -1)
            permuted = alpha.gather(-1, perm)
            tvds[:, p] = tvd_reference(decode(permuted), original)
        tvds[lengths <= 1] = 0
        median = torch.from_numpy(np.median(tvds.numpy(), axis=1)).to(attention.dtype)
    return median, tvds


# ---- single removal (S&S 2019) -------------------------------------------------------------

from attnmetrics.single_removal import SingleRemovalResult  # noqa: E402


def single_removal_reference(attention, values, decoder, lengths, which="top"):
    """S&S 2019 (sec. 3) single-weight removal, one row at a time: pick the weight
    (``"top"``: highest, ties to the lower index; ``"second"``: next in that order;
    ``"lowest"``: lowest, ties to the lower index; or a ``[B]`` tensor of positions, e.g.
    the random ones a run drew), zero it, renormalise the rest (a zero context if they
    sum to 0), decode the new and the original (renormalised) context one row at a time,
    and compare: JSD of the output distributions (float64, :func:`jsd_reference`) and
    whether the decision changed. Rows with L <= 1: NaN, False, -1, NaN.
    Multi-head attention [B, heads, T] (docs/definitions.md §15): the token is picked by the
    head mean, zeroed in every head, each head renormalised on its own; the context is the
    sum over heads; the removed weight is the head mean's.
    """
    multi = attention.dim() == 3
    jsds, flips, positions, weights = [], [], [], []
    with torch.no_grad():
        for b in range(attention.shape[0]):
            n = int(lengths[b])
            if n <= 1:
                jsds.append(math.nan), flips.append(False), positions.append(-1), weights.append(math.nan)
                continue
            rows = attention[b, ..., :n] if multi else attention[b, None, :n]  # [heads, n]
            h = values[b, ..., :n, :] if multi else values[b, None, :n]  # [heads, n, H]
            w = rows.mean(0)
            by_weight = sorted(range(n), key=lambda t: (-float(w[t]), t))  # descending, ties by index
            if isinstance(which, str):
                i = {
                    "top": by_weight[0],
                    "second": by_weight[1],
                    "lowest": min(range(n), key=lambda t: (float(w[t]), t)),
                }[which]
            else:
                i = int(which[b])

            def context(weights):
                out = torch.zeros_like(h[0, 0])
                for head in range(weights.shape[0]):
                    total = weights[head].sum()
                    if total != 0:
                        out = out + ((weights[head] / total)[:, None] * h[head]).sum(0)
                return out

            before = decoder(context(rows)[None])
            kept = rows.clone()
            kept[:, i] = 0
            after = decoder(context(kept)[None])
            p, q = output_distribution(before.double()), output_distribution(after.double())
            jsds.append(float(jsd_reference(p, q)[0]))
            flips.append(bool(decision(before)[0] != decision(after)[0]))
            positions.append(i)
            weights.append(float(w[i]))
    dtype = attention.dtype
    return SingleRemovalResult(
        torch.tensor(jsds, dtype=torch.float64).to(dtype),
        torch.tensor(flips),
        torch.tensor(positions, dtype=torch.int64),
        torch.tensor(weights, dtype=torch.float64).to(dtype),
    )


# ---- leave-one-out (J&W 2019) --------------------------------------------------------------


def _loo_distribution(model, tokens, lengths):
    """embed -> encode -> attend -> decoder -> output distribution, as the protocol reads."""
    hidden = model.encode(model.embed(tokens), lengths)
    attention = model.attend(hidden, lengths)
    context = (attention[..., None] * hidden).sum(1)
    return output_distribution(model.decoder(context))


def leave_one_out_reference(model, tokens, lengths, mode="delete", mask_token=None):
    """J&W 2019 sec. 4.1 leave-one-out, one sequence at a time (docs/definitions.md §7).

    For each row b (length L, special tokens included) and each real position
    t = lead .. L - trail - 1: build that row's sequence with t deleted (``mode="delete"``,
    length L - 1) or replaced by ``mask_token`` (``mode="mask"``), run the model on it
    alone and take ½ Σ |y - y_{-t}| against the output on the row alone. Model in eval
    mode (restored), no gradients. Returns ``[B, T - lead]`` in the embeddings' dtype,
    entry ``[b, t - lead]``, zero elsewhere.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            lead, trail = model.lead, model.trail
            dtype = model.embed(tokens[:1, :1]).dtype
            out = torch.zeros(tokens.shape[0], tokens.shape[1] - lead, dtype=dtype)
            for b in range(tokens.shape[0]):
                n = int(lengths[b])
                row = [int(x) for x in tokens[b, :n]]
                if n - lead - trail < 1:
                    continue
                y = _loo_distribution(model, torch.tensor([row]), torch.tensor([n]))[0]
                for t in range(lead, n - trail):
                    if mode == "delete":
                        seq = row[:t] + row[t + 1 :]
                    else:
                        seq = row[:t] + [mask_token] + row[t + 1 :]
                    y_t = _loo_distribution(model, torch.tensor([seq]), torch.tensor([len(seq)]))[0]
                    out[b, t - lead] = tvd_reference(y, y_t)
    finally:
        model.train(was_training)
    return out


def leave_one_out_jw(model, tokens, lengths, batch_size=None):
    """J&W's leave-one-out loop (``remove_and_run`` in their code): for each position t,
    delete column t from every row long enough to have a real token there and run one
    forward over the whole batch; rows too short run unchanged and are ignored.

    ``batch_size``: None runs the loop once on the whole batch; J&W's code sorts the
    test set by length and runs it on batches of ``bsize`` (32) rows, each up to its own
    longest row. Model in eval mode (J&W's code leaves dropout on; this does not), no
    gradients. Returns what :func:`leave_one_out_reference` does.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            lead, trail = model.lead, model.trail
            lengths = torch.as_tensor(lengths, dtype=torch.int64)
            dtype = model.embed(tokens[:1, :1]).dtype
            out = torch.zeros(tokens.shape[0], tokens.shape[1] - lead, dtype=dtype)
            order = torch.argsort(lengths, stable=True) if batch_size else torch.arange(tokens.shape[0])
            step = batch_size or tokens.shape[0]
            for s in range(0, tokens.shape[0], step):
                rows = order[s : s + step]
                lens = lengths[rows]
                tok = tokens[rows, : int(lens.max())]
                y = _loo_distribution(model, tok, lens)
                for t in range(lead, int(lens.max()) - trail):
                    long_enough = t < lens - trail
                    deleted = torch.cat([tok[:, :t], tok[:, t + 1 :]], 1)
                    # a short row ends at or before t + trail <= T - 1: dropping the last column keeps it whole
                    batch_tokens = torch.where(long_enough[:, None], deleted, tok[:, :-1])
                    batch_lengths = torch.where(long_enough, lens - 1, lens)
                    y_t = _loo_distribution(model, batch_tokens, batch_lengths)
                    out[rows[long_enough], t - lead] = tvd_reference(y[long_enough], y_t[long_enough]).to(dtype)
    finally:
        model.train(was_training)
    return out


# ---- attention rollout (Abnar & Zuidema 2020) ----------------------------------------------


def attention_rollout_reference(attentions, lengths=None, residual=0.5):
    """Abnar & Zuidema's rollout (sec. 3), one row at a time with torch matmuls: per layer
    the head mean on the valid block, ``(1 − residual)·A + residual·I``, rows renormalised
    (a zero row stays zero), then ``R = M_{n−1} ⋯ M_0``. Returns ``[B, T, T]``, zero
    outside each row's block."""
    batch, layers, _, width = attentions.shape[:4]
    lens = [width] * batch if lengths is None else [int(v) for v in lengths]
    out = attentions.new_zeros(batch, width, width)
    for b, n in enumerate(lens):
        if n == 0:
            continue
        rollout = None
        for layer in range(layers):
            mixed = (1 - residual) * attentions[b, layer, :, :n, :n].mean(0) + residual * torch.eye(
                n, dtype=attentions.dtype, device=attentions.device
            )
            total = mixed.sum(-1, keepdim=True)
            mixed = torch.where(total > 0, mixed / total, torch.zeros_like(mixed))
            rollout = mixed if rollout is None else mixed @ rollout
        out[b, :n, :n] = rollout
    return out


# ---- attention-derived attributions (Kobayashi 2020, GlobEnc, ALTI, Value Zeroing, Chefer 2021) --
#
# One sentence at a time, explicit loops over layers, heads and tokens, every state recomputed from
# the model's weights (embeddings included); the loop's forward is checked against the model's own.
# ``model`` is a protocol model whose ``hf`` is a ``BertForSequenceClassification``
# (``attnmetrics.models.hf.HFClassifier``), or our GPT classifier (``GPTClassifier``: post-LayerNorm
# causal blocks, models/gpt.py); ``ids`` one sentence's token ids (``[CLS] ... [SEP]`` or
# ``<start> ... <extract>``, no padding). The weights are read here from each model's own modules
# (:func:`_loop_layers`), not through the library's parts. Each ``*_sentence_reference`` returns
# the pooled position's (``[CLS]``'s; our GPT's ``<extract>``, its last) score of every position (a
# list of n floats); each ``*_reference`` the library's ``[B, T - lead]`` layout (real tokens'
# scores, the trailing special token and padding 0), float64.


def _loop_tolerance(dtype, float64):
    """(rtol, atol) of the loops' self-checks: ``float64`` in float64, float32's rounding otherwise."""
    return (float64, float64) if dtype == torch.float64 else (1e-4, 1e-4)


def _layer_norm(u, ln):
    """LayerNorm by plain sums: (output, the denominator sqrt(var + eps))."""
    mean = sum(u[k] for k in range(len(u))) / len(u)
    var = sum((u[k] - mean) ** 2 for k in range(len(u))) / len(u)
    return ln.weight * (u - mean) / torch.sqrt(var + ln.eps) + ln.bias, torch.sqrt(var + ln.eps)


def _ln_linear(u, ln, s):
    """LayerNorm's linear part at the fixed denominator s: gamma * (u - mean(u)) / s."""
    return ln.weight * (u - u.mean()) / s


def _is_gpt(model):
    return getattr(model, "hf", None) is None and hasattr(model, "gpt")


def _embeddings(model, ids):
    """The first layer's input: BERT's embeddings (word + position + token type 0, LayerNorm); our
    GPT's token + position embeddings (no LayerNorm)."""
    if _is_gpt(model):
        g = model.gpt
        return [g.tokens.weight[t] + g.positions.weight[i] for i, t in enumerate(ids)]
    e = model.hf.bert.embeddings
    return [
        _layer_norm(
            e.word_embeddings.weight[t] + e.position_embeddings.weight[i] + e.token_type_embeddings.weight[0],
            e.LayerNorm,
        )[0]
        for i, t in enumerate(ids)
    ]


def _loop_layers(model):
    """Each layer's weights as plain tensors and modules, read from the model's own attribute paths:
    ``Wq, bq, Wk, bk, Wv, bv`` ([d, d] out × in, head h the rows h·dh .. (h+1)·dh), ``Wo, bo`` (the
    attention's output projection), ``ln1``, ``W1, b1, act, W2, b2`` (the feed-forward network),
    ``ln2``, ``heads`` and ``causal`` (query i sees keys j <= i only). BERT: ``BertLayer``'s
    ``attention.self.{query,key,value}``, ``attention.output.{dense,LayerNorm}``,
    ``intermediate.dense``, GELU, ``output.{dense,LayerNorm}``. Our GPT (models/gpt.py ``Block``):
    one ``attn.qkv`` Linear whose outputs are the queries, keys and values in that order, ``attn.proj``,
    ``ln_1``, ``mlp.fc``, GELU's tanh approximation, ``mlp.proj``, ``ln_2``; causal."""
    import torch.nn.functional as F

    out = []
    if _is_gpt(model):
        for block in model.gpt.blocks:
            attn, mlp = block.attn, block.mlp
            d = attn.proj.weight.shape[0]
            W, b = attn.qkv.weight, attn.qkv.bias
            out.append(
                dict(
                    Wq=W[:d], bq=b[:d], Wk=W[d : 2 * d], bk=b[d : 2 * d], Wv=W[2 * d :], bv=b[2 * d :],
                    Wo=attn.proj.weight, bo=attn.proj.bias, ln1=block.ln_1, W1=mlp.fc.weight, b1=mlp.fc.bias,
                    act=lambda u: F.gelu(u, approximate="tanh"), W2=mlp.proj.weight, b2=mlp.proj.bias,
                    ln2=block.ln_2, heads=attn.n_head, causal=True,
                )
            )  # fmt: skip
        return out
    for layer in model.hf.bert.encoder.layer:
        sa, so = layer.attention.self, layer.attention.output
        out.append(
            dict(
                Wq=sa.query.weight, bq=sa.query.bias, Wk=sa.key.weight, bk=sa.key.bias, Wv=sa.value.weight,
                bv=sa.value.bias, Wo=so.dense.weight, bo=so.dense.bias, ln1=so.LayerNorm,
                W1=layer.intermediate.dense.weight, b1=layer.intermediate.dense.bias, act=F.gelu,
                W2=layer.output.dense.weight, b2=layer.output.dense.bias, ln2=layer.output.LayerNorm,
                heads=sa.num_attention_heads, causal=False,
            )
        )  # fmt: skip
    return out


def _pooled_position(model, n):
    """The pooled position of an n-token sentence: ``model.pooled`` (BERT's [CLS], 0; our GPT's
    <extract>, n - 1), 0 for a model without one."""
    return int(model.pooled(torch.tensor([n]))[0]) if hasattr(model, "pooled") else 0


def _own_outputs(model, ids):
    """The model's own last states ``[n, d]`` and logits ``[C]`` of one unpadded sentence."""
    device = next(model.parameters()).device
    tokens, lengths = torch.tensor([ids], device=device), torch.tensor([len(ids)], device=device)
    with torch.no_grad():
        if _is_gpt(model):
            states = model.gpt(tokens).hidden[0]
        else:
            states = model.hf.bert(input_ids=tokens).last_hidden_state[0]
        return states, model(tokens, lengths)[0][0]


def _head_loop(model):
    """The classification head after the pooled state: (the pooler with ``dense`` and
    ``activation``, or None; the classifier Linear). BERT: ``hf.bert.pooler``, ``hf.classifier``;
    our GPT with its extract read-out: no pooler, its ``decoder``."""
    if _is_gpt(model):
        return None, model.decoder
    return model.hf.bert.pooler, model.hf.classifier


def layer_loop(layer, x, zeroed=None):
    """One layer (:func:`_loop_layers`'s weights ``layer``) on token states ``x`` (a list of [d]
    vectors), token by token and head by head; a causal layer's query i attends to keys j <= i
    only (the others' weights 0); ``zeroed``: that token's value vectors set to 0 in every head
    (Value Zeroing). Returns the attention weights ``A[h][i][j]``, ``f[h][j]`` (value through head
    h's slice of W_O, b_V in, b_O out), the pre-LayerNorm states, their LayerNorm denominators and
    the outputs."""
    heads, n = layer["heads"], len(x)
    dh = layer["Wq"].shape[0] // heads
    A, f = [], []
    for h in range(heads):
        cols = slice(h * dh, (h + 1) * dh)
        q = [layer["Wq"][cols] @ x[i] + layer["bq"][cols] for i in range(n)]
        k = [layer["Wk"][cols] @ x[j] + layer["bk"][cols] for j in range(n)]
        v = [layer["Wv"][cols] @ x[j] + layer["bv"][cols] for j in range(n)]
        if zeroed is not None:
            v[zeroed] = torch.zeros_like(v[zeroed])
        rows = []
        for i in range(n):
            seen = i + 1 if layer["causal"] else n
            s = [float(q[i] @ k[j]) / math.sqrt(dh) for j in range(seen)]
            top = max(s)
            e = [math.exp(sj - top) for sj in s]
            rows.append([ej / sum(e) for ej in e] + [0.0] * (n - seen))
        A.append(rows)
        f.append([layer["Wo"][:, cols] @ v[j] for j in range(n)])
    pre1, s1, a, pre2, s2, out = [], [], [], [], [], []
    for i in range(n):
        p = layer["bo"] + x[i]
        for h in range(heads):
            for j in range(n):
                p = p + A[h][i][j] * f[h][j]
        ai, si = _layer_norm(p, layer["ln1"])
        mid = layer["act"](layer["W1"] @ ai + layer["b1"])
        p2 = layer["W2"] @ mid + layer["b2"] + ai
        oi, s2i = _layer_norm(p2, layer["ln2"])
        pre1.append(p), s1.append(si), a.append(ai), pre2.append(p2), s2.append(s2i), out.append(oi)
    return dict(A=A, f=f, pre1=pre1, s1=s1, a=a, pre2=pre2, s2=s2, out=out)


def states_loop(model, ids):
    """Every layer's weights, its input (the embeddings' output first) and :func:`layer_loop`'s
    results, ``[(layer, x, result), ...]``; the loop's outputs are checked against the model's own
    forward."""
    x, layers = _embeddings(model, ids), []
    for layer in _loop_layers(model):
        r = layer_loop(layer, x)
        layers.append((layer, x, r))
        x = r["out"]
    own, _ = _own_outputs(model, ids)
    rtol, atol = _loop_tolerance(own.dtype, 1e-9)
    torch.testing.assert_close(torch.stack(x), own, rtol=rtol, atol=atol)
    return layers


def _mixing(layer_result, x, i, j):
    """z_ij = sum_h A_h[i, j] f_h(x_j) + [i = j] x_i."""
    A, f = layer_result["A"], layer_result["f"]
    z = sum(A[h][i][j] * f[h][j] for h in range(len(A)))
    return z + x[i] if i == j else z


def _rollout_loop(matrices, p):
    """The pooled row p of C_{L-1} ... C_1 C_0, by plain sums."""
    n = len(matrices[0])
    rolled = [row[:] for row in matrices[0]]
    for c in matrices[1:]:
        rolled = [[sum(c[i][k] * rolled[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    return rolled[p]


def attention_value_norm_sentence_reference(model, ids):
    """Kobayashi et al. 2020 (sec. 3): ||sum_h A_h[p, j] f_h(x_j)|| in the last layer, per position j."""
    _, x, r = states_loop(model, ids)[-1]
    heads, n, p = len(r["A"]), len(ids), _pooled_position(model, len(ids))
    return [
        float(torch.linalg.vector_norm(sum(r["A"][h][p][j] * r["f"][h][j] for h in range(heads)))) for j in range(n)
    ]


def globenc_sentence_reference(model, ids):
    """GlobEnc (Modarressi et al. 2022, sec. 3): per layer ||LN_2'(LN_1'(z_ij))|| (both LayerNorms'
    linear parts at the token's own denominators), rolled out over the layers."""
    n, matrices = len(ids), []
    for layer, x, r in states_loop(model, ids):
        ln1, ln2 = layer["ln1"], layer["ln2"]
        matrices.append(
            [
                [
                    float(
                        torch.linalg.vector_norm(
                            _ln_linear(_ln_linear(_mixing(r, x, i, j), ln1, r["s1"][i]), ln2, r["s2"][i])
                        )
                    )
                    for j in range(n)
                ]
                for i in range(n)
            ]
        )
    return _rollout_loop(matrices, _pooled_position(model, n))


def alti_sentence_reference(model, ids):
    """ALTI (Ferrando et al. 2022, sec. 3): per layer c_ij = max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1),
    T_i(x_j) = LN_1'(z_ij), each row normalised to sum 1 (a row of zeros left 0), rolled out over
    the layers (:func:`alti_sentence_matrices`)."""
    return _rollout_loop(alti_sentence_matrices(model, ids), _pooled_position(model, len(ids)))


def alti_sentence_matrices(model, ids):
    """ALTI's per-layer matrices of one sentence (:func:`alti_sentence_reference`), ``[L][n][n]``
    nested lists. Checks that the decomposition is exact on the way."""
    n, matrices = len(ids), []
    for layer, x, r in states_loop(model, ids):
        ln, b_o = layer["ln1"], layer["bo"]
        rtol, atol = _loop_tolerance(b_o.dtype, 1e-10)
        rows = []
        for i in range(n):
            t = [_ln_linear(_mixing(r, x, i, j), ln, r["s1"][i]) for j in range(n)]
            y = r["a"][i]
            # the decomposition is exact: y_i = sum_j T_i(x_j) + LN'(b_O) + beta
            torch.testing.assert_close(sum(t) + _ln_linear(b_o, ln, r["s1"][i]) + ln.bias, y, rtol=rtol, atol=atol)
            c = [max(0.0, float(y.abs().sum()) - float((y - t[j]).abs().sum())) for j in range(n)]
            # a row of zeros (every distance past ||y_i||_1: on a causal model, the first position, whose
            # one contributor is itself, when the biases outweigh it) stays 0, as the library's
            rows.append([cj / sum(c) if sum(c) > 0 else 0.0 for cj in c])
        matrices.append(rows)
    return matrices


def value_zeroing_sentence_reference(model, ids):
    """Value Zeroing (Mohebbi et al. 2023, sec. 2): per layer and token j, the layer recomputed with
    j's value vectors zeroed in every head (one recomputation per token, as the authors' loop; a
    causal layer's attention stays causal, so the queries before j do not change);
    d_ij = max(0, 1 - cos(out_i, out_i with j zeroed)), rows normalised, rolled out over the layers."""
    n, matrices = len(ids), []
    for layer, x, r in states_loop(model, ids):
        distance = [[0.0] * n for _ in range(n)]
        for j in range(n):
            changed = layer_loop(layer, x, zeroed=j)["out"]
            for i in range(n):  # in float64: 1 - cos cancels, float32's rounding would swamp small distances
                u, w = changed[i].double(), r["out"][i].double()
                cos = float(u @ w) / float(u.norm() * w.norm())
                distance[i][j] = max(0.0, 1 - cos)
        matrices.append([[d / sum(row) for d in row] for row in distance])
    return _rollout_loop(matrices, _pooled_position(model, n))


def _attribution_rows(sentence_reference, model, tokens, lengths):
    """[B, T - lead] float64: each row's real tokens' scores (the lead special token dropped, the
    trailing one and padding 0)."""
    lead, trail = model.lead, model.trail
    out = torch.zeros(tokens.shape[0], tokens.shape[1] - lead, dtype=torch.float64)
    with torch.no_grad():
        for b in range(tokens.shape[0]):
            n = int(lengths[b])
            scores = sentence_reference(model, tokens[b, :n].tolist())
            out[b, : n - lead - trail] = torch.tensor(scores[lead : n - trail], dtype=torch.float64)
    return out


def attention_value_norm_reference(model, tokens, lengths):
    """:func:`attention_value_norm_sentence_reference` one row at a time, ``[B, T - lead]`` float64."""
    return _attribution_rows(attention_value_norm_sentence_reference, model, tokens, lengths)


def globenc_reference(model, tokens, lengths):
    """:func:`globenc_sentence_reference` one row at a time, ``[B, T - lead]`` float64."""
    return _attribution_rows(globenc_sentence_reference, model, tokens, lengths)


def alti_reference(model, tokens, lengths):
    """:func:`alti_sentence_reference` one row at a time, ``[B, T - lead]`` float64."""
    return _attribution_rows(alti_sentence_reference, model, tokens, lengths)


def value_zeroing_reference(model, tokens, lengths):
    """:func:`value_zeroing_sentence_reference` one row at a time, ``[B, T - lead]`` float64."""
    return _attribution_rows(value_zeroing_sentence_reference, model, tokens, lengths)


# ---- gradient-weighted attention rollout (Chefer, Gur & Wolf 2021, ICCV) -------------------------


def _differentiable_layer_loop(layer, x):
    """One layer (:func:`_loop_layers`'s weights ``layer``) on token states ``x`` (a list of [d]
    tensors), head by head and token by token, kept in autograd's graph (a causal layer's scores
    of later keys set to -inf before the softmax, so their weights are 0): (each head's attention
    probabilities ``A[h]`` [n, n], one tensor a head, the tensors to differentiate with respect to;
    the outputs, a list of [d])."""
    heads, n = layer["heads"], len(x)
    dh = layer["Wq"].shape[0] // heads
    A, context = [], []
    for h in range(heads):
        cols = slice(h * dh, (h + 1) * dh)
        q = torch.stack([layer["Wq"][cols] @ x[i] + layer["bq"][cols] for i in range(n)])
        k = torch.stack([layer["Wk"][cols] @ x[j] + layer["bk"][cols] for j in range(n)])
        v = torch.stack([layer["Wv"][cols] @ x[j] + layer["bv"][cols] for j in range(n)])
        scores = q @ k.T / math.sqrt(dh)
        if layer["causal"]:
            later = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(later, -math.inf)
        a = torch.softmax(scores, dim=-1)  # [n, n]: row i, query i's weights
        A.append(a)
        context.append([sum(a[i, j] * v[j] for j in range(n)) for i in range(n)])
    out = []
    for i in range(n):
        p = layer["bo"] + x[i]
        for h in range(heads):
            p = p + layer["Wo"][:, h * dh : (h + 1) * dh] @ context[h][i]
        ai = _differentiable_layer_norm(p, layer["ln1"])
        mid = layer["act"](layer["W1"] @ ai + layer["b1"])
        out.append(_differentiable_layer_norm(layer["W2"] @ mid + layer["b2"] + ai, layer["ln2"]))
    return A, out


def _differentiable_layer_norm(u, ln):
    mean = u.mean()
    return ln.weight * (u - mean) / torch.sqrt(((u - mean) ** 2).mean() + ln.eps) + ln.bias


def gradient_weighted_rollout_sentence_reference(model, ids):
    """Chefer, Gur & Wolf 2021 (ICCV, sec. 3, eqs. 5-6) for one sentence: the forward recomputed
    from the weights (checked against the model's states and logits), the gradient of the
    predicted class's logit with respect to every layer's and head's attention probabilities
    (autograd, this one sentence), then R = I and, layer by layer,
    ``Ā[i][j] = (1/H) sum_h max(0, ∇A_h[i][j] * A_h[i][j])`` and ``R <- R + Ā R`` by plain sums.
    Returns the pooled row of R (``[CLS]``'s; our GPT's ``<extract>``), every position (a list of n
    floats; the identity's 1 at the pooled position)."""
    p = _pooled_position(model, len(ids))
    with torch.enable_grad():
        x = _embeddings(model, ids)
        attention = []
        for layer in _loop_layers(model):
            A, x = _differentiable_layer_loop(layer, x)
            attention.append(A)
        own_states, own_logits = _own_outputs(model, ids)
        rtol, atol = _loop_tolerance(x[0].dtype, 1e-9)
        torch.testing.assert_close(torch.stack(x), own_states, rtol=rtol, atol=atol)
        logits = model.decoder(x[p][None])[0]  # the head at the pooled state (BERT: pooler, dropout (eval), classifier)
        torch.testing.assert_close(logits, own_logits, rtol=rtol, atol=atol)
        if len(logits) == 1:  # one sigmoid logit z: class 1 when z > 0, whose logit is z; class 0's is -z
            target = logits[0] if float(logits[0].detach()) > 0 else -logits[0]
        else:  # the first largest (ties to the lower class)
            target = logits[max(range(len(logits)), key=lambda c: (float(logits[c].detach()), -c))]
        flat = [a for layer_attention in attention for a in layer_attention]
        grads = torch.autograd.grad(target, flat)
    n, heads = len(ids), len(attention[0])
    R = [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
    for b in range(len(attention)):
        A, G = attention[b], grads[b * heads : (b + 1) * heads]
        bar = [
            [sum(max(0.0, float(G[h][i, j]) * float(A[h][i, j])) for h in range(heads)) / heads for j in range(n)]
            for i in range(n)
        ]
        AR = [[sum(bar[i][k] * R[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
        R = [[R[i][j] + AR[i][j] for j in range(n)] for i in range(n)]
    return R[p]


def gradient_weighted_rollout_reference(model, tokens, lengths):
    """:func:`gradient_weighted_rollout_sentence_reference` one row at a time, ``[B, T - lead]`` float64."""
    return _attribution_rows(gradient_weighted_rollout_sentence_reference, model, tokens, lengths)


# ---- DecompX (Modarressi et al. 2023, ACL) ---------------------------------------------------------


def _absdot_loop(parts, bias):
    """AbsDot (DecompX eq. 5): the bias split over the K terms ``parts`` (a list of vectors) by
    |bias . part_k| / sum_k' |bias . part_k'|; all-zero weights assign nothing."""
    w = [abs(float(bias @ part)) for part in parts]
    total = sum(w)
    return [part + (w[k] / total) * bias if total > 0 else part for k, part in enumerate(parts)]


def _ratio_loop(act, pre):
    """act(pre) / pre elementwise (DecompX eq. 10), 0 where pre is 0, one element at a time."""
    out = torch.zeros_like(pre)
    for t in range(len(pre)):
        if float(pre[t]) != 0:
            out[t] = act(pre[t : t + 1])[0] / pre[t]
    return out


def decompx_sentence_contributions(model, ids):
    """DecompX (Modarressi et al. 2023, ACL, sec. 3, eqs. 1-14) for one sentence, from the paper's
    equations: ``x_{i<-k} = [i = k] x_i`` the first layer's input (BERT: after the embeddings'
    LayerNorm; our GPT: token + position embeddings); per layer, query i and input token k, the
    attention terms ``sum_h sum_j A_h[i][j] W_O^h W_V^h x_{j<-k}`` (a causal layer's ``A_h[i][j]``
    0 for j > i) plus their AbsDot share of ``b_Att = sum_h W_O^h b_V^h + b_O``, the residual
    ``x_{i<-k}``, LayerNorm's ``gamma * (u - mean(u)) / s(i)`` plus the AbsDot share of beta, the
    feed-forward network (``W_1`` plus AbsDot share of ``b_1``, the activation's ratio
    ``act(zeta_i) / zeta_i`` at the token's own pre-activation applied to every term, ``W_2`` plus
    AbsDot share of ``b_2``), the residual and the second LayerNorm; then at the pooled position p
    (BERT's [CLS]) the pooler (tanh by the same ratio; our GPT has none: its extract read-out
    classifies p's state) and the classifier, every bias by AbsDot. Checks on the way that the terms
    sum to the model's states and logits (the decomposition is exact). Returns ``y[k][c]``, a list
    of n lists of C floats."""
    n, p = len(ids), _pooled_position(model, len(ids))
    states = states_loop(model, ids)
    x0 = states[0][1]
    zero = torch.zeros_like(x0[0])
    comps = [[x0[i] if i == k else zero for k in range(n)] for i in range(n)]
    for layer, _x, r in states:
        heads = layer["heads"]
        dh = layer["Wv"].shape[0] // heads
        rtol, atol = _loop_tolerance(x0[0].dtype, 1e-10)
        # each head's W_O^h W_V^h x_{j<-k} (no bias), for every j and k
        f = [
            [
                [
                    layer["Wo"][:, h * dh : (h + 1) * dh] @ (layer["Wv"][h * dh : (h + 1) * dh] @ comps[j][k])
                    for k in range(n)
                ]
                for j in range(n)
            ]
            for h in range(heads)
        ]
        b_att = layer["Wo"] @ layer["bv"] + layer["bo"]
        new = []
        for i in range(n):
            z = []
            for k in range(n):
                zk = zero
                for h in range(heads):
                    for j in range(n):
                        zk = zk + r["A"][h][i][j] * f[h][j][k]
                z.append(zk)
            z = _absdot_loop(z, b_att)  # eqs. 4-6
            z = [z[k] + comps[i][k] for k in range(n)]  # eq. 7, the residual
            ln1 = layer["ln1"]
            t = _absdot_loop([_ln_linear(z[k], ln1, r["s1"][i]) for k in range(n)], ln1.bias)  # eq. 8
            torch.testing.assert_close(sum(t), r["a"][i], rtol=rtol, atol=atol)
            zeta = _absdot_loop([layer["W1"] @ t[k] for k in range(n)], layer["b1"])  # eq. 9
            theta = _ratio_loop(layer["act"], layer["W1"] @ r["a"][i] + layer["b1"])
            g = _absdot_loop([layer["W2"] @ (theta * zeta[k]) for k in range(n)], layer["b2"])  # eq. 11
            ln2 = layer["ln2"]
            o = _absdot_loop([_ln_linear(t[k] + g[k], ln2, r["s2"][i]) for k in range(n)], ln2.bias)
            torch.testing.assert_close(sum(o), r["out"][i], rtol=rtol, atol=atol)
            new.append(o)
        comps = new
    pooler, classifier = _head_loop(model)
    q = comps[p]
    if pooler is not None:
        last = states[-1][2]["out"][p]  # the pooled position's final state
        q = _absdot_loop([pooler.dense.weight @ q[k] for k in range(n)], pooler.dense.bias)  # eq. 13
        theta = _ratio_loop(pooler.activation, pooler.dense.weight @ last + pooler.dense.bias)
        q = [theta * q[k] for k in range(n)]
    y = _absdot_loop([classifier.weight @ q[k] for k in range(n)], classifier.bias)
    _, own = _own_outputs(model, ids)
    rtol, atol = _loop_tolerance(own.dtype, 1e-10)
    torch.testing.assert_close(sum(y), own, rtol=rtol, atol=atol)  # eq. 14: the terms sum to the logits
    return [[float(v) for v in yk] for yk in y]


def decompx_sentence_reference(model, ids):
    """DecompX's importance for one sentence: each position's contribution to the predicted class's
    logit (the first largest logit; one sigmoid logit z: class 1 when z > 0, else class 0 with
    logit -z and contributions -z_k), a list of n floats."""
    y = decompx_sentence_contributions(model, ids)
    own = _own_outputs(model, ids)[1].tolist()
    if len(own) == 1:
        return [yk[0] if own[0] > 0 else -yk[0] for yk in y]
    c = max(range(len(own)), key=lambda c: (own[c], -c))
    return [yk[c] for yk in y]


def decompx_reference(model, tokens, lengths):
    """:func:`decompx_sentence_reference` one row at a time, ``[B, T - lead]`` float64."""
    return _attribution_rows(decompx_sentence_reference, model, tokens, lengths)


# ---- attention flow (Abnar & Zuidema 2020, ACL, sec. 3) -------------------------------------------


def _layer_attentions_loop(model, ids):
    """Every layer's attention of one unpadded sentence, ``[L][H][n][n]`` nested lists, from the
    model's ``layer_attentions`` (what attention rollout and ``attention_flow`` read: our GPT
    classifier, BERT-like and GPT-2-like Hugging Face classifiers); for a BERT-like model and our GPT checked
    against :func:`states_loop`'s recomputation from the weights first."""
    device = next(model.parameters()).device
    tokens = torch.tensor([ids], device=device)
    with torch.no_grad():
        probs = model.layer_attentions(tokens, torch.tensor([len(ids)], device=device))[0]
    if _is_gpt(model) or getattr(getattr(model, "hf", None), "bert", None) is not None:
        with torch.no_grad():
            states = states_loop(model, ids)
        loop = torch.stack([torch.tensor(r["A"], dtype=probs.dtype) for _, _, r in states])
        rtol, atol = _loop_tolerance(probs.dtype, 1e-10)
        torch.testing.assert_close(probs.cpu(), loop, rtol=rtol, atol=atol)
    return probs.tolist()


def attention_flow_sentence_reference(model, ids, residual=0.5):
    """Attention flow as the paper defines it (sec. 3) and the authors' code builds it: one networkx
    ``DiGraph`` for the sentence, a node ``(l, t)`` per layer boundary l = 0 .. L and position t, an
    edge ``(l, k) -> (l + 1, i)`` of float capacity ``Â_l[i, k]`` (the heads' mean attention of
    layer l, :func:`_layer_attentions_loop`'s, mixed with the identity, ``(1 - residual) A +
    residual I``, each row divided by its sum: the rollout's matrix; a causal model's attention is 0
    on later keys, so its edges of capacity 0 carry nothing), and one ``networkx.maximum_flow_value``
    from ``(0, j)`` to ``(L, p)`` per position j, p the model's pooled position (``model.pooled``:
    ``[CLS]``, or a causal model's last token; 0 without one); the flows not normalised."""
    n = len(ids)
    attentions = _layer_attentions_loop(model, ids)
    capacities = []
    for a in attentions:
        heads = len(a)
        layer = []
        for i in range(n):
            row = [
                (1 - residual) * sum(a[h][i][k] for h in range(heads)) / heads + (residual if i == k else 0.0)
                for k in range(n)
            ]
            total = sum(row)
            layer.append([float(row[k]) / float(total) for k in range(n)])
        capacities.append(layer)
    pooled = int(model.pooled(torch.tensor([n]))[0]) if hasattr(model, "pooled") else 0
    return networkx_max_flows(capacities, pooled, range(n))


def networkx_max_flows(capacities, pooled: int, sources) -> list[float]:
    """The authors' max-flow step: a networkx ``DiGraph`` with a node ``(l, t)`` per layer boundary
    and position, an edge ``(l, k) -> (l + 1, i)`` of capacity ``capacities[l][i][k]`` (``[L][n][n]``,
    any indexable), and ``networkx.maximum_flow_value`` from ``(0, j)`` to ``(L, pooled)`` per j of
    ``sources``."""
    import networkx as nx

    layers, n = len(capacities), len(capacities[0])
    graph = nx.DiGraph()
    for layer in range(layers):
        for i in range(n):
            for k in range(n):
                graph.add_edge((layer, k), (layer + 1, i), capacity=float(capacities[layer][i][k]))
    return [nx.maximum_flow_value(graph, (0, int(j)), (layers, pooled)) for j in sources]


def scipy_max_flows(m, pooled: int, sources, scale: int = 2**30):
    """Attention flow's maximum flows as the library computed them before its C++ op (and as a
    user of scipy would): from ``(0, j)`` to ``(L, pooled)`` for every j of ``sources``, ``m``
    ``[L, n, n]`` float64 (``m[l, i, k]`` the capacity from ``(l, k)`` to ``(l + 1, i)``). One and
    two layers in closed form; more through ``scipy.sparse.csgraph.maximum_flow`` (Dinic) on
    capacities floored to multiples of ``1 / scale`` (int32), one graph reused for every source,
    then the exact float64 capacity of the minimum cut the residual graph gives (the nodes it
    reaches from the source). The benchmark's baseline and an independent check of the op's
    rounding and cut (``tests/test_flow_op.py``)."""
    import numpy as np
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    layers, n = m.shape[0], m.shape[1]
    if layers == 1:  # one edge from (0, j) to (1, p)
        return m[0, pooled, sources]
    if layers == 2:  # the paths (0, j) -> (1, k) -> (2, p) share no edge
        return np.minimum(m[0][:, sources], m[1, pooled][:, None]).sum(0)
    # node 0 the source (its edges set per token), 1 + (l - 1) n + i the node (l, i) for
    # l = 1 .. L - 1, the last one the pooled node (L, p); only edges that can reach it
    caps = np.floor(m * scale).astype(np.int32)  # every entry in [0, 2^30]
    sink = 1 + (layers - 1) * n
    inner = [caps[b].T.reshape(-1) for b in range(1, layers - 1)]  # node (l, k)'s row: m[l, :, k]
    data = np.concatenate([np.zeros(n, np.int32), *inner, caps[layers - 1, pooled]])
    layer_of = np.repeat(np.arange(1, layers - 1), n)  # the inner nodes' layers, k fastest
    indices = np.concatenate(
        [1 + np.arange(n), (1 + layer_of[:, None] * n + np.arange(n)).reshape(-1), np.full(n, sink)]
    ).astype(np.int32)
    ends = [n + n * np.arange((layers - 2) * n + 1), n + (layers - 2) * n * n + 1 + np.arange(n)]
    indptr = np.concatenate([[0], *ends, [data.size]]).astype(np.int32)
    exact = np.concatenate([np.zeros(n), *[m[b].T.reshape(-1) for b in range(1, layers - 1)], m[layers - 1, pooled]])
    tails = np.repeat(np.arange(sink + 1), np.diff(indptr))  # each edge's tail node
    flows = np.empty(len(sources))
    graph = csr_array((data, indices, indptr), shape=(sink + 1, sink + 1))  # scipy copies it, never writes it
    for index, j in enumerate(sources):
        graph.data[:n], exact[:n] = caps[0, :, j], m[0, :, j]
        residual = graph - maximum_flow(graph, 0, sink, method="dinic").flow
        residual.data[residual.data < 0] = 0
        residual.eliminate_zeros()
        side = np.zeros(sink + 1, bool)  # the source side of the rounded graph's minimum cut
        side[breadth_first_order(residual, 0, directed=True, return_predecessors=False)] = True
        flows[index] = exact[side[tails] & ~side[indices]].sum()
    return flows


def attention_flow_reference(model, tokens, lengths):
    """:func:`attention_flow_sentence_reference` one row at a time, ``[B, T - lead]`` float64: each
    row's real tokens' flows (``model.lead`` and ``model.trail`` special positions dropped), zero
    past them."""
    lead, trail = model.lead, model.trail
    out = torch.zeros(tokens.shape[0], tokens.shape[1] - lead, dtype=torch.float64)
    for b in range(tokens.shape[0]):
        n = int(lengths[b])
        if n > lead + trail:
            scores = attention_flow_sentence_reference(model, tokens[b, :n].tolist())
            out[b, : n - lead - trail] = torch.tensor(scores[lead : n - trail], dtype=torch.float64)
    return out


#: The plain loops of the attention-derived attributions by their battery names
#: (``attnmetrics.attributions.METHODS``): whole batches, one sentence at a time
ATTRIBUTION_REFERENCES = {
    "value_norm": attention_value_norm_reference,
    "globenc": globenc_reference,
    "alti": alti_reference,
    "value_zeroing": value_zeroing_reference,
    "chefer": gradient_weighted_rollout_reference,
    "decompx": decompx_reference,
    "attention_flow": attention_flow_reference,
}
