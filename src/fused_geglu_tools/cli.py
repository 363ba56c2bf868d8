"""``fused-geglu``: one console script, one subcommand per job (the Makefile targets call these)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path


def repo_root() -> Path:
    env = os.environ.get("FUSED_GEGLU_ROOT")
    if env:
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for cand in (here, *here.parents):
        if (cand / "build.toml").is_file() and (cand / "torch-ext").is_dir():
            return cand
    return Path(__file__).resolve().parents[2]


def _cmd_build(argv: list[str]) -> int:
    from .builder import BuildError, build, planned_variants
    from .buildconfig import BuildConfigError
    from .toolchain import ToolchainError

    p = argparse.ArgumentParser(prog="fused-geglu build", description="Build every variant this machine can build into build/.")
    p.add_argument("--backends", help="comma-separated subset of build.toml's backends (default: all)")
    p.add_argument("--out", type=Path, help="output folder (default: <repo>/build)")
    p.add_argument("--no-clean", action="store_true",
                   help="keep every variant already in the output folder; by default a build of every backend "
                        "removes those built from other sources (an older commit's), keeping other torch versions'")
    p.add_argument("--plan", action="store_true",
                   help="print the names of the variants this machine would build, one a line, and build nothing")
    args = p.parse_args(argv)
    backends = args.backends.split(",") if args.backends else None
    try:
        if args.plan:
            for name in planned_variants(repo_root(), backends):
                print(name)
            return 0
        built = build(repo_root(), args.out, backends, clean=not args.no_clean)
    except (BuildError, BuildConfigError, ToolchainError) as exc:
        print(f"fused-geglu build: error: {exc}", file=sys.stderr)
        return 1
    for path in built:
        print(path)
    return 0


def _cmd_stage(argv: list[str]) -> int:
    from .buildconfig import BuildConfigError, hub_repo_id, hub_version
    from .stage import stage_build

    root = repo_root()
    p = argparse.ArgumentParser(prog="fused-geglu stage", description="Lay build/ out as an offline Hub snapshot.")
    p.add_argument("--build", type=Path, default=root / "build")
    p.add_argument("--cache", type=Path, default=root / ".hub-cache")
    p.add_argument("--repo-id", default=None, help="default: build.toml [general.hub] repo-id")
    p.add_argument("--ref", default=None, help="branch name (default: v<version> from build.toml)")
    p.add_argument("--variants", nargs="+", metavar="NAME", default=None,
                   help="stage only these build/ variants (default: all), e.g. torch-cpu")
    args = p.parse_args(argv)
    try:
        repo_id = args.repo_id or hub_repo_id(root)
        ref = args.ref or f"v{hub_version(root)}"
        sha = stage_build(args.build, args.cache, repo_id, ref, benchmarks_dir=root / "benchmarks",
                          variants=args.variants)
    except (FileNotFoundError, BuildConfigError) as exc:
        print(f"fused-geglu stage: error: {exc}", file=sys.stderr)
        return 1
    print(f"staged {repo_id}@{ref} = {sha} in {args.cache}")
    print(f"use it with: HF_HUB_OFFLINE=1 HF_HUB_CACHE={args.cache}")
    return 0


# subcommand -> (module, function) for the ones implemented in their own modules
_DELEGATED = {
    "lock": ("lock", "main"),
    "verify": ("verify", "main"),
    "publish": ("publish", "main"),
    "bench": ("bench", "main"),
    "demo": ("demo", "main"),
    "card": ("card", "main"),
    "build-matrix": ("matrix", "main"),
}
_LOCAL = {"build": _cmd_build, "stage": _cmd_stage}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = sorted([*_LOCAL, *_DELEGATED])
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: fused-geglu {" + ",".join(commands) + "} [args]  (fused-geglu CMD --help for each)")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd in _LOCAL:
        return _LOCAL[cmd](rest)
    if cmd in _DELEGATED:
        module, func = _DELEGATED[cmd]
        return int(getattr(importlib.import_module(f".{module}", __package__), func)(rest) or 0)
    print(f"fused-geglu: unknown command {cmd!r}; choose from {', '.join(commands)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
