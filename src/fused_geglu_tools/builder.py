"""The Nix-free builder: ``build.toml`` + sources -> ``build/<variant>/`` in the loader's layout.

Each variant is assembled in a scratch folder under ``build/`` and moved into place only when
complete, so an interrupted or failed build leaves no half-built variant behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from . import __version__, abi, templates, toolchain
from .buildconfig import BuildConfig, KernelSection, load_build_config
from .gitid import SourceIdentity, source_identity
from .metadata import write_metadata
from .public_api import write_symbols
from .variants import Variant


class BuildError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(f"[fused-geglu build] {msg}", flush=True)


@dataclass(frozen=True)
class Plan:
    variant: Variant
    sections: tuple[KernelSection, ...]  # compiled sources; empty for noarch


def ops_id_for(cfg: BuildConfig, variant: Variant, uid: str) -> str:
    """The variant's ops id: its Python module name, its torch.ops namespace and metadata.json's "id".

    Unique per build: kernels (0.19) refuses to load a second build under an id that is already loaded,
    and a noarch variant and the compiled one of the same backend are different builds of one commit
    (a process can hold both: a staged torch-cpu, then build/'s torch213 for a benchmark)."""
    kind = f"{variant.backend}_noarch" if variant.noarch else variant.backend
    return f"_{cfg.python_name}_{kind}_{uid}"


def plan_variants(cfg: BuildConfig, tc: toolchain.Toolchain | None, backends: list[str] | None) -> list[Plan]:
    """The variants this machine can build (optionally restricted to ``backends``)."""
    wanted = [b for b in cfg.backends if backends is None or b in backends]
    plans: list[Plan] = []
    for backend in wanted:
        sections = tuple(cfg.kernels_for(backend))
        if backend == "cpu":
            # ATen-only noarch variant: a CPU torch of a version with no compiled build (2.14, 2.15, ...)
            # still loads the kernel, its functions and layers; the loader prefers a compiled build.
            plans.append(Plan(Variant(backend="cpu"), ()))
            if tc is not None and sections:
                plans.append(Plan(Variant.for_this_torch("cpu"), sections))
        if backend == "cuda":
            # Triton-only noarch variant: for torch versions with no compiled build.
            plans.append(Plan(Variant(backend="cuda"), ()))
            mismatch = tc and toolchain.cuda_mismatch(tc.torch_cuda, tc.nvcc_cuda)
            if tc is not None and tc.torch_cuda and tc.nvcc and sections and not mismatch:
                plans.append(Plan(_cuda_variant(tc), sections))
            elif sections:
                why = ("the installed torch has no CUDA" if not (tc and tc.torch_cuda) else
                       "no nvcc" if not tc.nvcc else mismatch)
                _log(f"skipping the compiled CUDA variant: {why}")
    return plans


def _cuda_variant(tc: toolchain.Toolchain) -> Variant:
    """The compiled CUDA variant, named after the older of torch's CUDA and nvcc's (same major).

    What the library needs at run time is the release it was compiled with: nvcc 13.0 against torch
    2.15's CUDA 13.2 headers compiles with its own 13.0 headers (toolchain.detect), and kernels loads a
    cu130 build for any torch of CUDA 13.0 or a later 13.x. Named cu132 it would not load for torch
    2.15+cu130, which it runs on just as well."""
    v = Variant.for_this_torch("cuda")
    nvcc = tuple(int(p) for p in tc.nvcc_cuda.split(".")[:2]) if tc.nvcc_cuda else None
    return replace(v, cuda=nvcc) if nvcc and v.cuda and nvcc[0] == v.cuda[0] and nvcc < v.cuda else v


def _copy_package(cfg: BuildConfig, dest: Path) -> None:
    exts = {"." + e for e in cfg.pyext}
    src_root = cfg.package_dir
    if not (src_root / "__init__.py").is_file():
        raise BuildError(f"{src_root}/__init__.py is missing")
    for path in sorted(src_root.rglob("*")):
        rel = path.relative_to(src_root)
        if "__pycache__" in rel.parts or not path.is_file() or path.suffix not in exts:
            continue
        if rel.as_posix() == "_ops.py":  # generated per variant
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def _run(cmd: list[str], what: str) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise BuildError(f"{what} failed (exit {proc.returncode}); command:\n  " + " ".join(cmd))
    if os.environ.get("FUSED_GEGLU_BUILD_VERBOSE") and (proc.stdout or proc.stderr):
        sys.stderr.write(proc.stdout + proc.stderr)
    _log(f"{what} ({time.monotonic() - t0:.0f} s)")


_compiler_version = toolchain.compiler_version  # a compiler's identity for the object cache's key


_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def _local_headers(src: Path, include_dirs: list[Path], local: tuple[Path, ...]) -> list[Path]:
    """The repository headers outside ``src``'s folder that ``src`` reaches through quoted includes,
    resolved as the compiler resolves them (the including file's folder, then the -I folders in
    order). Only files under ``local`` (this repository's source folders) are followed: torch's and
    CUTLASS's headers are covered by the key's versions, the generated ones by their contents.
    A kernel source may include the binding's header (kernel_src/geglu_cuda/mlp_gemm.cpp includes
    torch_binding.h): a key of the source's folder alone would reuse a stale object after it changed."""
    roots = tuple(r.resolve() for r in local)
    home = src.parent.resolve()
    seen: set[Path] = set()
    found: list[Path] = []
    todo = [src]
    while todo:
        f = todo.pop()
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for name in _QUOTED_INCLUDE.findall(text):
            for d in (f.parent, *include_dirs):
                if (d / name).is_file():
                    hit = (d / name).resolve()
                    break
            else:
                continue  # not found here: the compiler will say so
            if hit in seen or not any(hit.is_relative_to(r) for r in roots):
                continue
            seen.add(hit)
            todo.append(hit)
            if hit.parent != home:
                found.append(hit)
    return sorted(found)


def _run_cached(cmd: list[str], what: str, cache: Path, salt: str, local: tuple[Path, ...] = ()) -> None:
    """Compile, reusing an object from ``build/.objcache`` when nothing that feeds it changed.

    Only kernel sources are cached: the binding (torch-ext/) is compiled with the ops id, which
    changes with every commit, and compiles in seconds. The key covers the torch version
    (``salt``), the compiler's ``--version``, the command line without the ops id and with the
    build's scratch folder as a placeholder (its generated headers by content), every file in
    the source's folder, the repository headers elsewhere that it includes (``local``: the
    repository's source folders; ``_local_headers``), and the CUTLASS version header of any
    include folder that has one (the cache outlives a machine when carried between device calls,
    and the headers' wheel may change under the same include path).
    """
    src, obj = Path(cmd[cmd.index("-o") - 1]), Path(cmd[cmd.index("-o") + 1])
    if "torch-ext" in src.parts:
        return _run(cmd, what)
    # The build's scratch folder (a fresh temporary name per build) holds the object and the
    # generated headers: the key names it by a placeholder and covers the generated files' contents.
    work = str(obj.parent)
    h = hashlib.sha256(salt.encode())
    h.update(_compiler_version(cmd[0]).encode())
    h.update(" ".join(c.replace(work, "<work>") for c in cmd
                      if not c.startswith("-DTORCH_EXTENSION_NAME=") and c != str(obj)).encode())
    for dep in sorted(src.parent.iterdir()):
        if dep.is_file():
            h.update(dep.name.encode() + dep.read_bytes())
    if local:
        inc_dirs = [Path(a[2:]) for a in cmd if a.startswith("-I") and not a[2:].startswith(work)]
        for dep in _local_headers(src, inc_dirs, local):
            # Named by its path below torch-ext/ or kernel_src/, so the key is the same in any checkout.
            rel = next(str(dep.relative_to(r.resolve())) for r in local if dep.is_relative_to(r.resolve()))
            h.update(rel.encode() + dep.read_bytes())
    for arg in cmd:
        inc = Path(arg[2:]) if arg.startswith("-I") else None
        if inc is None:
            continue
        if arg[2:].startswith(work):
            for gen in sorted(p for p in inc.rglob("*") if p.is_file()):
                h.update(gen.name.encode() + gen.read_bytes())
        elif (inc / "cutlass" / "version.h").is_file():
            h.update((inc / "cutlass" / "version.h").read_bytes())
    cached = cache / f"{src.stem}-{h.hexdigest()[:16]}.o"
    if cached.is_file():
        shutil.copy2(cached, obj)
        _log(f"{what} (cached)")
        return
    _run(cmd, what)
    cache.mkdir(parents=True, exist_ok=True)
    shutil.copy2(obj, cached)


def _compile_shared_object(
    cfg: BuildConfig, plan: Plan, tc: toolchain.Toolchain, ops_id: str, workdir: Path, out: Path
) -> list[str]:
    """Compile and link ``<ops_id>.abi3.so``; returns the CUDA archs compiled (empty for CPU)."""
    backend = plan.variant.backend
    gen = workdir / "gen"
    gen.mkdir()
    (gen / "registration.h").write_text(templates.REGISTRATION_H)
    root = cfg.root
    includes = [str(gen), str(root / "torch-ext"), str(root / "kernel_src"), *tc.include_dirs]
    if backend == "cuda":
        includes += list(tc.cuda_include_dirs)
    defines = tc.common_defines(ops_id, backend)
    cxx_base = [tc.cxx, "-c", "-fPIC", "-O3", f"-std={tc.cxx_std}", "-fno-gnu-unique", "-Wall",
                "-Wno-unused-function", *defines]

    jobs: list[tuple[list[str], str]] = []
    objects: list[Path] = []
    archs: set[str] = set()

    def add_cxx(src: Path, extra_inc: list[str], flags: tuple[str, ...]) -> None:
        obj = workdir / (src.name + ".o")
        objects.append(obj)
        jobs.append(([*cxx_base, *flags, *(f"-I{d}" for d in [*extra_inc, *includes]), str(src), "-o", str(obj)],
                     f"compiled {src.relative_to(root)}"))

    for src in cfg.torch_src:
        if src.endswith((".cpp", ".cc", ".cxx")):
            add_cxx(root / src, [], ())
    for section in plan.sections:
        extra_inc = [str(root / i) for i in section.include] + toolchain.dependency_include_dirs(section.depends)
        for src in section.src:
            path = root / src
            if path.suffix in (".cpp", ".cc", ".cxx"):
                add_cxx(path, extra_inc, section.cxx_flags)
            elif path.suffix == ".cu":
                caps = _cuda_capabilities(section)
                archs.update(caps)
                obj = workdir / (path.name + ".o")
                objects.append(obj)
                cmd = [tc.nvcc, "-c", "-O3", f"-std={'c++20' if tc.cxx_std == 'c++20' else 'c++17'}",
                       "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "--expt-extended-lambda",
                       *defines, *toolchain.gencode_flags(caps), *section.cuda_flags,
                       *(f"-I{d}" for d in [*extra_inc, *includes]), str(path), "-o", str(obj)]
                jobs.append((cmd, f"compiled {src} for sm {','.join(caps)}"))
            # headers (.h/.cuh) are listed for kernel-builder's benefit only

    cache = out.parent.parent.parent / ".objcache"  # build/.objcache (out = build/.partial-*/variant/x.so)
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        import torch

        salt = f"torch {torch.__version__} cuda {tc.torch_cuda}"
        local = (root / "torch-ext", root / "kernel_src")
        futures = [pool.submit(_run_cached, cmd, what, cache, salt, local) for cmd, what in jobs]
        errors = []
        for fut in futures:
            try:
                fut.result()
            except BuildError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    libs = [f"-L{d}" for d in tc.library_dirs] + [f"-Wl,-rpath,{d}" for d in tc.library_dirs]
    libs += ["-lc10", "-ltorch", "-ltorch_cpu"]
    if backend == "cuda":
        libs += [f"-L{d}" for d in tc.cuda_library_dirs]
        libs += ["-lc10_cuda", "-ltorch_cuda", *toolchain.cuda_library_link_flags("cudart", tc.cuda_library_dirs),
                 *toolchain.cuda_library_link_flags("cublasLt", tc.cuda_library_dirs)]
    libs += toolchain.shared_libstdcxx_flags(tc.cxx)
    _run([tc.cxx, "-shared", "-fPIC", *map(str, objects), "-o", str(out), *libs], f"linked {out.name}")
    toolchain.check_shared_libstdcxx(out)
    _report_portability(out)
    return sorted(archs)


def _report_portability(lib: Path) -> None:
    """Log whether ``lib`` meets the Hub's policy. Only a warning here: the library loads on this machine,
    and `fused-geglu verify` / `publish` are where a library that would not load elsewhere is refused."""
    try:
        found = abi.library_violations(lib)
    except (abi.CheckerMissing, ValueError) as e:
        _log(f"{lib.name}: portability not checked: {e}")
        return
    if not found:
        _log(f"{lib.name}: portable ({abi.POLICY})")
        return
    _log(f"warning: {lib.name} breaks {abi.POLICY}: it loads here, but `fused-geglu publish` refuses it")
    for line in found:
        _log(f"  {line}")


def _cuda_capabilities(section: KernelSection) -> list[str]:
    override = os.environ.get("FUSED_GEGLU_CUDA_ARCHS")  # e.g. "9.0" to build only for the local GPU
    caps = list(section.cuda_capabilities) or ["8.0", "9.0"]
    if override:
        keep = {c.strip() for c in override.split(",") if c.strip()}
        caps = [c for c in caps if c.rstrip("a") in keep or c in keep]
        if not caps:
            raise BuildError(f"[kernel.{section.name}]: none of {section.cuda_capabilities} is in "
                             f"FUSED_GEGLU_CUDA_ARCHS={override}")
    return caps


def build_variant(cfg: BuildConfig, plan: Plan, ident: SourceIdentity, tc, out_root: Path) -> Path:
    variant = plan.variant
    ops_id = ops_id_for(cfg, variant, ident.uid)
    final = out_root / variant.name
    _log(f"{variant.name}: ops id {ops_id}")
    t0 = time.monotonic()
    out_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".partial-{variant.name}-", dir=out_root))
    try:
        stage = scratch / "variant"
        stage.mkdir()
        _copy_package(cfg, stage)
        archs: list[str] = []
        if variant.noarch:
            (stage / "_ops.py").write_text(templates.NOARCH_OPS_PY.format(ops_id=ops_id))
        else:
            work = scratch / "obj"
            work.mkdir()
            archs = _compile_shared_object(cfg, plan, tc, ops_id, work, stage / f"{ops_id}.abi3.so")
            (stage / "_ops.py").write_text(templates.COMPILED_OPS_PY.format(ops_id=ops_id))
        write_symbols(stage)  # kernels describe-api reads it; written first so the digest covers it
        write_metadata(stage, cfg, variant, ops_id, ident, archs, builder_version=__version__)
        if final.exists():
            shutil.rmtree(final)
        stage.rename(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _log(f"{variant.name}: done in {time.monotonic() - t0:.0f} s")
    return final


def _toolchain() -> toolchain.Toolchain | None:
    try:
        return toolchain.detect()
    except toolchain.ToolchainError as exc:
        _log(f"no compiler: {exc}; building noarch variants only")
        return None


def planned_variants(root: Path, backends: list[str] | None = None) -> list[str]:
    """The names of the variants ``build`` would make here, in its order, without compiling anything."""
    return [plan.variant.name for plan in plan_variants(load_build_config(root), _toolchain(), backends)]


def _built_from(variant_dir: Path, uid: str) -> bool:
    """Whether the finished variant in ``variant_dir`` was built from the sources whose uid is ``uid``
    (its metadata.json's id ends in it: ops_id_for)."""
    try:
        ident = json.loads((variant_dir / "metadata.json").read_text()).get("id", "")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(ident, str) and ident.endswith(f"_{uid}")


def remove_stale_variants(out_root: Path, keep: set[str], uid: str | None = None) -> None:
    """Remove the finished variants in ``out_root`` that are not in ``keep`` and, given ``uid``, were not
    built from the same sources (another torch's build of this commit stays). Scratch folders stay."""
    for stale in sorted(out_root.iterdir()):
        if stale.is_dir() and stale.name not in keep and not stale.name.startswith(".partial-"):
            if (stale / "metadata.json").exists() and not (uid and _built_from(stale, uid)):
                _log(f"removing stale variant {stale.name}")
                shutil.rmtree(stale)


def build(root: Path, out_root: Path | None = None, backends: list[str] | None = None,
          clean: bool = True) -> list[Path]:
    """Build into ``out_root``; with ``clean`` and every backend, remove the variants built from other sources
    (an older commit's, a dirty tree's). Other torch versions' variants of the same sources stay: those of
    ``fused-geglu build-matrix``, which builds with ``clean=False`` under each torch and removes what none of
    them made at the end."""
    cfg = load_build_config(root)
    out_root = Path(out_root) if out_root else cfg.root / "build"
    sources = [cfg.root / "build.toml", *cfg.package_dir.rglob("*.py")]
    for section in cfg.kernels:
        sources += [cfg.root / s for s in section.src]
    ident = source_identity(cfg.root, fallback_paths=[p for p in sources if p.is_file()])
    _log(f"source {ident.commit or 'outside git'}{' (dirty)' if ident.dirty else ''}, uid {ident.uid}")
    tc = _toolchain()
    plans = plan_variants(cfg, tc, backends)
    if not plans:
        raise BuildError(f"nothing to build for backends {backends or list(cfg.backends)}")
    built = [build_variant(cfg, plan, ident, tc, out_root) for plan in plans]
    if clean and backends is None:  # other sources' variants would shadow nothing but confuse
        remove_stale_variants(out_root, {p.name for p in built}, ident.uid)
    return built
