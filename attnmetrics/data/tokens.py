"""J&W's word-level preprocessing, which the data sets (deduplication on the token sequence,
truncation) and the word vocabulary (:mod:`attnmetrics.models.text`) share, and the special
tokens every word vocabulary starts with (``<PAD> <UNK> <SOS> <EOS>``, ids 0-3; the GloVe
matrix gives them their rows)."""

from __future__ import annotations

import re

PAD, UNK, SOS, EOS = 0, 1, 2, 3
SPECIALS = ("<PAD>", "<UNK>", "<SOS>", "<EOS>")

_PTB_BRACKETS = re.compile(r"-LRB-|-RRB-")  # PTB-escaped round brackets (SST has no others)
_NON_WORD = re.compile(r"\W+")
_WORD = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")


def tokenize(text: str) -> list[str]:
    """J&W's preprocessing: drop PTB brackets, non-word characters to spaces, lower-case,
    tokens holding a digit -> ``qqq``, split on whitespace.

    >>> tokenize("-LRB- It's 2 good, 4ever! -RRB-")
    ['it', 's', 'qqq', 'good', 'qqq']
    """
    # Brackets go first: once '-' is a space, "-LRB-" would survive as the word "lrb".
    text = _PTB_BRACKETS.sub(" ", text)
    text = _NON_WORD.sub(" ", text).lower()
    return ["qqq" if _DIGIT.search(tok) else tok for tok in text.split()]


def truncate(text: str, max_tokens: int) -> str:
    """The shortest prefix of ``text`` holding its first ``max_tokens`` tokens, so that
    ``tokenize(truncate(text, n)) == tokenize(text)[:n]`` (J&W cut long documents this way).
    The original characters are kept, so reports still show the text as written."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    # tokenize's tokens are the \w runs left once PTB brackets are blanked; blanking them with
    # as many spaces keeps every character offset of the original.
    blanked = _PTB_BRACKETS.sub(lambda m: " " * len(m.group()), text)
    for k, match in enumerate(_WORD.finditer(blanked), 1):
        if k == max_tokens:
            return text[: match.end()]
    return text
