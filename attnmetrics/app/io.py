"""Never lose a user's results: atomic file writes and run folders that are not overwritten."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
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


def write_png_atomic(path: str | os.PathLike, fig, dpi: int) -> None:
    """Write a matplotlib ``Figure`` as a PNG at ``dpi``, atomically: concurrent writers of the same
    figure (several ``report`` calls at once) each write a temporary file of their own."""
    _write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=dpi), "wb")


#: Claims a run folder while a run writes it (locked with flock); gone once the run ends.
MARKER = ".attnmetrics-run"
#: In a staging folder a failed run kept (and named): the next claim names it instead of removing it.
KEPT = ".attnmetrics-kept"


#: the keys every run's results.json has
RUN_KEYS = ("command", "config", "data")


def read_results(path: str | os.PathLike) -> dict:
    """A run's ``results.json``, read and checked.

    Raises:
        ValueError: the file is not readable JSON, or is JSON but not a run's results (not an
            object with :data:`RUN_KEYS`); one line naming the file and what is wrong.
    """
    path = Path(path)
    try:
        results = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path} is not readable JSON ({e}); rerun the run to rewrite it") from None
    except RecursionError:  # json's decoder nests a call per level
        raise ValueError(
            f"{path} is not a run's results (JSON nested deeper than Python's {sys.getrecursionlimit()} levels); "
            "rerun the run to rewrite it"
        ) from None
    lacking = [k for k in RUN_KEYS if k not in results] if isinstance(results, dict) else list(RUN_KEYS)
    if lacking:
        kind = "an object" if isinstance(results, dict) else f"a JSON {type(results).__name__}"
        raise ValueError(
            f"{path} is not a run's results ({kind} without {', '.join(lacking)}); rerun the run to rewrite it"
        )
    return results


def read_status(path: str | os.PathLike) -> dict:
    """A sweep's ``status.json`` (``{"cells": {...}}``), or an empty one where it is missing or
    unreadable (it only records outcomes: a finished cell is one whose folder holds results.json),
    the latter said in one line on stderr."""
    path = Path(path)
    if not path.is_file():
        return {"cells": {}}
    try:
        status = json.loads(path.read_text())
        if isinstance(status, dict) and isinstance(status.get("cells"), dict):
            return status
        why = "not an object with cells"
    except (ValueError, UnicodeDecodeError) as e:
        why = str(e)
    print(f"attnmetrics sweep: {path} is unreadable ({why}); the cells' outcomes start afresh", file=sys.stderr)
    return {"cells": {}}


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


def claim_held(folder: str | os.PathLike) -> bool:
    """Whether a live process holds ``folder``'s claim (its marker is locked); False if there is no
    marker. Creates nothing."""
    try:
        fd = os.open(Path(folder) / MARKER, os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also gives the lock back
    return False


def _abandoned_claim(folder: Path) -> bool:
    """An empty folder, or one holding only the marker of a run that died before finishing (its
    lock is free): what a run killed while it created ``folder`` leaves. FileExistsError if that
    run is alive."""
    names = [p.name for p in folder.iterdir()]
    if names not in ([], [MARKER]):
        return False
    if names:
        os.close(_lock(folder))  # FileExistsError if its run is alive
    return True


def remove_abandoned_claim(folder: str | os.PathLike) -> bool:
    """Remove ``folder`` if it is the claim of a run that died before finishing (an empty folder,
    or one holding only an unheld marker); returns whether it was.

    Raises:
        FileExistsError: another process has been replacing ``folder`` for :data:`SWAP_WAIT_S`.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return False
    with _swap_lock(folder):  # not while a run is claiming it
        try:
            if not _abandoned_claim(folder):
                return False
        except FileExistsError:  # alive
            return False
        with contextlib.suppress(FileNotFoundError):
            (folder / MARKER).unlink()
        with contextlib.suppress(OSError):  # something new appeared in it: leave it
            folder.rmdir()
    return not folder.exists()


#: how long a claim waits for another process's swap of the same folder (a few renames) to end
SWAP_WAIT_S = 60.0


