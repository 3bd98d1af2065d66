"""Byte-level BPE for the GPT language model (Radford et al. 2018, sec. 4.1), trained with the
``tokenizers`` library.

Byte-level (as GPT-2, rather than GPT-1's ftfy + spaCy + character BPE): every string encodes,
with no unknown token, and ``decode(encode(text)) == text`` exactly, because text is neither
normalised nor lower-cased. The four special tokens come first, so their ids are fixed:
``<pad>`` = 0 (padding, never attended), and GPT-1's input transformations (sec. 3.3):
``<start>`` = 1, ``<delim>`` = 2, ``<extract>`` = 3.

Vocabulary size: GPT-1 learnt 40,000 merges on the BooksCorpus (about 800M words). The Gutenberg
corpus here is 11.7 MB (2.1M words in the 17 training books), some 400 times smaller.
:data:`DEFAULT_VOCAB_SIZE` = 8,192. Measured (trained on the 17 books, scored on the held-out
``carroll-alice.txt``; "rare" = ids seen under 10 times in the encoded training books):

==========  ===============  ================  ==========
vocabulary  tokens per word  training tokens   rare ids
==========  ===============  ================  ==========
4,096       1.74             3.52M             210
8,192       1.60             3.23M             379
16,384      1.52             3.05M             1,417
40,000      1.45             2.91M             26,066
==========  ===============  ================  ==========

Past 8k, each doubling saves only 5% of the tokens while the rare ids — whose embeddings barely
train — grow fast (two thirds of a 40k vocabulary), and the embedding and output softmax grow
with it (40k × 256 would be 10M parameters, three times the small model's blocks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, START, DELIM, EXTRACT = 0, 1, 2, 3
SPECIALS = ("<pad>", "<start>", "<delim>", "<extract>")
DEFAULT_VOCAB_SIZE = 8192


class BPETokenizer:
    """A byte-level BPE ``tokenizers.Tokenizer`` whose first four ids are :data:`SPECIALS`.

    ``encode(text) -> list[int]`` adds no special token; ``decode(ids) -> str`` drops them.
    """

    def __init__(self, tokenizer: Tokenizer):
        for i, tok in enumerate(SPECIALS):
            if tokenizer.token_to_id(tok) != i:
                raise ValueError(f"tokenizer must have {tok!r} at id {i}, got {tokenizer.token_to_id(tok)}")
        # Text that spells a special token ("<pad>" in a book) encodes as plain text: only the
        # model's input transformations place special ids, so no text can forge one.
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, min_frequency: int = 2) -> BPETokenizer:
        """Learn merges on ``texts`` (the pre-training books only, never the held-out one) until
        ``vocab_size`` ids (4 specials + 256 bytes + merges), or fewer when no pair occurs
        ``min_frequency`` times any more. Deterministic for the same texts.

        Raises:
            ValueError: ``vocab_size`` leaves no room for the specials and the 256 bytes.
        """
        if vocab_size < len(SPECIALS) + 256:
            raise ValueError(f"vocab_size must be >= {len(SPECIALS) + 256} (specials + bytes), got {vocab_size}")
        tok = Tokenizer(models.BPE())
        # add_prefix_space=False: a prefix space would change the text, breaking the round trip.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIALS),
            # all 256 bytes, seen or not, so any later text encodes
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """One text -> token ids (no special tokens added)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Texts -> id lists, encoded in parallel by the library."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text; ``decode(encode(t)) == t`` for every string ``t``."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def to_str(self) -> str:
        return self.tokenizer.to_str()

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer as the library's JSON (merges, vocabulary, pre-tokenizer, decoder)."""
        Path(path).write_text(self.to_str(), encoding="utf-8")

    @classmethod
    def from_str(cls, text: str) -> BPETokenizer:
        """Raises ValueError for text that is not a tokenizer with :data:`SPECIALS` at ids 0-3."""
        try:
            json.loads(text)
            tok = Tokenizer.from_str(text)
        except Exception as e:  # the library raises a bare Exception for malformed JSON
            raise ValueError(f"not a tokenizers JSON file: {e}") from None
        return cls(tok)

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a file written by :meth:`save`; ValueError names a file that is not one."""
        try:
            return cls.from_str(Path(path).read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
