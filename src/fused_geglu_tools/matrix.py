"""``fused-geglu build-matrix``: one ``build/`` with the compiled variants of several torch releases.

``fused-geglu build`` compiles for the torch it runs under, so a release that serves torch 2.11 to 2.15
needs one build per torch. This runs them: each torch release gets a virtual environment of its own under
``.venvs/`` (made once, with that torch and ``requirements/build.txt``) or an interpreter the caller names,
the builder runs there into the shared output folder without removing the others' variants, and at the end
the variants none of them made are removed, as a single build removes them.

Then each member loads what it built the way users do (the folder staged as a local Hub snapshot, read by
``kernels.get_kernel``) and checks its numbers (:mod:`.variant_check`): a variant that its torch does not
select, whose compiled library does not load under that torch, or whose results are off fails the matrix.

Before anything compiles, every member says which variants it would build (``fused-geglu build --plan``):
two torch releases that make the same compiled variant (2.15.0 and 2.15.1 both make ``torch215-...``) would
silently overwrite each other, so that is an error naming both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .builder import BuildError, remove_stale_variants
from .variants import Variant

_STAMP = ".fused-geglu-build-env"  # in each environment: the hash of what was installed into it
_CHECK_TIMEOUT_S = 600  # one member's load and check: ~4 s on 2 cores; a hang must not stall the matrix


class MatrixError(BuildError):
    """A member that cannot be set up or built, or two members that would build the same variant."""


def _log(msg: str) -> None:
    print(f"[fused-geglu build-matrix] {msg}", flush=True)


@dataclass(frozen=True)
class Member:
    """One torch release of the matrix and the interpreter that builds it."""

    torch: str  # the torch version pip installs ("2.15.0"), or the caller's label for a given interpreter
    python: Path
    managed: bool  # True: an environment this tool makes and installs into; False: the caller's interpreter


def parse_members(specs: list[str], venvs: Path) -> list[Member]:
    """``2.15.0`` is a managed environment at ``venvs/torch-2.15.0``; ``2.15.0=/path/to/python`` is the
    caller's interpreter, used as it is (its torch should be that release; the build says which it is)."""
    members, seen = [], set()
    for spec in specs:
        spec_body = spec.strip()
        if spec_body.startswith("torch=="):
            spec_body = spec_body[len("torch=="):]
        version, _, python = spec_body.partition("=")
        version = version.strip()
        if not version or not version[0].isdigit() or any(c.isspace() for c in version):
            raise MatrixError(f"--torch {spec!r}: expected a torch version such as 2.15.0, optionally "
                              "followed by =/path/to/python")
        if version in seen:
            raise MatrixError(f"--torch {version} is given twice")
        seen.add(version)
        if python:
            path = Path(python).expanduser()
            if not path.is_file():
                raise MatrixError(f"--torch {spec!r}: no interpreter at {path}")
            members.append(Member(version, path, managed=False))
        else:
            members.append(Member(version, venvs / f"torch-{version}" / "bin" / "python", managed=True))
    if not members:
        raise MatrixError("--torch: name at least one torch version")
    return members


def install_requirements(root: Path, torch_version: str) -> tuple[list[str], str]:
    """pip's arguments for a build environment of ``torch_version``, and the constraints file's text.

    The constraints are the project's pinned tree less torch and triton, which each environment takes
    from its own torch."""
    build_txt = root / "requirements" / "build.txt"
    constraints = root / "requirements" / "constraints.txt"
    for path in (build_txt, constraints):
        if not path.is_file():
            raise MatrixError(f"{path} is missing")
    lines = constraints.read_text().splitlines()
    kept = "\n".join(l for l in lines if l.split("==")[0].strip().lower() not in ("torch", "triton")) + "\n"
    return [f"torch=={torch_version}", "-r", str(build_txt)], kept


def _run(cmd: list[str], what: str, env: dict | None = None, capture: bool = False) -> str:
    proc = subprocess.run(cmd, env=env, text=True, capture_output=capture)
    if proc.returncode != 0:
        detail = (proc.stdout or "") + (proc.stderr or "") if capture else ""
        raise MatrixError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{detail[-4000:]}")
    return proc.stdout if capture else ""


