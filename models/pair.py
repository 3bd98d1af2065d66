"""J&W 2019's model for a pair of texts (question answering, inference; their
``model/Question_Answering.py`` and ``modules/{Encoder,Attention,Decoder}.py``): the passage
(premise) and the question (hypothesis) each encoded by an encoder of their own, attention over
the passage conditioned on the question's final state, and a decoder over [context; question].

It implements ``attnmetrics.protocol.AttentionClassifier`` with the question riding in each row
as fixed trailing positions, so that every procedure runs on it unchanged and perturbs the
passage only. A row is laid out (:class:`PairVocabulary`)::

    <SOS> p_1 ... p_n <EOS> | q_1 ... q_m <PAD> ... <PAD>      (the question part: Q slots)

``lead = 1`` and ``trail = 1 + Q``: the procedures' real tokens (the ones they explain, delete,
mask, permute, attend over) are the passage's, and the question part is a row's last Q
positions whatever is deleted before it. Question words have ids of their own (``V + id``: the
embedding table has a passage half and a question half, J&W's two encoders' own embeddings);
``<PAD>`` (id 0, a zero vector) fills the question part after the question.

Each passage state carries the question's encoding: ``hidden[t] = [h_t ; q]`` (``[B, T, 2H]``).
Since attention sums to 1 over the passage, the context ``sum_t a_t hidden[t]`` is exactly
``[sum_t a_t h_t ; q]``, J&W's decoder input, and any imposed attention (the permutation, the
adversary's, single-weight removal) mixes the passage states with the question held fixed, as
J&W's ``AdversaryMulti`` and ``permute_attn`` do. A passage with no word left (a one-word
passage's deletion) has nothing to attend to: its context is the zero vector, question part
included, as the single-text classifier's (J&W's code gives NaN there).

- attention ``tanh``: ``v . tanh(W_p h_t + W_q q + b)`` (J&W's ``TanhQAAttention``: ``attn1p``,
  ``attn1q``, ``attn2``; one linear map of ``[h_t ; q]``, the two biases summed), width H / 2;
  ``dot``: ``h_t . q / sqrt(H)`` (``DotQAAttention``).
- decoder: ``W_2 tanh(W_1p c + W_1q q + b_1) + b_2`` (``AttnDecoderQA.decode``), width H / 2.
- question encoders' final state: a BiLSTM's last forward and first backward states (``h_n``),
  the CNN's max over positions, the average encoder's mean over the question's words.

Where this differs from J&W's code: their softmax is over every vocabulary word with a mask
(all ones for bAbI; CNN's possible answers), here over the answers of the training split; the
average encoder's question mean is over the question's words (theirs averages padding too,
so a question's encoding depends on its batch); the question carries no ``<SOS>``/``<EOS>``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import Tensor, nn

from attnmetrics._validation import checked_ids
from attnmetrics.data.pairs import Pair, is_pair
from attnmetrics.data.tokens import EOS, PAD, SOS, UNK, tokenize
from attnmetrics.models.classifier import ENCODERS, AttentionForward, TanhAttention, _masked_softmax
from attnmetrics.models.deletions import delete_positions, mask_positions
from attnmetrics.models.text import Vocabulary
from attnmetrics.protocol import token_mask

#: attention over the passage conditioned on the question
PAIR_ATTENTIONS = ("tanh", "dot")
#: the passage encoders (J&W's QA experiments: lstm, average, cnn)
PAIR_ENCODERS = ("lstm", "gru", "cnn", "average")


class DotQuestionAttention(nn.Module):
    """J&W's ``DotQAAttention``: score_t = h_t . q / sqrt(H) over ``hidden[t] = [h_t ; q]``
    (``[B, T, 2H]``), softmax over the positions where ``mask`` is True, 0 elsewhere."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        h, q = hidden[..., : self.width], hidden[..., self.width :]
        return _masked_softmax((h * q).sum(-1) * self.width**-0.5, mask)


@dataclass
class PairModelConfig:
    """Everything needed to rebuild a :class:`PairAttentionClassifier` (saved beside its weights).

    ``vocab_size``: the passage vocabulary V (ids 0-3 the specials); the embedding table has 2V
    rows, question words at ``V + id``. ``question_width``: Q, the question part's slots.
    ``hidden_size``: per direction for ``lstm``/``gru`` (H = 2 hidden_size), the whole output for
    ``cnn``/``average``. ``num_classes``: the answers (QA) or the labels (NLI), >= 2."""

    vocab_size: int
    question_width: int
    num_classes: int
    embed_dim: int = 50
    hidden_size: int = 32
    encoder: str = "lstm"
    attention: str = "tanh"
    kind: str = "pair"

    @property
    def lead(self) -> int:
        return 1

    @property
    def trail(self) -> int:
        return 1 + self.question_width

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PairModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown pair model config keys: {sorted(unknown)}")
        return cls(**d)


