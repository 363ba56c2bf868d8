"""`fused-geglu lock`: pin a consumer project's kernel versions to Hub commits in ``kernels.lock``.

A consumer declares major versions in its ``pyproject.toml``::

    [tool.kernels.dependencies]
    "org/fused-geglu" = 1

and this command resolves each ``v<N>`` branch to the commit it points at, then writes
``kernels.lock`` in the format kernels 0.17-0.19 read and write (``[{"dependency": {"repo-id", "version"},
"lock": {"commit"}}]``), so that ``kernels.load_kernel(repo, lockfile=...)``,
``get_locked_kernel`` and ``LockedLayerRepository`` load exactly that commit.

Why not ``kernels lock``: it refuses repositories whose org is not a trusted kernel publisher
(it runs the trust check with ``trust_remote_code=False``) and it always asks the Hub. This
command resolves online through ``HfApi.list_repo_refs`` and offline from a Hub cache
(``refs/v<N>`` of ``kernels--<org>--<name>``, as staged by ``fused-geglu stage``), and checks
what it writes with kernels' own lock parser.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

LOCKFILE = "kernels.lock"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")

# Exit codes of `fused-geglu lock`.
EXIT_OK = 0
EXIT_STALE = 1  # --check: kernels.lock differs from what would be written
EXIT_USAGE = 2  # no / bad pyproject.toml or [tool.kernels.dependencies]
EXIT_UNRESOLVED = 3  # a version is not on the Hub / not in the cache, or the Hub is unreachable


class LockError(Exception):
    """A dependency cannot be resolved; the message says which and why."""


@dataclass(frozen=True, order=True)
class Dependency:
    repo_id: str
    version: int  # major version = Hub branch v<version>

    @property
    def branch(self) -> str:
        return f"v{self.version}"


@dataclass(frozen=True)
class Lock:
    dependency: Dependency
    commit: str
    source: str  # where the commit came from, for the report ("hub" or a cache path)


def read_dependencies(project_dir: Path) -> list[Dependency]:
    """The ``[tool.kernels.dependencies]`` table of ``project_dir/pyproject.toml``, sorted.

    Raises ``ValueError`` for a missing file or table and for values that are not a major
    version (an int >= 0; kernels 0.17-0.19 lock only versions, not revisions).
    """
    pyproject = Path(project_dir) / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
    except FileNotFoundError:
        raise ValueError(f"{pyproject} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{pyproject}: {e}") from e
    table = data.get("tool", {}).get("kernels", {}).get("dependencies")
    if not isinstance(table, dict) or not table:
        raise ValueError(f'{pyproject} has no [tool.kernels.dependencies] entries (e.g. "org/fused-geglu" = 1)')
    deps = []
    for repo_id, version in table.items():
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ValueError(f"{pyproject}: {repo_id!r} is not a Hub repository id (ORG/NAME)")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(
                f"{pyproject}: {repo_id} = {version!r}; expected a major version number (an int >= 0), "
                "which is the Hub branch v<N>"
            )
        deps.append(Dependency(repo_id, version))
    return sorted(deps)


def default_cache_dir() -> Path:
    """Where kernels looks offline: ``KERNELS_CACHE``, else huggingface_hub's ``HF_HUB_CACHE``."""
    if os.environ.get("KERNELS_CACHE"):
        return Path(os.environ["KERNELS_CACHE"])
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cache_repo_dir(cache_dir: Path, repo_id: str) -> Path:
    # huggingface_hub's repo_folder_name(repo_type="kernel"): kernels--ORG--NAME
    return Path(cache_dir) / ("kernels--" + repo_id.replace("/", "--"))


def resolve_from_cache(dep: Dependency, cache_dir: Path) -> str:
    """The commit ``refs/v<N>`` names in the cache, after checking its snapshot is there."""
    repo_dir = cache_repo_dir(cache_dir, dep.repo_id)
    ref = repo_dir / "refs" / dep.branch
    if not ref.is_file():
        have = sorted(p.name for p in (repo_dir / "refs").glob("v*")) if (repo_dir / "refs").is_dir() else []
        raise LockError(
            f"{dep.repo_id} {dep.branch} is not in the cache {cache_dir} "
            f"(refs found: {', '.join(have) or 'none'}); stage it (`fused-geglu stage`) or lock online"
        )
    commit = ref.read_text().strip()
    if not _COMMIT_RE.match(commit):
        raise LockError(f"{ref} holds {commit!r}, not a 40-hex commit")
    if not (repo_dir / "snapshots" / commit / "build").is_dir():
        raise LockError(f"{ref} points at {commit}, but snapshots/{commit}/build is not in the cache")
    return commit


