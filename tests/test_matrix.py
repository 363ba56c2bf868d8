"""``fused-geglu build-matrix`` and the builder options it drives (``build --plan``, ``build --no-clean``).

The members here are fake interpreters (small scripts that answer the three things the matrix asks of a
Python: its torch, the builder's plan, the build itself), so the orchestration is checked without
installing a torch per release; the real runs are recorded in the README ("Building for several torch
releases")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fused_geglu_tools import builder, cli, matrix
from fused_geglu_tools.matrix import Member, MatrixError
from fused_geglu_tools.variants import Variant

_FAKE_PYTHON = """\
#!{python}
# A stand-in interpreter: torch {torch}, building {names}. Every call is appended to {log}.
import json, pathlib, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[:1] == ["-c"]:
    print("{torch} 13.0")
elif args[:2] == ["-m", "fused_geglu_tools.variant_check"]:  # loads its own variant, every op within tolerance
    backend = args[args.index("--backend") + 1]
    mine = [n for n in {names!r} if ("-cxx11-cu" if backend == "cuda" else "-cxx11-cpu") in n] or ["torch-" + backend]
    print(json.dumps({{"torch": "{torch}", "backend": backend, "gpu": False, "variant": mine[0],
                      "available": {{"cpu": ["cpu", "torch"], "cuda": ["cuda", "torch"]}},
                      "checks": [{{"op": "geglu", "device": "cpu", "dtype": "float32", "error": 1e-7,
                                  "allowed": 2e-5, "ok": True, "backend": backend}}]}}))
elif "--plan" in args:
    print("[fused-geglu build] skipping nothing")  # a log line the matrix must not take for a variant
    for name in {names!r}:
        print(name)
