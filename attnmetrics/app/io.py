"""Never lose a user's results: atomic file writes and run folders that are not overwritten."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np


def _jsonable(x: Any) -> Any:
    # Strict JSON has no NaN/inf: write them as null so every reader can load the file.
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):  # numpy / torch scalars and arrays
        return _jsonable(x.tolist())
    return x


def _write_atomic(path: str | os.PathLike, write: Callable[[IO], None], mode: str) -> None:
    """Call ``write`` on a temporary file in ``path``'s folder, flush it to disk, then rename it
    to ``path``: readers see the old file or the whole new one, never a part."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    _write_atomic(path, lambda f: f.write(text), "w")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as strict JSON (NaN -> null), atomically."""
    write_text_atomic(path, json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")


def write_npz_atomic(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    """Write ``arrays`` as an uncompressed ``.npz`` (``numpy.savez``), atomically."""
    # a file object: savez would append ".npz" to a name
    _write_atomic(path, lambda f: np.savez(f, **arrays), "wb")


@contextlib.contextmanager
def run_folder(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh staging folder that becomes ``out`` only when the block succeeds.

    Raises ``FileExistsError`` if ``out`` exists and ``overwrite`` is false. On failure the
    staging folder is kept (named in the error) and an existing ``out`` is left untouched.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"run folder {out} already exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield staging
    except BaseException as e:
        e.add_note(f"partial outputs kept in {staging}")
        raise
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        os.replace(out, old / "run")
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old)
