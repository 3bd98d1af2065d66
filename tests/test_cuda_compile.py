"""The CUDA back end, checked on a machine without a GPU (docs/architecture.md).

- every ``csrc/cuda/*.cu`` compiles with plain ``nvcc -c -I csrc`` (no torch headers) for
  sm_80 and sm_90, with the loader's nvcc flags and warnings as errors;
- the ATen glue, one ``csrc/cuda/*_cuda.cpp`` per op family as ``csrc/cpu/*.cpp``, compiles
  file by file (``g++ -c -O0``, as cheap as ``-fsyntax-only``) against torch's headers (a
  CPU wheel ships ``c10/cuda`` and ``ATen/cuda`` too) and the CUDA include dir, and every
  launcher each file calls is defined, with the same signature, by the kernels' objects
  (what the link would check); together the glue files register every op once;
- ``tests/cuda/host_harness.cpp`` runs the kernels' per-thread code on the CPU over the
  launchers' grids and checks rows, scratch and outputs against the per-row functions; for
  attention_permutations, permutation_tvd_linear, project_prefix and leave_one_out_batch it
  also writes its inputs and outputs, which must equal the CPU ops' on the same inputs;
- the loader picks the build as documented.

The compiles run two at a time, once for the module (about a minute on 2 cores). A test
skips when the compiler it needs is missing; the host harness needs only g++.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils import cpp_extension

import attnmetrics
from attnmetrics import _ops

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
KERNELS = sorted(p.name for p in (CSRC / "cuda").glob("*.cu"))
GLUE = sorted(p.name for p in (CSRC / "cuda").glob("*_cuda.cpp"))
ARCHS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
CXX = os.environ.get("CXX", "c++")


def test_imports_this_checkout():
    assert Path(attnmetrics.__file__).resolve().is_relative_to(ROOT)


def find_nvcc() -> str | None:
    """nvcc for the compile check: the loader's choice, else CUDA_HOME / CUDA_PATH, PATH,
    /usr/local/cuda (a CPU build of torch has no CUDA_HOME of its own)."""
    found = _ops.find_nvcc()
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def cuda_include_dirs(nvcc: str) -> list[str]:
    """The include dirs nvcc itself passes (its --dryrun INCLUDES line)."""
    out = subprocess.run(
        [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], capture_output=True, text=True, timeout=60
    )
    found = re.search(r'INCLUDES="([^"]*)"', out.stdout + out.stderr)
    dirs = [d[2:] for d in found.group(1).split() if d.startswith("-I")] if found else []
    return [d for d in dirs if os.path.exists(os.path.join(d, "cuda_runtime_api.h"))]


NVCC = find_nvcc()


def _jobs(tmp: Path) -> dict[str, list[str]]:
    jobs = {}
    if NVCC:
        for name in KERNELS:
            jobs[name] = [
                NVCC,
                "-c",
                str(CSRC / "cuda" / name),
                "-o",
                str(tmp / f"{name}.o"),
                *ARCHS,
                *_ops.NVCC_FLAGS,
                "-std=c++20",  # the standard torch's extension build compiles with
                "-I",
                str(CSRC),
                "--Werror",
                "all-warnings",
                "-Xcompiler",
                "-Wall,-Wextra",
            ]
        includes = cuda_include_dirs(NVCC)
        if includes:
            # The CUDA wheel's generated c10/cuda/impl/cuda_cmake_macros.h is missing from a
            # CPU wheel; it only defines C10_CUDA_BUILD_SHARED_LIBS (Windows exports).
            system = [a for d in (*cpp_extension.include_paths(), *includes) for a in ("-isystem", d)]
            # -c -O0 rather than -fsyntax-only: as cheap, and the object's undefined symbols
            # show which launchers it calls (checked against the kernels' objects below).
            for name in GLUE:
                jobs[name] = [
                    CXX,
                    "-std=c++20",
                    "-c",
                    "-O0",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",
                    "-DTORCH_API_INCLUDE_EXTENSION_H",
                    "-DTORCH_EXTENSION_NAME=attnmetrics_C_cuda",
                    *system,
                    "-I",
                    str(CSRC),
                    str(CSRC / "cuda" / name),
                    "-o",
                    str(tmp / f"{name}.o"),
                ]
    if shutil.which(CXX):
        jobs["host_harness"] = [
            CXX,
            "-std=c++20",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
            str(CSRC),
            str(ROOT / "tests" / "cuda" / "host_harness.cpp"),
            "-o",
            str(tmp / "harness"),
        ]
    return jobs


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Every compile of this module, two at a time (nvcc is slow; the machine has 2 cores)."""
    tmp = tmp_path_factory.mktemp("cuda_compile")
    jobs = _jobs(tmp)

    def run(cmd):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        # slowest first
        order = sorted(jobs, key=lambda n: n not in ("kendall.cu", "flip.cu", "permutation.cu"))
        futures = {name: pool.submit(run, jobs[name]) for name in order}
        results = {name: f.result() for name, f in futures.items()}
    return tmp, results


