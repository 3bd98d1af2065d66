"""Gradient-based token importance: Jain & Wallace 2019's (sec. 4.1), grad x input of the
output distribution with respect to the input embeddings, the attention held fixed; and,
through Captum, integrated gradients (Sundararajan et al. 2017) and the whole model's
gradient x input (Shrikumar et al. 2016), for comparisons with published attribution studies.

Model-agnostic, over the protocol (:class:`attnmetrics.AttentionClassifier`); per-token
results cover the real tokens only, non-negative and summing to 1 over each row's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics._cudnn import eval_mode_backward
from attnmetrics._validation import check_logits, check_model_inputs
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.protocol import AttentionClassifier, eval_mode, real_tokens, token_mask

#: whose probability J&W's gradient differentiates: every class's (summed), or the predicted one's
GRADIENT_CLASSES = ("all", "predicted")


def gradient_importance(model: AttentionClassifier, tokens: Tensor, lengths: Tensor, *, classes: str = "all") -> Tensor:
    """Gradient-based token importance of Jain & Wallace 2019 (sec. 4.1, "Gradient").

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) only the passage's
    words are scored; the question's embeddings, the row's fixed ``trail`` part, are held as they are.

    For every output class c, the gradient of p_c with respect to the input embeddings,
    with the attention weights detached (held fixed), times the embedding and summed
    over the embedding dimension (grad x input); the absolute values are summed over
    classes and L1-normalised over each row's real tokens. With ``classes="predicted"``
    only the predicted class's p is differentiated: J&W's question-answering code
    (``model/Question_Answering.py`` ``gradient_mem``: the gradient of the maximum class
    probability), which the battery uses on pair tasks. For two classes the two agree
    (``|grad p_1 . x| = |grad p_0 . x|``; the sum, twice it, is normalised away).

    Args:
        model: any :class:`attnmetrics.AttentionClassifier`.
        tokens: [B, T] int64 token ids, special tokens included.
        lengths: [B] integer positions per row, special tokens included, in
            ``[lead + trail, T]``.

    Returns:
        [B, T - lead] importance in the same float dtype as the model's embeddings:
        non-negative, summing to 1 over each row's real tokens (0 on padding; a row
        whose gradients all vanish is left at 0).

    Raises:
        TypeError: ``model`` does not implement the protocol; tokens/lengths not tensors.
        ValueError: the input checks of :func:`attnmetrics.leave_one_out` (same messages):
            tokens not ``[B, T]`` int64 or with negative ids, an empty batch, lengths not
            ``[B]`` integers in ``[lead + trail, T]`` or on another device, ``model.lead``
            or ``model.trail`` not an int >= 0; embeddings or logits that are not finite
            (or logits not ``[B, C]``); an importance that is not finite (NaN or inf
            gradients w.r.t. the embeddings), each naming the first bad row; ``classes`` not
            one of :data:`GRADIENT_CLASSES`.
    """
    if classes not in GRADIENT_CLASSES:
        raise ValueError(f"classes must be one of {GRADIENT_CLASSES}, got {classes!r}")
    lengths = check_model_inputs(model, tokens, lengths)
    with eval_mode(model):
        embedded = model.embed(tokens).detach().requires_grad_(True)
        valid = token_mask(lengths, tokens.shape[1])
        _check_rows(
            torch.isfinite(embedded.detach()).flatten(2).all(2) | ~valid,
            "model.embed returned NaN or infinite embeddings in row {row}",
        )
        with torch.enable_grad(), eval_mode_backward(model, embedded.device):
            hidden = model.encode(embedded, lengths)
            attention = model.attend(hidden, lengths).detach()
            logits = model.decoder(torch.einsum("bt,bth->bh", attention, hidden))
            logits = check_logits(
                logits, tokens.shape[0], source="model", inputs="the input rows", on=" on the input rows"
            )
            probs = output_distribution(logits)
            if classes == "predicted":  # J&W's QA: the predicted class's probability (ties: the lower class)
                top = probs.gather(1, decision(logits)[:, None])[:, 0]
                (grad,) = torch.autograd.grad(top.sum(), embedded)
                score = (grad * embedded).sum(-1).abs()
            else:
                # Two classes (a sigmoid output's (1 - p, p) too): p_1 = 1 - p_0, so the gradient of
                # p_1 is minus p_0's and |grad p_1 . x| = |grad p_0 . x|: one backward pass, not two.
                n_classes = 1 if probs.shape[1] == 2 else probs.shape[1]
                score = torch.zeros(embedded.shape[:2], dtype=embedded.dtype, device=embedded.device)
                for c in range(n_classes):
                    (grad,) = torch.autograd.grad(probs[:, c].sum(), embedded, retain_graph=c + 1 < n_classes)
                    score += (grad * embedded).sum(-1).abs()
                if n_classes == 1:
                    score *= 2
    return _normalised(score.detach(), lengths, model, "gradient importance", "gradients of the output probabilities")


#: how a token's attribution vector (one entry per embedding dimension) becomes its score, as
#: :func:`integrated_gradients` and :func:`input_x_gradient` take ``aggregation``:
#: ``"sum"`` ``|sum_e a_e|`` (this library's, the default); ``"l2"`` ``||a||_2`` (ALTI's ``ig_l2`` /
#: ``grad_input_l2``, DecompX's ``NORM``); ``"mean_abs"`` ``mean_e |a_e|`` (ALTI's ``ig_abs_mean`` /
#: ``grad_input_mean_abs_mean``)
AGGREGATIONS = ("sum", "l2", "mean_abs")


def aggregate_attribution(attribution: Tensor, aggregation: str = "sum") -> Tensor:
    """``[..., E]`` attributions per embedding dimension -> ``[...]`` one score per token.

    - ``"sum"``: ``|sum_e a_e|`` (the embedding dimensions summed, then the absolute value).
    - ``"l2"``: ``||a||_2 = sqrt(sum_e a_e^2)``: ALTI (mt-upc/transformer-contributions@4f890398,
      ``src/contributions.py`` ``interpret_sentence`` lines 425 and 449: ``torch.norm(attribution.squeeze(),
      dim=-1)``, their ``ig_l2`` and ``grad_input_l2``) and DecompX (mohsenfayyaz/DecompX@b6bddf0b,
      ``experiments/notebooks/compute_integrated_saliency.ipynb`` and ``compute_saliency.ipynb``:
      ``torch.norm(integrated_saliency, dim=-1)`` / ``torch.norm(inputXgradient, dim=-1)``, their
      ``IG_ALL_ZERO_NORM`` and ``IXG_NORM`` of Table 1).
    - ``"mean_abs"``: ``mean_e |a_e|``: ALTI's ``ig_abs_mean`` and ``grad_input_mean_abs_mean``
      (``torch.mean(torch.abs(attribution.squeeze()), dim=-1)``, the same lines).

    Raises:
        ValueError: an ``aggregation`` not in :data:`AGGREGATIONS`.
    """
    _check_aggregation(aggregation)
    if aggregation == "sum":
        return attribution.sum(-1).abs()
    if aggregation == "l2":
        return torch.linalg.vector_norm(attribution, dim=-1)
    return attribution.abs().mean(-1)


def _check_aggregation(aggregation) -> str:
    if not isinstance(aggregation, str) or aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    return aggregation


#: the most integration points: Captum's Gauss-Legendre nodes cost O(steps^3) to compute (20,000:
#: a quarter of an hour) and every point is a forward and backward pass (Captum's default: 50)
MAX_IG_STEPS = 1000
#: on a GPU, the positions (rows x width) one forward of integrated gradients holds: rows sorted
#: by length in groups cut to their longest, each forward as many rows of a group's steps as fit
IG_GPU_POSITIONS = 16384


def integrated_gradients(
    model: AttentionClassifier, tokens: Tensor, lengths: Tensor, *, steps: int = 50, aggregation: str = "sum"
) -> Tensor:
    """Integrated-gradients token importance (Sundararajan et al. 2017), through Captum.

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) only the passage's
    words are scored and moved to the baseline; the question, the row's fixed ``trail`` part, is held as
    it is.

    For the predicted class ŷ, per embedding entry
    ``IG = (x - x') * ∫_0^1 ∂p_ŷ(x' + s (x - x')) / ∂x ds`` with x the input embeddings and
    the baseline x' the same rows with every real token's embedding set to zero (special
    tokens and padding as they are), the integral by Captum's default Gauss–Legendre rule
    with ``steps`` points. The whole model is differentiated (attention not held fixed,
    unlike :func:`gradient_importance`). A token's score is ``|sum_e IG[t, e]|`` (or, by
    ``aggregation``, ``||IG[t]||_2`` or ``mean_e |IG[t, e]|``: :func:`aggregate_attribution`),
    L1-normalised over the row's real tokens: a partner for Kendall τ and an ordering for
    the flip search and ERASER, beside published studies (e.g. Neely et al. 2022).

    Args:
        model: any :class:`attnmetrics.AttentionClassifier`.
        tokens: [B, T] int64 token ids, special tokens included.
        lengths: [B] integer positions per row, special tokens included, in
            ``[lead + trail, T]``.
        steps: integration points (>= 1; Captum's default 50). Each runs the model forward
            and backward on the rows. On a GPU the rows run sorted by length, in groups cut to
            their longest, each forward holding at most :data:`IG_GPU_POSITIONS` positions of a
            group's rows and steps (few large calls, little padding); on the CPU the rows of one
            length at a time, cut to it (no padding computed), as many steps a forward as keep
            it within the batch's rows.
        aggregation: ``"sum"`` (default), ``"l2"`` or ``"mean_abs"`` (:func:`aggregate_attribution`).

    Returns:
        [B, T - lead] importance in the embeddings' float dtype, laid out as
        :func:`gradient_importance`'s: non-negative, summing to 1 over each row's real
        tokens (0 on padding; a row whose attributions all vanish is left at 0).

    Raises:
        ImportError: Captum is not installed (``pip install captum``).
        TypeError, ValueError: as :func:`gradient_importance`; ``steps`` not an int >= 1; an
            unknown ``aggregation``.
    """
    try:
        from captum.attr import IntegratedGradients
    except ImportError as e:
        raise ImportError("integrated_gradients needs Captum: pip install captum") from e
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_IG_STEPS:
        raise ValueError(f"steps must be an int >= 1 and <= {MAX_IG_STEPS}, got {steps!r}")
    _check_aggregation(aggregation)

    from attnmetrics.loo import _length_groups, padded_calls

    def attribute(probability, embedded, real, target, lengths):
        method = IntegratedGradients(probability)

        def rows(group, width, per_forward):
            x = embedded[group, :width]
            return method.attribute(
                x,
                baselines=x.masked_fill(real[group, :width].unsqueeze(-1), 0),
                target=target[group],
                additional_forward_args=(lengths[group],),
                n_steps=steps,
                internal_batch_size=per_forward,
            )

        out = torch.zeros_like(embedded)
        if padded_calls(embedded.device):
            # A GPU call's cost is mostly its launch: few large calls of rows sorted by length
            # (little padding), each cut to its group's longest row (one read of the lengths).
            order = torch.argsort(lengths, stable=True)
            widths = lengths[order].tolist()
            for s, e in _length_groups([1] * len(widths), widths, 1, IG_GPU_POSITIONS, padding=None):
                width = widths[e - 1]
                out[order[s:e], :width] = rows(order[s:e], width, max(1, IG_GPU_POSITIONS // width))
            return out
        # On the CPU a forward's cost follows its positions: rows of one length at a time, cut
        # to it, compute no padding (each call's forwards hold several steps of its rows, at most
        # as many rows as the batch has: memory as for one gradient).
        for n in lengths.unique().tolist():
            group = torch.nonzero(lengths == n).squeeze(1)
            out[group, :n] = rows(group, n, embedded.shape[0])
        return out

    return _captum_importance(model, tokens, lengths, attribute, "integrated gradients", aggregation)


def input_x_gradient(
    model: AttentionClassifier, tokens: Tensor, lengths: Tensor, *, aggregation: str = "sum"
) -> Tensor:
    """Gradient × input token importance of the whole model (Shrikumar et al. 2016), through
    Captum's ``InputXGradient``.

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) only the passage's
    words are scored; the question, the row's fixed ``trail`` part, is held as it is.

    ``x * ∂p_ŷ(x) / ∂x`` per embedding entry, for the predicted class ŷ, with the whole model
    differentiated: unlike :func:`gradient_importance` (J&W's, every class, attention held
    fixed), the gradient also flows through the attention. A token's score is ``|sum_e|`` (or,
    by ``aggregation``, the L2 norm or the mean absolute value over e: :func:`aggregate_attribution`),
    L1-normalised over the row's real tokens: a further Kendall τ partner and ordering, as
    in attribution studies that compare it with attention (e.g. Neely et al. 2022).

    Args:
        model, tokens, lengths: as :func:`gradient_importance`.
        aggregation: ``"sum"`` (default), ``"l2"`` or ``"mean_abs"`` (:func:`aggregate_attribution`).

    Returns:
        [B, T - lead] importance laid out as :func:`gradient_importance`'s.

    Raises:
        ImportError: Captum is not installed (``pip install captum``).
        TypeError, ValueError: as :func:`gradient_importance`; an unknown ``aggregation``.
    """
    try:
        from captum.attr import InputXGradient
    except ImportError as e:
        raise ImportError("input_x_gradient needs Captum: pip install captum") from e
    _check_aggregation(aggregation)

    def attribute(probability, embedded, real, target, lengths):
        x = embedded.requires_grad_(True)  # a leaf of its own (Captum would warn and set it)
        return InputXGradient(probability).attribute(x, target=target, additional_forward_args=(lengths,))

    return _captum_importance(model, tokens, lengths, attribute, "gradient x input", aggregation)


def _captum_importance(
    model: AttentionClassifier, tokens: Tensor, lengths: Tensor, attribute, name: str, aggregation: str = "sum"
) -> Tensor:
    """|sum_e attribution| (or ``aggregation``'s score, :func:`aggregate_attribution`) per token of the predicted class's probability, L1-normalised over
    the real tokens; ``attribute(probability, embedded, real, target, lengths)`` runs a Captum
    method on the embeddings (``probability(x, lengths)``: the model's output distribution)."""
    lengths = check_model_inputs(model, tokens, lengths)
    with eval_mode(model):
        embedded = model.embed(tokens).detach()
        _check_rows(
            torch.isfinite(embedded).flatten(2).all(2) | ~token_mask(lengths, tokens.shape[1]),
            "model.embed returned NaN or infinite embeddings in row {row}",
        )
        real = token_mask(lengths, tokens.shape[1], model.lead, model.trail)
        with torch.no_grad():
            logits = check_logits(
                _logits(model, embedded, lengths),
                tokens.shape[0],
                source="model",
                inputs="the input rows",
                on=" on the input rows",
            )
        with torch.enable_grad(), eval_mode_backward(model, embedded.device):
            attribution = attribute(
                lambda x, n: output_distribution(_logits(model, x, n)), embedded, real, decision(logits), lengths
            )
    score = aggregate_attribution(attribution.detach(), aggregation).to(embedded.dtype)
    return _normalised(score, lengths, model, name, "attributions")


def _logits(model: AttentionClassifier, embedded: Tensor, lengths: Tensor) -> Tensor:
    """The model's logits [B, C] on ``embedded`` (encode -> attend -> decoder)."""
    hidden = model.encode(embedded, lengths)
    return model.decoder(torch.einsum("bt,bth->bh", model.attend(hidden, lengths), hidden))


def _normalised(score: Tensor, lengths: Tensor, model: AttentionClassifier, name: str, what: str) -> Tensor:
    """score [B, T] on all positions -> [B, T - lead] on the real tokens, L1-normalised per row
    (a row of zeros stays zero); ValueError naming the first row that is not finite."""
    score, real = real_tokens(score, lengths, model)
    mask = token_mask(real, score.shape[1])
    score = score.masked_fill(~mask, 0)
    total = score.sum(1, keepdim=True)
    _check_rows(
        torch.isfinite(score).all(1, keepdim=True) & torch.isfinite(total),
        f"{name} is not finite in row {{row}}: the {what} w.r.t. the embeddings, times the embeddings, "
        "hold NaN or inf, or overflow",
    )
    return torch.where(total > 0, score / total.clamp_min(torch.finfo(score.dtype).tiny), score)


def _check_rows(ok: Tensor, what: str) -> None:
    """ValueError ``what``, its ``{row}`` the first row of ``ok`` [B, ...] (bool) with a False entry."""
    bad = ~ok.flatten(1).all(1)
    if bad.any():
        raise ValueError(what.format(row=int(bad.nonzero()[0])))
