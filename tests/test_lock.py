"""`fused-geglu lock`: v<N> resolved to a commit, written as the kernels.lock that kernels 0.17-0.19 read, and
loaded back by kernels exactly (load_kernel, get_locked_kernel, LockedLayerRepository + kernelize).

Loading happens in a fresh interpreter: a second staged build with the same ops namespace must not
be imported into the test process (its torch.library registrations would clash with the kernel
other tests loaded), and a fresh process proves HF_HUB_OFFLINE=1 alone is enough.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO_ID, VERSION
from fused_geglu_tools import digest, lock, verify
from fused_geglu_tools.stage import stage_build


BRANCH = f"v{VERSION}"  # this checkout's version branch, which `make stage` staged


def write_project(path: Path, deps: str = f'"{REPO_ID}" = {VERSION}') -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [project]
            name = "consumer"
            version = "0.1.0"

            [tool.kernels.dependencies]
            """
        )
        + deps
        + "\n"
    )
    return path


def staged_ref(cache: Path, ref: str = BRANCH) -> str:
    return (lock.cache_repo_dir(cache, REPO_ID) / "refs" / ref).read_text().strip()


def parse_lock(path: Path) -> dict[tuple[str, int], str]:
    """The lock as kernels itself parses it."""
    from kernels._rust import KernelLocks

    return {(d.repo_id, d.version.version): str(lk.commit)  # an Oid since kernels 0.19
            for d, lk in KernelLocks.from_json(path.read_text()).items()}


# --- resolution and the file format --------------------------------------------------------------


def test_offline_lock_from_staged_cache(hub_cache, tmp_path, capsys):
    project = write_project(tmp_path / "consumer")
    assert lock.main([str(project)]) == lock.EXIT_OK  # conftest sets HF_HUB_OFFLINE=1 and HF_HUB_CACHE
    commit = staged_ref(Path(hub_cache))
    assert parse_lock(project / "kernels.lock") == {(REPO_ID, VERSION): commit}
    assert json.loads((project / "kernels.lock").read_text()) == [
        {"dependency": {"repo-id": REPO_ID, "version": VERSION}, "lock": {"commit": commit}}
    ]
    assert f"{REPO_ID} {BRANCH} -> {commit}" in capsys.readouterr().out
    assert lock.main([str(project), "--check"]) == lock.EXIT_OK


def test_check_reports_a_stale_or_missing_lock(hub_cache, tmp_path):
    project = write_project(tmp_path / "consumer")
    assert lock.main([str(project), "--check"]) == lock.EXIT_STALE  # no kernels.lock yet
    assert not (project / "kernels.lock").exists()
    (project / "kernels.lock").write_text(
        json.dumps([{"dependency": {"repo-id": REPO_ID, "version": VERSION}, "lock": {"commit": "f" * 40}}])
    )
    assert lock.main([str(project), "--check"]) == lock.EXIT_STALE


def test_unknown_version_and_missing_cache_fail(hub_cache, tmp_path, capsys):
    project = write_project(tmp_path / "consumer", f'"{REPO_ID}" = 7')
    assert lock.main([str(project)]) == lock.EXIT_UNRESOLVED
    assert "v7 is not in the cache" in capsys.readouterr().err
    assert not (project / "kernels.lock").exists()
    project = write_project(tmp_path / "other")
    assert lock.main([str(project), "--cache-dir", str(tmp_path / "empty-cache")]) == lock.EXIT_UNRESOLVED


@pytest.mark.parametrize("damage", ["short_ref", "long_ref", "non_hex_ref", "no_snapshot_build"])
def test_a_damaged_cache_is_unresolved_not_locked(hub_cache, tmp_path, capsys, damage):
    """A cache whose refs/v<N> is not a full commit id, or whose snapshot lacks build/, resolves nothing:
    a lock must name a commit the loader can find offline."""
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(hub_cache, cache, symlinks=True)
    repo_dir = lock.cache_repo_dir(cache, REPO_ID)
    ref = repo_dir / "refs" / BRANCH
    commit = ref.read_text().strip()
    if damage == "short_ref":
        ref.write_text(commit[:12])
    elif damage == "long_ref":  # its snapshot folder exists: only the ref's form gives it away
        ref.write_text(commit + "0")
        (repo_dir / "snapshots" / commit).rename(repo_dir / "snapshots" / (commit + "0"))
    elif damage == "non_hex_ref":
        ref.write_text("g" * 40)
    else:
        shutil.rmtree(repo_dir / "snapshots" / commit / "build")
    project = write_project(tmp_path / "consumer")
    assert lock.main([str(project), "--cache-dir", str(cache)]) == lock.EXIT_UNRESOLVED
    err = capsys.readouterr().err
    assert ("not a 40-hex commit" in err) if damage != "no_snapshot_build" else ("build is not in the cache" in err), err
    assert not (project / "kernels.lock").exists()