def _check(results, name):
    res = results[name]
    assert res.returncode == 0, f"{name} failed to compile:\n{res.stdout}\n{res.stderr}"


FAMILIES = ("distances", "kendall", "flip", "permutation", "projection", "loo", "rollout", "lstm", "spliced")
#: CPU files whose ops run on the host only (_ops.HOST_OPS): no kernels, no glue
HOST_FAMILIES = ("flow",)


def test_kernels_found():
    assert {f"{family}.cu" for family in FAMILIES} <= set(KERNELS)


def test_glue_files_found():
    """One glue file per op family, beside its kernels, as the CPU impls in csrc/cpu."""
    assert set(GLUE) == {f"{family}_cuda.cpp" for family in FAMILIES}
    assert {p.stem for p in (CSRC / "cpu").glob("*.cpp")} == set(FAMILIES) | set(HOST_FAMILIES)


def _registered(path: Path, key: str) -> list[str]:
    """The ops that path's TORCH_LIBRARY_IMPL(attnmetrics, key, m) blocks register."""
    text = path.read_text()
    blocks = re.findall(r"TORCH_LIBRARY_IMPL\(attnmetrics,\s*" + key + r",\s*m\)\s*\{([^}]*)\}", text, re.S)
    return [op for block in blocks for op in re.findall(r'm\.impl\("(\w+)"', block)]


def test_glue_registers_every_op_once_as_the_cpu_impls_do():
    """Each op's CUDA impl sits in the glue file of the family whose CPU file holds its CPU impl."""
    cuda = {name: _registered(CSRC / "cuda" / name, "CUDA") for name in GLUE}
    cpu = {p.stem: _registered(p, "CPU") for p in (CSRC / "cpu").glob("*.cpp")}
    everything = [op for ops in cuda.values() for op in ops]
    assert sorted(everything) == sorted(_ops._OPS)
    host = {family: cpu.pop(family) for family in HOST_FAMILIES}
    assert sorted(op for ops in host.values() for op in ops) == sorted(_ops.HOST_OPS)
    assert {name.removesuffix("_cuda.cpp"): sorted(ops) for name, ops in cuda.items()} == {
        family: sorted(ops) for family, ops in cpu.items()
    }


def test_build_object_names_are_unique():
    """torch's JIT build names each object after its source's basename (x.cpp -> x.o,
    x.cu -> x.cuda.o): two sources with one object name would overwrite each other."""
    objects = [Path(s).stem + (".cuda.o" if s.endswith(".cu") else ".o") for s in _ops._sources(True)]
    assert len(objects) == len(set(objects)), sorted(objects)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA_HOME, PATH, /usr/local/cuda)")
