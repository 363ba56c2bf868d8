"""The Hub's portability policy for compiled libraries (fused_geglu_tools.abi): the build meets it,
the libc shim is what makes it meet it on a newer glibc, and verify / publish refuse a library that
breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from fused_geglu_tools import abi, verify
from test_verify import copy_build

pytest.importorskip("kernel_abi_check", reason="requirements/dev.txt pins kernel-abi-check")

# Built on a newer glibc, this needs __libc_single_threaded (glibc >= 2.32: libstdc++'s inline reference
# counting) and __isoc23_strtol (glibc >= 2.38: std::stol under _GNU_SOURCE); torch-ext/libc_compat.cpp
# says why.
NEEDS_NEWER_GLIBC = """
#include <memory>
#include <sstream>
#include <string>
std::string describe(const std::string& text) {
  std::ostringstream s;
  s << std::stol(text);
  auto p = std::make_shared<int>(1);
  return s.str() + std::to_string(*p);
}
"""


def compiled_variants(build: Path) -> list[Path]:
    return [v for v in verify.find_variants(build) if abi.libraries(v)]


@pytest.fixture
def compiled_build(build_dir) -> Path:
    """The shared build/, on a machine that built at least one compiled variant."""
    if not compiled_variants(build_dir):
        pytest.skip("no compiled variant was built on this machine")
    return build_dir


@pytest.fixture
def build_copy(compiled_build, tmp_path) -> Path:
    return copy_build(compiled_build, tmp_path / "build")


def test_every_compiled_variant_meets_the_hub_policy(compiled_build):
    for v in compiled_variants(compiled_build):
        assert abi.variant_violations(v) == {}, f"{v.name} breaks {abi.POLICY}"


def _glibc() -> tuple[int, int]:
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    except (ValueError, OSError, AttributeError):
        return (0, 0)
    return tuple(int(p) for p in version.split(".")[:2]) if name == "glibc" else (0, 0)


def test_libc_shim_removes_the_newer_glibc_references(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    glibc = _glibc()
    if glibc < (2, 32):
        pytest.skip(f"glibc {glibc} headers: the code references no symbol newer than 2.28")
    src = tmp_path / "describe.cpp"
    src.write_text(NEEDS_NEWER_GLIBC)
    plain, shimmed = tmp_path / "plain.so", tmp_path / "shimmed.so"
    shim = REPO_ROOT / "torch-ext" / "libc_compat.cpp"
    for out, extra in ((plain, []), (shimmed, [str(shim)])):
        subprocess.run([cxx, "-O2", "-fPIC", "-shared", str(src), *extra, "-o", str(out)], check=True)
    found = abi.library_violations(plain)
    assert any(v.startswith("__libc_single_threaded needs GLIBC 2.32") for v in found), found
    if glibc >= (2, 38):
        assert any(v.startswith("__isoc23_strtol needs GLIBC 2.38") for v in found), found
    assert abi.library_violations(shimmed) == []


def test_verify_refuses_a_library_that_breaks_the_policy(build_copy, monkeypatch, capsys):
    build = build_copy
    variants = compiled_variants(build)
    checked = []

    def newer_glibc(path):
        checked.append(Path(path).name)
        return ["memfd_create needs GLIBC 2.27 (stand-in)"]

    monkeypatch.setattr(abi, "library_violations", newer_glibc)
    assert verify.main([str(build)]) == verify.EXIT_NOT_PORTABLE
    out = capsys.readouterr().out
    for v in variants:
        assert f"not portable ({abi.POLICY}): {abi.libraries(v)[0].name}" in out
    assert "memfd_create needs GLIBC 2.27 (stand-in)" in out
    # noarch variants ship no library and are not checked
    assert sorted(checked) == sorted(lib.name for v in variants for lib in abi.libraries(v))
    reports = {r.variant: r for r in verify.verify_tree(build)}
    assert all(r.portable for name, r in reports.items() if name not in {v.name for v in variants})


def test_verify_says_when_it_could_not_check(build_copy, monkeypatch, capsys):
    build = build_copy

    def missing():
        raise abi.CheckerMissing("kernel-abi-check is not installed (pip install kernel-abi-check)")

    monkeypatch.setattr(abi, "_checker", missing)
    assert verify.main([str(build)]) == verify.EXIT_NOT_PORTABLE
    assert "portability not checked: kernel-abi-check is not installed" in capsys.readouterr().out