class PairAttentionClassifier(AttentionForward, nn.Module):
    """J&W's QA/NLI model on the attention-classifier protocol (module docstring).

    ``forward(tokens [B, T], lengths [B])`` -> ``(logits [B, C], attention [B, T])``; attention is
    over the passage's words only (0 at ``<SOS>``, ``<EOS>``, the question part and padding).
    """

    def __init__(self, config: PairModelConfig, embeddings: Tensor | None = None):
        """``embeddings``: an optional [V, E] start for both halves of the table (J&W give both
        encoders the same pre-trained vectors); ``<PAD>`` stays zero."""
        super().__init__()
        if config.encoder not in PAIR_ENCODERS:
            raise ValueError(f"unknown pair encoder {config.encoder!r}; choose from {PAIR_ENCODERS}")
        if config.attention not in PAIR_ATTENTIONS:
            raise ValueError(f"unknown pair attention {config.attention!r}; choose from {PAIR_ATTENTIONS}")
        if config.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 (a softmax over answers or labels), got {config.num_classes}")
        if config.question_width < 1:
            raise ValueError(f"question_width must be >= 1, got {config.question_width}")
        self.config = config
        self.lead, self.trail = config.lead, config.trail
        self.embedding = nn.Embedding(2 * config.vocab_size, config.embed_dim, padding_idx=PAD)
        if embeddings is not None:
            if tuple(embeddings.shape) != (config.vocab_size, config.embed_dim):
                raise ValueError(
                    f"embeddings must be [{config.vocab_size}, {config.embed_dim}], got {list(embeddings.shape)}"
                )
            with torch.no_grad():
                self.embedding.weight.copy_(torch.cat([embeddings, embeddings]))
                self.embedding.weight[PAD].zero_()
                self.embedding.weight[config.vocab_size + PAD].zero_()
        self.passage_encoder = ENCODERS[config.encoder](config.embed_dim, config.hidden_size)
        self.question_encoder = ENCODERS[config.encoder](config.embed_dim, config.hidden_size)
        H = self.width = self.passage_encoder.output_size
        if config.attention == "tanh":
            self.attention = TanhAttention(2 * H, H // 2)
        else:
            self.attention = DotQuestionAttention(H)
        self.decoder = nn.Sequential(nn.Linear(2 * H, H // 2), nn.Tanh(), nn.Linear(H // 2, config.num_classes))

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] int64 (passage ids < V, question ids in [V, 2V)) -> [B, T, E];
        ValueError for ids outside ``[0, 2V)``."""
        return self.embedding(checked_ids(tokens, 2 * self.config.vocab_size))

    def _question(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        """The question part's final state q [B, H] (module docstring)."""
        Q = self.config.question_width
        index = (lengths - Q)[:, None] + torch.arange(Q, device=lengths.device)  # [B, Q]
        words = embedded.gather(1, index[..., None].expand(-1, -1, embedded.shape[-1]))  # [B, Q, E]
        present = words.ne(0).any(-1)  # <PAD> is the zero vector (padding_idx)
        q_lengths = present.sum(1)
        gap = (present.cumsum(1) != torch.arange(1, Q + 1, device=lengths.device)).logical_and(present)
        if bool((q_lengths == 0).any() | gap.any()):  # one read from the device
            raise ValueError(
                "the question part (each row's last question_width positions) must hold the question's words "
                "first and then <PAD>, at least one word; got a row without a question or with a gap"
            )
        out = self.question_encoder(words, q_lengths)  # [B, Q, H], zero past q_lengths
        H = self.width
        if self.config.encoder in ("lstm", "gru"):
            half = H // 2
            rows = torch.arange(len(lengths), device=lengths.device)
            return torch.cat([out[rows, q_lengths - 1, :half], out[:, 0, half:]], -1)
        if self.config.encoder == "cnn":
            return out.amax(1)  # ReLU outputs >= 0 and 0 on padding: the max over the question's words
        return out.sum(1) / q_lengths[:, None].to(out.dtype)

    def encode(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        """embeddings [B, T, E], lengths [B] (passage, specials and question part) -> hidden
        [B, T, 2H]: ``[h_t ; q]`` at ``<SOS>``, the passage and ``<EOS>``, 0 on the question part
        and padding."""
        passage_lengths = lengths - self.config.question_width
        h = self.passage_encoder(embedded, passage_lengths)  # zero from passage_lengths on
        q = self._question(embedded, lengths)
        inside = token_mask(passage_lengths, embedded.shape[1]).unsqueeze(-1).to(h.dtype)
        return torch.cat([h, q[:, None, :] * inside], -1)

    def attend(self, hidden: Tensor, lengths: Tensor) -> Tensor:
        """hidden [B, T, 2H], lengths [B] -> attention [B, T], summing to 1 over the passage's
        words, exactly 0 elsewhere."""
        return self.attention(hidden, token_mask(lengths, hidden.shape[1], self.lead, self.trail))

    def deletion_logits(self, embedded: Tensor, lengths: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
        """``logits(rows [N], positions [N])`` -> ``[N, C]``: row ``rows[i]`` with passage
        position ``positions[i]`` deleted (the question part moves with the row's end), each
        deletion re-encoded (J&W's ``remove_and_run``)."""
        return self._edited(embedded, lengths, None)

    def masking_logits(self, embedded: Tensor, lengths: Tensor, mask_token: int) -> Callable[[Tensor, Tensor], Tensor]:
        """:meth:`deletion_logits` with the position replaced by ``mask_token`` (a passage id)."""
        replacement = self.embed(torch.tensor([[mask_token]], device=embedded.device))[0, 0].to(embedded.dtype)
        return self._edited(embedded, lengths, replacement)

    def _edited(self, embedded: Tensor, lengths: Tensor, replacement: Tensor | None) -> Callable:
        """The edits' logits. An edit of the passage leaves the question's state q as it is, so q
        is computed once per row; the recurrent and average encoders reuse the passage states an
        edit leaves unchanged (``models/deletions.py``, as the single-text classifier's), the CNN
        re-encodes each edited passage."""
        passage = lengths - self.config.question_width  # <SOS> passage <EOS>
        kept = passage - (0 if replacement is not None else 1)
        q = self._question(embedded, lengths)
        if hasattr(self.passage_encoder, "deletions"):
            states = self.passage_encoder.deletions(embedded, passage, replacement=replacement)
        else:

            def states(rows: Tensor, positions: Tensor) -> Tensor:
                if replacement is None:
                    edited = delete_positions(embedded, passage, rows, positions)
                else:
                    edited = mask_positions(embedded, passage, replacement, rows, positions)
                return self.passage_encoder(edited, kept[rows])

        def logits(rows: Tensor, positions: Tensor) -> Tensor:
            h = states(rows, positions)  # [N, W, H], zero from kept[rows] on
            inside = token_mask(kept[rows], h.shape[1])
            hidden = torch.cat([h, q[rows, None, :] * inside.unsqueeze(-1).to(h.dtype)], -1)
            attention = self.attention(hidden, token_mask(kept[rows], h.shape[1], self.lead, 1))
            return self.decoder(torch.bmm(attention.unsqueeze(1).to(hidden.dtype), hidden).squeeze(1))

        return logits

    def attention_parameters(self) -> list[nn.Parameter]:
        """The attention layer's parameters (J&W exempt them from weight decay)."""
        return list(self.attention.parameters())


def is_pair_model(model: object) -> bool:
    """Whether ``model`` is J&W's pair model (a :class:`PairAttentionClassifier`, or anything whose
    config says ``kind == "pair"``): the battery then perturbs the passage only (docs/definitions.md §21)."""
    return getattr(getattr(model, "config", None), "kind", None) == "pair"


class PairVocabulary(Vocabulary):
    """The passage vocabulary plus the question part's layout: a :class:`Pair` ->
    ``[<SOS>, passage ids, <EOS>, V + question ids, <PAD> ...]`` with exactly
    ``question_width`` question slots. Questions longer than that are cut to their first
    ``question_width`` words and counted (``last_truncated``); a passage or question without a
    word is refused."""

    filename = "vocab.json"

    def __init__(self, words: Iterable[str], question_width: int):
        super().__init__(words)
        if question_width < 1:
            raise ValueError(f"question_width must be >= 1, got {question_width}")
        self.question_width = question_width

    @classmethod
    def build_pairs(cls, pairs: Iterable[Pair], min_count: int = 1) -> PairVocabulary:
        """The words of the training pairs' passages and questions (one vocabulary, as J&W fit
        theirs on both), and Q = the longest training question."""
        pairs = list(pairs)
        if not pairs or not all(is_pair(p) for p in pairs):
            raise ValueError("build_pairs needs a non-empty list of Pair(passage, question)")
        base = Vocabulary.build([p.passage for p in pairs] + [p.question for p in pairs], min_count)
        return cls(base.itos[4:], max(len(tokenize(p.question)) for p in pairs))

    def encode_text(self, pair: Pair) -> list[int]:  # type: ignore[override]
        if not is_pair(pair):
            raise ValueError(f"a pair task's example must be a Pair(passage, question), got {type(pair).__name__}")
        passage = [self.stoi.get(w, UNK) for w in tokenize(pair.passage)]
        question = [len(self) + self.stoi.get(w, UNK) for w in tokenize(pair.question)]
        if not passage or not question:
            raise ValueError(f"a pair needs a word in its passage and its question, got {pair!r}")
        Q = self.question_width
        self.last_truncated += len(question) > Q
        return [SOS, *passage, EOS, *question[:Q], *[PAD] * (Q - min(len(question), Q))]

    def encode(self, texts: Iterable[Pair]) -> list[list[int]]:
        self.last_truncated = 0
        return [self.encode_text(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids -> words; a question id ``V + i`` reads as ``?word``."""
        V = len(self)
        return [self.itos[i] if i < V else "?" + self.itos[i - V] for i in ids]

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(
            json.dumps({"specials": self.itos[:4], "words": self.itos[4:], "question_width": self.question_width})
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> PairVocabulary:
        base = Vocabulary.load(path)
        width = json.loads(Path(path).read_text(encoding="utf-8")).get("question_width")
        if not isinstance(width, int):
            raise ValueError(f"{path}: not a pair vocabulary (no question_width)")
        return cls(base.itos[4:], width)
