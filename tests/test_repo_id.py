"""The Hub repository id is written once, in ``build.toml`` (``[general.hub] repo-id``): a fork that
changes it there gets it from every tool's default (stage, demo, publish, the card, the transformers
helpers), and ``--repo-id`` / ``repo_id=`` still override it. Each test uses a copy of the project
whose ``build.toml`` names another repository, so a tool that falls back to a literal fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ID, VERSION
from test_publish import copy_build

FORK = "someone-else/geglu-fork"
FORK_DIR = "kernels--someone-else--geglu-fork"
BRANCH = f"v{VERSION}"  # these forks keep this checkout's version


def _fork(repo_root: Path, dst: Path, hub_table: str | None = f'[general.hub]\nrepo-id = "{FORK}"\n') -> Path:
    """A project root like ``repo_root`` whose ``build.toml`` has ``hub_table`` as its hub table."""
    text = (repo_root / "build.toml").read_text()
    original = f'[general.hub]\nrepo-id = "{REPO_ID}"\n'
    assert original in text, "build.toml's [general.hub] table changed shape: update this test"
    dst.mkdir()
    (dst / "build.toml").write_text(text.replace(original, hub_table or ""))
    (dst / "CARD.md").write_text((repo_root / "CARD.md").read_text())
    for name in ("torch-ext", "kernel_src"):  # load_build_config checks the sources exist
        (dst / name).symlink_to(repo_root / name)
    (dst / "benchmarks" / "results").mkdir(parents=True)
    return dst


@pytest.fixture
def fork(repo_root, tmp_path, monkeypatch) -> Path:
    root = _fork(repo_root, tmp_path / "fork")
    monkeypatch.setenv("FUSED_GEGLU_ROOT", str(root))  # what `fused-geglu ...` run in the fork finds
    return root


def test_hub_repo_id_reads_build_toml(repo_root, fork, tmp_path):
    from fused_geglu_tools.buildconfig import BuildConfigError, hub_repo_id, load_build_config

    assert hub_repo_id(repo_root) == REPO_ID  # this checkout's own (org/fused-geglu as published)
    assert hub_repo_id(fork) == FORK and hub_repo_id() == FORK  # root defaults to FUSED_GEGLU_ROOT
    assert load_build_config(fork).repo_id == FORK
    bare = _fork(repo_root, tmp_path / "bare", hub_table=None)
    assert load_build_config(bare).repo_id is None  # building needs no repo id ...
    with pytest.raises(BuildConfigError, match=r"set \[general.hub\] repo-id"):
        hub_repo_id(bare)  # ... but the tools that name one refuse to guess
    bad = _fork(repo_root, tmp_path / "bad", hub_table='[general.hub]\nrepo-id = "no-org"\n')
    with pytest.raises(BuildConfigError, match="not a Hub repository id"):
        hub_repo_id(bad)


def test_stage_defaults_to_build_toml(fork, build_dir, tmp_path, capsys):
    from fused_geglu_tools import cli
    from fused_geglu_tools.stage import stage_build

    cache = tmp_path / "cache"
    assert cli.main(["stage", "--build", str(build_dir), "--cache", str(cache)]) == 0
    assert f"staged {FORK}@{BRANCH} = " in capsys.readouterr().out
    assert sorted(p.name for p in cache.iterdir()) == [FORK_DIR]
    sha = (cache / FORK_DIR / "refs" / BRANCH).read_text()
    assert stage_build(build_dir, tmp_path / "cache2") == sha  # the function's default too
    assert sorted(p.name for p in (tmp_path / "cache2").iterdir()) == [FORK_DIR]
    assert cli.main(["stage", "--build", str(build_dir), "--cache", str(cache), "--repo-id", "other/x"]) == 0
    assert (cache / "kernels--other--x" / "refs" / BRANCH).read_text() == sha


def test_transformers_helpers_default_to_build_toml(repo_root, tmp_path, monkeypatch):
    import fused_geglu_tools.transformers as fgt
    from fused_geglu_tools.hf import config, repos

    monkeypatch.setattr(repos, "CHECKOUT", _fork(repo_root, tmp_path / "fork"))
    assert fgt.REPO_ID == repos.REPO_ID == FORK
    mapping = repos.kernel_mapping(source="hub", linear_bias=True)
    ids = {repo._repo_id for devices in mapping.values() for modes in devices.values() for repo in modes.values()}
    assert ids == {FORK}
    assert repos.describe_source("hub") == f"{FORK}@{BRANCH}"
    assert repos.describe_source("hub", repo_id="other/x") == f"other/x@{BRANCH}"
    assert repos.layer_repository("FusedGeGLUMLP", repo_id="other/x")._repo_id == "other/x"
    if config.kernel_config_support() is None:
        assert config.kernel_config().kernel_mapping["FusedGeGLUMLP"][0] == f"{FORK}:GeGLUMLP"


def test_publish_and_card_default_to_build_toml(fork, build_dir, tmp_path, capsys):
    from fused_geglu_tools import card, publish

    build = copy_build(build_dir, tmp_path / "build")
    out = tmp_path / "dry"
    assert publish.main(["--repo-root", str(fork), "--build-dir", str(build), "--dry-run", str(out)]) == 0
    assert json.loads((out / "plan.json").read_text())["repo_id"] == FORK
    readme = (out / "main" / "README.md").read_text()
    assert f'get_kernel("{FORK}", version={VERSION}' in readme and REPO_ID not in readme
    capsys.readouterr()
    assert card.main(["--build-dir", str(build)]) == 0  # --repo-root from FUSED_GEGLU_ROOT
    assert f'get_kernel("{FORK}", version={VERSION}' in capsys.readouterr().out
    assert card.main(["--build-dir", str(build), "--repo-id", "other/x"]) == 0
    assert f'get_kernel("other/x", version={VERSION}' in capsys.readouterr().out


def test_demo_defaults_to_build_toml(fork, build_dir, repo_root, tmp_path):
    """`make demo` in a fork: stage and demo (kernelize included) name the fork's repository."""
    from fused_geglu_tools.stage import stage_build

    cache = tmp_path / "cache"
    stage_build(build_dir, cache, FORK, BRANCH)  # only the fork's id is in this cache
    path = os.pathsep.join([str(repo_root / "src"), *sys.path[1:]])
    env = {**os.environ, "PYTHONPATH": path, "FUSED_GEGLU_ROOT": str(fork)}
    proc = subprocess.run([sys.executable, "-m", "fused_geglu_tools", "demo", "--cache", str(cache)], cwd=fork,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"loaded {FORK}@{BRANCH} through kernels.get_kernel" in proc.stdout
    if "transformers not installed" not in proc.stdout:
        assert f"GeGLUMLP from {FORK}@{BRANCH}" in proc.stdout, proc.stdout
