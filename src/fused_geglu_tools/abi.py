"""Portability of a variant's compiled library: the checks the Hub applies to kernel builds.

kernel-builder checks every library it builds, and ``kernels check`` (kernels <= 0.18; now
``kernel-builder check-abi``) checks a published repository, against two policies, with the
``kernel-abi-check`` package:

- Python's stable ABI as of 3.9 (the ``.abi3.so`` name promises that one file serves every Python);
- manylinux_2_28: no glibc / libstdc++ symbol version newer than glibc 2.28 and GCC 8 ship, so the
  library loads wherever torch's own manylinux_2_28 wheels do.

The Nix-free builder compiles with whatever compiler and glibc headers the machine has, so its
libraries need the same check: until ``torch-ext/libc_compat.cpp``, a build on glibc 2.36 referenced
``__libc_single_threaded`` (GLIBC_2.32) and one on glibc 2.39 also ``__isoc23_strtol`` (GLIBC_2.38),
so neither would have loaded on glibc 2.28-2.31 (RHEL 8, Ubuntu 20.04) or 2.28-2.37.
"""

from __future__ import annotations

from pathlib import Path

PYTHON_ABI = "3.9"
MANYLINUX = "manylinux_2_28"
POLICY = f"Python stable ABI {PYTHON_ABI}, {MANYLINUX}"


class CheckerMissing(RuntimeError):
    """``kernel-abi-check`` is not installed (requirements/dev.txt pins it)."""


def _checker():
    try:
        import kernel_abi_check
    except ImportError as e:
        raise CheckerMissing("kernel-abi-check is not installed (pip install kernel-abi-check)") from e
    return kernel_abi_check


def libraries(variant_dir: Path) -> list[Path]:
    """The compiled libraries a variant ships (none for a noarch variant)."""
    return sorted(Path(variant_dir).glob("*.so"))


def library_violations(path: Path) -> list[str]:
    """One line per symbol of ``path`` that breaks :data:`POLICY`; empty when the library complies.

    Raises :class:`CheckerMissing` without kernel-abi-check, ``ValueError`` for a file it cannot parse.
    """
    obj = _checker().ObjectFile(str(path))
    found = []
    for v in obj.check_manylinux(MANYLINUX):
        found.append(f"{v.name} needs {v.dep} {v.version} ({MANYLINUX} allows older only)")
    for v in obj.check_python_abi(PYTHON_ABI):
        added = getattr(v, "version_added", None)  # None: a NonAbi3Symbol
        found.append(f"{v.name}: " + (f"Python C API of {added} (abi3 {PYTHON_ABI} allows older only)"
                                      if added else "not in Python's stable ABI"))
    return found


def variant_violations(variant_dir: Path) -> dict[str, list[str]]:
    """:func:`library_violations` of each library of a variant, by file name (only those with some)."""
    found = {}
    for lib in libraries(variant_dir):
        bad = library_violations(lib)
        if bad:
            found[lib.name] = bad
    return found