@pytest.mark.parametrize(
    "deps, message",
    [
        (f'"{REPO_ID}" = "1"', "major version number"),
        (f'"{REPO_ID}" = true', "major version number"),
        ('"fused-geglu" = 1', "not a Hub repository id"),
        ("", "no [tool.kernels.dependencies]"),
    ],
)
def test_bad_dependency_tables_are_usage_errors(tmp_path, capsys, deps, message):
    project = write_project(tmp_path / "consumer", deps)
    assert lock.main([str(project)]) == lock.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_online_resolution_reads_the_hub_branch(tmp_path):
    """Online, v<N> is the target commit of the Hub branch (list_repo_refs, repo_type kernel)."""
    calls = []

    class FakeApi:
        def list_repo_refs(self, repo_id, *, repo_type=None):
            calls.append((repo_id, repo_type))
            branch = lambda name, sha: SimpleNamespace(name=name, target_commit=sha)  # noqa: E731
            return SimpleNamespace(branches=[branch("main", "0" * 40), branch("v1", "1" * 40), branch("v2", "2" * 40)])

    project = write_project(tmp_path / "consumer", f'"{REPO_ID}" = 2\n"org/other-kernel" = 1')
    locks, text = lock.lock_project(project, offline=False, api=FakeApi())
    assert sorted(calls) == sorted([(REPO_ID, "kernel"), ("org/other-kernel", "kernel")])
    assert parse_lock(project / "kernels.lock") == {(REPO_ID, 2): "2" * 40, ("org/other-kernel", 1): "1" * 40}
    with pytest.raises(lock.LockError, match="no branch v3"):
        lock.resolve([lock.Dependency(REPO_ID, 3)], offline=False, api=FakeApi())


def test_an_unreachable_hub_is_unresolved_not_stale(tmp_path, capsys, monkeypatch):
    """Without a network the client's transport error (httpx2's ConnectError under huggingface_hub 2.x,
    not an OSError) is reported as "could not resolve" (exit 3), not a traceback and exit 1 ("stale")."""
    errors = [e for e in lock._network_errors() if e is not OSError]
    if not errors:
        pytest.skip("huggingface_hub's HTTP client (httpx / httpx2) is not installed")

    class NoNetworkApi:
        def list_repo_refs(self, repo_id, *, repo_type=None):
            raise errors[0]("[Errno -3] Temporary failure in name resolution")

    project = write_project(tmp_path / "consumer", f'"{REPO_ID}" = 1')
    with pytest.raises(lock.LockError, match=f"cannot reach the Hub for {REPO_ID}"):
        lock.resolve([lock.Dependency(REPO_ID, 1)], offline=False, api=NoNetworkApi())
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", NoNetworkApi)  # what the CLI's resolution constructs
    assert lock.main([str(project), "--online", "--check"]) == lock.EXIT_UNRESOLVED
    assert "cannot reach the Hub" in capsys.readouterr().err


def test_snapshot_id_names_paths_and_contents(tmp_path):
    """The staged snapshot id changes when a file is renamed (same bytes, other path) as well as
    when its bytes change, and the same tree stages to the same id again."""
    variant = tmp_path / "build" / "torch-cpu"
    variant.mkdir(parents=True)
    (variant / "metadata.json").write_text("{}")
    (variant / "a.py").write_text("x = 1\n")
    cache = tmp_path / "cache"
    first = stage_build(tmp_path / "build", cache, REPO_ID, BRANCH)
    (variant / "a.py").rename(variant / "b.py")
    renamed = stage_build(tmp_path / "build", cache, REPO_ID, BRANCH)
    assert renamed != first
    assert (lock.cache_repo_dir(cache, REPO_ID) / "snapshots" / renamed / "build" / "torch-cpu" / "b.py").is_file()
    (variant / "b.py").write_text("x = 2\n")
    assert stage_build(tmp_path / "build", cache, REPO_ID, BRANCH) not in (first, renamed)
    (variant / "b.py").rename(variant / "a.py")
    (variant / "a.py").write_text("x = 1\n")
    assert stage_build(tmp_path / "build", cache, REPO_ID, BRANCH) == first == staged_ref(cache)