else:
    out = pathlib.Path(args[args.index("--out") + 1])
    for name in {names!r}:
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "metadata.json").write_text(json.dumps({{"built by": "{torch}"}}))
"""


def _fake_member(tmp_path: Path, torch: str, names: list[str]) -> Member:
    path = tmp_path / f"python-{torch}"
    path.write_text(_FAKE_PYTHON.format(python=sys.executable, torch=torch, names=names,
                                        log=str(tmp_path / f"calls-{torch}.jsonl")))
    path.chmod(0o755)
    return Member(torch, path, managed=False)


def _calls(tmp_path: Path, torch: str) -> list[list[str]]:
    log = tmp_path / f"calls-{torch}.jsonl"
    return [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []


def _variant(out: Path, name: str, built_by: str = "earlier") -> None:
    (out / name).mkdir(parents=True)
    (out / name / "metadata.json").write_text(json.dumps({"built by": built_by}))


def test_matrix_builds_every_torch_into_one_folder_and_removes_what_none_made(tmp_path, repo_root):
    out = tmp_path / "build"
    _variant(out, "torch299-cxx11-cu130-x86_64-linux")  # an older build's: no member makes it
    (out / ".objcache").mkdir()  # the object cache is not a variant
    m12 = _fake_member(tmp_path, "2.12.1", ["torch-cuda", "torch212-cxx11-cu130-x86_64-linux"])
    m15 = _fake_member(tmp_path, "2.15.0", ["torch-cuda", "torch215-cxx11-cu130-x86_64-linux", "torch-cpu"])

    plans = matrix.build_matrix(repo_root, [m12, m15], out)

    assert plans == {"2.12.1": ["torch-cuda", "torch212-cxx11-cu130-x86_64-linux"],
                     "2.15.0": ["torch-cuda", "torch215-cxx11-cu130-x86_64-linux", "torch-cpu"]}
    assert sorted(p.name for p in out.iterdir()) == [
        ".objcache", "torch-cpu", "torch-cuda", "torch212-cxx11-cu130-x86_64-linux", "torch215-cxx11-cu130-x86_64-linux"]
    # Each member's compiled variant is its own; the shared noarch one is the last member's.
    assert json.loads((out / "torch212-cxx11-cu130-x86_64-linux" / "metadata.json").read_text()) == {"built by": "2.12.1"}
    assert json.loads((out / "torch-cuda" / "metadata.json").read_text()) == {"built by": "2.15.0"}
    for torch in ("2.12.1", "2.15.0"):
        builds = [c for c in _calls(tmp_path, torch) if c[:3] == ["-m", "fused_geglu_tools", "build"] and "--plan" not in c]
        # One build each, into the shared folder, told to keep the other members' variants.
        assert builds == [["-m", "fused_geglu_tools", "build", "--out", str(out), "--no-clean"]]


def test_matrix_refuses_two_releases_that_make_one_variant_before_compiling(tmp_path, repo_root):
    a = _fake_member(tmp_path, "2.15.0", ["torch-cuda", "torch215-cxx11-cu130-x86_64-linux"])
    b = _fake_member(tmp_path, "2.15.1", ["torch-cuda", "torch215-cxx11-cu130-x86_64-linux"])
    with pytest.raises(MatrixError, match=r"torch215-cxx11-cu130-x86_64-linux \(torch 2.15.0 and torch 2.15.1\)"):
        matrix.build_matrix(repo_root, [a, b], tmp_path / "build")
    for torch in ("2.15.0", "2.15.1"):
        assert not [c for c in _calls(tmp_path, torch) if "--out" in c], "a member built before the clash was found"
    assert not (tmp_path / "build").exists()


def test_matrix_fails_when_a_member_does_not_make_what_it_planned(tmp_path, repo_root):
    member = _fake_member(tmp_path, "2.14.1", ["torch-cuda"])
    # The plan names a variant the build then does not write (a build that lost it, say).
    script = member.python.read_text().replace('for name in [\'torch-cuda\']:\n        (out',
                                               'for name in []:\n        (out')
    assert script != member.python.read_text()
    member.python.write_text(script)
    with pytest.raises(MatrixError, match="torch 2.14.1: the build finished without torch-cuda"):
        matrix.build_matrix(repo_root, [member], tmp_path / "build")


def test_member_specs(tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    venvs = tmp_path / "venvs"
    assert matrix.parse_members(["2.15.0", f"torch==2.12.1={python}"], venvs) == [
        Member("2.15.0", venvs / "torch-2.15.0" / "bin" / "python", managed=True),
        Member("2.12.1", python, managed=False)]
    for spec, message in [("latest", "expected a torch version"), ("2.15.0=" + str(tmp_path / "nope"), "no interpreter"),
                          ("", "expected a torch version")]:
        with pytest.raises(MatrixError, match=message):
            matrix.parse_members([spec], venvs)
    with pytest.raises(MatrixError, match="2.15.0 is given twice"):
        matrix.parse_members(["2.15.0", "2.15.0"], venvs)


def test_managed_environment_is_made_once_and_reinstalled_when_its_requirements_change(tmp_path, repo_root, monkeypatch):
    commands = []

    def fake_run(cmd, what, env=None, capture=False):
        commands.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:  # the venv's interpreter appears
            (Path(cmd[3]) / "bin").mkdir(parents=True)
            (Path(cmd[3]) / "bin" / "python").write_text("")
        return ""

    monkeypatch.setattr(matrix, "_run", fake_run)
    (member,) = matrix.parse_members(["2.12.1"], tmp_path)
    matrix.ensure_environment(member, repo_root, [])
    venv, pip = commands
    assert venv == [sys.executable, "-m", "venv", str(tmp_path / "torch-2.12.1")]
    assert pip[:3] == [str(member.python), "-m", "pip"]
    assert "torch==2.12.1" in pip and str(repo_root / "requirements" / "build.txt") in pip
    constraints = Path(pip[pip.index("-c") + 1]).read_text()
    assert "kernels==" in constraints and "torch==" not in constraints and "triton==" not in constraints

    commands.clear()
    matrix.ensure_environment(member, repo_root, [])
    assert commands == [], "an environment that holds what it should was reinstalled"

    matrix.ensure_environment(member, repo_root, ["--no-cache-dir"])
    assert len(commands) == 1 and commands[0][-1] == "--no-cache-dir", commands

    commands.clear()
    matrix.ensure_environment(Member("2.11.0", member.python, managed=False), repo_root, [])
    assert commands == [], "the caller's own interpreter was installed into"


def test_build_requirements_are_the_builders_own_and_pinned(repo_root):
    lines = [l.split("#")[0].strip() for l in (repo_root / "requirements" / "build.txt").read_text().splitlines()]
    pins = dict(l.split("==") for l in lines if l)
    assert set(pins) == {"kernels", "kernel-abi-check", "nvidia-cutlass"}
    dev = (repo_root / "requirements" / "dev.txt").read_text()
    for name in ("kernels", "kernel-abi-check"):  # the same versions the tests run with
        assert f"{name}=={pins[name]}" in dev


def test_build_cli_passes_no_clean_through(monkeypatch, repo_root):
    seen = {}

    def fake_build(root, out, backends, clean=True):
        seen.update(out=out, backends=backends, clean=clean)
        return []

    monkeypatch.setattr(builder, "build", fake_build)
    assert cli.main(["build", "--no-clean", "--out", "/tmp/x"]) == 0
    assert seen == {"out": Path("/tmp/x"), "backends": None, "clean": False}
    assert cli.main(["build"]) == 0
    assert seen["clean"] is True


def test_remove_stale_variants_keeps_scratch_and_non_variant_folders(tmp_path):
    for name in ("torch-cuda", "torch211-cxx11-cu130-x86_64-linux", "torch299-cxx11-cpu-x86_64-linux"):
        _variant(tmp_path, name)
    (tmp_path / ".partial-abc" / "torch-cpu").mkdir(parents=True)
    (tmp_path / ".objcache").mkdir()
    builder.remove_stale_variants(tmp_path, {"torch-cuda", "torch211-cxx11-cu130-x86_64-linux"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".objcache", ".partial-abc", "torch-cuda", "torch211-cxx11-cu130-x86_64-linux"]


def test_build_plan_names_the_variants_this_machine_builds(repo_root, build_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo_root / "src"), *sys.path[1:]])}
    # The backends build/ was made for: all of them here, cuda alone on the GPU machine (its script builds
    # --backends cuda).
    built = {p.parent.name for p in build_dir.glob("*/metadata.json")}
    backends = sorted({Variant.parse(n).backend for n in built})
    proc = subprocess.run([sys.executable, "-m", "fused_geglu_tools", "build", "--plan", "--backends", ",".join(backends)],
                          cwd=repo_root, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    names = [l for l in proc.stdout.splitlines() if not l.startswith("[fused-geglu build]")]
    for name in names:
        Variant.parse(name)  # a variant name, nothing else
    assert {f"torch-{b}" for b in backends} <= set(names)
    # `make test` built them: the plan is what the build made (build/ may hold more, from a matrix).
    assert set(names) <= built
    assert not list(build_dir.glob(".partial-*")), "--plan left a scratch folder"


def test_a_plain_build_keeps_other_torch_versions_variants_of_its_own_sources(tmp_path, repo_root, monkeypatch):
    """`make build` after a matrix (`make stage` runs it) must not undo the matrix: it removes the variants of
    other sources (an older commit's, a dirty tree's) and keeps other torch versions' builds of its own."""
    from fused_geglu_tools import toolchain
    from fused_geglu_tools.gitid import SourceIdentity

    out = tmp_path / "build"

    def variant_with_id(name, ident):
        (out / name).mkdir(parents=True)
        (out / name / "metadata.json").write_text(json.dumps({"id": ident}))

    variant_with_id("torch215-cxx11-cu130-x86_64-linux", "_fused_geglu_cuda_abc1234")  # this commit, torch 2.15
    variant_with_id("torch214-cxx11-cu130-x86_64-linux", "_fused_geglu_cuda_0123456")  # an older commit
    variant_with_id("torch212-cxx11-cu130-x86_64-linux", "_fused_geglu_cuda_abc1234_dirty")  # a dirty tree
    (out / "torch299-cxx11-cpu-x86_64-linux").mkdir()  # no metadata.json: not a finished variant

    def no_compiler():
        raise toolchain.ToolchainError("none here")

    def fake_build_variant(cfg, plan, ident, tc, out_root):
        variant_with_id(plan.variant.name, f"_x_{ident.uid}")
        return out_root / plan.variant.name

    monkeypatch.setattr(builder, "source_identity", lambda *a, **k: SourceIdentity("abc1234", None, False))
    monkeypatch.setattr(builder.toolchain, "detect", no_compiler)
    monkeypatch.setattr(builder, "build_variant", fake_build_variant)
    built = builder.build(repo_root, out)
    assert sorted(p.name for p in built) == ["torch-cpu", "torch-cuda"]
    assert sorted(p.name for p in out.iterdir()) == [
        "torch-cpu", "torch-cuda", "torch215-cxx11-cu130-x86_64-linux", "torch299-cxx11-cpu-x86_64-linux"]


