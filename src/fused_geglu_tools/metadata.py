"""``metadata.json`` for a variant, written from typed data and checked with kernels' parser."""

from __future__ import annotations

import json
from pathlib import Path

from .buildconfig import BuildConfig
from .digest import ALGORITHM, hash_variant
from .gitid import SourceIdentity
from .variants import Variant


def metadata_dict(cfg: BuildConfig, variant: Variant, ops_id: str, ident: SourceIdentity,
                  archs: list[str], builder_version: str, files: dict[str, str]) -> dict:
    backend: dict = {"type": variant.backend}
    if archs:
        backend["archs"] = archs
    provenance: dict = {"kernel-builder": {"version": builder_version}}
    if ident.commit is not None:
        provenance["kernel"] = {"commit": ident.commit, "dirty": ident.dirty}
    data = {
        "name": cfg.name,
        "id": ops_id,
        "version": cfg.version,
        "license": cfg.license,
        "python-depends": list(cfg.python_depends),
        "backend": backend,
        "provenance": provenance,
        "digest": {"algorithm": ALGORITHM, "files": files},
    }
    if cfg.upstream:
        data["upstream"] = cfg.upstream
    return data


def write_metadata(variant_dir: Path, cfg: BuildConfig, variant: Variant, ops_id: str,
                   ident: SourceIdentity, archs: list[str], builder_version: str) -> Path:
    """Hash the finished variant folder and write its ``metadata.json`` (last, so it covers all)."""
    files = hash_variant(variant_dir)
    data = metadata_dict(cfg, variant, ops_id, ident, archs, builder_version, files)
    path = variant_dir / "metadata.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    try:
        from kernels._rust import Metadata
    except ImportError:
        return path
    Metadata.read_from_file(path)  # raises ValueError if the loader would reject it
    return path
