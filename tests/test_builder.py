"""The Nix-free builder's output is what the loader expects, and its failures are loud and clean."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys

import pytest
from fused_geglu_tools import kernels_internals
from fused_geglu_tools.buildconfig import BuildConfigError, load_build_config
from fused_geglu_tools.digest import hash_variant
from fused_geglu_tools.gitid import source_identity
from fused_geglu_tools.variants import Variant


def test_variant_names_round_trip_over_a_grid():
    for major, minor, cxx11, backend, cuda, arch in itertools.product(
            [2], [9, 11, 13], [True, False], ["cpu", "cuda"], [(12, 6), (13, 0)], ["x86_64", "aarch64"]):
        v = Variant(backend=backend, torch=(major, minor), cxx11=cxx11,
                    cuda=cuda if backend == "cuda" else None, arch=arch)
        assert Variant.parse(v.name) == v
    for backend in ("cpu", "cuda"):
        assert Variant.parse(f"torch-{backend}") == Variant(backend=backend)
    assert Variant.parse("torch211-cxx11-cu130-x86_64-linux").cuda == (13, 0)
    with pytest.raises(ValueError, match="not a build variant"):
        Variant.parse("torch-universal-foo")


def test_variant_names_agree_with_the_loader():
    parse_variant = kernels_internals.parse_variant()  # the loader's own parser

    for name in ("torch213-cxx11-cpu-x86_64-linux", "torch211-cxx11-cu130-x86_64-linux", "torch-cuda", "torch-cpu"):
        assert parse_variant(name) is not None, name


def test_build_layout_and_metadata(build_dir, repo_root):
    cfg = load_build_config(repo_root)
    ident = source_identity(repo_root)
    variants = {p.name: p for p in build_dir.iterdir() if (p / "metadata.json").is_file()}
    import torch

    compiled = Variant.for_this_torch("cuda" if torch.version.cuda else "cpu").name
    assert compiled in variants or torch.version.cuda, sorted(variants)  # CUDA builds need nvcc
    assert "torch-cuda" in variants
    # torch-cpu: the CPU torch versions with no compiled build; built with the cpu backend (not in the
    # GPU machine's --backends cuda build).
    assert "torch-cpu" in variants or not any(Variant.parse(n).backend == "cpu" for n in variants), sorted(variants)
    from kernels._rust import Metadata

    for name, path in variants.items():
        meta = json.loads((path / "metadata.json").read_text())
        Metadata.read_from_file(path / "metadata.json")  # the loader's parser accepts it
        v = Variant.parse(name)
        assert meta["name"] == "fused-geglu" and meta["version"] == cfg.version
        assert meta["license"] == cfg.license and meta["python-depends"] == []
        assert meta["backend"]["type"] == v.backend
        assert meta["id"].startswith(f"_fused_geglu_{v.backend}_")
        assert meta["digest"]["files"] == hash_variant(path), f"{name}: digest does not match the files"
        assert {"__init__.py", "_ops.py", "layers.py", "triton_kernels/geglu.py"} <= set(meta["digest"]["files"])
        assert not any(p.name in ("torch_binding.cpp", "registration.h") for p in path.rglob("*"))
        if ident.commit is not None:  # inside git: the build records the commit it came from
            assert meta["provenance"]["kernel"]["commit"] == ident.commit, "build/ is from another commit: run make build"
        if not v.noarch:
            so = path / f"{meta['id']}.abi3.so"
            assert so.is_file(), f"{name}: the .so must be named after the ops id"
            symbols = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
            assert f"PyInit_{meta['id']}" in symbols
            assert f'from . import {meta["id"]}' in (path / "_ops.py").read_text()
    assert not list(build_dir.glob(".partial-*")), "half-built variants left behind"


def test_metadata_writer_records_archs_provenance_and_dependencies(repo_root, tmp_path):
    """Fields the local CPU build leaves empty (CUDA archs, python-depends, upstream, a dirty tree)
    are written as the loader reads them: metadata.json parsed back by kernels' own parser."""
    import dataclasses

    from fused_geglu_tools.gitid import SourceIdentity
    from fused_geglu_tools.metadata import write_metadata
    from kernels._rust import Metadata

    cfg = dataclasses.replace(load_build_config(repo_root), python_depends=("einops",),
                              upstream="https://github.com/org/fused-geglu")
    variant = Variant(backend="cuda", torch=(2, 11), cuda=(13, 0))
    (tmp_path / "sub").mkdir()
    (tmp_path / "__init__.py").write_text("x = 1\n")
    (tmp_path / "sub" / "configs.json").write_text("{}")
    ident = SourceIdentity(uid="abc1234_dirty", commit="c" * 40, dirty=True)
    path = write_metadata(tmp_path, cfg, variant, "_fused_geglu_cuda_abc1234_dirty", ident, ["8.0", "9.0a"], "9.9.9")
    meta = Metadata.read_from_file(path)
    assert meta.id == "_fused_geglu_cuda_abc1234_dirty" and meta.version == cfg.version
    assert meta.backend.archs == ["8.0", "9.0a"]
    assert str(meta.provenance.kernel.commit) == "c" * 40 and meta.provenance.kernel.dirty is True
    assert meta.python_depends == ["einops"] and meta.upstream == "https://github.com/org/fused-geglu"
    assert dict(meta.digest.files) == hash_variant(tmp_path) and set(meta.digest.files) == {
        "__init__.py", "sub/configs.json"}
    # Outside git, with no commit named: no kernel provenance at all (not a made-up clean one).
    path = write_metadata(tmp_path, cfg, Variant(backend="cpu", torch=(2, 13)), "_fused_geglu_cpu_abc1234",
                          SourceIdentity(uid="abc1234", commit=None, dirty=False), [], "9.9.9")
    data = json.loads(path.read_text())
    assert "kernel" not in data["provenance"] and "archs" not in data["backend"]
    assert data["digest"]["files"] == hash_variant(tmp_path), "metadata.json must not hash itself"