def ensure_environment(member: Member, root: Path, pip_args: list[str]) -> None:
    """Make ``member``'s environment if it is managed and missing, or reinstall where what it should hold
    changed (another requirements/build.txt, constraints or pip arguments)."""
    if not member.managed:
        return
    venv = member.python.parent.parent
    requirements, constraints = install_requirements(root, member.torch)
    stamp = hashlib.sha256("\0".join([*requirements, (root / "requirements" / "build.txt").read_text(),
                                      constraints, *pip_args]).encode()).hexdigest()
    stamp_file = venv / _STAMP
    if member.python.is_file() and stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
        return
    if not member.python.is_file():
        _log(f"torch {member.torch}: making the environment {venv}")
        _run([sys.executable, "-m", "venv", str(venv)], f"python -m venv {venv}")
    _log(f"torch {member.torch}: installing torch=={member.torch} and requirements/build.txt")
    cfile = venv / "constraints.txt"
    cfile.write_text(constraints)
    _run([str(member.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements,
          "-c", str(cfile), *pip_args], f"installing torch {member.torch}")
    stamp_file.write_text(stamp + "\n")


def _builder_env(root: Path) -> dict:
    """The environment a member's builder runs in: this checkout's tools on its Python, its root named."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env["FUSED_GEGLU_ROOT"] = str(root)
    return env


def _builder(member: Member, *args: str) -> list[str]:
    return [str(member.python), "-m", "fused_geglu_tools", "build", *args]


def _backends_arg(backends: list[str] | None) -> list[str]:
    return ["--backends", ",".join(backends)] if backends else []


def torch_of(member: Member) -> str:
    """The torch version (and CUDA, where it has one) ``member``'s interpreter imports."""
    out = _run([str(member.python), "-c", "import torch; print(torch.__version__, torch.version.cuda or 'cpu')"],
               f"torch {member.torch}: importing torch", capture=True)
    return out.strip().splitlines()[-1] if out.strip() else "?"


def plan(member: Member, root: Path, backends: list[str] | None) -> list[str]:
    args = ["--plan", *_backends_arg(backends)]
    out = _run(_builder(member, *args), f"torch {member.torch}: fused-geglu build --plan",
               env=_builder_env(root), capture=True)
    names = []
    for line in out.splitlines():
        try:
            Variant.parse(line.strip())
        except ValueError:  # the builder's own log lines ("skipping the compiled CUDA variant: ...")
            if line.strip():
                _log(f"torch {member.torch}: {line.strip().removeprefix('[fused-geglu build] ')}")
            continue
        names.append(line.strip())
    return names


def overlapping_variants(plans: dict[str, list[str]]) -> list[str]:
    """Compiled variants that more than one member would build (noarch ones are the same for every torch)."""
    owner: dict[str, str] = {}
    clashes = []
    for version, names in plans.items():
        for name in names:
            if Variant.parse(name).noarch:
                continue
            if name in owner:
                clashes.append(f"{name} (torch {owner[name]} and torch {version})")
            else:
                owner[name] = version
    return clashes


def build_matrix(root: Path, members: list[Member], out: Path, backends: list[str] | None = None,
                 pip_args: list[str] | None = None, clean: bool = True,
                 report: dict | None = None) -> dict[str, list[str]]:
    """Build every member's variants into ``out``; returns each member's variant names. ``report``, where
    given, gets each member's interpreter, the torch it imports, its variants and its build time."""
    for member in members:
        ensure_environment(member, root, list(pip_args or []))
    plans = {}
    entries = report.setdefault("members", {}) if report is not None else {}
    for member in members:
        imports = torch_of(member)
        entries[member.torch] = {"python": str(member.python), "imports": imports}
        _log(f"torch {member.torch}: {member.python} imports torch {imports}")
        plans[member.torch] = entries[member.torch]["variants"] = plan(member, root, backends)
        _log(f"torch {member.torch}: would build {', '.join(plans[member.torch]) or 'nothing'}")
    clashes = overlapping_variants(plans)
    if clashes:
        raise MatrixError("two torch releases would build the same variant, the later overwriting the earlier: "
                          + "; ".join(clashes) + ". Keep one release per torch minor version.")
    out.mkdir(parents=True, exist_ok=True)
    for member in members:
        t0 = time.monotonic()
        args = ["--out", str(out), "--no-clean", *_backends_arg(backends)]
        _log(f"torch {member.torch}: building")
        _run(_builder(member, *args), f"torch {member.torch}: fused-geglu build", env=_builder_env(root))
        entries[member.torch]["build_s"] = round(time.monotonic() - t0, 1)
        missing = [n for n in plans[member.torch] if not (out / n / "metadata.json").is_file()]
        if missing:
            raise MatrixError(f"torch {member.torch}: the build finished without {', '.join(missing)}")
    if clean and backends is None:
        remove_stale_variants(out, {n for names in plans.values() for n in names})
    for member in members:
        _log(f"torch {member.torch}: {entries[member.torch]['build_s']:.0f} s, {', '.join(plans[member.torch])}")
    return plans


def expected_loads(names: list[str]) -> dict[str, str]:
    """backend -> the variant kernels should load for it under this member's torch: the member's compiled
    variant of that backend, or where it built none, the noarch one."""
    expected: dict[str, str] = {}
    for name in names:
        variant = Variant.parse(name)
        if not variant.noarch or variant.backend not in expected:
            expected[variant.backend] = name
    return expected


def _check_verdict(result: dict, expected: str) -> list[str]:
    """What is wrong with one load's record (:mod:`.variant_check`), as phrases; empty when nothing is."""
    if "error" in result:
        return [f"loading failed: {result['error']}"]
    variant = Variant.parse(expected)
    if "skipped" in result:  # a CPU torch and the noarch torch-cuda: nothing it could load
        return [] if variant.noarch else [f"not loaded ({result['skipped']}), expected {expected}"]
    problems = []
    if result.get("variant") != expected:
        problems.append(f"loaded {result.get('variant')}, expected {expected}")
    if not variant.noarch and variant.backend not in result.get("available", {}).get(variant.backend, []):
        problems.append(f"its compiled {variant.backend} kernels are not registered "
                        f"(backends for {variant.backend} tensors: {result.get('available', {}).get(variant.backend)})")
    if not result.get("checks"):
        problems.append("no op was checked")
    for rec in result.get("checks", []):
        if not rec["ok"]:
            problems.append(f"{rec['op']} on {rec['device']} ({rec['dtype']}, backend {rec['backend']}): error "
                            f"{rec['error']:.2e} > allowed {rec['allowed']:.2e}")
    return problems


def _summary(result: dict) -> str:
    if "skipped" in result:
        return f"not loaded under torch {result.get('torch')}: {result['skipped']}"
    checks = ", ".join(f"{r['op']} {r['device']} {r['error']:.1e} ({r['backend']})" for r in result.get("checks", []))
    gpu = "" if result.get("gpu") or result.get("backend") != "cuda" else "; no GPU, so CUDA tensors were not run"
    return f"loaded {result.get('variant')} under torch {result.get('torch')}: {checks}{gpu}"


def check_matrix(root: Path, members: list[Member], plans: dict[str, list[str]], out: Path,
                 report: dict | None = None) -> dict:
    """Stage ``out`` as a local Hub snapshot, then under each member's interpreter load each backend's
    variant through ``kernels.get_kernel`` and check its numbers. Returns member -> backend -> record
    (also ``report["checks"]``, filled as the loads run); raises :class:`MatrixError` naming every load
    that failed."""
    from .buildconfig import hub_repo_id, hub_version
    from .stage import stage_build

    repo_id, version = hub_repo_id(root), hub_version(root)
    results: dict[str, dict[str, dict]] = report.setdefault("checks", {}) if report is not None else {}
    failures = []
    with tempfile.TemporaryDirectory(prefix="fused-geglu-matrix-check-") as cache:
        stage_build(out, Path(cache), repo_id, f"v{version}")
        env = _builder_env(root)
        env.update(HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
        env.pop("FUSED_GEGLU_BACKEND", None)  # check what users get by default
        for member in members:
            for backend, expected in expected_loads(plans[member.torch]).items():
                cmd = [str(member.python), "-m", "fused_geglu_tools.variant_check", "--repo-id", repo_id,
                       "--version", str(version), "--backend", backend]
                try:
                    proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=_CHECK_TIMEOUT_S)
                    result = json.loads(proc.stdout.strip().splitlines()[-1])
                except subprocess.TimeoutExpired:
                    result = {"error": f"no answer within {_CHECK_TIMEOUT_S} s"}
                except (IndexError, json.JSONDecodeError):
                    result = {"error": f"exit {proc.returncode}, no result: {(proc.stdout + proc.stderr)[-2000:]}"}
                results.setdefault(member.torch, {})[backend] = result
                problems = _check_verdict(result, expected)
                if problems:
                    failures.append(f"torch {member.torch}, {backend}: " + "; ".join(problems))
                    _log(f"torch {member.torch}, {backend}: FAILED: " + "; ".join(problems))
                else:
                    _log(f"torch {member.torch}, {backend}: {_summary(result)}")
    if failures:
        raise MatrixError("the check of the built variants failed:\n  " + "\n  ".join(failures))
    return results


def _provenance(out: Path, names: list[str]) -> dict:
    """The commit and dirty flag the builder recorded in the matrix's variants (one tree built them all)."""
    for name in names:
        try:
            kernel = json.loads((out / name / "metadata.json").read_text())["provenance"]["kernel"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return {"commit": kernel.get("commit"), "dirty": kernel.get("dirty")}
    return {"commit": None, "dirty": None}


def write_report(path: Path, report: dict, out: Path) -> None:
    names = sorted({n for m in report.get("members", {}).values() for n in m.get("variants", [])})
    doc = {"tool": "fused-geglu build-matrix",
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"arch": platform.machine(), "cpus": os.cpu_count()},
           **_provenance(out, names), **report}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    _log(f"report: {path}")


def main(argv: list[str]) -> int:
    from .cli import repo_root

    root = repo_root()
    p = argparse.ArgumentParser(
        prog="fused-geglu build-matrix",
        description="Build the variants of several torch releases into one build/, each in its own environment.")
    p.add_argument("--torch", nargs="+", required=True, metavar="VERSION[=PYTHON]",
                   help="torch releases, e.g. 2.12.1 2.15.0; VERSION=/path/to/python builds with that interpreter "
                        "instead of an environment under --venvs")
    p.add_argument("--venvs", type=Path, default=root / ".venvs",
                   help="where the per-torch environments are made (default: <repo>/.venvs)")
    p.add_argument("--out", type=Path, default=root / "build", help="output folder (default: <repo>/build)")
    p.add_argument("--backends", help="comma-separated subset of build.toml's backends (default: all)")
    p.add_argument("--pip-args", default="",
                   help="extra arguments for each environment's pip install, e.g. '--index-url URL' "
                        "for torch builds of another CUDA")
    p.add_argument("--no-clean", action="store_true", help="keep variants in --out that no member builds")
    p.add_argument("--no-check", action="store_true",
                   help="skip loading each member's variants through kernels and checking their numbers")
    p.add_argument("--report", type=Path,
                   help="write what ran to this JSON file (members, their torch, variants, build times, the "
                        "check's records, the commit), also when it fails")
    args = p.parse_args(argv)
    report: dict = {"ok": False, "error": None}
    out = args.out.resolve()
    try:
        members = parse_members(args.torch, args.venvs.resolve())
        plans = build_matrix(root, members, out, args.backends.split(",") if args.backends else None,
                             args.pip_args.split(), clean=not args.no_clean, report=report)
        if not args.no_check:
            check_matrix(root, members, plans, out, report=report)
        report["ok"] = True
    except MatrixError as exc:
        report["error"] = str(exc)
        print(f"fused-geglu build-matrix: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.report:
            write_report(args.report, report, out)
    return 0
