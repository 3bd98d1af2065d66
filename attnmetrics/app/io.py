"""Never lose a user's results: atomic file writes and run folders that are not overwritten."""

from __future__ import annotations

import contextlib
import fcntl
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


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; set straight back
    os.umask(mask)
    return mask


#: read once, at import: os.umask sets as it reads, which threads writing files must not race
_UMASK = _read_umask()


def _write_atomic(path: str | os.PathLike, write: Callable[[IO], None], mode: str) -> None:
    """Call ``write`` on a temporary file in ``path``'s folder, flush it to disk, then rename it
    to ``path``: readers see the old file or the whole new one, never a part."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide results from the user's group
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


def write_parquet_atomic(path: str | os.PathLike, table) -> None:
    """Write a ``pyarrow.Table`` as Parquet, atomically."""
    import pyarrow.parquet as pq  # only runs and sweeps write tables

    _write_atomic(path, lambda f: pq.write_table(table, f), "wb")


def write_npz_atomic(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    """Write ``arrays`` as an uncompressed ``.npz`` (``numpy.savez``), atomically."""
    # a file object: savez would append ".npz" to a name
    _write_atomic(path, lambda f: np.savez(f, **arrays), "wb")


#: Claims a run folder while a run writes it (locked with flock); gone once the run ends.
MARKER = ".attnmetrics-run"


def is_run_folder(path: str | os.PathLike) -> bool:
    """A folder this tool wrote: it holds the ``results.json`` every command writes last."""
    return (Path(path) / "results.json").is_file()


def _lock(folder: Path) -> int:
    """Open and lock ``folder``'s marker (created if missing); the fd holds the claim until closed.
    The kernel drops the lock when the process dies, however it dies, so no claim goes stale."""
    fd = os.open(folder / MARKER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FileExistsError(
            f"run folder {folder} is being written by another attnmetrics run; choose another --out"
        ) from None
    return fd


def _abandoned_claim(folder: Path) -> bool:
    """A folder holding only the marker of a run that died before finishing (its lock is free);
    FileExistsError if that run is alive."""
    if [p.name for p in folder.iterdir()] != [MARKER]:
        return False
    os.close(_lock(folder))  # FileExistsError if its run is alive
    return True


def remove_abandoned_claim(folder: str | os.PathLike) -> bool:
    """Remove ``folder`` if it is the claim of a run that died before finishing; returns whether it was."""
    folder = Path(folder)
    try:
        if not folder.is_dir() or not _abandoned_claim(folder):
            return False
    except FileExistsError:  # alive
        return False
    with contextlib.suppress(FileNotFoundError):
        (folder / MARKER).unlink()
    with contextlib.suppress(OSError):  # something new appeared in it: leave it
        folder.rmdir()
    return not folder.exists()


@contextlib.contextmanager
def claimed_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """Create ``folder`` if needed and hold its claim (a locked marker) while the block runs, for
    outputs that a command writes in place and resumes (pre-training checkpoints), not staged.

    Raises:
        FileExistsError: another attnmetrics process holds the folder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = _lock(folder)
    try:
        yield folder
    finally:
        (folder / MARKER).unlink(missing_ok=True)
        os.close(fd)


def check_out(out: str | os.PathLike, protect: tuple[str | os.PathLike, ...] = ()) -> Path:
    """Refuse an ``--out`` that a run could not write without harm, before any work: a file, the
    working folder or one of its parents, or a folder holding (or inside) one of ``protect``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a folder; choose a folder for the run")
    resolved, cwd = out.resolve(), Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise FileExistsError(f"--out {out} is the working folder or one of its parents; choose a new folder")
    for p in protect:
        p = Path(p).resolve()
        if resolved == p or resolved in p.parents or p in resolved.parents:
            raise FileExistsError(f"--out {out} would replace or nest in {p}, which this command reads")
    return out


@contextlib.contextmanager
def run_folder(
    out: str | os.PathLike, overwrite: bool = False, protect: tuple[str | os.PathLike, ...] = ()
) -> Iterator[Path]:
    """Claim ``out`` at once, yield a fresh staging folder, and make it ``out`` only when the block
    succeeds.

    The claim is atomic: ``out`` is created (``mkdir``) and its marker locked before the block
    runs, so a second run into the same ``out`` is refused at its start, not when it finishes.
    ``overwrite`` replaces only a run folder of this tool (one holding ``results.json``) that no
    other run is writing. The claim is a locked marker file in ``out``; the kernel releases the
    lock when the process dies, so a killed run's claim is taken over by the next run. On failure the staging folder is kept (named in the error) if it holds
    anything, an existing ``out`` is left untouched, and a folder this run created is removed.

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false; ``out`` is not a run folder;
            another run is writing it; or :func:`check_out` refuses it (a file, the working
            folder or a parent of it, a folder holding or inside one of ``protect``).
    """
    out = check_out(out, protect)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        out.mkdir()
        created = True
    except FileExistsError:
        created = _abandoned_claim(out)  # taken over from a run that died before finishing
        if not created:
            if not is_run_folder(out):
                raise FileExistsError(
                    f"{out} exists and is not an attnmetrics run folder (no results.json); --overwrite "
                    "replaces only run folders: choose another --out"
                ) from None
            if not overwrite:
                raise FileExistsError(f"run folder {out} already exists; pass --overwrite to replace it") from None
    fd = _lock(out)
    try:
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
        staging.chmod(0o777 & ~_UMASK)  # mkdtemp's 0700 would become the run folder's mode
        try:
            yield staging
        except BaseException as e:
            if any(staging.iterdir()):
                e.add_note(f"partial outputs kept in {staging}")
            else:
                staging.rmdir()
            (out / MARKER).unlink()  # give the claim back, and the name if this run took it
            if created:
                with contextlib.suppress(OSError):
                    out.rmdir()
            raise
        if created:  # out holds only our marker: an empty folder is replaced by the rename
            (out / MARKER).unlink()
            os.replace(staging, out)
        else:  # the old run (and our marker) move aside, then go
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.replace(out, old / "run")
            os.replace(staging, out)
            shutil.rmtree(old)
    finally:
        os.close(fd)
