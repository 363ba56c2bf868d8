"""`fused-geglu verify`: re-hash build variants against the digest in their ``metadata.json``.

A variant is a folder with a ``metadata.json`` (``build/<variant>/`` locally, or
``snapshots/<sha>/build/<variant>/`` in a staged / downloaded Hub cache). Its digest lists every
shipped file with its base64 SHA-256 (rule in :mod:`fused_geglu_tools.digest`). Verification
reports, by name, the files the digest expects but the folder lacks (missing), the files the
folder has but the digest does not list (unknown) and the files whose bytes differ (changed).

It also reports the provenance the builder recorded (kernel git commit, dirty flag): a build made
from a working tree with uncommitted changes is flagged, because its commit does not say what
was built; and whether each compiled library meets the Hub's portability policy (:mod:`.abi`).

Nothing here imports the kernel or touches the network.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import abi, digest

METADATA = "metadata.json"

# Exit codes of `fused-geglu verify`.
EXIT_OK = 0
EXIT_INTEGRITY = 1  # a file is missing / unknown / changed, or metadata.json is unusable
EXIT_USAGE = 2  # PATH does not exist or holds no variant
EXIT_DIRTY = 3  # every digest matches, but a variant was built from a dirty tree (or says nothing)
EXIT_NOT_PORTABLE = 4  # every digest matches, but a compiled library breaks abi.POLICY (or was not checked)


@dataclass
class VariantReport:
    """What :func:`verify_variant` found for one variant folder."""

    path: Path
    name: str | None = None  # metadata "name"
    version: int | None = None  # metadata "version"
    missing: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # metadata unreadable, no digest, ...
    commit: str | None = None  # provenance.kernel.commit
    dirty: bool | None = None  # provenance.kernel.dirty; None = not recorded
    builder_version: str | None = None  # provenance.kernel-builder.version
    files_checked: int = 0
    abi_violations: dict[str, list[str]] = field(default_factory=dict)  # library -> abi.library_violations
    abi_unchecked: str | None = None  # why the compiled libraries could not be checked

    @property
    def variant(self) -> str:
        return self.path.name

    @property
    def intact(self) -> bool:
        """Every file matches the digest and the metadata is usable."""
        return not (self.missing or self.unknown or self.changed or self.errors)

    @property
    def portable(self) -> bool:
        """Every compiled library was checked and meets abi.POLICY (a noarch variant has none)."""
        return not self.abi_violations and self.abi_unchecked is None

    @property
    def clean(self) -> bool:
        """The build records a commit and a clean working tree."""
        return self.commit is not None and self.dirty is False

    def to_json(self) -> dict:
        return {
            "variant": self.variant,
            "path": str(self.path),
            "name": self.name,
            "version": self.version,
            "intact": self.intact,
            "missing": self.missing,
            "unknown": self.unknown,
            "changed": self.changed,
            "errors": self.errors,
            "files_checked": self.files_checked,
            "portable": self.portable,
            "abi": {"policy": abi.POLICY, "violations": self.abi_violations, "unchecked": self.abi_unchecked},
            "provenance": {"commit": self.commit, "dirty": self.dirty, "kernel-builder": self.builder_version},
        }


def read_metadata(variant_dir: Path) -> dict:
    """Load ``metadata.json`` as a dict; when kernels is installed, also run its own parser on it.

    Raises ``ValueError`` with the reason when either fails.
    """
    path = Path(variant_dir) / METADATA
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    try:
        from kernels._rust import Metadata
    except ImportError:  # verification works without kernels; the loader's checks are a bonus
        return data
    try:
        Metadata.read_from_file(path)
    except Exception as e:  # the Rust parser raises ValueError/RuntimeError subclasses
        raise ValueError(f"{path}: rejected by kernels' metadata parser: {e}") from e
    return data


def find_variants(path: Path) -> list[Path]:
    """The variant folders ``path`` stands for, sorted by name.

    Accepted: a variant folder; a ``build/`` folder; a folder that holds ``build/`` (the project
    root, or a cache ``snapshots/<sha>/``).
    """
    path = Path(path)
    if (path / METADATA).is_file():
        return [path]
    if (path / "build").is_dir() and not any((p / METADATA).is_file() for p in _subdirs(path)):
        path = path / "build"
    return [p for p in _subdirs(path) if (p / METADATA).is_file()]


def _subdirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []


def verify_variant(variant_dir: Path) -> VariantReport:
    """Re-hash ``variant_dir`` and compare it with the digest in its ``metadata.json``."""
    variant_dir = Path(variant_dir)
    report = VariantReport(path=variant_dir)
    try:
        meta = read_metadata(variant_dir)
    except ValueError as e:
        report.errors.append(str(e))
        return report
    report.name = meta.get("name")
    report.version = meta.get("version")

    provenance = meta.get("provenance") or {}
    kernel_git = provenance.get("kernel") or {}
    report.commit = kernel_git.get("commit")
    report.dirty = kernel_git.get("dirty")
    report.builder_version = (provenance.get("kernel-builder") or {}).get("version")

    recorded = meta.get("digest")
    if not isinstance(recorded, dict) or not isinstance(recorded.get("files"), dict):
        report.errors.append("metadata.json has no digest (digest.files): nothing to verify against")
        return report
    algorithm = str(recorded.get("algorithm", "")).lower()
    if algorithm != digest.ALGORITHM:
        report.errors.append(
            f"digest algorithm {recorded.get('algorithm')!r} is not supported (expected {digest.ALGORITHM!r})"
        )
        return report

    expected: dict[str, str] = recorded["files"]
    actual = digest.hash_variant(variant_dir)
    report.files_checked = len(actual)
    report.missing = sorted(set(expected) - set(actual))
    report.unknown = sorted(set(actual) - set(expected))
    report.changed = sorted(p for p in set(expected) & set(actual) if expected[p] != actual[p])
    _check_portability(report)
    return report


def _check_portability(report: VariantReport) -> None:
    if not abi.libraries(report.path):
        return
    try:
        report.abi_violations = abi.variant_violations(report.path)
    except (abi.CheckerMissing, ValueError) as e:
        report.abi_unchecked = str(e)


def verify_tree(path: Path) -> list[VariantReport]:
    """Verify every variant under ``path`` (see :func:`find_variants`).

    Variants of one tree must agree on ``name`` and ``version``; a variant that disagrees gets
    an error, since one Hub branch ``v<N>`` holds them all.
    """
    reports = [verify_variant(v) for v in find_variants(path)]
    readable = [r for r in reports if r.name is not None]
    if readable:
        first = readable[0]
        for r in readable[1:]:
            if (r.name, r.version) != (first.name, first.version):
                r.errors.append(
                    f"metadata says {r.name} version {r.version}, but {first.variant} says "
                    f"{first.name} version {first.version}"
                )
    return reports


def format_report(report: VariantReport) -> str:
    status = "OK" if report.intact else "FAILED"
    lines = [f"{report.variant}: {status} ({report.files_checked} files hashed)"]
    for label, paths in (("missing", report.missing), ("unknown", report.unknown), ("changed", report.changed)):
        for p in paths:
            lines.append(f"  {label} file: {p}")
    for err in report.errors:
        lines.append(f"  error: {err}")
    for lib, found in report.abi_violations.items():
        lines.append(f"  not portable ({abi.POLICY}): {lib}")
        lines += [f"    {v}" for v in found]
    if report.abi_unchecked:
        lines.append(f"  portability not checked: {report.abi_unchecked}")
    commit = report.commit or "unknown"
    if report.dirty is None:
        state = "dirty flag not recorded"
    else:
        state = "DIRTY working tree" if report.dirty else "clean"
    lines.append(f"  provenance: kernel commit {commit}, {state}, built by fused-geglu tools {report.builder_version or '?'}")
    if not report.clean:
        lines.append("  warning: not a clean build - its commit does not identify what was built")
    return "\n".join(lines)


def exit_code(reports: list[VariantReport], *, allow_dirty: bool = False) -> int:
    if not reports:
        return EXIT_USAGE
    if not all(r.intact for r in reports):
        return EXIT_INTEGRITY
    if not all(r.portable for r in reports):
        return EXIT_NOT_PORTABLE
    if not allow_dirty and not all(r.clean for r in reports):
        return EXIT_DIRTY
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fused-geglu verify",
        description="Re-hash build variants against the digest in their metadata.json and report provenance.",
        epilog=(
            "exit codes: 0 all variants intact and clean; 1 a file is missing/unknown/changed or metadata is "
            "unusable; 2 PATH holds no variant; 3 intact, but built from a dirty tree (see --allow-dirty); 4 intact, "
            f"but a compiled library breaks the Hub's policy ({abi.POLICY}) or could not be checked"
        ),
    )
    parser.add_argument(
        "path",
        nargs="?",
        default="build",
        type=Path,
        help="a variant folder, a build/ folder, or a folder holding build/ (project root, cache snapshot); "
        "default: ./build",
    )
    parser.add_argument("--variant", action="append", default=[], help="only this variant (repeatable)")
    parser.add_argument("--allow-dirty", action="store_true", help="exit 0 for intact builds from a dirty tree")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.path.exists():
        print(f"fused-geglu verify: {args.path} does not exist", file=sys.stderr)
        return EXIT_USAGE
    reports = verify_tree(args.path)
    if args.variant:
        unknown = sorted(set(args.variant) - {r.variant for r in reports})
        if unknown:
            print(f"fused-geglu verify: no variant {', '.join(unknown)} under {args.path}", file=sys.stderr)
            return EXIT_USAGE
        reports = [r for r in reports if r.variant in args.variant]
    if not reports:
        print(f"fused-geglu verify: no variant (folder with {METADATA}) under {args.path}", file=sys.stderr)
        return EXIT_USAGE
    code = exit_code(reports, allow_dirty=args.allow_dirty)
    if args.json:
        print(json.dumps({"exit_code": code, "variants": [r.to_json() for r in reports]}, indent=2))
    else:
        for r in reports:
            print(format_report(r))
        n_bad = sum(not r.intact for r in reports)
        n_dirty = sum(not r.clean for r in reports)
        n_unportable = sum(not r.portable for r in reports)
        print(f"{len(reports)} variant(s): {len(reports) - n_bad} intact, {n_bad} failed, {n_dirty} not clean, "
              f"{n_unportable} not portable")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
