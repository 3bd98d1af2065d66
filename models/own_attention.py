"""GPT-1's own attention as the procedures' attention (docs/definitions.md §15): the last
layer's attention row of the ``<extract>`` position, per head, decomposed so that every
procedure's edit of it is exact.

For row b with L positions (``<start>``, the real tokens ``1 .. L-2``, ``<extract>`` at
``p = L-1``) and head h of the last block, with attention ``a[h, s]`` (s <= p), value vectors
``U[h, s] = v[h, s] @ W_o[:, h]^T`` (the head's slice of the output projection), output bias
``b_o`` and the block's input ``x_p``:

- the real tokens' mass ``m_h = sum_{t real} a[h, t]`` and their share ``alpha[h, t] = a[h, t] /
  m_h`` (the tested attention: sums to 1 over the real tokens; computed as the softmax of the
  head's scores over the real tokens alone, which is the same and never underflows);
- the special positions keep their weights: ``S_h = a[h, 0] U[h, 0] + a[h, p] U[h, p]``;
- ``values[h, t] = m_h U[h, t] + S_h + (x_p + b_o) / heads``.

Then ``sum_h sum_t alpha[h, t] values[h, t] = attn_p + x_p`` (the attention sublayer's output
plus its residual) exactly whenever every head's ``alpha`` sums to 1 — as it does after a
renormalised removal, a permutation or an adversary's softmax. An edit of ``alpha`` is
therefore the model with the real tokens' weights edited within their mass ``m_h`` and the
special positions' weights kept. The decoder is the rest of the network: the block's first
layer norm, its feed-forward sublayer and second layer norm, and the classifier
(:class:`ExtractDecoder`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnmetrics.models.gpt import Block, causal_mask
from attnmetrics.protocol import FactoredValues, TestedAttention, token_mask


class ExtractDecoder(nn.Module):
    """The network after the last block's attention at ``<extract>``, for GPT-1's read-out:
    ``c`` (attention output plus residual) ``[N, d]`` -> ``LN1`` -> ``+ MLP`` -> ``LN2`` ->
    classifier ``[N, C]``. Shares the model's modules (no copies)."""

    def __init__(self, block: Block, classifier: nn.Module):
        super().__init__()
        self.block, self.classifier = block, classifier

    def forward(self, context: Tensor) -> Tensor:
        x = self.block.ln_1(context)
        return self.classifier(self.block.ln_2(x + self.block.mlp(x)))


@torch.no_grad()
def extract_attention(model, tokens: Tensor, lengths: Tensor) -> TestedAttention:
    """The decomposition of the module docstring for a :class:`~attnmetrics.models.gpt_classifier.GPTClassifier`
    with ``attention="extract"`` (call it in eval mode).

    Args:
        model: the classifier.
        tokens: ``[B, T]`` int64, ``<start> ids <extract>`` and right padding.
        lengths: ``[B]`` int64 in ``[2, T]`` (every row has ``<start>`` and ``<extract>``).

    Returns:
        :class:`~attnmetrics.protocol.TestedAttention` with attention ``[B, heads, T - 1]``
        and values ``[B, heads, T - 1, d]`` over the real tokens (columns from ``<start>``'s
        successor on, as :func:`attnmetrics.protocol.real_tokens` slices; zero past each
        row's ``L - 2``), in the model's dtype.
    """
    if model.attention is not None:
        raise ValueError(
            f"the own-attention decomposition is for GPT-1's extract read-out (attention='extract'); this model "
            f"reads out through its {model.attention_name!r} attention head, whose own attention is the tested one"
        )
    B, T = tokens.shape
    if bool((lengths < 2).any()):
        raise ValueError(f"lengths must be >= 2 (<start> and <extract>), got min {int(lengths.min())}")
    blocks = model.gpt.blocks
    mask = causal_mask(lengths, T)
    x = model.embed(tokens)
    for block in blocks[:-1]:
        x, _ = block(x, mask)
    last = blocks[-1]
    attn = last.attn
    q, k, v = attn.heads(x)  # [B, heads, T, d / heads]
    _, probs = attn.attention(q, k, v, mask)  # [B, heads, T, T]
    heads, dh = attn.n_head, v.shape[-1]
    rows = torch.arange(B, device=tokens.device)
    p = lengths - 1
    a = probs[rows, :, p]  # [B, heads, T]: the <extract> row of every head
    w_o = attn.proj.weight.view(-1, heads, dh)  # [d, heads, dh]
    real = token_mask(lengths, T, model.lead, model.trail)  # [B, T]
    attention, values, factored, context = decompose_row(
        a, q[rows, :, p], k, v, w_o, attn.proj.bias, x[rows, p], q.shape[-1] ** -0.5, real, model.lead
    )
    decoder = ExtractDecoder(last, model.decoder)
    return TestedAttention(
        attention,
        values,
        lengths - model.lead - model.trail,
        decoder(context),  # the model's own logits, also for rows without a real token
        decoder,
        factored,
    )


