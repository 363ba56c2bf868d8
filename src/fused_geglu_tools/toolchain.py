"""Compiler command lines for the compiled variants (g++ for C++, nvcc for CUDA).

Mirrors what kernel-builder's CMake does for a [torch] kernel: the ops id as
TORCH_EXTENSION_NAME, CPU_KERNEL / CUDA_KERNEL, the cxx11 ABI flag of the installed torch, C++17
for torch < 2.12 and C++20 from 2.12, Python's limited API, one shared object per variant.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


class ToolchainError(RuntimeError):
    pass


@dataclass(frozen=True)
class Toolchain:
    cxx: str
    nvcc: str | None
    torch_version: tuple[int, int]
    cxx11_abi: bool
    torch_cuda: str | None  # torch.version.cuda
    nvcc_cuda: str | None  # the CUDA release nvcc reports ("13.0"), None without nvcc or when unreadable
    include_dirs: tuple[str, ...]
    cuda_include_dirs: tuple[str, ...]
    library_dirs: tuple[str, ...]
    cuda_library_dirs: tuple[str, ...]

    @property
    def cxx_std(self) -> str:
        return "c++20" if self.torch_version >= (2, 12) else "c++17"

    def common_defines(self, ops_id: str, backend: str) -> list[str]:
        return [
            f"-D_GLIBCXX_USE_CXX11_ABI={int(self.cxx11_abi)}",
            f"-DTORCH_EXTENSION_NAME={ops_id}",
            "-DPy_LIMITED_API=0x03090000",
            "-DCPU_KERNEL" if backend == "cpu" else "-DCUDA_KERNEL",
        ]


def _cuda_home(nvcc: str | None) -> Path | None:
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env:
        return Path(env)
    if nvcc:
        home = Path(nvcc).resolve().parent.parent
        if _is_toolkit(home):
            return home
        # nvcc on PATH may be a wrapper script (`exec /usr/local/cuda-13.0/bin/nvcc "$@"`): its folder's
        # parent is then /usr/local, whose lib has no libcudart.so. nvcc itself names its toolkit.
        return _nvcc_top(nvcc) or home
    return None


def _is_toolkit(home: Path) -> bool:
    return any((home / sub / "cuda_runtime.h").is_file() for sub in ("include", "targets/x86_64-linux/include"))


def _nvcc_top(nvcc: str) -> Path | None:
    """The toolkit root nvcc reports for itself (``#$ TOP=...`` of a dry run), or None."""
    try:
        out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("#$ TOP="):
            top = Path(line.split("=", 1)[1].strip().strip('"')).resolve()
            return top if _is_toolkit(top) else None
    return None


@lru_cache(maxsize=None)
def compiler_version(exe: str) -> str:
    """What ``exe --version`` prints ("" when it cannot run)."""
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def nvcc_release(nvcc: str | None) -> str | None:
    """The CUDA release of ``nvcc`` ("13.0" from its ``--version`` line "... release 13.0, V13.0.88"), or None."""
    m = re.search(r"release (\d+\.\d+)", compiler_version(nvcc)) if nvcc else None
    return m.group(1) if m else None


def cuda_mismatch(torch_cuda: str | None, nvcc_cuda: str | None) -> str | None:
    """Why ``nvcc`` of release ``nvcc_cuda`` cannot build for a torch built with CUDA ``torch_cuda``, or None.

    Another major release cannot (the runtime's and the libraries' sonames change with it). An older minor
    of the same major can: the code it emits runs on the newer runtime torch loads, and its own headers
    come first on the include path (detect). An unreadable release is not refused here: the compile says."""
    if not torch_cuda or not nvcc_cuda:
        return None
    if torch_cuda.split(".")[0] != nvcc_cuda.split(".")[0]:
        return (f"nvcc is CUDA {nvcc_cuda} but torch was built with CUDA {torch_cuda}; put a CUDA "
                f"{torch_cuda.split('.')[0]}.x nvcc first on PATH (or set NVCC) to build the compiled CUDA variant")
    return None


def detect() -> Toolchain:
    import torch
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise ToolchainError("no C++ compiler found (install g++ or set CXX)")
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    cuda_home = _cuda_home(nvcc)
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    cuda_includes: list[str] = []
    cuda_libs: list[str] = []
    if cuda_home is not None:
        for sub in ("include", "targets/x86_64-linux/include"):
            if (cuda_home / sub).is_dir():
                cuda_includes.append(str(cuda_home / sub))
        for sub in ("lib64", "targets/x86_64-linux/lib", "lib"):
            if (cuda_home / sub).is_dir():
                cuda_libs.append(str(cuda_home / sub))
    # Libraries: the nvidia-* wheels first. Their cuBLASLt is the copy torch itself loads, and one
    # process must not end up with two cuBLAS builds (the toolkit's and the wheel's).
    # Headers: the toolkit's first. Its CUDA runtime and CCCL headers are versioned with nvcc, and
    # CCCL refuses another release's ("CUDA compiler and CUDA toolkit headers are incompatible"):
    # torch 2.15's PyPI build brings CUDA 13.2 headers in its wheels, and nvcc 13.0 failed on every
    # .cu until these came second. The wheels still supply what a toolkit image may lack (cublasLt.h).
    wheel_inc, wheel_lib = _nvidia_wheel_dirs()
    cuda_includes = cuda_includes + wheel_inc
    cuda_libs = wheel_lib + cuda_libs
    return Toolchain(
        cxx=cxx,
        nvcc=nvcc,
        torch_version=version,
        cxx11_abi=bool(torch.compiled_with_cxx11_abi()),
        torch_cuda=torch.version.cuda,
        nvcc_cuda=nvcc_release(nvcc),
        include_dirs=tuple(includes),
        cuda_include_dirs=tuple(cuda_includes),
        library_dirs=tuple(cpp_extension.library_paths()),
        cuda_library_dirs=tuple(cuda_libs),
    )


def dependency_include_dirs(depends: tuple[str, ...]) -> list[str]:
    """Header folders for kernel-builder ``depends`` entries that this builder can provide.

    ``cutlass_*``: the CUTLASS/CuTe headers shipped in the ``nvidia-cutlass`` wheel (found
    through its ``cutlass_library`` package), or ``$CUTLASS_PATH/include``.
    """
    dirs: list[str] = []
    for dep in depends:
        if dep == "torch":
            continue
        if dep.startswith("cutlass"):
            dirs.extend(_cutlass_include_dirs())
        else:
            raise ToolchainError(f"build.toml depends on {dep!r}, which this builder cannot provide")
    return dirs


def _cutlass_include_dirs() -> list[str]:
    env = os.environ.get("CUTLASS_PATH")
    candidates = [Path(env) / "include"] if env else []
    # Locate the wheel's files without importing it (its Python side needs extra packages).
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.origin:
        base = Path(spec.origin).parent
        candidates += [base / "source" / "include", base.parent / "cutlass" / "include"]
        candidates += [p.parent.parent for p in base.rglob("cutlass/cutlass.h")]
    for cand in candidates:
        if (cand / "cutlass" / "cutlass.h").is_file():
            out = [str(cand)]
            util = cand.parent / "tools" / "util" / "include"
            if util.is_dir():
                out.append(str(util))
            return out
    raise ToolchainError(
        "CUTLASS headers not found: pip install nvidia-cutlass (or set CUTLASS_PATH)"
    )


def gencode_flags(capabilities: list[str]) -> list[str]:
    """``-gencode`` for each capability, "9.0" -> sm_90, "9.0a" -> sm_90a."""
    flags = []
    for cap in capabilities:
        num = cap.replace(".", "").replace("+PTX", "")
        flags += ["-gencode", f"arch=compute_{num},code=sm_{num}"]
        if cap.endswith("+PTX"):
            flags += ["-gencode", f"arch=compute_{num},code=compute_{num}"]
    return flags


def _nvidia_wheel_dirs() -> tuple[list[str], list[str]]:
    """Headers and libraries of the ``nvidia-*`` wheels a CUDA torch installs (cuBLASLt's
    ``cublasLt.h`` is not in every toolkit image, and the wheel's library is the one torch loads)."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return [], []
    incs, libs = [], []
    for base in map(Path, spec.submodule_search_locations):
        for sub in ("cu13", "cu12", "cublas", "cuda_runtime"):
            if (base / sub / "include").is_dir():
                incs.append(str(base / sub / "include"))
            if (base / sub / "lib").is_dir():
                libs.append(str(base / sub / "lib"))
    return incs, libs


def cuda_library_link_flags(name: str, library_dirs: tuple[str, ...]) -> list[str]:
    """Link flags for CUDA library ``name`` ("cudart", "cublasLt"): the first folder that has it, in
    order (the nvidia-* wheels', whose copy torch itself loads, before the toolkit's). A wheel ships only
    the versioned file (``libcudart.so.13``), which ``-l:`` names; a toolkit has the ``lib<name>.so`` link."""
    for d in library_dirs:
        versioned = sorted(Path(d).glob(f"lib{name}.so.*"))
        if versioned:
            return [f"-L{d}", f"-l:{versioned[0].name}", f"-Wl,-rpath,{d}"]
        if (Path(d) / f"lib{name}.so").exists():
            return [f"-L{d}", f"-l{name}"]
    raise ToolchainError(f"lib{name} not found in {list(library_dirs)} (a CUDA toolkit's lib64, or the nvidia-* "
                         "wheels a CUDA torch installs)")


def shared_libstdcxx_flags(cxx: str) -> list[str]:
    """Link the C++ runtime as the shared ``libstdc++.so.6`` that torch's process already has.

    Where the compiler's ``libstdc++.so`` development link is missing (the H200 image's g++ 13),
    ``g++ -shared`` silently takes ``libstdc++.a`` instead, and the extension carries a second copy
    of the runtime's statics: its own locale facet ids, so a stream insertion inside the extension
    (a ``TORCH_CHECK`` message, ``c10::str``) indexed the wrong facet and crashed (the cuBLASLt
    SIGSEGV of 2026-12-02), and two sets of runtime destructors ran at exit.
    """
    dev_link = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout.strip()
    if dev_link and os.path.isabs(dev_link) and os.path.exists(dev_link):
        return []  # the usual case: -lstdc++ (implicit) finds the shared library
    return ["-l:libstdc++.so.6"]


def needed_libraries(path: Path) -> list[str]:
    """DT_NEEDED entries of an ELF shared object (``readelf -d``)."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def check_shared_libstdcxx(path: Path) -> None:
    """Refuse an extension that does not load the shared C++ runtime (see shared_libstdcxx_flags)."""
    if shutil.which("readelf") is None:
        return  # binutils ships readelf beside ld; without it there is nothing to check with
    needed = needed_libraries(path)
    if not any(n.startswith("libstdc++.so") for n in needed):
        raise ToolchainError(
            f"{path.name} does not link the shared libstdc++ (DT_NEEDED: {needed}); a statically linked "
            "C++ runtime inside a torch extension crashes on stream insertion and at exit"
        )
