"""The kernel's major version is written once, in ``build.toml`` (``[general] version``), beside the
repository id (test_repo_id.py): a fork that sets ``version = 2`` there stages ``refs/v2``, and its
transformers helpers, its demo and its test suite load ``v2`` through ``kernels``. Each test uses a copy
of the project whose ``build.toml`` names another version (and repository), and a cache holding only
that version's branch, so a tool that falls back to a literal ``1`` fails here."""

from __future__ import annotations

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


@pytest.fixture
def fork(repo_root, tmp_path, monkeypatch) -> Path:
    root = _fork_version(repo_root, tmp_path / "fork")
    monkeypatch.setenv("FUSED_GEGLU_ROOT", str(root))  # what `fused-geglu ...` run in the fork finds
    return root


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