def test_matrix_runs_the_real_builder_of_a_given_interpreter(tmp_path, repo_root, monkeypatch):
    """The fakes above stand in for each torch's Python; here this process's own interpreter builds (the cuda
    backend, which on any torch includes the noarch torch-cuda and compiles nothing on a CPU torch)."""
    import torch

    # The child must see the packages this process sees (kernels' build.toml parser among them).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path[1:]))
    (member,) = matrix.parse_members([f"{torch.__version__.split('+')[0]}={sys.executable}"], tmp_path / "venvs")
    if torch.version.cuda:
        pytest.skip("on a CUDA torch the cuda backend compiles the CUDA variant (minutes); CI's CPU torch runs this")
    out = tmp_path / "build"
    plans = matrix.build_matrix(repo_root, [member], out, backends=["cuda"])
    assert plans == {member.torch: ["torch-cuda"]}
    meta = json.loads((out / "torch-cuda" / "metadata.json").read_text())
    assert meta["id"].startswith("_fused_geglu_cuda_noarch_")
    assert not (tmp_path / "venvs").exists(), "an environment was made for the caller's interpreter"


# --- the check after the build: each member loads its own variants through kernels -----------------------

def test_expected_loads_prefer_the_compiled_variant_of_each_backend():
    assert matrix.expected_loads(["torch-cuda", "torch215-cxx11-cu130-x86_64-linux", "torch-cpu",
                                  "torch215-cxx11-cpu-x86_64-linux"]) == {
        "cuda": "torch215-cxx11-cu130-x86_64-linux", "cpu": "torch215-cxx11-cpu-x86_64-linux"}
    # No compiler there: the noarch variants are what that torch loads.
    assert matrix.expected_loads(["torch-cuda", "torch-cpu"]) == {"cuda": "torch-cuda", "cpu": "torch-cpu"}


