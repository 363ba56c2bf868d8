"""The source tree's identity: the ops id suffix and the provenance in ``metadata.json``.

The uid is the first 7 hex digits of the git tree id of the *working tree* (tracked and
untracked-not-ignored files, computed through a temporary index, so the real index is untouched).
A clean checkout therefore gets its HEAD tree id, exactly as kernel-builder does, and two builds of
the same commit agree; a dirty tree gets the id of its actual content plus ``_dirty``, so two
different dirty builds never share an ops namespace in one process.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceIdentity:
    uid: str
    commit: str | None  # HEAD commit (40 hex), None outside git
    dirty: bool


def _git(root: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def _content_hash(root: Path, paths: list[Path]) -> str:
    h = hashlib.sha1()
    for p in sorted(paths):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def source_identity(root: Path, fallback_paths: list[Path] | None = None) -> SourceIdentity:
    root = Path(root)
    try:
        top = Path(_git(root, "rev-parse", "--show-toplevel"))
    except (OSError, subprocess.CalledProcessError):
        top = None
    if top is None or top.resolve() != root.resolve():
        # A copy without .git (e.g. a tree shipped to a build machine): the content names it, and
        # the commit it was copied from may be passed in by whoever copied it.
        digest = _content_hash(root, fallback_paths or [])
        commit = os.environ.get("FUSED_GEGLU_COMMIT")
        dirty = os.environ.get("FUSED_GEGLU_DIRTY", "1") != "0"
        return SourceIdentity(uid=digest[:7] + ("_dirty" if dirty else ""), commit=commit, dirty=dirty)
    try:
        commit = _git(root, "rev-parse", "HEAD")
        head_tree = _git(root, "rev-parse", "HEAD^{tree}")
    except subprocess.CalledProcessError:  # no commit yet
        commit, head_tree = None, None
    with tempfile.TemporaryDirectory() as tmp:
        # A scratch index filled from HEAD's tree carries no stat data, so `add -A` hashes every
        # file's content. A copy of the real index would let git trust matching size and mtime,
        # and a file rewritten within the filesystem's timestamp granularity with the same size
        # would then read as unchanged (seen in CI: a racy clean).
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if head_tree is not None:
            _git(root, "read-tree", head_tree, env=env)
        _git(root, "add", "-A", env=env)
        tree = _git(root, "write-tree", env=env)
    dirty = tree != head_tree
    env_commit = os.environ.get("FUSED_GEGLU_COMMIT")
    if env_commit and env_commit != commit:
        # A copied tree (a build machine's): whoever copied it names the commit it came from. The
        # copy's own git state says nothing about that: it may have no commit, or a stale one (the
        # H200 machine's copies reported an old HEAD, so device builds recorded the wrong commit).
        # Clean means the tree matches that commit's tree, where the copy knows the commit;
        # otherwise the copier says so with FUSED_GEGLU_DIRTY=0.
        try:
            env_tree = _git(root, "rev-parse", "--verify", "-q", f"{env_commit}^{{tree}}")
        except subprocess.CalledProcessError:
            env_tree = None
        commit = env_commit
        dirty = tree != env_tree if env_tree else os.environ.get("FUSED_GEGLU_DIRTY", "1") != "0"
    return SourceIdentity(uid=tree[:7] + ("_dirty" if dirty else ""), commit=commit, dirty=dirty)