def decompose_row(
    a: Tensor,
    q_p: Tensor,
    k: Tensor,
    v: Tensor,
    w_o: Tensor,
    b_o: Tensor,
    x_p: Tensor,
    scaling: float,
    real: Tensor,
    lead: int,
) -> tuple[Tensor, Tensor, FactoredValues, Tensor]:
    """The module docstring's decomposition of one position's last-layer attention row, per head:
    GPT-1's ``<extract>`` here and the Hugging Face adapter's pooled position
    (:meth:`attnmetrics.models.hf.HFClassifier.tested_attention`).

    Args:
        a: ``[B, heads, T]``, the position's attention probabilities (every column, specials included).
        q_p: ``[B, heads, dh]``, its queries; k, v: ``[B, heads, T, dh]``, every position's keys and values.
        w_o: ``[d, heads, dh]``, the output projection (out, in), its input split by head; b_o: ``[d]``, its bias.
        x_p: ``[B, d]``, the residual added to the attention output at the position.
        scaling: the scores' scale (``dh ** -0.5``).
        real: ``[B, T]`` bool, the real tokens.
        lead: columns before the first real token, sliced off (:func:`attnmetrics.protocol.real_tokens`).

    Returns:
        (attention ``[B, heads, T - lead]``: alpha, each head's share over the real tokens;
        values ``[B, heads, T - lead, d]`` and the same :class:`FactoredValues`, zero past each
        row's real tokens; the context ``[B, d]``: the attention output plus residual at the position),
        in ``v``'s dtype.
    """
    heads = v.shape[1]
    U = torch.einsum("bhsk,dhk->bhsd", v, w_o)  # [B, heads, T, d]: each head through its slice
    mass = (a * real[:, None, :]).sum(-1, keepdim=True)  # [B, heads, 1]
    # The real tokens' share as a softmax over their scores alone (= a / mass, without the
    # underflow of a / mass when a head puts almost all its weight on the special positions)
    scores = torch.einsum("bhk,bhtk->bht", q_p, k) * scaling
    alpha = torch.softmax(scores.masked_fill(~real[:, None, :], -torch.inf), -1).nan_to_num(0.0)
    special = torch.einsum("bhs,bhsd->bhd", a * ~real[:, None, :], U)  # the special positions, fixed weights
    residual = (x_p + b_o) / heads  # [B, d]
    values = mass[..., None] * U + (special + residual[:, None, :])[:, :, None, :]
    values = values[:, :, lead:] * real[:, None, lead:, None]
    # the same values factored: each head's own vectors, then its slice of the projection
    per_head = (mass[..., None] * v)[:, :, lead:] * real[:, None, lead:, None]
    factored = FactoredValues(per_head.contiguous(), w_o.permute(1, 2, 0).contiguous(), special + residual[:, None, :])
    context = torch.einsum("bhs,bhsd->bd", a, U) + heads * residual
    return alpha[:, :, lead:].contiguous(), values.contiguous(), factored, context
