"""`fused-geglu publish`: upload the build to a Hub repository of type ``kernel``.

The repository is ``build.toml``'s ``[general.hub] repo-id`` unless ``--repo-id`` names another.

Two trees go up, as kernel-builder's ``upload`` lays them out:

- branch ``v<version>`` (``version`` from ``build.toml``): ``build/<variant>/...`` for every
  variant under ``build/`` and the ``benchmarks/`` folder, in one commit that also deletes
  whatever else the branch held under ``build/`` and ``benchmarks/`` (so no stale file outlives
  the new digest);
- branch ``main``: ``README.md``, the card rendered from ``CARD.md`` (:mod:`.card`).

Before anything is uploaded the build must pass :mod:`.verify` (every digest intact; every compiled
library checked against the Hub's portability policy, :mod:`.abi`; a build from a dirty tree only
with ``--allow-dirty``), every variant must carry ``build.toml``'s name and
version, and when the branch ``v<version>`` already exists it must keep its API: the same
``__all__`` in every variant it has, and no variant dropped. Any such change needs a new major
version (bump ``version`` in ``build.toml``), so there is no flag to override it.

``--dry-run OUT`` writes the two trees exactly as they would be uploaded into ``OUT/<branch>/``
(plus ``OUT/plan.json``), prints them and touches no network; ``--compare-to PATH`` then stands
in for the current branch (a cache snapshot, or any folder with ``build/<variant>/``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import abi, card, public_api, verify
from .buildconfig import hub_repo_id

REPO_TYPE = "kernel"
CARD_BRANCH = "main"
# Everything on the version branch that this tool manages; other paths are left alone.
MANAGED_PATTERNS = ["build/**", "benchmarks/**"]
_SKIP_NAMES = {"__pycache__", ".pytest_cache", ".ipynb_checkpoints"}

# Exit codes of `fused-geglu publish`.
EXIT_OK = 0
EXIT_REFUSED = 1  # the build or the branch change is not publishable (reasons printed)
EXIT_USAGE = 2  # no build / build.toml / CARD.md, bad arguments
EXIT_HUB = 3  # the Hub could not be reached or refused a request


class PublishRefused(Exception):
    def __init__(self, reasons: list[str]):
        super().__init__("; ".join(reasons))
        self.reasons = reasons


@dataclass
class BranchState:
    """What the version branch holds now: ``{variant: __all__}``; ``exists=False`` if no branch."""

    exists: bool
    apis: dict[str, list[str]] = field(default_factory=dict)
    source: str = ""


@dataclass
class Plan:
    repo_id: str
    version: int
    branch: str
    variants: list[str]
    trees: dict[str, Path]  # branch -> folder holding exactly what goes up to it
    notes: list[str] = field(default_factory=list)

    def to_json(self, root: Path) -> dict:
        return {
            "repo_id": self.repo_id,
            "repo_type": REPO_TYPE,
            "version": self.version,
            "variants": self.variants,
            "notes": self.notes,
            "commits": [
                {
                    "branch": self.branch,
                    "folder": self.trees[self.branch].relative_to(root).as_posix(),
                    "delete_patterns": MANAGED_PATTERNS,
                    "create_branch_if_missing": True,
                },
                {"branch": CARD_BRANCH, "folder": self.trees[CARD_BRANCH].relative_to(root).as_posix()},
            ],
            "files": {b: tree_listing(t) for b, t in self.trees.items()},
        }


def read_general(repo_root: Path) -> dict:
    path = Path(repo_root) / "build.toml"
    try:
        general = tomllib.loads(path.read_text())["general"]
        int(general["version"]), general["name"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: cannot read [general] name/version: {e!r}") from e
    return general


# --- checks --------------------------------------------------------------------------------------


def check_build(build_dir: Path, general: dict, *, allow_dirty: bool) -> list[verify.VariantReport]:
    """Verify every variant; raise :class:`PublishRefused` with all reasons if any fails."""
    reports = verify.verify_tree(build_dir)
    if not reports:
        raise ValueError(f"no build variant (folder with metadata.json) under {build_dir}; run `fused-geglu build`")
    reasons = []
    for r in reports:
        if not r.intact:
            reasons.append(f"{r.variant} does not match its digest:\n{verify.format_report(r)}")
        elif (r.name, r.version) != (general["name"], general["version"]):
            reasons.append(
                f"{r.variant} is {r.name} version {r.version}, but build.toml says "
                f"{general['name']} version {general['version']}; rebuild"
            )
        elif not r.portable:
            reasons.append(f"{r.variant}: a compiled library would not load everywhere the Hub promises "
                           f"({abi.POLICY}):\n{verify.format_report(r)}")
        elif not r.clean and not allow_dirty:
            state = "a dirty working tree" if r.dirty else "an unrecorded git state"
            reasons.append(
                f"{r.variant} was built from {state} (kernel commit {r.commit or 'unknown'}); commit and rebuild, "
                "or pass --allow-dirty"
            )
    if reasons:
        raise PublishRefused(reasons)
    return reports


def check_branch(new_apis: dict[str, list[str]], current: BranchState, branch: str, version: int) -> None:
    """Refuse changes that the versioning policy says need a new major version."""
    if not current.exists:
        return
    reasons = []
    bump = f"bump `version` in build.toml to {version + 1} to publish this as branch v{version + 1}"
    dropped = sorted(set(current.apis) - set(new_apis))
    if dropped:
        reasons.append(f"{branch} has variant(s) this build lacks: {', '.join(dropped)}; dropping a variant needs a new "
                       "version (variants of other torch releases come from `fused-geglu build-matrix`)")
    for variant in sorted(set(current.apis) & set(new_apis)):
        old, new = set(current.apis[variant]), set(new_apis[variant])
        if old - new:
            reasons.append(f"{branch} {variant}: would remove {', '.join(sorted(old - new))} from __all__ (API shrink)")
        if new - old:
            reasons.append(f"{branch} {variant}: would add {', '.join(sorted(new - old))} to __all__")
    if reasons:
        reasons.append(bump)
        raise PublishRefused(reasons)


def local_branch_state(path: Path) -> BranchState:
    """The branch as a local folder shows it (a staged / downloaded snapshot, or a build)."""
    variants = verify.find_variants(path)
    if not variants:
        raise ValueError(f"--compare-to {path}: no variant (folder with metadata.json) there")
    return BranchState(exists=True, apis={v.name: public_api.variant_api(v) for v in variants}, source=str(path))


def hub_branch_state(api, repo_id: str, branch: str) -> BranchState:
    """The branch on the Hub; ``exists=False`` when the repository or the branch is missing."""
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
    except RepositoryNotFoundError:
        return BranchState(exists=False, source="hub")
    if branch not in {b.name for b in refs.branches}:
        return BranchState(exists=False, source="hub")
    files = api.list_repo_files(repo_id, revision=branch, repo_type=REPO_TYPE)
    inits = sorted(f for f in files if f.startswith("build/") and f.count("/") == 2 and f.endswith("/__init__.py"))
    apis = {}
    for f in inits:
        local = api.hf_hub_download(repo_id, filename=f, revision=branch, repo_type=REPO_TYPE)
        apis[f.split("/")[1]] = public_api.read_all(Path(local))
    return BranchState(exists=True, apis=apis, source=f"hub {repo_id}@{branch}")


# --- trees ---------------------------------------------------------------------------------------


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n in _SKIP_NAMES or n.endswith(".pyc")])


def write_trees(repo_root: Path, build_dir: Path, out_dir: Path, *, repo_id: str, version: int) -> dict[str, Path]:
    """Write ``out_dir/v<version>/`` and ``out_dir/main/`` exactly as they are to be uploaded."""
    branch = f"v{version}"
    version_tree = out_dir / branch
    for variant in verify.find_variants(build_dir):
        _copy_tree(variant, version_tree / "build" / variant.name)
    benchmarks = Path(repo_root) / "benchmarks"
    if benchmarks.is_dir():
        _copy_tree(benchmarks, version_tree / "benchmarks")
    card_tree = out_dir / CARD_BRANCH
    card_tree.mkdir(parents=True)
    (card_tree / "README.md").write_text(card.render_repo_card(repo_root, build_dir, repo_id=repo_id))
    return {branch: version_tree, CARD_BRANCH: card_tree}


def tree_listing(tree: Path) -> dict[str, dict]:
    return {
        p.relative_to(tree).as_posix(): {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(tree.rglob("*"))
        if p.is_file()
    }


def format_plan(plan: Plan) -> str:
    lines = []
    for branch, tree in plan.trees.items():
        listing = tree_listing(tree)
        total = sum(f["size"] for f in listing.values())
        extra = f", deleting other {' and '.join(MANAGED_PATTERNS)}" if branch == plan.branch else ""
        lines.append(f"{plan.repo_id} (type {REPO_TYPE}) branch {branch}: {len(listing)} files, {total} bytes{extra}")
        lines += [f"  {path}  {info['size']}  sha256:{info['sha256'][:12]}" for path, info in listing.items()]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


# --- the command ---------------------------------------------------------------------------------


def prepare(
    repo_root: Path,
    build_dir: Path,
    out_dir: Path,
    *,
    repo_id: str | None,
    allow_dirty: bool,
    current: BranchState | None,
) -> Plan:
    """All checks, then the trees under ``out_dir``. ``current=None``: branch state unknown."""
    general = read_general(repo_root)
    version = int(general["version"])
    repo_id = repo_id or hub_repo_id(repo_root)
    if not (Path(repo_root) / card.CARD_TEMPLATE).is_file():
        raise ValueError(f"{Path(repo_root) / card.CARD_TEMPLATE} does not exist")
    branch = f"v{version}"
    reports = check_build(build_dir, general, allow_dirty=allow_dirty)
    new_apis = public_api.tree_api(build_dir)
    notes = []
    if current is None:
        notes.append(f"branch {branch} not compared (dry run without --compare-to): API/variant checks skipped")
    else:
        check_branch(new_apis, current, branch, version)
        notes.append(
            f"branch {branch} compared with {current.source}: API kept" if current.exists else f"branch {branch} is new"
        )
    dirty = [r.variant for r in reports if not r.clean]
    if dirty:
        notes.append(f"publishing build(s) from a dirty tree (--allow-dirty): {', '.join(dirty)}")
    trees = write_trees(repo_root, build_dir, out_dir, repo_id=repo_id, version=version)
    return Plan(repo_id=repo_id, version=version, branch=branch, variants=[r.variant for r in reports], trees=trees, notes=notes)


def upload(plan: Plan, api, *, private: bool | None, exists: bool) -> list[str]:
    """Push ``plan``'s trees: the version branch first, then the card. Returns commit URLs."""
    commits = []
    api.create_repo(plan.repo_id, repo_type=REPO_TYPE, exist_ok=True, private=private)
    if not exists:
        api.create_branch(plan.repo_id, branch=plan.branch, repo_type=REPO_TYPE, exist_ok=True)
    info = api.upload_folder(
        repo_id=plan.repo_id,
        folder_path=plan.trees[plan.branch],
        repo_type=REPO_TYPE,
        revision=plan.branch,
        commit_message=f"fused-geglu v{plan.version}: {len(plan.variants)} build variant(s)",
        commit_description="\n".join(plan.variants),
        delete_patterns=MANAGED_PATTERNS,
    )
    commits.append(str(getattr(info, "commit_url", info)))
    info = api.upload_folder(
        repo_id=plan.repo_id,
        folder_path=plan.trees[CARD_BRANCH],
        repo_type=REPO_TYPE,
        revision=CARD_BRANCH,
        commit_message=f"Card for fused-geglu v{plan.version}",
    )
    commits.append(str(getattr(info, "commit_url", info)))
    return commits


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fused-geglu publish",
        description="Upload build/<variant> (and benchmarks/) to branch v<version> of a Hub kernel repository "
        "and the card rendered from CARD.md as README.md on main.",
        epilog="exit codes: 0 uploaded / dry run written; 1 refused (digest mismatch, a library that is not portable, dirty build, version "
        "mismatch, API or variant change on an existing branch); 2 usage (no build, build.toml, CARD.md); "
        "3 Hub error. Needs a write token (HF_TOKEN or `hf auth login`) unless --dry-run.",
    )
    parser.add_argument("--repo-root", type=Path, default=None,
                        help="folder with build.toml and CARD.md (default: $FUSED_GEGLU_ROOT, else found from the cwd)")
    parser.add_argument("--build-dir", type=Path, default=None, help="default: REPO_ROOT/build")
    parser.add_argument("--repo-id", default=None, help="default: build.toml [general.hub] repo-id")
    parser.add_argument("--dry-run", type=Path, default=None, metavar="OUT",
                        help="write the trees into OUT/<branch>/ and OUT/plan.json, print them, upload nothing")
    parser.add_argument("--compare-to", type=Path, default=None, metavar="PATH",
                        help="with --dry-run: check the API against this local copy of the branch")
    parser.add_argument("--allow-dirty", action="store_true", help="publish a build made from a dirty tree")
    parser.add_argument("--private", action="store_true", default=None, help="create the repository as private")
    return parser