@pytest.mark.parametrize("name", KERNELS)
def test_nvcc_compiles_kernel_for_sm80_and_sm90(builds, name):
    """Plain nvcc, no torch include path: the .cu files stay free of torch headers."""
    _, results = builds
    _check(results, name)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: no CUDA include dir for the glue")
@pytest.mark.parametrize("name", GLUE)
def test_glue_syntax_against_torch_and_cuda_headers(builds, name):
    _, results = builds
    if name not in results:
        pytest.skip("no cuda_runtime_api.h in nvcc's include dirs")
    _check(results, name)


def _symbols(obj: Path, flag: str) -> set[str]:
    out = subprocess.run(["nm", "-C", flag, str(obj)], capture_output=True, text=True, check=True).stdout
    names = (re.match(r"\s*(?:[0-9a-fA-F]+\s+)?[A-Za-z]\s+(.*)", line) for line in out.splitlines())
    return {m.group(1) for m in names if m and m.group(1).startswith("attnmetrics::gpu::")}


@pytest.mark.skipif(NVCC is None or shutil.which("nm") is None, reason="needs nvcc and nm")
def test_glue_calls_only_launchers_the_kernels_define(builds):
    """What linking would check: every launcher each glue file calls, with its exact
    signature, is defined by the nvcc objects (a CPU torch has no libc10_cuda to link
    against)."""
    tmp, results = builds
    if not any(name in results for name in GLUE):
        pytest.skip("no cuda_runtime_api.h in nvcc's include dirs")
    for name in (*GLUE, *KERNELS):
        _check(results, name)
    defined = set().union(*(_symbols(tmp / f"{name}.o", "--defined-only") for name in KERNELS))
    wanted = {name: _symbols(tmp / f"{name}.o", "--undefined-only") for name in GLUE}
    for name, launchers in wanted.items():
        assert launchers, f"{name} calls no launcher"
        assert launchers <= defined, (name, launchers - defined)
    # tvd, jsd, kendall_tau, flip ops, permutation_tvd_linear, project_prefix x 2 dtypes,
    # check_rows, attention_permutations, leave_one_out_batch, attention_rollout x 2 dtypes
    assert len(set().union(*wanted.values())) >= 19


@pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no {CXX}")
def test_host_harness(builds):
    tmp, results = builds
    _check(results, "host_harness")
    run = subprocess.run([str(tmp / "harness")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all checks passed" in run.stdout


_NUMPY = {"i64": np.int64, "f32": np.float32, "f64": np.float64}


def _harness_cases(folder: Path):
    """The harness's runs: (op, {name: tensor or int}) per line of its manifest."""
    for line in (folder / "manifest.txt").read_text().splitlines():
        op, *fields = line.split()
        args = {}
        for field in fields:
            name, value = field.split("=", 1)
            if ":" in value:
                file, kind, dims = value.split(":")
                shape = [] if dims == "s" else [int(d) for d in dims.split("x")]
                args[name] = torch.from_numpy(np.fromfile(folder / file, dtype=_NUMPY[kind]).reshape(shape))
            else:
                args[name] = int(value)
        yield op, args


@pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no {CXX}")
def test_host_harness_equals_cpu_ops(builds, tmp_path):
    """The new kernels' per-thread code, over their launchers' grids (and smaller ones that
    give each thread many items), gives the CPU ops' results on the same inputs: integers
    and, with the same IEEE operations (no FMA on either side), floats bit for bit."""
    tmp, results = builds
    _check(results, "host_harness")
    run = subprocess.run([str(tmp / "harness"), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    ops = _ops.ops
    seen = {}
    for op, a in _harness_cases(tmp_path):
        seen[op] = seen.get(op, 0) + 1
        if op == "attention_permutations":
            got = ops.attention_permutations(
                a["lengths"], a["width"], a["permutations"], a["seed"], a["row_offset"], a["permutation_offset"]
            )
            assert torch.equal(got, a["out"])
        elif op == "permutation_tvd_linear":
            median, tvds = ops.permutation_tvd_linear(
                a["attention"], a["projected"], a["bias"], a["lengths"], a["permutations"], a["seed"], a["row_offset"]
            )
            assert torch.equal(tvds, a["tvd"]) and torch.equal(median, a["median"])
            assert (tvds > 0).any() or a["attention"].shape[1] <= 1
        elif op == "project_prefix":
            assert torch.equal(ops.project_prefix(a["values"], a["weight"], a["lengths"]), a["out"])
        else:
            assert op == "leave_one_out_batch"
            mask = a["mask_token"] if a["mask_token"] >= 0 else None
            got = ops.leave_one_out_batch(a["tokens"], a["lengths"], a["lead"], a["trail"], mask, a["pad"])
            for g, name in zip(got, ("out", "out_lengths", "out_source")):
                assert torch.equal(g, a[name]), name
    assert seen == {
        "attention_permutations": 6,
        "permutation_tvd_linear": 14,
        "project_prefix": 12,
        "leave_one_out_batch": 7,
    }


GLUE_HEADER = CSRC / "cuda" / "glue.h"  # the glue files' shared helpers: ATen, for them only


def test_kernels_and_launcher_header_stay_free_of_torch():
    for path in [*(CSRC / "cuda").glob("*.cu"), *(CSRC / "cuda").glob("*.h"), *(CSRC / "kernels").glob("*.h")]:
        if path == GLUE_HEADER:
            continue
        text = path.read_text()
        assert not re.search(r"#include\s*[<\"](torch|ATen|c10)/", text), path
        assert not re.search(r"#include\s*[<\"](cuda/)?glue\.h", text), path


# ---- the loader's choice of build ---------------------------------------------------------


def _plan(monkeypatch, *, gpu: bool, nvcc: str | None, mode: str | None):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(_ops, "find_nvcc", lambda: nvcc)
    if mode is None:
        monkeypatch.delenv("ATTNMETRICS_CUDA", raising=False)
    else:
        monkeypatch.setenv("ATTNMETRICS_CUDA", mode)
    return _ops._want_cuda()


def test_loader_plan(monkeypatch):
    assert _plan(monkeypatch, gpu=False, nvcc=None, mode=None) == (False, None)
    assert _plan(monkeypatch, gpu=False, nvcc="/x/nvcc", mode=None) == (False, None)
    assert _plan(monkeypatch, gpu=True, nvcc="/x/nvcc", mode=None) == (True, None)
    assert _plan(monkeypatch, gpu=True, nvcc="/x/nvcc", mode="0") == (False, None)
    with_cuda, why = _plan(monkeypatch, gpu=True, nvcc=None, mode="auto")
    assert not with_cuda and "nvcc" in why and "CUDA_HOME" in why
    with pytest.raises(RuntimeError, match="cannot build its CUDA kernels: no CUDA compiler: nvcc"):
        _plan(monkeypatch, gpu=True, nvcc=None, mode="1")
    with pytest.raises(RuntimeError, match="sees no CUDA GPU"):
        _plan(monkeypatch, gpu=False, nvcc="/x/nvcc", mode="1")
    with pytest.raises(RuntimeError, match="ATTNMETRICS_CUDA must be auto, 0 or 1"):
        _plan(monkeypatch, gpu=True, nvcc=None, mode="yes")


def test_cpu_build_sources_have_no_cuda():
    assert not any("cuda" in Path(s).parts for s in _ops._sources(False))
    cuda = _ops._sources(True)
    assert {Path(s).name for s in cuda} >= {*KERNELS, *GLUE, "ops.cpp"}


def test_this_process_loaded_the_expected_build():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = (
            torch.cuda.is_available()
            and _ops.find_nvcc() is not None
            and os.environ.get("ATTNMETRICS_CUDA", "auto") != "0"
        )
    assert _ops.CUDA_KERNELS == expected