def test_stage_can_hold_chosen_variants_only(tmp_path):
    """``stage --variants torch-cpu`` stages that folder alone (make test's second pass loads it so), and a
    name that was not built is an error naming it and what was built, not an empty or partial snapshot."""
    for name in ("torch-cpu", "torch213-cxx11-cpu-x86_64-linux"):
        (tmp_path / "build" / name).mkdir(parents=True)
        (tmp_path / "build" / name / "metadata.json").write_text("{}")
    cache = tmp_path / "cache"
    sha = stage_build(tmp_path / "build", cache, REPO_ID, BRANCH, variants=["torch-cpu"])
    staged = lock.cache_repo_dir(cache, REPO_ID) / "snapshots" / sha / "build"
    assert sorted(p.name for p in staged.iterdir()) == ["torch-cpu"]
    assert sha != stage_build(tmp_path / "build", cache, REPO_ID, BRANCH)  # all variants: another snapshot
    with pytest.raises(FileNotFoundError, match=r"torch-rocm \(built: torch-cpu, torch213-cxx11-cpu-x86_64-linux\)"):
        stage_build(tmp_path / "build", tmp_path / "other", REPO_ID, BRANCH, variants=["torch-cpu", "torch-rocm"])
    assert not (tmp_path / "other").exists()


# --- the lock pins a commit, through a rebuild ---------------------------------------------------

LOAD_SCRIPT = r"""
import inspect, json, sys
from pathlib import Path

import kernels
from torch import nn

repo_id, lockfile = sys.argv[1], Path(sys.argv[2])
found = {}
module = kernels.load_kernel(repo_id, lockfile=lockfile)
found["load_kernel"] = module.__file__
found["get_locked_kernel"] = kernels.get_locked_kernel(repo_id, lockfile=lockfile, trust_remote_code=True).__file__
found["marker"] = getattr(module, "_LOCK_TEST_MARKER", None)

# kernelize a host module with the first layer the kernel defines, through LockedLayerRepository.
layers = module.layers
name = next(n for n, c in vars(layers).items()
            if isinstance(c, type) and issubclass(c, nn.Module) and c.__module__ == layers.__name__)

class Host(nn.Module):
    def forward(self, *args, **kwargs):
        raise AssertionError("forward was not replaced")

Host.forward.__signature__ = inspect.signature(getattr(layers, name).forward)  # same arity as the layer
kernels.replace_kernel_forward_from_hub(Host, name)
repo = kernels.LockedLayerRepository(repo_id, lockfile=lockfile, layer_name=name, trust_remote_code=True)
model = nn.Sequential(Host())
with kernels.use_kernel_mapping({name: {"cpu": repo}}, inherit_mapping=False):
    kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu", use_fallback=False)
found["kernelize"] = inspect.getfile(model[0].forward)
print("RESULT " + json.dumps(found))
"""


def run_loader(cache: Path, lockfile: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELS_CACHE", "LOCAL_KERNELS")}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_TELEMETRY="1")
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, REPO_ID, str(lockfile)], env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def rebuild_with_change(build: Path, dst: Path) -> Path:
    """A second build 'with different content': every variant's __init__.py gains a marker."""
    shutil.copytree(build, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for variant in verify.find_variants(dst):
        init = variant / "__init__.py"
        init.write_text(init.read_text() + '\n_LOCK_TEST_MARKER = "second build"\n')
        meta = json.loads((variant / "metadata.json").read_text())
        meta["digest"] = {"algorithm": digest.ALGORITHM, "files": digest.hash_variant(variant)}
        (variant / "metadata.json").write_text(json.dumps(meta, indent=2))
    return dst


def test_lock_keeps_loading_the_locked_commit_after_a_new_build(build_dir, tmp_path):
    cache = tmp_path / "cache"
    first = stage_build(build_dir, cache, REPO_ID, BRANCH)
    project = write_project(tmp_path / "consumer")
    assert lock.main([str(project), "--offline", "--cache-dir", str(cache)]) == lock.EXIT_OK
    lockfile = project / "kernels.lock"
    assert parse_lock(lockfile) == {(REPO_ID, VERSION): first}

    second_build = rebuild_with_change(build_dir, tmp_path / "build2")
    assert all(r.intact for r in verify.verify_tree(second_build))
    second = stage_build(second_build, cache, REPO_ID, BRANCH)
    assert second != first and staged_ref(cache) == second  # the branch moved on ...

    found = run_loader(cache, lockfile)  # ... the lock did not
    snapshot = str(lock.cache_repo_dir(cache, REPO_ID) / "snapshots" / first) + os.sep
    for how in ("load_kernel", "get_locked_kernel", "kernelize"):
        assert found[how].startswith(snapshot), (how, found[how])
    assert found["marker"] is None

    # Re-locking picks up the new commit, and the old lock is reported stale.
    assert lock.main([str(project), "--offline", "--cache-dir", str(cache), "--check"]) == lock.EXIT_STALE
    assert lock.main([str(project), "--offline", "--cache-dir", str(cache)]) == lock.EXIT_OK
    assert run_loader(cache, lockfile)["marker"] == "second build"