def main(argv: list[str], *, api=None) -> int:
    args = build_parser().parse_args(argv)
    if args.repo_root is None:
        from .cli import repo_root

        args.repo_root = repo_root()
    build_dir = args.build_dir or args.repo_root / "build"
    if args.compare_to is not None and args.dry_run is None:
        print("fused-geglu publish: --compare-to is for --dry-run; a real publish compares with the Hub", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.dry_run is not None:
            return _dry_run(args, build_dir)
        return _publish(args, build_dir, api)
    except PublishRefused as e:
        print("fused-geglu publish: refused:", file=sys.stderr)
        for reason in e.reasons:
            print(f"  - {reason}", file=sys.stderr)
        return EXIT_REFUSED
    except ValueError as e:  # card.CardError and public_api.ApiError are ValueErrors
        print(f"fused-geglu publish: {e}", file=sys.stderr)
        return EXIT_USAGE


def _dry_run(args, build_dir: Path) -> int:
    out = args.dry_run
    if out.exists() and any(out.iterdir()):
        if not (out / "plan.json").is_file():
            raise ValueError(f"--dry-run {out} is not empty (and not an earlier dry run): choose another folder")
        shutil.rmtree(out)
    current = local_branch_state(args.compare_to) if args.compare_to is not None else None
    with tempfile.TemporaryDirectory(prefix="fused-geglu-publish-") as tmp:
        # Build in a scratch folder first, so a refusal leaves OUT untouched.
        plan = prepare(args.repo_root, build_dir, Path(tmp), repo_id=args.repo_id,
                       allow_dirty=args.allow_dirty, current=current)
        out.mkdir(parents=True, exist_ok=True)
        for branch, tree in plan.trees.items():
            shutil.move(str(tree), out / branch)
            plan.trees[branch] = out / branch
    (out / "plan.json").write_text(json.dumps(plan.to_json(out), indent=2) + "\n")
    print(format_plan(plan))
    print(f"dry run: nothing uploaded; trees in {out}")
    return EXIT_OK


def _publish(args, build_dir: Path, api) -> int:
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    if constants.HF_HUB_OFFLINE:
        print("fused-geglu publish: HF_HUB_OFFLINE is set; unset it to publish (or use --dry-run)", file=sys.stderr)
        return EXIT_HUB
    api = api or HfApi()
    general = read_general(args.repo_root)
    repo_id = args.repo_id or hub_repo_id(args.repo_root)
    branch = f"v{general['version']}"
    try:
        current = hub_branch_state(api, repo_id, branch)
        with tempfile.TemporaryDirectory(prefix="fused-geglu-publish-") as tmp:
            plan = prepare(args.repo_root, build_dir, Path(tmp), repo_id=repo_id,
                           allow_dirty=args.allow_dirty, current=current)
            print(format_plan(plan))
            commits = upload(plan, api, private=args.private, exists=current.exists)
    except (HfHubHTTPError, OSError) as e:
        print(f"fused-geglu publish: Hub error: {e}", file=sys.stderr)
        return EXIT_HUB
    for url in commits:
        print(f"committed {url}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