def _record(variant, ok=True, available=None, **extra):
    return {"torch": "2.15.0+cu132", "backend": "cuda", "gpu": False, "variant": variant,
            "available": available or {"cpu": ["torch"], "cuda": ["cuda", "triton", "torch"]},
            "checks": [{"op": "geglu_mlp", "device": "cpu", "dtype": "float32", "error": 3e-7 if ok else 1e-3,
                        "allowed": 2e-5, "ok": ok, "backend": "torch+gemm"}], **extra}


def test_check_verdict_names_what_is_wrong():
    cu = "torch215-cxx11-cu130-x86_64-linux"
    assert matrix._check_verdict(_record(cu), cu) == []
    assert matrix._check_verdict(_record("torch-cuda"), cu) == [f"loaded torch-cuda, expected {cu}"]
    (bad,) = matrix._check_verdict(_record(cu, ok=False), cu)
    assert "geglu_mlp on cpu (float32, backend torch+gemm): error 1.00e-03 > allowed 2.00e-05" in bad
    (unregistered,) = matrix._check_verdict(_record(cu, available={"cuda": ["triton", "torch"]}), cu)
    assert "compiled cuda kernels are not registered" in unregistered
    assert matrix._check_verdict({"error": "OSError: undefined symbol"}, cu) == [
        "loading failed: OSError: undefined symbol"]
    assert matrix._check_verdict({**_record(cu), "checks": []}, cu) == ["no op was checked"]
    # A CPU torch cannot load the noarch torch-cuda; it cannot have built a compiled CUDA variant either.
    assert matrix._check_verdict({"skipped": "a CPU build of torch loads no CUDA variant"}, "torch-cuda") == []
    assert matrix._check_verdict({"skipped": "no"}, cu) == [f"not loaded (no), expected {cu}"]


_FAKE_CHECKER = """\
#!{python}
# A stand-in interpreter whose variant_check loads {loads} for every backend.
import json, sys
assert sys.argv[1:3] == ["-m", "fused_geglu_tools.variant_check"], sys.argv
print("a log line first")
print(json.dumps({record}))
"""


def test_check_matrix_fails_a_member_that_loads_another_variant(tmp_path, repo_root):
    out = tmp_path / "build"
    for name in ("torch-cuda", "torch215-cxx11-cu130-x86_64-linux"):
        _variant(out, name)
    python = tmp_path / "python"
    python.write_text(_FAKE_CHECKER.format(python=sys.executable, loads="torch-cuda", record=_record("torch-cuda")))
    python.chmod(0o755)
    member = Member("2.15.0", python, managed=False)
    with pytest.raises(MatrixError, match=r"torch 2.15.0, cuda: loaded torch-cuda, expected torch215-cxx11-cu130"):
        matrix.check_matrix(repo_root, [member], {"2.15.0": ["torch-cuda", "torch215-cxx11-cu130-x86_64-linux"]}, out)
    python.write_text(_FAKE_CHECKER.format(python=sys.executable, loads="torch215",
                                           record=_record("torch215-cxx11-cu130-x86_64-linux")))
    results = matrix.check_matrix(repo_root, [member], {"2.15.0": ["torch-cuda", "torch215-cxx11-cu130-x86_64-linux"]}, out)
    assert results["2.15.0"]["cuda"]["variant"] == "torch215-cxx11-cu130-x86_64-linux"


