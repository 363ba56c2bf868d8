"""The per-variant content digest that ``metadata.json`` carries.

Same rule as kernels' ``Digest.hash_variant``: every regular file under the variant folder except
the top-level ``metadata.json`` / ``metadata.json.sigstore``, anything under ``__pycache__`` and
``*.pyc``; value = standard base64 (with padding) of the file's SHA-256; keys are ``/``-separated
relative paths, sorted.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

ALGORITHM = "sha256"
_EXCLUDED_TOP_LEVEL = {"metadata.json", "metadata.json.sigstore"}


def hashed_files(variant_dir: Path) -> list[Path]:
    """The files of ``variant_dir`` that the digest covers, sorted by relative path."""
    out = []
    for path in sorted(variant_dir.rglob("*")):
        rel = path.relative_to(variant_dir)
        if not path.is_file():
            continue
        if len(rel.parts) == 1 and rel.name in _EXCLUDED_TOP_LEVEL:
            continue
        if "__pycache__" in rel.parts or path.suffix == ".pyc":
            continue
        out.append(path)
    return out


def file_digest(path: Path) -> str:
    return base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode("ascii")


def hash_variant(variant_dir: Path) -> dict[str, str]:
    """``{relative/path: base64 sha256}`` for every covered file of ``variant_dir``."""
    variant_dir = Path(variant_dir)
    return {p.relative_to(variant_dir).as_posix(): file_digest(p) for p in hashed_files(variant_dir)}
