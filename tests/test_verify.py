"""`fused-geglu verify`: digests re-hashed against metadata.json, provenance reported.

Every test works on a copy of the built `build/` (fixture `build_dir`) in tmp_path, so tampering
never touches the shared build or the staged cache.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO_CACHE_DIR, VERSION
from fused_geglu_tools import digest, verify

CLEAN = {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False}


def copy_build(build_dir: Path, dst: Path, *, kernel_git: dict | None = CLEAN) -> Path:
    """Copy ``build_dir`` to ``dst``; set each variant's provenance.kernel (None: leave it)."""
    shutil.copytree(build_dir, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if kernel_git is not None:
        for variant in verify.find_variants(dst):
            edit_metadata(variant, lambda m: m.setdefault("provenance", {}).__setitem__("kernel", dict(kernel_git)))
    return dst


def edit_metadata(variant: Path, change) -> None:
    path = variant / "metadata.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta, indent=2))


def a_python_file(variant: Path) -> Path:
    """The variant's largest shipped .py file (never an empty one)."""
    files = sorted(p for p in variant.rglob("*.py") if "__pycache__" not in p.parts)
    return max(files, key=lambda p: p.stat().st_size)


@pytest.fixture
def build_copy(build_dir, tmp_path) -> Path:
    return copy_build(build_dir, tmp_path / "build")


@pytest.fixture
def variant(build_copy) -> Path:
    return verify.find_variants(build_copy)[0]


def test_intact_build_passes_and_reports_provenance(build_copy, capsys):
    assert verify.main([str(build_copy)]) == verify.EXIT_OK
    out = capsys.readouterr().out
    for v in verify.find_variants(build_copy):
        assert f"{v.name}: OK" in out
    assert f"kernel commit {CLEAN['commit']}, clean" in out


def test_tampered_byte_is_reported_by_name(variant, capsys):
    target = a_python_file(variant)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    assert verify.main([str(variant)]) == verify.EXIT_INTEGRITY
    out = capsys.readouterr().out
    assert f"changed file: {target.relative_to(variant).as_posix()}" in out
    assert f"{variant.name}: FAILED" in out


def test_added_and_deleted_files_are_reported_by_name(variant, capsys):
    deleted = a_python_file(variant)
    deleted.unlink()
    (variant / "injected.py").write_text("import os\n")
    (variant / "sub").mkdir()
    (variant / "sub" / "extra.json").write_text("{}")
    assert verify.main([str(variant)]) == verify.EXIT_INTEGRITY
    out = capsys.readouterr().out
    assert f"missing file: {deleted.relative_to(variant).as_posix()}" in out
    assert "unknown file: injected.py" in out
    assert "unknown file: sub/extra.json" in out


def test_bytecode_and_pycache_are_not_shipped_files(variant):
    (variant / "__pycache__").mkdir()
    (variant / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (variant / "stray.pyc").write_bytes(b"\0")
    assert verify.verify_variant(variant).intact


def test_one_bad_variant_fails_the_tree(build_copy, variant, capsys):
    (variant / "injected.py").write_text("")
    assert verify.main([str(build_copy)]) == verify.EXIT_INTEGRITY
    reports = {r.variant: r for r in verify.verify_tree(build_copy)}
    assert reports[variant.name].unknown == ["injected.py"]
    assert all(r.intact for name, r in reports.items() if name != variant.name)


def test_dirty_build_is_flagged(build_dir, tmp_path, capsys):
    dirty = copy_build(build_dir, tmp_path / "build", kernel_git={"commit": CLEAN["commit"], "dirty": True})
    assert verify.main([str(dirty)]) == verify.EXIT_DIRTY
    out = capsys.readouterr().out
    assert "DIRTY working tree" in out and "not a clean build" in out
    assert verify.main([str(dirty), "--allow-dirty"]) == verify.EXIT_OK


def test_missing_provenance_is_not_clean(variant):
    edit_metadata(variant, lambda m: m.pop("provenance", None))
    report = verify.verify_variant(variant)
    assert report.intact and not report.clean and report.commit is None


def test_metadata_without_digest_or_unparseable_fails(build_copy):
    first, *rest = verify.find_variants(build_copy)
    edit_metadata(first, lambda m: m.pop("digest"))
    assert "no digest" in verify.verify_variant(first).errors[0]
    if rest:  # kernels' own parser rejects metadata without a required key
        edit_metadata(rest[0], lambda m: m.pop("license"))
        assert verify.verify_variant(rest[0]).errors
    assert verify.main([str(build_copy)]) == verify.EXIT_INTEGRITY


def test_variants_must_agree_on_version(build_copy):
    variants = verify.find_variants(build_copy)
    if len(variants) < 2:
        pytest.skip("needs two variants")
    edit_metadata(variants[1], lambda m: m.__setitem__("version", 99))
    reports = verify.verify_tree(build_copy)
    assert "version 99" in reports[1].errors[0]


def test_staged_snapshot_verifies(hub_cache):
    repo = Path(hub_cache) / REPO_CACHE_DIR
    snapshot = repo / "snapshots" / (repo / "refs" / f"v{VERSION}").read_text().strip()
    reports = verify.verify_tree(snapshot)  # a snapshot folder holds build/<variant>
    assert reports and all(r.intact for r in reports), [verify.format_report(r) for r in reports]
    assert verify.main([str(snapshot), "--allow-dirty"]) == verify.EXIT_OK


def test_json_output_and_usage_errors(build_copy, tmp_path, capsys):
    assert verify.main([str(build_copy), "--json"]) == verify.EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 0 and all(v["intact"] for v in data["variants"])
    assert verify.main([str(tmp_path / "nope")]) == verify.EXIT_USAGE
    (tmp_path / "empty").mkdir()
    assert verify.main([str(tmp_path / "empty")]) == verify.EXIT_USAGE
    assert verify.main([str(build_copy), "--variant", "torch99-nope"]) == verify.EXIT_USAGE


def test_digest_rule_matches_kernels(variant):
    """Our digest helper and kernels' Rust Digest.hash_variant agree on the shipped files."""
    rust = pytest.importorskip("kernels._rust")
    theirs = rust.Digest.hash_variant(rust.DigestAlgorithm.SHA256, variant).files
    assert dict(theirs) == digest.hash_variant(variant)


def test_unrecorded_dirty_flag_is_not_clean_without_kernels(variant, monkeypatch, capsys):
    """A commit without a dirty flag says nothing about the tree, so it is not a clean build, also
    where kernels (whose parser would reject such metadata) is not installed."""
    monkeypatch.setitem(sys.modules, "kernels._rust", None)  # `from kernels._rust import ...` fails
    edit_metadata(variant, lambda m: m["provenance"]["kernel"].pop("dirty"))
    report = verify.verify_variant(variant)
    assert report.intact and report.commit == CLEAN["commit"] and report.dirty is None
    assert not report.clean
    assert verify.main([str(variant)]) == verify.EXIT_DIRTY
    assert "dirty flag not recorded" in capsys.readouterr().out
    assert verify.main([str(variant), "--allow-dirty"]) == verify.EXIT_OK


def test_digest_of_another_algorithm_is_refused(variant):
    """sha512 is a digest kernels knows, but not one verify computes: the sha256 values recorded
    under that name must not be taken as a match."""
    edit_metadata(variant, lambda m: m["digest"].__setitem__("algorithm", "sha512"))
    report = verify.verify_variant(variant)
    assert not report.intact and "'sha512' is not supported" in report.errors[0]
    assert verify.main([str(variant)]) == verify.EXIT_INTEGRITY


def test_variant_option_reports_only_the_named_variants(build_copy, variant, capsys):
    others = [v for v in verify.find_variants(build_copy) if v != variant]
    if not others:
        pytest.skip("needs two variants")
    assert verify.main([str(build_copy), "--variant", variant.name, "--json"]) == verify.EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert [v["variant"] for v in data["variants"]] == [variant.name]
    (others[0] / "injected.py").write_text("")  # a failure outside the selection does not count
    assert verify.main([str(build_copy), "--variant", variant.name]) == verify.EXIT_OK
    assert verify.main([str(build_copy), "--variant", others[0].name]) == verify.EXIT_INTEGRITY


def test_every_shipped_file_is_covered(variant):
    """Deleting any one shipped file (the generated _ops.py and the .so included) is reported."""
    shipped = digest.hashed_files(variant)
    assert {"_ops.py", "__init__.py"} <= {p.relative_to(variant).as_posix() for p in shipped}
    for path in shipped:
        data = path.read_bytes()
        path.unlink()
        try:
            assert verify.verify_variant(variant).missing == [path.relative_to(variant).as_posix()]
        finally:
            path.write_bytes(data)
    assert verify.verify_variant(variant).intact


def test_only_the_top_level_metadata_is_outside_the_digest(variant):
    """metadata.json / .sigstore are skipped at the variant's top level only: a metadata.json in a
    subfolder is a shipped file like any other (kernels' Digest.hash_variant hashes it too)."""
    (variant / "metadata.json.sigstore").write_text("{}")
    assert verify.verify_variant(variant).intact
    nested = variant / "triton_kernels" / "metadata.json"
    nested.write_text("{}")
    assert verify.verify_variant(variant).unknown == ["triton_kernels/metadata.json"]
    rust = pytest.importorskip("kernels._rust")
    theirs = rust.Digest.hash_variant(rust.DigestAlgorithm.SHA256, variant).files
    assert dict(theirs) == digest.hash_variant(variant)
