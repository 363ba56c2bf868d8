"""The kernel's major version is written once, in ``build.toml`` (``[general] version``), beside the
repository id (test_repo_id.py): a fork that sets ``version = 2`` there stages ``refs/v2``, and its
transformers helpers, its demo and its test suite load ``v2`` through ``kernels``. Each test uses a copy
of the project whose ``build.toml`` names another version (and repository), and a cache holding only
that version's branch, so a tool that falls back to a literal ``1`` fails here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import VERSION
from test_repo_id import FORK, FORK_DIR, _fork

OTHER = VERSION + 1  # the fork's version: 2 here


def _fork_version(repo_root: Path, dst: Path, version_line: str | None = f"version = {OTHER}") -> Path:
    """A fork (``test_repo_id._fork``: repository ``FORK``) whose ``[general]`` has ``version_line``
    in place of this checkout's version (``None``: no version at all)."""
    root = _fork(repo_root, dst)
    toml = root / "build.toml"
    text = toml.read_text()
    original = f"\nversion = {VERSION}\n"
    assert text.count(original) == 1, "build.toml's [general] version changed shape: update this test"
    toml.write_text(text.replace(original, "\n" + (f"{version_line}\n" if version_line is not None else "")))
    return root


def _env(repo_root: Path, **extra: str) -> dict[str, str]:
    # The child must see the same packages as this process, and this checkout's tools.
    path = os.pathsep.join([str(repo_root / "src"), *sys.path[1:]])
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELS_CACHE", "LOCAL_KERNELS")}
    return {**env, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", **extra}


@pytest.fixture
def fork(repo_root, tmp_path, monkeypatch) -> Path:
    root = _fork_version(repo_root, tmp_path / "fork")
    monkeypatch.setenv("FUSED_GEGLU_ROOT", str(root))  # what `fused-geglu ...` run in the fork finds
    return root


@pytest.fixture
def fork_cache(build_dir, tmp_path) -> Path:
    """A Hub cache that holds the fork's repository at ``v<OTHER>`` only (no ``v<VERSION>``)."""
    from fused_geglu_tools.stage import stage_build

    cache = tmp_path / "cache"
    stage_build(build_dir, cache, FORK, f"v{OTHER}")
    return cache


# --- hub_version ---------------------------------------------------------------------------------


def test_hub_version_reads_build_toml(repo_root, fork):
    from fused_geglu_tools.buildconfig import hub_version, load_build_config

    assert hub_version(repo_root) == VERSION == load_build_config(repo_root).version
    assert hub_version(fork) == OTHER == load_build_config(fork).version
    assert hub_version() == OTHER  # root defaults to FUSED_GEGLU_ROOT


@pytest.mark.parametrize(
    "line, error",
    [
        (None, r"no \[general\] version"),
        ("version = 0", r"\[general\] version = 0 is not a major version"),
        ("version = -1", r"\[general\] version = -1 is not a major version"),
        ('version = "2"', r"\[general\] version = '2' is not a major version"),
        ("version = 1.5", r"\[general\] version = 1\.5 is not a major version"),
        ("version = true", r"\[general\] version = True is not a major version"),
    ],
)
def test_hub_version_refuses_a_missing_or_bad_version(repo_root, tmp_path, monkeypatch, line, error):
    from fused_geglu_tools import buildconfig

    root = _fork_version(repo_root, tmp_path / "bad", line)
    with pytest.raises(buildconfig.BuildConfigError, match=error) as exc:
        buildconfig.hub_version(root)
    assert str(root / "build.toml") in str(exc.value)  # names the file
    # load_build_config refuses it too: kernels' parser first (in its own words) where it objects ...
    with pytest.raises(buildconfig.BuildConfigError, match="build.toml"):
        buildconfig.load_build_config(root)
    # ... and with the same check as hub_version where it does not (version = 0) or is not installed.
    monkeypatch.setattr(buildconfig, "_validate_with_kernels_parser", lambda root: None)
    with pytest.raises(buildconfig.BuildConfigError, match=error):
        buildconfig.load_build_config(root)


def test_hub_version_without_build_toml(tmp_path):
    from fused_geglu_tools.buildconfig import BuildConfigError, hub_version

    with pytest.raises(BuildConfigError, match=r"build\.toml: cannot read \[general\]"):
        hub_version(tmp_path)


# --- the tools in a fork with version = OTHER ----------------------------------------------------


def test_stage_defaults_to_build_toml_version(fork, build_dir, tmp_path, capsys):
    from fused_geglu_tools import cli
    from fused_geglu_tools.stage import stage_build

    cache = tmp_path / "cache"
    assert cli.main(["stage", "--build", str(build_dir), "--cache", str(cache)]) == 0
    assert f"staged {FORK}@v{OTHER} = " in capsys.readouterr().out
    refs = cache / FORK_DIR / "refs"
    assert sorted(p.name for p in refs.iterdir()) == [f"v{OTHER}"]
    sha = (refs / f"v{OTHER}").read_text()
    assert stage_build(build_dir, tmp_path / "cache2") == sha  # the function's default too
    assert sorted(p.name for p in (tmp_path / "cache2" / FORK_DIR / "refs").iterdir()) == [f"v{OTHER}"]
    assert cli.main(["stage", "--build", str(build_dir), "--cache", str(cache), "--ref", "v9"]) == 0  # overrides
    assert (refs / "v9").read_text() == sha


def test_transformers_helpers_ask_for_build_toml_version(repo_root, tmp_path, monkeypatch):
    import fused_geglu_tools.transformers as fgt
    from fused_geglu_tools.buildconfig import BuildConfigError
    from fused_geglu_tools.hf import config, repos

    monkeypatch.setattr(repos, "CHECKOUT", _fork_version(repo_root, tmp_path / "fork"))
    assert fgt.VERSION == repos.VERSION == OTHER
    mapping = repos.kernel_mapping(source="hub", linear_bias=True)
    hub_repos = [repo for devices in mapping.values() for modes in devices.values() for repo in modes.values()]
    assert {(repo._repo_id, repo._version, repo._revision) for repo in hub_repos} == {(FORK, OTHER, None)}
    assert repos.describe_source("hub") == f"{FORK}@v{OTHER}"
    # version= and revision= still override it.
    assert repos.layer_repository(fgt.GEGLU_MLP, version=7)._version == 7
    assert repos.describe_source("hub", version=7) == f"{FORK}@v7"
    pinned = repos.layer_repository(fgt.GEGLU_MLP, revision="main")
    assert (pinned._version, pinned._revision) == (None, "main")
    assert repos.describe_source("hub", revision="main") == f"{FORK}@main"
    if config.kernel_config_support() is None:
        assert config.kernel_config().kernel_mapping["FusedGeGLUMLP"] == (
            f"{FORK}:GeGLUMLP", {"version": OTHER, "trust_remote_code": True})
        assert config.kernel_config(revision="main").kernel_mapping["FusedGeGLUMLP"][1]["revision"] == "main"
    # Read when asked for: a build.toml without a version breaks only what needs one.
    monkeypatch.setattr(repos, "CHECKOUT", _fork_version(repo_root, tmp_path / "bare", None))
    with pytest.raises(BuildConfigError, match=r"no \[general\] version"):
        fgt.VERSION
    assert repos.layer_repository(fgt.GEGLU_MLP, version=OTHER)._version == OTHER


KERNELIZE_SCRIPT = r"""
import sys
from pathlib import Path

from kernels import Mode
from transformers import GemmaConfig, GemmaForCausalLM

from fused_geglu_tools.hf import repos

repos.CHECKOUT = Path(sys.argv[1])  # the fork's build.toml, as if this were the fork's checkout
import fused_geglu_tools.transformers as fgt

print("VERSION", fgt.VERSION)
print("layer", fgt.layer_repository(fgt.GEGLU_MLP).load().__qualname__)
cfg = GemmaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
model = GemmaForCausalLM(cfg).eval()
print("report", fgt.kernelize(model, mode=Mode.INFERENCE, device="cpu", source="hub"))
"""


def test_kernelize_loads_build_toml_version(repo_root, tmp_path, fork_cache):
    """kernels resolves ``v<OTHER>`` from a cache that holds nothing else, through the helpers' defaults."""
    pytest.importorskip("transformers")
    fork = _fork_version(repo_root, tmp_path / "fork")
    proc = subprocess.run([sys.executable, "-c", KERNELIZE_SCRIPT, str(fork)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=_env(repo_root, HF_HUB_CACHE=str(fork_cache)))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert f"VERSION {OTHER}\n" in proc.stdout and "layer GeGLUMLP\n" in proc.stdout
    assert f"GeGLUMLP from {FORK}@v{OTHER}" in proc.stdout, proc.stdout


def test_demo_loads_build_toml_version(fork, fork_cache, repo_root):
    """`make demo` in the fork: get_kernel and the kernelize step both load ``v<OTHER>``."""
    proc = subprocess.run([sys.executable, "-m", "fused_geglu_tools", "demo", "--cache", str(fork_cache)], cwd=fork,
                          env=_env(repo_root, FUSED_GEGLU_ROOT=str(fork)), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert f"loaded {FORK}@v{OTHER} through kernels.get_kernel" in proc.stdout
    if "transformers not installed" not in proc.stdout:
        assert f"GeGLUMLP from {FORK}@v{OTHER}" in proc.stdout, proc.stdout


def test_fork_test_suite_loads_build_toml_version(repo_root, tmp_path, fork_cache):
    """The fork's own tests (conftest's ``kernel`` and ``hub_cache``, test_loading.py's loading tests,
    test_verify.py's staged snapshot) find ``v<OTHER>``."""
    fork = _fork_version(repo_root, tmp_path / "fork")
    shutil.copytree(repo_root / "tests", fork / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(repo_root / "pyproject.toml", fork)  # pytest's settings
    (fork / "build").symlink_to(repo_root / "build")
    tests = ["test_get_kernel_from_staged_cache", "test_has_and_install_kernel_offline",
             "test_missing_version_is_reported", "test_staged_snapshot_verifies"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "tests/test_loading.py", "tests/test_verify.py", "-k", " or ".join(tests)],
        cwd=fork, capture_output=True, text=True, timeout=600,
        env=_env(repo_root, FUSED_GEGLU_TEST_CACHE=str(fork_cache)),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(tests)} passed" in proc.stdout, proc.stdout[-2000:]
