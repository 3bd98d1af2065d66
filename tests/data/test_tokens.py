"""J&W's preprocessing: tokenisation and truncation (attnmetrics.data.tokens)."""

from __future__ import annotations

import pytest

from attnmetrics.data.tokens import tokenize, truncate


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("A -LRB- very -RRB- good film .", ["a", "very", "good", "film"]),
        ("It 's the 21st Century 's best", ["it", "s", "the", "qqq", "century", "s", "best"]),
        ("1990s -- 3-D , 100 % fun", ["qqq", "qqq", "d", "qqq", "fun"]),
        ("co-writer\\/director won't", ["co", "writer", "director", "won", "t"]),
        ("``Wow'' ... WOW!", ["wow", "wow"]),
        ("snake_case stays", ["snake_case", "stays"]),  # \w keeps underscores
        ("", []),
    ],
)
def test_tokenize(text, tokens):
    assert tokenize(text) == tokens


@pytest.mark.parametrize(
    "text",
    ["-LRB- It 's 2 good , 4ever ! -RRB- yes x_y", "one", "", "  lead and trail  ", "a-LRB-b c\\/d e"],
)
def test_truncate_keeps_the_first_tokens_of_the_original(text):
    n_tokens = len(tokenize(text))
    for n in range(1, n_tokens + 2):
        cut = truncate(text, n)
        assert text.startswith(cut)
        assert tokenize(cut) == tokenize(text)[:n]
    assert truncate(text, n_tokens + 1) == text
    with pytest.raises(ValueError, match=">= 1"):
        truncate(text, 0)
