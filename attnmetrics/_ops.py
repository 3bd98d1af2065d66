"""Builds the C++ extension once per process (fake impls: :mod:`attnmetrics._fake`).

The sources ship inside the package (``attnmetrics/csrc``) and are compiled on first
use by ``torch.utils.cpp_extension.load`` (ninja). The build is cached in
``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions/<python>_<torch's device>``), in a
folder keyed by everything that changes the binary (:func:`build_key`: the sources' bytes, the
flags, the compiler named by ``CXX``, torch's version, the Python ABI, the CUDA architectures):
checkouts and environments whose builds would be identical share one build and load it without
running the compiler or ninja, and builds that differ never evict each other. A new key's build
starts from the newest earlier build of the same checkout (its objects and ninja's log are
copied), so editing one source recompiles that file only. Build folders not loaded for
``STALE_DAYS`` days are removed after a build.

Two builds, under two names so their caches never clash:

- ``attnmetrics_C`` (CPU kernels only): the default, and all a machine without a GPU
  ever builds; it needs a C++ compiler and nothing from CUDA.
- ``attnmetrics_C_cuda`` (CPU and CUDA kernels, ``csrc/cuda``): built when
  ``torch.cuda.is_available()`` and nvcc is found (``torch.utils.cpp_extension.CUDA_HOME``
  or ``PYTORCH_NVCC``, as torch's own build looks for it). Architectures follow torch's
  rules: ``TORCH_CUDA_ARCH_LIST``, else the visible GPUs.

With a GPU but no nvcc the loader warns and builds the CPU kernels only, so CPU tensors
keep working; an op called on CUDA tensors then raises a RuntimeError that names the
missing compiler. ``ATTNMETRICS_CUDA=1`` turns that case into an import-time
RuntimeError instead, and ``ATTNMETRICS_CUDA=0`` builds the CPU kernels only even where
CUDA is available (default ``auto``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch


class _NoCudaRuntimeNotice(logging.Filter):
    """Drops torch's import-time "No CUDA runtime is found, using CUDA_HOME=..." warning, which
    a CUDA build of torch (pip's default on Python >= 3.12) prints on every machine without a GPU
    where a CUDA toolkit is installed: there, attnmetrics builds its CPU kernels only and never
    needs a CUDA runtime."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


logging.getLogger("torch.utils.cpp_extension").addFilter(_NoCudaRuntimeNotice())
from torch.utils import cpp_extension  # noqa: E402  (after the filter: the warning is logged at import)

_CSRC = Path(__file__).resolve().parent / "csrc"
_loaded = False

#: Whether the loaded build holds the CUDA kernels (set by :func:`load`).
CUDA_KERNELS = False
#: The loaded build's name: ``attnmetrics_C_<key>`` or ``attnmetrics_C_cuda_<key>`` (set by :func:`load`).
EXTENSION_NAME = None
#: The loaded build's folder (set by :func:`load`).
BUILD_DIR: Path | None = None
#: Written into a build folder, atomically, once its library is complete: the key and what it hashes.
STAMP = "attnmetrics-build.json"
#: A build folder not loaded for this many days is removed after another build completes.
STALE_DAYS = 30

# -fopenmp: at::parallel_for runs in parallel. No -std: torch's build passes its own (C++20), which
# its headers need from torch 2.14 on (std::strong_ordering); a -std=c++17 here would override it.
CXX_FLAGS = ["-O3", "-fopenmp"]
# --fmad=false: no fused multiply-adds, so the GPU rounds every product and sum as the CPU
# build does (x86-64 without -march has no FMA): the shared per-row code then gives the
# same bits on both (flip decisions, tau) up to the math library (log, erf/erfc).
NVCC_FLAGS = ["-O3", "--fmad=false"]

_OPS = (
    "tvd",
    "jsd",
    "value_flags",
    "tvd_checked",
    "jsd_checked",
    "kendall_tau",
    "flip_search_linear",
    "renormalised_contexts",
    "attention_permutations",
    "permutation_tvd_linear",
    "project_prefix",
    "leave_one_out_batch",
    "rationale_batch",
    "attention_rollout",
    "lstm_runs",
    "spliced_attention",
)
#: Ops with a CPU impl only (their procedure runs on the host whatever the model's device):
#: attention flow's maximum flows (csrc/cpu/flow.cpp)
HOST_OPS = ("attention_flow",)


def _sources(with_cuda: bool = False) -> list[str]:
    sources = [str(_CSRC / "ops.cpp")] + sorted(str(p) for p in (_CSRC / "cpu").glob("*.cpp"))
    if with_cuda:
        cuda = _CSRC / "cuda"
        sources += sorted(str(p) for p in cuda.glob("*.cu")) + sorted(str(p) for p in cuda.glob("*.cpp"))
    return sources


def find_nvcc() -> str | None:
    """The nvcc torch's extension build would run, or None when there is none."""
    if os.environ.get("PYTORCH_NVCC"):
        return os.environ["PYTORCH_NVCC"]
    home = cpp_extension.CUDA_HOME  # None on a CPU build of torch
    if home:
        nvcc = os.path.join(home, "bin", "nvcc")
        if os.path.exists(nvcc):
            return nvcc
    return None


def _want_cuda() -> tuple[bool, str | None]:
    """(build the CUDA kernels?, why not, when a GPU would have used them)."""
    mode = os.environ.get("ATTNMETRICS_CUDA", "auto").strip().lower()
    if mode not in ("auto", "0", "1"):
        raise RuntimeError(f"ATTNMETRICS_CUDA must be auto, 0 or 1, got {mode!r}")
    if mode == "0":
        return False, None
    if not torch.cuda.is_available():
        if mode == "1":
            raise RuntimeError(
                "ATTNMETRICS_CUDA=1 asks for the CUDA kernels, but torch sees no CUDA GPU "
                f"(torch {torch.__version__}, CUDA {torch.version.cuda})"
            )
        return False, None
    if find_nvcc() is None:
        why = (
            "no CUDA compiler: nvcc was not found (looked in CUDA_HOME="
            f"{cpp_extension.CUDA_HOME!r} and PYTORCH_NVCC); install the CUDA toolkit matching "
            f"torch's CUDA {torch.version.cuda} or set CUDA_HOME"
        )
        if mode == "1":
            raise RuntimeError(f"attnmetrics cannot build its CUDA kernels: {why}")
        return False, why
    return True, None


def _register_cuda_stubs(why: str) -> None:
    """CUDA impls that explain why there are no CUDA kernels (CPU-only build on a GPU machine)."""
    global _stub_library
    _stub_library = torch.library.Library("attnmetrics", "IMPL")  # kept alive: owns the impls
    for name in _OPS:

        def stub(*args, _name=name):
            raise RuntimeError(
                f"attnmetrics::{_name} got CUDA tensors, but attnmetrics was built without its "
                f"CUDA kernels ({why}). Move the inputs to the CPU, or install nvcc and restart."
            )

        _stub_library.impl(name, stub, "CUDA")


def _inputs(with_cuda: bool) -> list[Path]:
    """The files a build compiles or includes: all of csrc, csrc/cuda only with the CUDA kernels."""
    return sorted(
        p for p in _CSRC.rglob("*") if p.is_file() and (with_cuda or "cuda" not in p.relative_to(_CSRC).parts)
    )


def build_key(with_cuda: bool = False) -> tuple[str, dict]:
    """The key of the build this process would load: a SHA-256 over everything that changes the
    binary, and that description (sources by content, not by path, so two checkouts of one commit
    get one key). Not in it: the compiler's version behind the ``CXX`` name (an upgrade in place
    keeps the key; remove the build folder to rebuild)."""
    sources = hashlib.sha256()
    for path in _inputs(with_cuda):
        sources.update(path.relative_to(_CSRC).as_posix().encode() + b"\0")
        sources.update(path.read_bytes() + b"\0")
    what = {
        "sources": sources.hexdigest(),
        "cxx": os.environ.get("CXX", "c++"),
        "cxx_flags": CXX_FLAGS,
        "torch": f"{torch.__version__} {torch.version.git_version} cuda {torch.version.cuda}",
        "python": f"{sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')}",
        "cuda": None,
    }
    if with_cuda:
        archs = os.environ.get("TORCH_CUDA_ARCH_LIST") or sorted(
            {".".join(map(str, torch.cuda.get_device_capability(i))) for i in range(torch.cuda.device_count())}
        )
        what["cuda"] = {"nvcc": find_nvcc(), "nvcc_flags": NVCC_FLAGS, "archs": archs}
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    return key, what


def _built(build_dir: Path, key: str) -> Path | None:
    """The library in ``build_dir`` when its stamp (written once the library was complete) has ``key``."""
    try:
        stamp = json.loads((build_dir / STAMP).read_text())
    except (OSError, ValueError):
        return None
    library = build_dir / stamp.get("library", "")
    return library if stamp.get("key") == key and library.is_file() else None


def _replace_atomic(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` through a unique temporary file and a rename."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _publish(library: Path, build_dir: Path, key: str, what: dict) -> Path:
    """Copy the freshly linked ``library`` into the keyed ``build_dir``, then write its stamp, each
    atomically: a reader that finds the stamp finds the whole library."""
    target = build_dir / library.name
    _replace_atomic(target, library.read_bytes())
    stamp = {"key": key, "library": target.name, "what": what, "built_in": str(library.parent)}
    _replace_atomic(build_dir / STAMP, json.dumps(stamp, indent=1).encode())
    return target


def _prune(root: Path, keep: tuple[Path, ...]) -> None:
    """Remove attnmetrics build folders (keyed and work folders) not loaded for ``STALE_DAYS`` days."""
    cutoff = time.time() - STALE_DAYS * 86400
    for folder in root.glob("attnmetrics_C*"):
        if not folder.is_dir() or folder in keep:
            continue
        used = [p.stat().st_mtime for p in (folder / STAMP, folder) if p.exists()]
        if max(used) < cutoff:
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _build_lock(work_dir: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``<work_dir>.build-lock`` around a build in ``work_dir``.

    torch serialises builds with a plain lock file (``<work_dir>/lock``) that a killed build
    (kill -9, the OOM killer) leaves behind, and every later import then waits on it forever,
    silently. A flock dies with its holder: whoever holds ours is the only attnmetrics build alive
    in that folder, so a torch lock file found then is stale and is removed, with a notice naming
    it. Prints a one-line notice while it waits for another process's build.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(work_dir.parent / f"{work_dir.name}.build-lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"attnmetrics: waiting for another process to finish building the kernels ({work_dir})",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        stale = work_dir / "lock"
        if stale.exists():
            print(
                f"attnmetrics: removing the stale build lock {stale} (left by a build that was killed)",
                file=sys.stderr,
                flush=True,
            )
            stale.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def _build_progress(build_dir: Path, sources: int, every: float = 15.0) -> Iterator[None]:
    """While the build runs, print to stderr every ``every`` seconds how many of the ``sources``
    object files ninja has written and the time so far, then the total time: a build of one to
    three minutes is never silent."""
    start, done = time.monotonic(), threading.Event()

    def compiled() -> int:
        return sum(1 for p in build_dir.glob("*.o") if p.stat().st_mtime >= wall_start)

    def report() -> None:
        while not done.wait(every):
            print(
                f"attnmetrics: compiling: {min(compiled(), sources)}/{sources} files, {time.monotonic() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    wall_start = time.time() - 1.0  # object files written from now on (mtime granularity)
    thread = threading.Thread(target=report, name="attnmetrics-build-progress", daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        done.set()
        thread.join()
        print(
            f"attnmetrics: {'compiled' if ok else 'build failed after'} {time.monotonic() - start:.0f} s",
            file=sys.stderr,
            flush=True,
        )


@contextlib.contextmanager
def _ninja_beside_python() -> Iterator[None]:
    """PATH with this Python's scripts folder first for the build, so that torch runs the ninja
    installed beside it (the pip dependency) whether or not its environment is activated: ninja
    versions hash the commands of a work folder's log differently, and another ninja would
    recompile every file."""
    before = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), before) if p)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def _build(name: str, with_cuda: bool, work_dir: Path) -> Path:
    """Compile (ninja: only what changed since this work folder's last build) and link the kernels
    in ``work_dir``; the linked library's path."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise RuntimeError(
            "attnmetrics needs a C++ compiler to build its kernels on first use: "
            f"no '{os.environ.get('CXX', 'c++')}' on PATH (install g++, or set CXX)."
        )
    sources = _sources(with_cuda)
    print(
        f"attnmetrics: compiling the {'C++/CUDA' if with_cuda else 'C++'} kernels, once for these sources, "
        f"flags, torch and Python: up to {len(sources)} source files with {os.environ.get('CXX', 'c++')} on "
        f"{os.environ.get('MAX_JOBS', 'all')} jobs (all of them: about a minute on 2 quiet cores), in {work_dir}",
        file=sys.stderr,
        flush=True,
    )
    with _build_progress(work_dir, len(sources)), _ninja_beside_python():
        library = cpp_extension.load(
            name=name,
            sources=sources,
            extra_include_paths=[str(_CSRC)],
            extra_cflags=CXX_FLAGS,
            extra_cuda_cflags=NVCC_FLAGS if with_cuda else None,
            extra_ldflags=["-fopenmp"],
            build_directory=str(work_dir),
            is_python_module=False,
            verbose=os.environ.get("ATTNMETRICS_VERBOSE_BUILD") == "1",
        )
    return Path(library)


def _work_dir(root: Path, base: str, what: dict) -> Path:
    """This checkout's build folder for ``base`` under ``root``: keyed by the sources' path (not
    their bytes, so that ninja recompiles only what changed), the Python ABI and torch."""
    checkout = hashlib.sha256(json.dumps([str(_CSRC), what["python"], what["torch"]]).encode()).hexdigest()
    return root / f"{base}-work-{checkout[:16]}"


def load() -> None:
    """Load the extension, compiling it first when no build with this process's key exists; idempotent.

    The library lives in ``<root>/<name>_<key>`` (:func:`build_key`), which any checkout or
    environment with the same key loads as is. A build runs in this checkout's work folder
    ``<root>/<name>-work-<checkout>`` under a flock, and its library is then published into the
    keyed folder.
    """
    global _loaded, CUDA_KERNELS, EXTENSION_NAME, BUILD_DIR
    if _loaded:
        return
    with_cuda, why_not = _want_cuda()
    if why_not:
        warnings.warn(f"attnmetrics: building the CPU kernels only: {why_not}", RuntimeWarning, stacklevel=2)
    base = "attnmetrics_C_cuda" if with_cuda else "attnmetrics_C"
    key, what = build_key(with_cuda)
    name = f"{base}_{key[:16]}"
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    library = _built(build_dir, key)
    if library is None:
        work_dir = _work_dir(build_dir.parent, base, what)
        with _build_lock(work_dir):
            library = _built(build_dir, key)  # built by another process while this one waited
            if library is None:
                library = _publish(_build(base, with_cuda, work_dir), build_dir, key, what)
                _prune(build_dir.parent, keep=(build_dir, work_dir))
            else:
                torch.ops.load_library(str(library))
    else:
        torch.ops.load_library(str(library))
    with contextlib.suppress(OSError):  # a read-only shared cache is used as it is
        os.utime(build_dir / STAMP)  # when it was last loaded: builds unused for STALE_DAYS are pruned
    if why_not:
        _register_cuda_stubs(why_not)
    CUDA_KERNELS, EXTENSION_NAME, BUILD_DIR = with_cuda, name, build_dir
    _loaded = True


load()
ops = torch.ops.attnmetrics

from attnmetrics import _fake  # noqa: E402, F401  (registers the fake impls once the schemas exist)
