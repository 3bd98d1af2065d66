"""Builds the C++ extension once per process (fake impls: :mod:`attnmetrics._fake`).

The sources ship inside the package (``attnmetrics/csrc``) and are compiled on first
use by ``torch.utils.cpp_extension.load`` (ninja). The build is cached in
``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), so later processes
only load the shared library.

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
#: The loaded build's name: ``attnmetrics_C`` or ``attnmetrics_C_cuda`` (set by :func:`load`).
EXTENSION_NAME = None

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


@contextlib.contextmanager
def _build_lock(name: str, with_cuda: bool = False) -> Iterator[None]:
    """Hold an exclusive flock on ``TORCH_EXTENSIONS_DIR/<name>.build-lock`` around the build.

    torch serialises builds with a plain lock file (``<name>/lock``) that a killed build (kill -9,
    the OOM killer) leaves behind, and every later import then waits on it forever, silently.
    A flock dies with its holder: whoever holds ours is the only attnmetrics build alive, so a
    torch lock file found then is stale and is removed, with a notice naming it. Prints a
    one-line notice while it waits for another process's build, and before a (re)compile.
    """
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    fd = os.open(build_dir.parent / f"{name}.build-lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"attnmetrics: waiting for another process to finish building the kernels ({build_dir})",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            print(
                f"attnmetrics: removing the stale build lock {stale} (left by a build that was killed)",
                file=sys.stderr,
                flush=True,
            )
            stale.unlink(missing_ok=True)
        built = [p.stat().st_mtime for p in build_dir.glob(f"{name}*.so")]
        # what this build compiles: csrc/cuda only with the CUDA kernels
        inputs = [
            p for p in _CSRC.rglob("*") if p.is_file() and (with_cuda or "cuda" not in p.relative_to(_CSRC).parts)
        ]
        if not built or max(p.stat().st_mtime for p in inputs) > max(built):
            sources = len(_sources(with_cuda))
            print(
                f"attnmetrics: compiling the {'C++/CUDA' if with_cuda else 'C++'} kernels once, {sources} source "
                f"files with {os.environ.get('CXX', 'c++')} on {os.environ.get('MAX_JOBS', 'all')} jobs "
                f"(1-3 minutes on 2 cores), cached in {build_dir}",
                file=sys.stderr,
                flush=True,
            )
            with _build_progress(build_dir, sources):
                yield
        else:
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


def load() -> None:
    """Compile (first time) and load the extension; idempotent."""
    global _loaded, CUDA_KERNELS, EXTENSION_NAME
    if _loaded:
        return
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise RuntimeError(
            "attnmetrics needs a C++ compiler to build its kernels on first use: "
            f"no '{os.environ.get('CXX', 'c++')}' on PATH (install g++, or set CXX)."
        )
    with_cuda, why_not = _want_cuda()
    if why_not:
        warnings.warn(f"attnmetrics: building the CPU kernels only: {why_not}", RuntimeWarning, stacklevel=2)
    name = "attnmetrics_C_cuda" if with_cuda else "attnmetrics_C"
    sources = _sources(with_cuda)
    with _build_lock(name, with_cuda):
        cpp_extension.load(
            name=name,
            sources=sources,
            extra_include_paths=[str(_CSRC)],
            extra_cflags=CXX_FLAGS,
            extra_cuda_cflags=NVCC_FLAGS if with_cuda else None,
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=os.environ.get("ATTNMETRICS_VERBOSE_BUILD") == "1",
        )
    if why_not:
        _register_cuda_stubs(why_not)
    CUDA_KERNELS, EXTENSION_NAME = with_cuda, name
    _loaded = True


load()
ops = torch.ops.attnmetrics

from attnmetrics import _fake  # noqa: E402, F401  (registers the fake impls once the schemas exist)
