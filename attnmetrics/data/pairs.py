"""Examples over a pair of texts, J&W 2019's other half (sec. 3, Table 1): a passage and a
question about it (question answering: bAbI, CNN) or a premise and a hypothesis (natural
language inference: SNLI). The model attends over the passage (premise) conditioned on the
question (hypothesis); every procedure perturbs and explains the passage only.

An example is ``(Pair(passage, question), label)``: the same ``(text, label)`` shape as the
single-text sets, so :class:`~attnmetrics.data.corpora.Splits` holds either; ``classes[label]``
names the answer (an entity) or the NLI label.
"""

from __future__ import annotations

from typing import NamedTuple


class Pair(NamedTuple):
    """The two texts of one example, each tokenised by :func:`attnmetrics.data.tokens.tokenize`.

    passage: the text attended over, explained and perturbed (bAbI's story before the question,
        CNN's article, SNLI's premise).
    question: the text the attention is conditioned on, held fixed by every procedure (the
        question, or SNLI's hypothesis)."""

    passage: str
    question: str


def is_pair(text: object) -> bool:
    """Whether an example's text is a :class:`Pair` (a pair task) rather than one string."""
    return isinstance(text, Pair)


def check_pairs(name: str, examples: list[tuple[Pair, int]], classes: tuple[str, ...]) -> None:
    """ValueError naming the data set and the first example whose passage or question is empty
    (no token) or whose label is not an index of ``classes``."""
    from attnmetrics.data.tokens import tokenize

    for i, (pair, label) in enumerate(examples):
        if not isinstance(pair, Pair):
            raise ValueError(f"{name}: example {i} is not a Pair(passage, question), got {type(pair).__name__}")
        if not tokenize(pair.passage):
            raise ValueError(f"{name}: example {i} has an empty passage (no token): {pair!r}")
        if not tokenize(pair.question):
            raise ValueError(f"{name}: example {i} has an empty question (no token): {pair!r}")
        if not 0 <= label < len(classes):
            raise ValueError(f"{name}: example {i} has label {label}, expected an index of its {len(classes)} classes")