def test_check_matrix_loads_the_real_build_through_kernels(repo_root, build_dir, monkeypatch):
    """This interpreter as the only member, over the real build/: staged, loaded with kernels.get_kernel in a
    child process for each backend this torch built, every op checked against float64 (CUDA tensors too
    where there is a GPU)."""
    import torch

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path[1:]))
    member = Member(torch.__version__.split("+")[0], Path(sys.executable), managed=False)
    this_torch = tuple(int(p) for p in member.torch.split(".")[:2])
    # build/ may hold other torch releases' variants (a matrix): this member built the noarch ones and its own.
    mine = [p.parent.name for p in build_dir.glob("*/metadata.json")
            if Variant.parse(p.parent.name).torch in (None, this_torch)]
    results = matrix.check_matrix(repo_root, [member], {member.torch: mine}, build_dir)
    loaded = {b: r.get("variant") for b, r in results[member.torch].items()}
    compiled = [n for n in mine if not Variant.parse(n).noarch]
    assert set(compiled) <= set(loaded.values()), (compiled, loaded)
    for record in results[member.torch].values():
        for check in record.get("checks", []):
            assert check["ok"] and check["error"] > 0, check  # exact zero would mean the reference was compared to itself


def test_variant_check_catches_wrong_numbers():
    """check_device against a stand-in kernel whose MLP is off by a little: that op fails, the others pass."""
    import types

    import torch

    from fused_geglu_tools import variant_check

    f = torch.nn.functional

    def mlp(x, wg, wu, wd, bg, bu, bd, approximate):
        return f.linear(f.gelu(f.linear(x, wg, bg), approximate=approximate) * f.linear(x, wu, bu), wd, bd) * (1 + 1e-3)

    fake = types.SimpleNamespace(geglu_mlp=mlp, linear=f.linear,
                                 geglu=lambda g, u, approximate: f.gelu(g, approximate=approximate) * u,
                                 last_backend=lambda op: "stand-in")
    records = {r["op"]: r for r in variant_check.check_device(fake, "cpu")}
    assert not records["geglu_mlp"]["ok"] and records["geglu_mlp"]["error"] > 5e-4
    assert records["linear"]["ok"] and records["geglu"]["ok"]


def test_cli_report_records_the_members_and_their_checks_also_on_failure(tmp_path, repo_root):
    out, report = tmp_path / "build", tmp_path / "report.json"
    ok = _fake_member(tmp_path, "2.15.0", ["torch-cuda", "torch215-cxx11-cu130-x86_64-linux", "torch-cpu"])
    assert matrix.main(["--torch", f"2.15.0={ok.python}", "--out", str(out), "--report", str(report)]) == 0
    doc = json.loads(report.read_text())
    assert doc["ok"] is True and doc["error"] is None
    assert doc["members"]["2.15.0"]["variants"] == ["torch-cuda", "torch215-cxx11-cu130-x86_64-linux", "torch-cpu"]
    assert doc["members"]["2.15.0"]["imports"] == "2.15.0 13.0" and doc["members"]["2.15.0"]["build_s"] >= 0
    assert {b: r["variant"] for b, r in doc["checks"]["2.15.0"].items()} == {
        "cuda": "torch215-cxx11-cu130-x86_64-linux", "cpu": "torch-cpu"}

    # A member whose build lacks what it planned: the report still comes, saying why.
    bad = _fake_member(tmp_path, "2.14.1", ["torch-cuda"])
    bad.python.write_text(bad.python.read_text().replace("for name in ['torch-cuda']:\n        (out",
                                                         "for name in []:\n        (out"))
    assert matrix.main(["--torch", f"2.14.1={bad.python}", "--out", str(tmp_path / "build-2"),
                        "--report", str(report)]) == 1
    doc = json.loads(report.read_text())
    assert doc["ok"] is False and "the build finished without torch-cuda" in doc["error"]
    assert "checks" not in doc
