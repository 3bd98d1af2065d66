"""Plain references for J&W's pair model (``models/pair.py``), one example at a time and
written from their description (``model/Question_Answering.py``, ``modules/Attention.py``
``TanhQAAttention``/``DotQAAttention``, ``modules/Decoder.py`` ``AttnDecoderQA``), not from the
row layout the model uses: the passage and the question are two separate sequences, each run
through its own encoder alone; no question part, no ``[h ; q]`` states.

Used by tests/models/test_pair.py to prove the model and the procedures on it (leave-one-out
deletes a word of the passage text and nothing else)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics.distances import tvd
from attnmetrics.outputs import output_distribution


def _question_state(model, question: list[int]) -> Tensor:
    """J&W's ``Q.last_hidden``: the question encoder run on the question alone."""
    encoder, kind = model.question_encoder, model.config.encoder
    x = model.embedding.weight[torch.tensor(question)]  # [m, E], the question half's rows
    if kind in ("lstm", "gru"):
        _, h_n = encoder.rnn(x[None])
        h_n = h_n[0] if kind == "lstm" else h_n  # LSTM: (h_n, c_n)
        return torch.cat([h_n[0, 0], h_n[1, 0]])  # forward's last state, backward's first
    if kind == "cnn":
        out = torch.cat([torch.relu(conv(x.T[None]))[0] for conv in encoder.convs])  # [H, m]
        return out.amax(1)
    return torch.tanh(encoder.proj(x)).mean(0)


def pair_distribution_reference(model, passage: list[int], question: list[int]) -> Tensor:
    """The output distribution [C] for one passage (word ids with its ``<SOS>`` and ``<EOS>``) and
    question (word ids of the passage vocabulary; the question half of the table is ``V + id``)."""
    V = model.config.vocab_size
    ids = torch.tensor(passage)
    h = model.passage_encoder(model.embedding.weight[ids][None], torch.tensor([len(ids)]))[0]  # [n + 2, H]
    q = _question_state(model, [V + w for w in question])
    H = h.shape[1]
    words = h[1:-1]  # attention over the passage's words (J&W mask <SOS>/<EOS>)
    if model.config.attention == "tanh":
        W, b = model.attention.proj.weight, model.attention.proj.bias  # [A, 2H]: attn1p | attn1q
        v = model.attention.v.weight[0]
        scores = [v @ torch.tanh(W[:, :H] @ h_t + W[:, H:] @ q + b) for h_t in words]
    else:
        scores = [h_t @ q / H**0.5 for h_t in words]
    if len(words) == 0:  # a one-word passage with its word deleted: nothing to attend to, and the
        # protocol's zero context is the zero vector, question part included (J&W's code gives NaN)
        context, q = h.new_zeros(H), h.new_zeros(H)
    else:
        a = torch.softmax(torch.stack(scores), 0)
        context = sum(a_t * h_t for a_t, h_t in zip(a, words))
    first, last = model.decoder[0], model.decoder[2]  # linear_1p | linear_1q, then linear_2
    logits = last(torch.tanh(first.weight[:, :H] @ context + first.weight[:, H:] @ q + first.bias))
    return output_distribution(logits[None])[0]


def pair_leave_one_out_reference(
    model, examples: list[tuple[list[int], list[int]]], mode: str = "delete", mask_token: int | None = None
) -> list[Tensor]:
    """J&W's leave-one-out on the passage: for each example ``(passage with its <SOS>/<EOS>,
    question)`` and each word t of the passage, delete it (``mode="delete"``) or replace it by
    ``mask_token`` (``"mask"``), the question untouched, and take the TVD between the outputs.
    One tensor [n] per example, n its passage's words."""
    out = []
    model.eval()
    with torch.no_grad():
        for passage, question in examples:
            y = pair_distribution_reference(model, passage, question)
            scores = []
            for t in range(1, len(passage) - 1):
                replaced = [] if mode == "delete" else [mask_token]
                edited = passage[:t] + replaced + passage[t + 1 :]
                y_t = pair_distribution_reference(model, edited, question)
                scores.append(tvd(y[None], y_t[None])[0])
            out.append(torch.stack(scores))
    return out