def test_ops_id_comes_from_the_git_tree(repo_root, build_dir):
    ident = source_identity(repo_root)
    assert ident == source_identity(repo_root), "two identities of one tree must agree"
    # The tree of the commit the build names (a copy's own HEAD may be stale: FUSED_GEGLU_COMMIT).
    tree = subprocess.run(["git", "-C", str(repo_root), "rev-parse", "--verify", "-q",
                           f"{ident.commit or 'HEAD'}^{{tree}}"], capture_output=True, text=True).stdout.strip()
    if not ident.dirty and tree:  # a copy that does not know its named commit cannot compare
        assert ident.uid == tree[:7]
    for name, kind in (("torch-cuda", "cuda_noarch"), ("torch-cpu", "cpu_noarch")):
        if not (build_dir / name / "metadata.json").is_file():  # a --backends cuda build has no torch-cpu
            continue
        meta = json.loads((build_dir / name / "metadata.json").read_text())
        assert meta["id"] == f"_fused_geglu_{kind}_{ident.uid}" or meta["provenance"]["kernel"]["dirty"]


def test_copied_tree_takes_the_commit_it_was_copied_from(tmp_path, monkeypatch):
    """A tree with no commit of its own (a build machine's copy) records FUSED_GEGLU_COMMIT."""
    (tmp_path / "f.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.setenv("FUSED_GEGLU_COMMIT", "a" * 40)
    monkeypatch.setenv("FUSED_GEGLU_DIRTY", "0")
    ident = source_identity(tmp_path)
    assert ident.commit == "a" * 40 and not ident.dirty and not ident.uid.endswith("_dirty")
    monkeypatch.delenv("FUSED_GEGLU_COMMIT")
    assert source_identity(tmp_path).commit is None


def test_named_commit_wins_over_a_stale_head(tmp_path, monkeypatch):
    """A copy whose own HEAD is stale records the commit its copier names, not that HEAD."""
    (tmp_path / "f.py").write_text("x = 1\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "old"], check=True)
    stale = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "f.py").write_text("x = 2\n")  # the copied content: another commit's
    monkeypatch.setenv("FUSED_GEGLU_COMMIT", "b" * 40)
    monkeypatch.setenv("FUSED_GEGLU_DIRTY", "0")
    ident = source_identity(tmp_path)
    assert ident.commit == "b" * 40 != stale and not ident.dirty
    monkeypatch.setenv("FUSED_GEGLU_COMMIT", stale)  # naming the copy's own HEAD: compared with it
    assert source_identity(tmp_path).dirty
    monkeypatch.delenv("FUSED_GEGLU_COMMIT")
    assert source_identity(tmp_path).commit == stale


def _copy_sources(repo_root, dest):
    for name in ("build.toml", "torch-ext", "kernel_src"):
        src = repo_root / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / name)


