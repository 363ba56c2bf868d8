"""Lay ``build/`` out as a local Hub snapshot, so ``kernels`` loads it offline like a download.

Layout (what huggingface_hub's cache holds for a ``kernel``-type repo; ``ORG/NAME`` is
``build.toml``'s ``[general.hub] repo-id`` unless ``--repo-id`` names another, and ``N`` its
``[general] version`` unless ``--ref`` names another branch)::

    <cache>/kernels--ORG--NAME/refs/vN                  # 40-hex snapshot id
    <cache>/kernels--ORG--NAME/snapshots/<id>/build/<variant>/...
    <cache>/kernels--ORG--NAME/snapshots/<id>/benchmarks/benchmark*.py

The snapshot id is a SHA-1 over every staged file's path and content, so the same build stages to
the same id and any change of content gets a new one (and an older lock keeps pointing at the old).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from .digest import file_digest


def repo_cache_dir(cache_dir: Path, repo_id: str) -> Path:
    return Path(cache_dir) / ("kernels--" + repo_id.replace("/", "--"))


def _staged_files(build_dir: Path, benchmarks_dir: Path | None,
                  variants: list[str] | None = None) -> list[tuple[str, Path]]:
    built = sorted(p for p in build_dir.iterdir()
                   if p.is_dir() and not p.name.startswith(".") and (p / "metadata.json").is_file())
    if variants is not None:
        missing = sorted(set(variants) - {p.name for p in built})
        if missing:
            raise FileNotFoundError(f"variants not built in {build_dir}: {', '.join(missing)} "
                                    f"(built: {', '.join(p.name for p in built) or 'none'})")
        built = [p for p in built if p.name in variants]
    files: list[tuple[str, Path]] = []
    for variant in built:
        for path in sorted(variant.rglob("*")):
            rel = path.relative_to(variant)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
                files.append((f"build/{variant.name}/{rel.as_posix()}", path))
    if benchmarks_dir is not None and benchmarks_dir.is_dir():
        for path in sorted(benchmarks_dir.glob("benchmark*.py")):
            files.append((f"benchmarks/{path.name}", path))
    return files


def snapshot_id(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha1()
    for rel, path in files:
        h.update(f"{rel}\0{file_digest(path)}\n".encode())
    return h.hexdigest()


def stage_build(build_dir: Path, cache_dir: Path, repo_id: str | None = None, ref: str | None = None,
                benchmarks_dir: Path | None = None, variants: list[str] | None = None) -> str:
    """Stage ``build_dir`` into ``cache_dir`` under ``ref``; returns the snapshot id.

    ``repo_id`` defaults to ``build.toml``'s ``[general.hub] repo-id`` (:func:`.buildconfig.hub_repo_id`),
    ``ref`` to ``v<version>``, its ``[general] version`` (:func:`.buildconfig.hub_version`).
    ``variants``: stage only these ``build/`` folders (all by default), for example ``torch-cpu`` alone,
    what kernels loads for a CPU torch with no compiled build, to test that variant on this machine.
    """
    if repo_id is None:
        from .buildconfig import hub_repo_id

        repo_id = hub_repo_id()
    if ref is None:
        from .buildconfig import hub_version

        ref = f"v{hub_version()}"
    build_dir = Path(build_dir)
    files = _staged_files(build_dir, benchmarks_dir, variants)
    if not any(rel.startswith("build/") for rel, _ in files):
        raise FileNotFoundError(f"no built variants in {build_dir}: run `fused-geglu build` first")
    sha = snapshot_id(files)
    repo_dir = repo_cache_dir(cache_dir, repo_id)
    snap = repo_dir / "snapshots" / sha
    if snap.exists():
        shutil.rmtree(snap)
    for rel, path in files:
        target = snap / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / ref).write_text(sha)
    return sha