def _network_errors() -> tuple[type[BaseException], ...]:
    """What an unreachable Hub raises: OSError (offline mode's own subclass, requests-based clients) and
    the transport errors of the HTTP client huggingface_hub uses (httpx, or httpx2 from 2.x), which are
    not OSErrors: without them a lock with no network ended in a traceback and exit 1 ("stale")."""
    errors: list[type[BaseException]] = [OSError]
    for name in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def resolve_from_hub(dep: Dependency, api=None) -> str:
    """The commit the Hub branch ``v<N>`` of the kernel repository points at."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = api or HfApi()
    try:
        refs = api.list_repo_refs(dep.repo_id, repo_type="kernel")
    except HfHubHTTPError as e:
        raise LockError(f"cannot list the branches of {dep.repo_id} on the Hub: {e}") from e
    except _network_errors() as e:
        raise LockError(f"cannot reach the Hub for {dep.repo_id}: {e}") from e
    branches = {b.name: b.target_commit for b in refs.branches}
    if dep.branch not in branches:
        versions = sorted(b for b in branches if re.fullmatch(r"v\d+", b))
        raise LockError(f"{dep.repo_id} has no branch {dep.branch} (version branches: {', '.join(versions) or 'none'})")
    return branches[dep.branch]


def resolve(deps: list[Dependency], *, offline: bool, cache_dir: Path | None = None, api=None) -> list[Lock]:
    locks = []
    for dep in deps:
        if offline:
            cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            locks.append(Lock(dep, resolve_from_cache(dep, cache), str(cache)))
        else:
            locks.append(Lock(dep, resolve_from_hub(dep, api), "hub"))
    return locks


def render_lockfile(locks: list[Lock]) -> str:
    """The ``kernels.lock`` text (kernels 0.17-0.19), entries sorted by repo id (stable diffs)."""
    entries = [
        {"dependency": {"repo-id": lk.dependency.repo_id, "version": lk.dependency.version}, "lock": {"commit": lk.commit}}
        for lk in sorted(locks, key=lambda lk: lk.dependency)
    ]
    text = json.dumps(entries, indent=2) + "\n"
    check_with_kernels(text, locks)
    return text


def check_with_kernels(text: str, locks: list[Lock]) -> None:
    """Parse ``text`` with kernels' own lock parser and check it says what we meant.

    Skipped (silently) when kernels is not installed; the text is still the documented format.
    """
    try:
        from kernels._rust import KernelLocks, KernelVersion
    except ImportError:
        return
    parsed = KernelLocks.from_json(text)  # raises ValueError on a format kernels cannot read
    got = {}
    for dep, lock in parsed.items():
        assert isinstance(dep.version, KernelVersion.Version), dep
        got[(dep.repo_id, dep.version.version)] = str(lock.commit)  # an Oid since kernels 0.19
    want = {(lk.dependency.repo_id, lk.dependency.version): lk.commit for lk in locks}
    if got != want:
        raise AssertionError(f"kernels parses the lock as {got}, expected {want}")


def lock_project(
    project_dir: Path, *, offline: bool | None = None, cache_dir: Path | None = None, api=None, write: bool = True
) -> tuple[list[Lock], str]:
    """Resolve ``project_dir``'s kernel dependencies; write ``kernels.lock`` unless ``write=False``.

    ``offline=None`` follows ``HF_HUB_OFFLINE``. Returns the locks and the lock file text.
    """
    deps = read_dependencies(project_dir)
    if offline is None:
        offline = hub_offline()
    locks = resolve(deps, offline=offline, cache_dir=cache_dir, api=api)
    text = render_lockfile(locks)
    if write:
        (Path(project_dir) / LOCKFILE).write_text(text)
    return locks, text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fused-geglu lock",
        description="Resolve [tool.kernels.dependencies] of PROJECT_DIR/pyproject.toml to Hub commits "
        "and write PROJECT_DIR/kernels.lock (the format of kernels 0.17-0.19).",
        epilog="exit codes: 0 written (or up to date with --check); 1 --check found kernels.lock stale; "
        "2 bad pyproject.toml / dependency table; 3 a version could not be resolved",
    )
    parser.add_argument("project_dir", type=Path, help="folder holding the consumer's pyproject.toml")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--offline", dest="offline", action="store_const", const=True, default=None,
                      help="resolve from the Hub cache only (default when HF_HUB_OFFLINE=1)")
    mode.add_argument("--online", dest="offline", action="store_const", const=False,
                      help="resolve on the Hub even when HF_HUB_OFFLINE is set")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="Hub cache to resolve from offline (default: $KERNELS_CACHE, else $HF_HUB_CACHE)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if kernels.lock is missing or differs from the resolution")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        locks, text = lock_project(args.project_dir, offline=args.offline, cache_dir=args.cache_dir, write=not args.check)
    except ValueError as e:
        print(f"fused-geglu lock: {e}", file=sys.stderr)
        return EXIT_USAGE
    except LockError as e:
        print(f"fused-geglu lock: {e}", file=sys.stderr)
        return EXIT_UNRESOLVED
    path = args.project_dir / LOCKFILE
    for lk in locks:
        where = "the Hub" if lk.source == "hub" else f"cache {lk.source}"
        print(f"{lk.dependency.repo_id} {lk.dependency.branch} -> {lk.commit} (from {where})")
    if args.check:
        current = path.read_text() if path.is_file() else None
        if current is None or _normalise(current) != _normalise(text):
            print(f"{path} is {'missing' if current is None else 'stale'}; run `fused-geglu lock {args.project_dir}`")
            return EXIT_STALE
        print(f"{path} is up to date")
        return EXIT_OK
    print(f"wrote {path}")
    return EXIT_OK


def _normalise(text: str):
    try:
        return sorted(json.dumps(e, sort_keys=True) for e in json.loads(text))
    except (json.JSONDecodeError, TypeError):
        return text


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
