"""Jain & Wallace's own adversarial-attention loop (J&W 2019, sec. 4.3), transcribed as a test reference.

A plain PyTorch transcription of ``AdversaryMulti.forward`` and of the statistic their plots report, read
from successar/AttentionExplanation at commit 425a89a49a8b3bffc3f5e8338287e2ecd0cf1fa2 (written from
reading it, not copied). Line numbers below are of that commit. "BC" is ``model/Binary_Classification.py``,
"QA" ``model/Question_Answering.py``, "utils" ``model/modelUtils.py``, "dec" ``model/modules/Decoder.py``.

Their loop, step by step (:func:`jw_adversarial_reference`, :func:`jw_loss`):

1. Masks (utils:39): per row ``[1] + [0] * (len - 2) + [1] * (pad + 1)``: ``<SOS>``, ``<EOS>`` and the
   padding are masked; ``len`` counts both specials. Here: ``lead``/``trail`` positions at each end.
2. Start (BC:32-33): ``log(generate_uniform_attn())``, i.e. ``log(1 / len)`` at every position (utils:58-62,
   ``len`` with the specials), repeated K = 5 times, plus ``3 * torch.randn((B, K, maxlen))`` from torch's
   global generator (here ``generator``, or the ``noise`` given).
3. Optimiser (BC:38): ``torch.optim.Adam(lr=0.01, amsgrad=True)`` on those log-attentions, 500 steps (BC:40).
4. Each step (BC:41-57): ``log_attn = z + 1 - 1`` (a copy, rounded through ``+ 1``), masked positions set
   to ``-inf``, softmax over the row (BC:41-43); contexts ``sum_t a_kt h_t`` and the decoder on them
   (``AttnDecoder.get_output``, dec:68-79; the decoder is one ``nn.Linear``, dec:34-36).
5. Output change: sigmoid outputs (their binary tasks): ``sum_o |sigmoid(y_k) - sigmoid(y)|`` (BC:47-48);
   softmax outputs (their QA / NLI models): ``sum_c |softmax(y_k) - softmax(y)|``, the L1 distance, twice
   the TVD (QA:70-76). Hinge ``ReLU(change - 1e-2)`` (BC:48, QA:52).
6. Distances: ``jsd(p, q) = (KL(p || m) + KL(q || m)) / 2``, ``m = (p + q) / 2``, each KL with ``p`` clamped
   to [0, 1] and ``log(x + 1e-10)`` (utils:69-85); nats.
7. Loss (BC:53-54): ``sum_{b,k} [-JSD(a_bk, alpha_b) + 500 * hinge_bk] - mean_{i,j} sum_b JSD(a_bi, a_bj)``:
   the candidates' cross JSD ``[B, K, K, 1]`` is summed over the batch (``.sum(0)``) and averaged over the
   K x K ordered pairs, the zero diagonal included (``.mean()``).
8. After the last step (BC:59-63): the final softmax, the decoder, and for sigmoid outputs
   ``sigmoid(predict)``; the K candidates and their outputs are all returned (BC:342-351).

Their statistic (:func:`jw_emax_jsd`; Trainers/PlottingBC.py:109-129 ``plot_multi_adversarial``, QA's in
Trainers/PlottingQA.py:115-139): the original attention is appended as candidate K + 1 with output change 0;
the output change is ``mean_o |Δ sigmoid|`` (BC:115; for one output ``|Δp|``) or ``0.5 * sum_c |Δ softmax|``
(PlottingQA.py:121, the TVD); a candidate whose change is ``> 5e-2`` gets JSD -100 (BC:125; QA: -1); the JSD
is numpy's (common_code/common.py:84-98, the same 1e-10) over the real tokens ``[1 : L - 1]`` (BC:124);
``np.argmax``, so the first of equal maxima and the original only if no candidate beats it (BC:126). The
histogram ``eMaxJDS_Hist`` (BC:135, 143) is of these per-instance values. The original attention and
``yhat`` come from ``Model.evaluate`` (BC:155-184), in ``train()`` mode; their encoders have no dropout
(model/modules/Encoder.py), so it is the model's attention and output.

Where their code differs from :func:`attnmetrics.adversarial_attention` under ``--protocol jain-wallace``
(``diversity_weight = 0.16``, ``amsgrad = True``, every other option its default):

- Scale: their loss per row is K times ours (``-sum_k`` and ``500 sum_k`` against our means over k); Adam is
  invariant to the factor but for its ``eps = 1e-8`` (theirs acts as ``eps / K`` on our gradient).
- Diversity: ``mean_{K x K}`` counts each unordered pair twice and the zero diagonal: ``2 P / K^2 =
  (K - 1) / K`` times the mean over the P pairs, i.e. ``(K - 1) / K^2 = 0.16`` of it after the factor K. Our
  0.16 equals theirs only for K = 5 (the ``jain-wallace`` value is fixed, not derived from K).
- JSD: theirs with ``log(x + 1e-10)`` and a clamp; ours exact (padding excluded).
- The start: ``log(1 / len)`` counts the specials, ours ``log(1 / L)`` the real tokens: a constant shift
  per row, which neither the softmax nor the gradient sees. Their noise covers the full width (specials and
  padding included, then masked), from torch's global generator; ours ``torch.randn((B, K, T_real))`` from
  ``generator`` (or keyed by instance): the same distribution, other numbers.
- ``z + 1 - 1`` rounds the logits to the grid of ``1 + z`` (float32: ~1e-7) before each softmax; ours not.
- Softmax outputs: their hinge is on the L1 distance, ``ReLU(L1 - 0.01)``, i.e. a TVD margin of 0.005
  (QA:52, 74); ours ``ReLU(TVD - 0.01)``. The selection threshold is the TVD ``<= 0.05`` in both. For one
  sigmoid output their ``|Δp|`` is our TVD of ``(1 - p, p)`` exactly. (Several sigmoid outputs,
  multi-label: their hinge sums ``|Δσ|`` over outputs and their selection averages it; ours has one
  softmax or one sigmoid.)
- Selection: equal JSDs go to the lower k and then the original in theirs (``np.argmax``), to the original
  in ours; the reported JSD is the same either way. A row with one real token: all their candidates equal
  the original (JSD 0), ours reports the original. A row with no real token: their softmax over all
  ``-inf`` is NaN; ours reports the original.
- Precision: theirs float32 on a GPU; this transcription and ours run in the inputs' dtype.
- Batching: their loss is summed over a batch of rows and their Adam is element-wise, so rows are
  independent in both (ours sorts rows into chunks; the trajectory of a row does not depend on it).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

Output = Literal["sigmoid", "softmax"]

#: J&W's margins and weights (BC:48, 53; PlottingBC.py:125).
HINGE_MARGIN = 1e-2
HINGE_WEIGHT = 500.0
EPSILON = 5e-2


class JWAdversary(NamedTuple):
    """What ``AdversaryMulti`` leaves in ``data`` (BC:59-63).

    attention: ``[B, K, T]`` the candidates (``attn_volatile``), 0 at masked positions.
    outputs: ``[B, K, O]`` sigmoid probabilities (``output="sigmoid"``, BC:63) or softmax distributions
        (``"softmax"``; QA returns the logits, BC:68, whose softmax this is).
    log_attention: ``[B, K, T]`` the optimised log-attentions (``log_attn_volatile``).
    """

    attention: Tensor
    outputs: Tensor
    log_attention: Tensor


def jw_masks(lengths: Tensor, width: int, lead: int = 1, trail: int = 1) -> Tensor:
    """``[B, T]`` bool, True where J&W mask (utils:39): the ``lead`` first positions, and from
    ``lengths - trail`` on (the ``<EOS>`` and the padding)."""
    t = torch.arange(width, device=lengths.device)
    return (t < lead) | (t >= (lengths - trail)[:, None])


def jw_kld(a1: Tensor, a2: Tensor) -> Tensor:
    """utils:69-79: ``sum a1 (log(a1 + 1e-10) - log(a2 + 1e-10))`` over the last dim, inputs clamped to [0, 1]."""
    a1 = torch.clamp(a1, 0, 1)
    a2 = torch.clamp(a2, 0, 1)
    return (a1 * (torch.log(a1 + 1e-10) - torch.log(a2 + 1e-10))).sum(-1)


def jw_jsd(p: Tensor, q: Tensor) -> Tensor:
    """utils:81-85: ``[..., 1]`` JSD in nats with their 1e-10."""
    m = 0.5 * (p + q)
    return (0.5 * (jw_kld(p, m) + jw_kld(q, m))).unsqueeze(-1)


def jw_output_diff(predict_new: Tensor, predict: Tensor, output: Output = "sigmoid") -> Tensor:
    """The output change ``[B, K, 1]`` from logits ``[B, K, O]`` and the original ``[B, 1, O]``:
    ``sum |Δ sigmoid|`` (BC:47-48) or ``sum |Δ softmax|`` (QA:70-76, twice the TVD)."""
    if output == "sigmoid":
        return torch.abs(torch.sigmoid(predict_new) - torch.sigmoid(predict)).sum(-1, keepdim=True)
    if output == "softmax":
        return torch.abs(torch.softmax(predict_new, -1) - torch.softmax(predict, -1)).sum(-1, keepdim=True)
    raise ValueError(f"output must be 'sigmoid' or 'softmax', got {output!r}")


def _attend(log_attention: Tensor, masks: Tensor) -> Tensor:
    """BC:41-43: ``z + 1 - 1`` (their copy before the in-place mask), -inf where masked, softmax."""
    log_attn = log_attention + 1 - 1
    log_attn = log_attn.masked_fill(masks.unsqueeze(1), -float("inf"))
    return torch.softmax(log_attn, -1)


def _decode(attn: Tensor, hidden: Tensor, decoder) -> Tensor:
    """dec:72-74: contexts ``(attn[..., None] * hidden[:, None]).sum(2)`` ``[B, K, H]`` through the decoder."""
    return decoder((attn.unsqueeze(-1) * hidden.unsqueeze(1)).sum(2))


def jw_loss(
    log_attention: Tensor,
    attention: Tensor,
    hidden: Tensor,
    decoder,
    masks: Tensor,
    predict: Tensor,
    output: Output = "sigmoid",
) -> Tensor:
    """One step's loss (BC:41-54): log-attentions ``[B, K, T]``, the original attention ``[B, T]`` and
    hidden states ``[B, T, H]``, ``masks`` from :func:`jw_masks`, the original logits ``[B, O]``."""
    attn = _attend(log_attention, masks)  # (B, K, T)
    predict_new = _decode(attn, hidden, decoder)  # (B, K, O)
    diff = torch.relu(jw_output_diff(predict_new, predict.unsqueeze(1), output) - HINGE_MARGIN)  # (B, K, 1)
    jsd = jw_jsd(attn, attention.unsqueeze(1))  # (B, K, 1)
    cross_jsd = jw_jsd(attn.unsqueeze(1), attn.unsqueeze(2))  # (B, K, K, 1)
    loss = -(jsd**1) + HINGE_WEIGHT * diff
    return loss.sum() - cross_jsd.sum(0).mean()


def jw_adversarial_reference(
    attention: Tensor,
    values: Tensor,
    decoder,
    lengths: Tensor,
    lead: int = 1,
    trail: int = 1,
    *,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
    steps: int = 500,
    candidates: int = 5,
    lr: float = 0.01,
    output: Output = "sigmoid",
) -> JWAdversary:
    """J&W's ``AdversaryMulti.forward`` (BC:29-63) on one batch.

    attention: ``[B, T]`` the model's attention over the whole rows, specials included (0 there).
    values: ``[B, T, H]`` the hidden states it averages (``data.hidden``).
    decoder: contexts ``[..., H]`` -> logits ``[..., O]`` (their ``AttnDecoder.decode``, an ``nn.Linear``).
    lengths: ``[B]`` row lengths counting ``lead`` + ``trail`` specials (their ``data.lengths``).
    noise: ``[B, K, T]`` standard normal noise to use instead of ``torch.randn((B, K, T), generator=generator)``
        (theirs: the global generator, BC:33).
    output: ``"sigmoid"`` (BC) or ``"softmax"`` (QA's ``output_diff``).
    """
    batch, width = attention.shape
    masks = jw_masks(lengths, width, lead, trail)
    hidden = values.detach()  # BC:30
    alpha = attention.detach()
    with torch.no_grad():
        predict = _decode(alpha.unsqueeze(1), hidden, decoder)[:, 0]  # data.predict (the model's forward)
    uniform = (1.0 / lengths.to(attention.dtype))[:, None].expand(batch, width)  # utils:58-62
    new_attn = torch.log(uniform).unsqueeze(1).repeat(1, candidates, 1)  # BC:32
    if noise is None:
        noise = torch.randn(new_attn.size(), generator=generator, dtype=attention.dtype, device=attention.device)
    new_attn = (new_attn + noise * 3).detach().requires_grad_(True)  # BC:33-35
    optim = torch.optim.Adam([new_attn], lr=lr, amsgrad=True)  # BC:38
    for _ in range(steps):  # BC:40
        with torch.enable_grad():
            loss = jw_loss(new_attn, alpha, hidden, decoder, masks, predict, output)
            # BC:55-56, zero_grad + backward; the decoder's parameters are frozen (BC:320-324): no grad for them
            (new_attn.grad,) = torch.autograd.grad(loss, [new_attn])
        optim.step()
    with torch.no_grad():  # BC:59-63
        attn = _attend(new_attn, masks)
        predict_new = _decode(attn, hidden, decoder)
        outputs = torch.sigmoid(predict_new) if output == "sigmoid" else torch.softmax(predict_new, -1)
    return JWAdversary(attn, outputs, new_attn.detach())


class JWStatistic(NamedTuple):
    """J&W's per-instance adversarial statistic (PlottingBC.py:120-129).

    emax_jsd: ``[B]`` the largest JSD over the candidates (and the original) whose output change is within
        the threshold (``eMaxJDS``); -100 never occurs (the original, change 0, always qualifies).
    position: ``[B]`` int64 index of the kept one in ``0 .. K`` (K: the original).
    attention: ``[B, T]`` the kept attention.
    output_change: ``[B]`` its output change.
    """

    emax_jsd: Tensor
    position: Tensor
    attention: Tensor
    output_change: Tensor


def jw_emax_jsd(
    attention: Tensor,
    outputs: Tensor,
    original_attention: Tensor,
    original_outputs: Tensor,
    lengths: Tensor,
    lead: int = 1,
    trail: int = 1,
    *,
    epsilon: float = EPSILON,
    output: Output = "sigmoid",
) -> JWStatistic:
    """``plot_multi_adversarial`` (PlottingBC.py:109-129; PlottingQA.py:115-139 for softmax outputs).

    attention ``[B, K, T]`` and outputs ``[B, K, O]`` (probabilities, as :func:`jw_adversarial_reference`
    returns them); the original attention ``[B, T]`` and outputs ``[B, O]`` (sigmoid probabilities / softmax
    distribution). The original is appended as candidate K (BC:114, 117); the output change is
    ``mean_o |Δp|`` (BC:115) or ``0.5 sum_c |Δp|`` (PlottingQA.py:121, 124); the JSD is theirs (1e-10) over
    positions ``lead .. lengths - trail`` (BC:124); a change ``> epsilon`` sets the JSD to -100 (BC:125);
    the first maximum wins (``np.argmax``, BC:126).
    """
    attn = torch.cat([attention, original_attention.unsqueeze(1)], 1)  # (B, K+1, T)
    preds = torch.cat([outputs, original_outputs.unsqueeze(1)], 1)  # (B, K+1, O)
    if output == "sigmoid":
        delta_y = (preds - original_outputs.unsqueeze(1)).abs().mean(-1)
    else:
        delta_y = 0.5 * (preds - original_outputs.unsqueeze(1)).abs().sum(-1)
        delta_y[:, -1] = 0.0  # PlottingQA.py:124: the original's change is appended as 0
    batch, k1, width = attn.shape
    emax, pos = [], []
    for i in range(batch):
        lo, hi = lead, int(lengths[i]) - trail  # attn[i][1:L-1]
        delta_attn = torch.stack([jw_jsd(original_attention[i, lo:hi], attn[i, k, lo:hi])[0] for k in range(k1)])
        delta_attn[delta_y[i] > epsilon] = -100.0
        p = int(torch.argmax(delta_attn))  # torch.argmax, like np.argmax, returns the first maximal index
        emax.append(delta_attn[p])
        pos.append(p)
    position = torch.tensor(pos, dtype=torch.int64, device=attention.device)
    rows = torch.arange(batch, device=attention.device)
    return JWStatistic(torch.stack(emax), position, attn[rows, position], delta_y[rows, position])