@contextlib.contextmanager
def _swap_lock(out: Path) -> Iterator[None]:
    """Hold ``.OUT.lock`` beside ``out`` (flock): every claim, clean-up and swap of ``out`` runs
    under it, so none sees another's half-done swap. Removed on release; a killed holder's lock
    file is taken over (the lock went with the process) and the inode is checked after locking,
    so a holder never locks a file another has just removed."""
    path = out.parent / f".{out.name}.lock"
    deadline = time.monotonic() + SWAP_WAIT_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise FileExistsError(
                            f"{path} has been locked for {SWAP_WAIT_S:.0f} s by another attnmetrics process "
                            f"replacing {out}; retry when it is done"
                        ) from None
                    time.sleep(0.05)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # locked a file that its holder removed meanwhile: lock the new one
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _swap_step(step: str) -> None:
    """Called between the steps of making a staging folder ``out``; a no-op. Tests replace it to
    kill the process at each step (tests/app/test_io.py)."""


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _load_renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        f = ctypes.CDLL(None, use_errno=True).renameat2  # glibc 2.28+
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    f.restype = ctypes.c_int
    return f


_renameat2 = _load_renameat2()


def _exchange(a: Path, b: Path) -> bool:
    """Swap the folders ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``): at no
    moment is either name missing. False where the system or file system cannot (then nothing
    moved); OSError for any other failure."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _suffix(path: Path, kind: str) -> str:
    return path.name.rsplit(f".{kind}-", 1)[1]  # mkdtemp's part has no dot; OUT's name may


def _siblings(out: Path, kind: str) -> list[Path]:
    """The folders ``.OUT.KIND-S`` beside ``out`` (S as mkdtemp makes it: no dot, so a sibling run
    named ``OUT.partial-x`` is not taken for one), sorted."""
    prefix = f".{out.name}.{kind}-"
    return sorted(
        p
        for p in out.parent.iterdir()
        if p.name.startswith(prefix) and re.fullmatch(r"[A-Za-z0-9_]+", p.name[len(prefix) :]) and p.is_dir()
    )


def _restore_swap(out: Path) -> list[str]:
    """Finish or undo the ``--overwrite`` swap of a run killed in it (the fallback's two renames:
    ``out`` -> ``.OUT.old-S``, ``.OUT.partial-S`` -> ``out``) and remove the replaced run; what was
    done, in words. Only under :func:`_swap_lock`."""
    done = []
    for old in _siblings(out, "old"):
        new = out.parent / f".{out.name}.partial-{_suffix(old, 'old')}"
        if not out.exists() and new.is_dir() and is_run_folder(new):  # killed between the renames
            os.replace(new, out)  # the finished new run: the swap's end
            done.append(f"finished the interrupted replacement of {out}")
        elif not out.exists() and (is_run_folder(old) or is_run_folder(old / "run")):
            os.replace(old / "run" if is_run_folder(old / "run") else old, out)  # the old run comes back
            done.append(f"restored {out} from an interrupted replacement")
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)
            done.append(f"removed {old}")
    return done


def _remove_leftovers(out: Path, remove_kept: bool = False) -> list[str]:
    """Remove what dead runs of ``out`` left (staging folders, replaced runs, a stale marker inside a
    finished ``out``) unless a live run holds ``out``'s claim; a staging folder a failed run kept
    (and named: :data:`KEPT`) is only named unless ``remove_kept``. What was done, in words. Only
    under :func:`_swap_lock`."""
    done = _restore_swap(out)
    if claim_held(out):
        return done
    for staging in _siblings(out, "partial"):
        if (staging / KEPT).exists() and not remove_kept:
            done.append(f"{staging} was kept by a failed run (remove it once done with it)")
        else:
            shutil.rmtree(staging, ignore_errors=True)
            done.append(f"removed {staging}")
    if is_run_folder(out) and (out / MARKER).exists():
        (out / MARKER).unlink(missing_ok=True)
        done.append(f"removed a dead run's claim from {out}")
    return done


def remove_leftovers(out: str | os.PathLike, remove_kept: bool = False) -> tuple[list[str], bool]:
    """Clean up after dead runs of the run folder ``out`` (as its next claim does): finish or undo a
    half-done ``--overwrite``, remove staging folders (``.OUT.partial-*``; one a failed run kept and
    named only if ``remove_kept``), replaced runs (``.OUT.old-*``) and a stale marker. Returns what
    was done, in words, and whether a live run holds ``out`` (then its staging folders are left
    alone).

    Raises:
        FileExistsError: another process has been replacing ``out`` for :data:`SWAP_WAIT_S`.
    """
    out = Path(out)
    if not out.parent.is_dir():
        return [], False
    with _swap_lock(out):
        return _remove_leftovers(out, remove_kept), claim_held(out)


def _say(out: Path, lines: list[str]) -> None:
    if lines:
        print(f"attnmetrics: leftovers of earlier runs of {out}: {'; '.join(lines)}", file=sys.stderr)


class UnwritableFolder(OSError):
    """A folder a command must write (its ``--out``) cannot be written: a read-only file system, no
    permission, no space; raised before any work, the message in one line."""


@contextlib.contextmanager
def writable(out: Path, flag: str = "--out") -> Iterator[None]:
    """Turn an OSError of the block (the writes that claim ``out``) into an :class:`UnwritableFolder`
    naming ``flag``, ``out``, the path refused and the cause (a traceback before)."""
    try:
        yield
    except UnwritableFolder:
        raise
    except OSError as e:
        if e.errno is None:  # raised with a message of ours (a file in the way, a claim held)
            raise
        where = f": {e.filename}" if e.filename else ""
        error = UnwritableFolder(f"{flag} {out} cannot be written ({e.strerror}{where}); choose a folder you can write")
        error.errno = e.errno
        raise error from e


def check_writable(folder: str | os.PathLike, flag: str = "--out") -> Path:
    """Make ``folder`` (and its parents) if missing and write a temporary file in it, before any
    work: :class:`UnwritableFolder` in one line if it cannot be written (for outputs that are not
    claimed: a sweep's folder, a comparison's)."""
    folder = check_folder_path(folder, flag)
    with writable(folder, flag):
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    return folder


@contextlib.contextmanager
def claimed_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """Create ``folder`` if needed and hold its claim (a locked marker) while the block runs, for
    outputs that a command writes in place and resumes (pre-training checkpoints), not staged.

    Raises:
        FileExistsError: another attnmetrics process holds the folder.
        UnwritableFolder: ``folder`` cannot be made or written (read-only, no permission).
    """
    folder = Path(folder)
    with writable(folder):
        folder.mkdir(parents=True, exist_ok=True)
        fd = _lock(folder)
    try:
        yield folder
    finally:
        (folder / MARKER).unlink(missing_ok=True)
        os.close(fd)


def _missing_target(link: Path) -> str:
    """Why the link ``link`` leads nowhere, in words."""
    try:
        os.stat(link)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a loop of links"
    return "which does not exist"


def check_folder_path(folder: str | os.PathLike, flag: str = "--out") -> Path:
    """Refuse, before any work and in one line naming ``flag``, a path where no folder can be made:
    a file or a path inside one, a link to nowhere or a loop of links (``folder`` or the nearest of
    its parents that exists), a name the file system refuses (too long: :class:`UnwritableFolder`).

    Raises:
        FileExistsError: ``folder`` or a parent of it is a file.
        FileNotFoundError: ``folder`` or a parent of it is a link that leads nowhere.
        UnwritableFolder: the file system refuses to look the path up.
    """
    folder = Path(folder)
    with writable(folder, flag):  # a name too long, a parent that cannot be searched
        for path in (folder, *folder.parents):
            at = "" if path == folder else f": {path}"
            if path.is_symlink() and not path.exists():
                raise FileNotFoundError(
                    f"{flag} {folder}{at} is a link to {os.readlink(path)}, {_missing_target(path)}; choose a folder"
                )
            if path.exists():
                if not path.is_dir():
                    raise FileExistsError(f"{flag} {folder}{at} is a file, not a folder; choose a folder")
                _check_names(folder, path)
                break
    return folder


def _check_names(folder: Path, base: Path) -> None:
    """Raise ENAMETOOLONG (an OSError) for a name of ``folder`` below its nearest existing parent
    ``base`` that is longer than ``base``'s file system allows: ``mkdir`` would make the folders
    before that name, then fail."""
    try:
        limit = os.pathconf(base, "PC_NAME_MAX")
    except (OSError, ValueError):  # the file system does not say
        return
    for i in range(len(base.parts), len(folder.parts)):
        if len(os.fsencode(folder.parts[i])) > limit:
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(Path(*folder.parts[: i + 1])))


def check_out(out: str | os.PathLike, protect: tuple[str | os.PathLike, ...] = ()) -> Path:
    """Refuse an ``--out`` that a run could not write without harm, before any work: what
    :func:`check_folder_path` refuses, the working folder or one of its parents, or a folder
    holding (or inside) one of ``protect``."""
    out = check_folder_path(out)
    resolved, cwd = out.resolve(), Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise FileExistsError(f"--out {out} is the working folder or one of its parents; choose a new folder")
    for p in protect:
        p = Path(p).resolve()
        if resolved == p or resolved in p.parents or p in resolved.parents:
            raise FileExistsError(f"--out {out} would replace or nest in {p}, which this command reads")
    return out


def _claim(out: Path, overwrite: bool) -> tuple[int, bool]:
    """Take ``out``'s claim (under :func:`_swap_lock`): its locked marker's fd, and whether this run
    made ``out`` (new, or taken over from a run that died making it)."""
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
    return _lock(out), created


def _make_out(out: Path, staging: Path, created: bool) -> None:
    """Make the finished ``staging`` ``out`` (under :func:`_swap_lock`, holding ``out``'s claim): one
    atomic exchange where the file system has it, else renames whose half-done states the next
    claim restores (:func:`_restore_swap`)."""
    _swap_step("swap-locked")
    if _exchange(staging, out):  # out: the new run; staging: the old one (or our marker alone)
        _swap_step("exchanged")
        shutil.rmtree(staging)
    elif created:  # out holds only our marker: an empty folder is replaced by the rename
        (out / MARKER).unlink()
        _swap_step("marker-unlinked")
        os.replace(staging, out)
    else:  # the old run (and our marker) move aside, then go
        old = out.parent / f".{out.name}.old-{_suffix(staging, 'partial')}"
        os.replace(out, old)
        _swap_step("old-aside")
        os.replace(staging, out)
        _swap_step("new-in")
        shutil.rmtree(old)


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
    lock when the process dies, so a killed run's claim is taken over by the next run (an empty
    ``out``, or one holding only a dead run's marker). On failure the staging folder is kept
    (named in the error) if it holds anything, an existing ``out`` is left untouched, and a folder
    this run created is removed.

    A kill at any moment loses no finished run: the swap of the staging folder and ``out`` is one
    ``renameat2(RENAME_EXCHANGE)`` on Linux, else two renames under a lock beside ``out``
    (``.OUT.lock``) that every claim takes; the next claim of ``out`` finishes or undoes a
    half-done swap, then removes (and names, in one line on stderr) what dead runs left: staging
    folders ``.OUT.partial-*`` (one a failed run kept and named is only named again), replaced
    runs ``.OUT.old-*``, a stale marker in ``out``.

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false; ``out`` is not a run folder;
            another run is writing it; or :func:`check_out` refuses it (a file, the working
            folder or a parent of it, a folder holding or inside one of ``protect``).
        UnwritableFolder: ``out`` or its parent cannot be written (read-only, no permission).
    """
    out = check_out(out, protect)
    with writable(out):  # a read-only file system, no permission: one line, before any work
        out.parent.mkdir(parents=True, exist_ok=True)
        with _swap_lock(out):
            _say(out, _remove_leftovers(out))
            fd, created = _claim(out, overwrite)
            try:
                staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
                staging.chmod(0o777 & ~_UMASK)  # mkdtemp's 0700 would become the run folder's mode
            except BaseException:
                os.close(fd)
                raise
    try:
        try:
            yield staging
        except BaseException as e:
            if any(staging.iterdir()):
                with contextlib.suppress(OSError):  # named, so the next claim keeps it too
                    (staging / KEPT).write_text(f"{type(e).__name__}: {e}\n")
                e.add_note(f"partial outputs kept in {staging}")
            else:
                staging.rmdir()
            with _swap_lock(out):
                (out / MARKER).unlink()  # give the claim back, and the name if this run took it
                if created:
                    with contextlib.suppress(OSError):
                        out.rmdir()
            raise
        with _swap_lock(out):
            _make_out(out, staging, created)
    finally:
        os.close(fd)