def _build(dest, repo_root, *args):
    # The child must see the same packages (kernels' build.toml parser among them) as this process.
    path = os.pathsep.join([str(repo_root / "src"), *sys.path[1:]])
    env = {**os.environ, "PYTHONPATH": path, "FUSED_GEGLU_ROOT": str(dest)}
    return subprocess.run([sys.executable, "-m", "fused_geglu_tools", "build", *args], cwd=dest,
                          capture_output=True, text=True, env=env)


def _kernels_reads_edition_6() -> bool:
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("kernels")) >= Version("0.18")


def test_build_toml_is_in_the_edition_kernel_builder_requires(repo_root):
    """kernels 0.19's parser (kernel-builder's own) reads edition 5 by upgrading it in memory, with a warning
    that the Nix builder requires edition 6: flake.nix fetches the current kernel-builder (no lock), so an
    edition 5 build.toml no longer builds there. Until 2026-12-05 this file was edition 5."""
    if not _kernels_reads_edition_6():
        pytest.skip("kernels < 0.18 predates edition 6 (transformers 5.20-5.22 pin 0.17.2)")
    proc = subprocess.run([sys.executable, "-c", f"from kernels._rust import Build; Build.open({str(repo_root)!r})"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "edition" not in proc.stderr + proc.stdout, proc.stderr


def test_kernel_sections_name_their_language_or_backend(tmp_path):
    """Edition 6's ``language`` ("cpp-cpu", "cpp-cuda") and edition 5's ``backend`` both give a section's
    backend; a language this builder cannot compile is an error naming the section."""
    from fused_geglu_tools.buildconfig import _section_backend

    assert _section_backend("a", {"language": "cpp-cuda"}) == "cuda"
    assert _section_backend("a", {"language": "cpp-cpu"}) == "cpu"
    assert _section_backend("a", {"backend": "cpu"}) == "cpu"
    with pytest.raises(BuildConfigError, match=r"\[kernel.m\]: language = 'cpp-metal'"):
        _section_backend("m", {"language": "cpp-metal"})
    with pytest.raises(BuildConfigError, match=r"\[kernel.n\]: no language"):
        _section_backend("n", {"src": []})


def test_invalid_build_toml_fails_the_build(tmp_path, repo_root):
    if not _kernels_reads_edition_6():
        pytest.skip("kernels < 0.18 cannot parse edition 6: the builder's own checks stand in (no unknown-key check)")
    _copy_sources(repo_root, tmp_path)
    toml = tmp_path / "build.toml"
    assert "edition = 6" in toml.read_text()
    toml.write_text(toml.read_text().replace("edition = 6", "edition = 6\nbogus-key = 1"))
    with pytest.raises(BuildConfigError, match="invalid"):
        load_build_config(tmp_path)
    proc = _build(tmp_path, repo_root)
    assert proc.returncode == 1 and "invalid" in proc.stderr
    assert not (tmp_path / "build").exists()


def test_compile_error_is_shown_and_leaves_nothing(tmp_path, repo_root):
    _copy_sources(repo_root, tmp_path)
    src = tmp_path / "kernel_src" / "geglu_cpu" / "geglu_cpu.cpp"
    src.write_text("#error deliberately broken for the test\n" + src.read_text())
    proc = _build(tmp_path, repo_root, "--backends", "cpu")
    assert proc.returncode == 1
    assert "deliberately broken for the test" in proc.stderr, proc.stderr[-2000:]
    leftovers = [p.name for p in (tmp_path / "build").iterdir()] if (tmp_path / "build").exists() else []
    assert not [n for n in leftovers if n.startswith("torch2") or n.startswith(".partial")], leftovers


def test_compiled_variants_load_the_shared_cpp_runtime(build_dir):
    """A torch extension must use the process's libstdc++.so.6, never a static copy (which crashed the
    CUDA variant's stream insertions on the H200: see toolchain.shared_libstdcxx_flags)."""
    from fused_geglu_tools import toolchain

    sos = list(build_dir.glob("torch*-cxx11-*/*.so"))
    if not sos:
        pytest.skip("no compiled variant in build/")
    for so in sos:
        assert any(n.startswith("libstdc++.so") for n in toolchain.needed_libraries(so)), so


def test_missing_libstdcxx_dev_link_falls_back_to_the_shared_runtime(tmp_path):
    from fused_geglu_tools import toolchain

    fake = tmp_path / "g++"
    fake.write_text("#!/bin/sh\necho libstdc++.so\n")  # what g++ prints when it has no such file
    fake.chmod(0o755)
    assert toolchain.shared_libstdcxx_flags(str(fake)) == ["-l:libstdc++.so.6"]
    real = shutil.which("g++")
    if real:
        dev = subprocess.run([real, "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout.strip()
        assert toolchain.shared_libstdcxx_flags(real) == ([] if os.path.isabs(dev) else ["-l:libstdc++.so.6"])


def test_cuda_libraries_link_from_a_wheel_or_a_toolkit(tmp_path):
    """A CUDA torch's nvidia-* wheels ship only versioned files (libcudart.so.13), a toolkit the
    lib<name>.so link: the first folder that has the library decides, the wheel's (torch's own copy)
    listed first. Until deddce2 cudart was linked with a bare -lcudart, which a machine with pip's CUDA
    runtime and no toolkit link in the search path could not link."""
    from fused_geglu_tools import toolchain

    wheel, toolkit = tmp_path / "wheel", tmp_path / "toolkit"
    wheel.mkdir()
    toolkit.mkdir()
    (wheel / "libcudart.so.13").write_bytes(b"")
    (toolkit / "libcudart.so").write_bytes(b"")
    (toolkit / "libcublasLt.so").write_bytes(b"")
    assert toolchain.cuda_library_link_flags("cudart", (str(wheel), str(toolkit))) == [
        f"-L{wheel}", "-l:libcudart.so.13", f"-Wl,-rpath,{wheel}"]
    assert toolchain.cuda_library_link_flags("cublasLt", (str(wheel), str(toolkit))) == [f"-L{toolkit}", "-lcublasLt"]
    with pytest.raises(toolchain.ToolchainError, match="libcusparse not found"):
        toolchain.cuda_library_link_flags("cusparse", (str(wheel), str(toolkit)))


def test_cuda_home_behind_an_nvcc_wrapper_script(tmp_path, monkeypatch):
    """nvcc on PATH may be a script that execs the toolkit's nvcc (/usr/local/bin/nvcc on the project
    machines): the toolkit is then the one nvcc reports (``#$ TOP=`` of a dry run), not the script's
    folder's parent; $CUDA_HOME still wins."""
    from fused_geglu_tools import toolchain

    kit = tmp_path / "cuda-13.0"
    (kit / "include").mkdir(parents=True)
    (kit / "include" / "cuda_runtime.h").write_text("")
    (kit / "bin").mkdir()
    wrapper = tmp_path / "local" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\necho "#$ TOP={kit}/bin/.." >&2\n')  # nvcc prints its dry run on stderr
    wrapper.chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert toolchain._cuda_home(str(wrapper)) == kit
    real_kit_nvcc = kit / "bin" / "nvcc"
    real_kit_nvcc.write_text("#!/bin/sh\nexit 1\n")
    real_kit_nvcc.chmod(0o755)
    assert toolchain._cuda_home(str(real_kit_nvcc)) == kit  # nvcc inside a toolkit: its parent's parent
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "elsewhere"))
    assert toolchain._cuda_home(str(wrapper)) == tmp_path / "elsewhere"


def test_cuda_headers_come_from_nvccs_toolkit_and_libraries_from_torchs_wheels(tmp_path, monkeypatch):
    """Headers: the toolkit's before the nvidia-* wheels', since CCCL and the runtime headers must be
    nvcc's own release. torch 2.15's PyPI build (CUDA 13.2 wheels) with nvcc 13.0 failed every .cu
    ("CUDA compiler and CUDA toolkit headers are incompatible") while the wheels' came first.
    Libraries: the wheels' first, the cuBLASLt torch itself loads."""
    from fused_geglu_tools import toolchain

    kit, wheel = tmp_path / "cuda-13.0", tmp_path / "site" / "nvidia" / "cu13"
    for d in (kit / "include", kit / "lib64", wheel / "include", wheel / "lib"):
        d.mkdir(parents=True)
    monkeypatch.setattr(toolchain, "_cuda_home", lambda nvcc: kit)
    monkeypatch.setattr(toolchain, "_nvidia_wheel_dirs", lambda: ([str(wheel / "include")], [str(wheel / "lib")]))
    monkeypatch.setattr(toolchain, "nvcc_release", lambda nvcc: "13.0")
    tc = toolchain.detect()
    assert tc.cuda_include_dirs == (str(kit / "include"), str(wheel / "include"))
    assert tc.cuda_library_dirs == (str(wheel / "lib"), str(kit / "lib64"))
    assert tc.nvcc_cuda == "13.0"


def test_nvcc_of_another_cuda_major_skips_the_compiled_cuda_variant(tmp_path, monkeypatch, repo_root, capsys):
    """nvcc's release comes from its --version line. Another major than torch's CUDA cannot build the
    compiled variant: the build says so and goes on with the others, rather than failing in the compiler.
    An older minor of the same major builds (torch 2.15's CUDA 13.2 with nvcc 13.0), named after nvcc's."""
    from fused_geglu_tools import builder, toolchain
    from fused_geglu_tools.buildconfig import load_build_config

    nvcc = tmp_path / "nvcc"
    nvcc.write_text('#!/bin/sh\necho "nvcc: NVIDIA (R) Cuda compiler driver"\n'
                    'echo "Cuda compilation tools, release 12.4, V12.4.131"\n')
    nvcc.chmod(0o755)
    assert toolchain.nvcc_release(str(nvcc)) == "12.4"
    assert toolchain.nvcc_release(str(tmp_path / "missing")) is None
    assert toolchain.cuda_mismatch("13.2", "13.0") is None
    assert toolchain.cuda_mismatch("13.0", None) is None
    assert "nvcc is CUDA 12.4 but torch was built with CUDA 13.2" in toolchain.cuda_mismatch("13.2", "12.4")

    cfg = load_build_config(repo_root)
    monkeypatch.setattr(builder.Variant, "for_this_torch",
                        classmethod(lambda cls, backend: Variant.parse("torch215-cxx11-cu132-x86_64-linux")))

    def planned(nvcc_cuda):
        tc = toolchain.Toolchain(cxx="g++", nvcc=str(nvcc), torch_version=(2, 15), cxx11_abi=True, torch_cuda="13.2",
                                 nvcc_cuda=nvcc_cuda, include_dirs=(), cuda_include_dirs=(), library_dirs=(),
                                 cuda_library_dirs=())
        return [p.variant.name for p in builder.plan_variants(cfg, tc, ["cuda"])]

    # Named after the release it was compiled with, where that is older than torch's: a cu130 build is
    # what kernels loads for torch 2.15 of CUDA 13.0 and of 13.2 alike.
    assert planned("13.0") == ["torch-cuda", "torch215-cxx11-cu130-x86_64-linux"]
    assert planned("13.2") == planned("13.4") == planned(None) == ["torch-cuda", "torch215-cxx11-cu132-x86_64-linux"]
    capsys.readouterr()
    assert planned("12.4") == ["torch-cuda"]
    assert "skipping the compiled CUDA variant: nvcc is CUDA 12.4 but torch was built with CUDA 13.2" in \
        capsys.readouterr().out


def test_object_cache_key_covers_compiler_and_cutlass_headers(tmp_path, monkeypatch):
    """build/.objcache is reused across machines (carried between device calls), so an object is
    reused only when the compiler and the CUTLASS headers it saw are the same too, besides the
    command line and the files beside the source."""
    from fused_geglu_tools import builder

    runs = []

    def fake_run(cmd, what):
        runs.append(what)
        out = cmd[cmd.index("-o") + 1]
        with open(out, "w") as f:
            f.write(f"object {len(runs)}")

    monkeypatch.setattr(builder, "_run", fake_run)
    versions = {"cc": "cc 1.0"}
    monkeypatch.setattr(builder, "_compiler_version", lambda exe: versions[exe])
    src_dir, inc, cache = tmp_path / "kernel_src" / "k", tmp_path / "inc", tmp_path / "objcache"
    src_dir.mkdir(parents=True)
    (src_dir / "k.cu").write_text("// kernel")
    (inc / "cutlass").mkdir(parents=True)
    (inc / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4")
    obj = tmp_path / "k.o"
    cmd = ["cc", "-c", f"-I{inc}", str(src_dir / "k.cu"), "-o", str(obj)]

    def compile_once():
        builder._run_cached(cmd, "compiled k", cache, "torch X")
        return obj.read_text()

    assert compile_once() == "object 1"
    assert compile_once() == "object 1" and len(runs) == 1, "same inputs: the cached object"
    (inc / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 5")
    assert compile_once() == "object 2", "other CUTLASS headers: compiled again"
    versions["cc"] = "cc 2.0"
    assert compile_once() == "object 3", "another compiler: compiled again"
    (src_dir / "k.h").write_text("// a header beside the source")
    assert compile_once() == "object 4", "a changed file beside the source: compiled again"
    assert compile_once() == "object 4" and len(runs) == 4
    # A later build compiles in a fresh scratch folder (a new temporary name, its generated headers
    # included from there): the same object, unless a generated header differs.
    for n, registration in enumerate(["// gen", "// gen", "// other gen"]):
        work = tmp_path / f".partial-{n}"
        (work / "gen").mkdir(parents=True)
        (work / "gen" / "registration.h").write_text(registration)
        cmd[:] = ["cc", "-c", f"-I{work / 'gen'}", f"-I{inc}", str(src_dir / "k.cu"), "-o", str(work / "k.o")]
        obj = work / "k.o"
        builder._run_cached(cmd, "compiled k", cache, "torch X")
    assert len(runs) == 6, "the second scratch folder reused the first one's object; the third did not"


def test_object_cache_key_covers_repository_headers_outside_the_source_folder(tmp_path, monkeypatch):
    """A kernel source may include a header from another folder of the repository (mlp_gemm.cpp
    includes torch-ext/torch_binding.h): changing that header must compile the source again, while
    headers outside the repository's source folders (torch, CUTLASS) are left to the key's versions."""
    from fused_geglu_tools import builder

    runs = []

    def fake_run(cmd, what):
        runs.append(what)
        with open(cmd[cmd.index("-o") + 1], "w") as f:
            f.write(f"object {len(runs)}")

    monkeypatch.setattr(builder, "_run", fake_run)
    monkeypatch.setattr(builder, "_compiler_version", lambda exe: "cc 1.0")
    root = tmp_path / "repo"
    src_dir, binding, vendor = root / "kernel_src" / "k", root / "torch-ext", tmp_path / "vendor"
    for d in (src_dir, binding, vendor / "lib"):
        d.mkdir(parents=True)
    (src_dir / "k.cpp").write_text('#include "binding.h"\n#include "lib/v.h"\n')
    (binding / "binding.h").write_text('#pragma once\n  #  include "more.h"\n')
    (binding / "more.h").write_text("// v1")
    (vendor / "lib" / "v.h").write_text("// vendor v1")
    local = (binding, root / "kernel_src")
    cache, obj = tmp_path / "objcache", tmp_path / "scratch" / "k.o"  # the build's scratch folder
    obj.parent.mkdir()
    cmd = ["cc", "-c", f"-I{binding}", f"-I{vendor}", str(src_dir / "k.cpp"), "-o", str(obj)]
    assert builder._local_headers(src_dir / "k.cpp", [binding, vendor], local) == [
        (binding / "binding.h").resolve(), (binding / "more.h").resolve()]

    def compile_once():
        builder._run_cached(cmd, "compiled k", cache, "torch X", local)
        return obj.read_text()

    assert compile_once() == "object 1"
    assert compile_once() == "object 1", "nothing changed: the cached object"
    (binding / "more.h").write_text("// v2")
    assert compile_once() == "object 2", "a header the binding header includes changed: compiled again"
    (binding / "binding.h").write_text('#pragma once\n#include "more.h"\n// edited\n')
    assert compile_once() == "object 3", "the included binding header changed: compiled again"
    (vendor / "lib" / "v.h").write_text("// vendor v2")
    assert compile_once() == "object 3" and len(runs) == 3, "a vendor header is not the repository's"
    # Without any repository header outside its folder, a source's key is what it was before
    # `local` existed, so objects cached by earlier builds stay valid.
    (src_dir / "k.cpp").write_text("// no includes\n")
    builder._run_cached(cmd, "compiled k", cache, "torch X", local)
    builder._run_cached(cmd, "compiled k", cache, "torch X")
    assert len(runs) == 4, "the key with no outside headers equals the key without `local`"
