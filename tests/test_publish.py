"""`fused-geglu publish` and the card. No network: the dry run, and the real upload path against a
stand-in HfApi that records what would be sent."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO_CACHE_DIR, REPO_ID, VERSION
from fused_geglu_tools import abi, card, digest, public_api, publish, verify

BRANCH = f"v{VERSION}"  # the branch publish writes: build.toml's version
CLEAN = {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False}


def copy_build(build_dir: Path, dst: Path, *, dirty: bool = False) -> Path:
    shutil.copytree(build_dir, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for variant in verify.find_variants(dst):
        meta = json.loads((variant / "metadata.json").read_text())
        meta.setdefault("provenance", {})["kernel"] = {**CLEAN, "dirty": dirty}
        (variant / "metadata.json").write_text(json.dumps(meta, indent=2))
    return dst


def set_all(build: Path, names: list[str]) -> None:
    """Give every variant a different ``__all__`` (appended, so it wins) and re-hash it."""
    for variant in verify.find_variants(build):
        init = variant / "__init__.py"
        init.write_text(init.read_text() + f"\n__all__ = {names!r}\n")
        meta = json.loads((variant / "metadata.json").read_text())
        meta["digest"] = {"algorithm": digest.ALGORITHM, "files": digest.hash_variant(variant)}
        (variant / "metadata.json").write_text(json.dumps(meta, indent=2))


def files_of(tree: Path) -> dict[str, str]:
    return {
        p.relative_to(tree).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in tree.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.fixture
def clean_build(build_dir, tmp_path) -> Path:
    return copy_build(build_dir, tmp_path / "build")


@pytest.fixture
def api_names(clean_build) -> list[str]:
    return public_api.variant_api(verify.find_variants(clean_build)[0])


def dry_run(repo_root, build, out, *extra) -> int:
    return publish.main(["--repo-root", str(repo_root), "--build-dir", str(build), "--dry-run", str(out), *extra])


# --- dry run -------------------------------------------------------------------------------------


def test_dry_run_writes_the_exact_trees(repo_root, clean_build, tmp_path, capsys):
    out = tmp_path / "dry"
    assert dry_run(repo_root, clean_build, out) == publish.EXIT_OK
    printed = capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    assert plan["repo_type"] == "kernel" and plan["repo_id"] == REPO_ID
    assert [c["branch"] for c in plan["commits"]] == [BRANCH, "main"]

    # v<VERSION>: every variant, byte for byte, and it verifies as uploaded.
    for variant in verify.find_variants(clean_build):
        uploaded = out / BRANCH / "build" / variant.name
        assert files_of(uploaded) == files_of(variant)
        assert verify.verify_variant(uploaded).intact
        assert f"build/{variant.name}/metadata.json" in printed
    bench = repo_root / "benchmarks"
    for script in bench.glob("benchmark*.py"):
        assert (out / BRANCH / "benchmarks" / script.name).read_bytes() == script.read_bytes()
    assert not any(p.name == "__pycache__" for p in (out / BRANCH).rglob("*"))
    assert set(plan["files"][BRANCH]) == set(files_of(out / BRANCH))

    # main: only the card.
    assert set(files_of(out / "main")) == {"README.md"}
    assert "nothing uploaded" in printed


def test_card_lists_the_api_layers_and_version(repo_root, clean_build, tmp_path, api_names):
    assert dry_run(repo_root, clean_build, tmp_path / "dry") == publish.EXIT_OK
    readme = (tmp_path / "dry" / "main" / "README.md").read_text()
    assert "layers" in api_names
    modules = public_api.exported_modules(verify.find_variants(clean_build)[0])
    assert modules == {"layers", "reference"}, modules
    for name in api_names:
        if name not in modules:  # the functions; the exported submodules are not listed as functions
            assert f"- `{name}`" in readme
    layers = public_api.read_layers(verify.find_variants(clean_build)[0])
    assert layers, "the kernel should define at least one layer"
    for layer in layers:
        assert f"- `{layer}`" in readme
    assert f'get_kernel("{REPO_ID}", version={VERSION}' in readme and f"`{BRANCH}`" in readme
    for variant in verify.find_variants(clean_build):
        assert f"`{variant.name}`" in readme
    assert "{{" not in readme and "{%" not in readme
    assert "## Benchmarks" in readme


def test_dry_run_refuses_a_dirty_build_unless_allowed(repo_root, build_dir, tmp_path, capsys):
    dirty = copy_build(build_dir, tmp_path / "build", dirty=True)
    assert dry_run(repo_root, dirty, tmp_path / "dry") == publish.EXIT_REFUSED
    assert "dirty working tree" in capsys.readouterr().err
    assert not (tmp_path / "dry").exists()
    assert dry_run(repo_root, dirty, tmp_path / "dry", "--allow-dirty") == publish.EXIT_OK
    assert "--allow-dirty" in capsys.readouterr().out


def test_refuses_a_tampered_build_even_when_forced(repo_root, clean_build, tmp_path, capsys):
    (verify.find_variants(clean_build)[0] / "injected.py").write_text("")
    assert dry_run(repo_root, clean_build, tmp_path / "dry", "--allow-dirty") == publish.EXIT_REFUSED
    assert "unknown file: injected.py" in capsys.readouterr().err


def test_refuses_a_library_that_breaks_the_portability_policy_even_when_forced(
        repo_root, clean_build, tmp_path, monkeypatch, capsys):
    compiled = [v for v in verify.find_variants(clean_build) if abi.libraries(v)]
    if not compiled:
        pytest.skip("no compiled variant was built on this machine")
    monkeypatch.setattr(abi, "library_violations", lambda path: ["__libc_single_threaded needs GLIBC 2.32"])
    assert dry_run(repo_root, clean_build, tmp_path / "dry", "--allow-dirty") == publish.EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"{compiled[0].name}: a compiled library would not load everywhere" in err
    assert "__libc_single_threaded needs GLIBC 2.32" in err
    assert not (tmp_path / "dry").exists()


def test_refuses_a_build_without_recorded_git_state_unless_allowed(repo_root, clean_build, tmp_path, capsys):
    """No kernel commit recorded is not a clean build either: refused like a dirty one."""
    for variant in verify.find_variants(clean_build):
        meta = json.loads((variant / "metadata.json").read_text())
        del meta["provenance"]["kernel"]
        (variant / "metadata.json").write_text(json.dumps(meta, indent=2))
    assert dry_run(repo_root, clean_build, tmp_path / "dry") == publish.EXIT_REFUSED
    assert "an unrecorded git state (kernel commit unknown)" in capsys.readouterr().err
    assert dry_run(repo_root, clean_build, tmp_path / "dry", "--allow-dirty") == publish.EXIT_OK


def test_refuses_a_build_of_another_version(repo_root, clean_build, tmp_path, capsys):
    """Every variant must carry build.toml's version: a stale build would go up to the wrong branch."""
    version = publish.read_general(repo_root)["version"]
    for variant in verify.find_variants(clean_build):  # metadata.json is outside the digest
        meta = json.loads((variant / "metadata.json").read_text())
        meta["version"] = version + 1
        (variant / "metadata.json").write_text(json.dumps(meta, indent=2))
    assert all(r.intact for r in verify.verify_tree(clean_build))
    assert dry_run(repo_root, clean_build, tmp_path / "dry") == publish.EXIT_REFUSED
    assert f"version {version + 1}, but build.toml says fused-geglu version {version}" in capsys.readouterr().err
    assert not (tmp_path / "dry").exists()


def test_dry_run_uploads_no_bytecode(repo_root, clean_build, tmp_path):
    variant = verify.find_variants(clean_build)[0]
    (variant / "stray.pyc").write_bytes(b"\0")
    (variant / "triton_kernels" / "__pycache__").mkdir()
    (variant / "triton_kernels" / "__pycache__" / "geglu.cpython-311.pyc").write_bytes(b"\0")
    assert dry_run(repo_root, clean_build, tmp_path / "dry") == publish.EXIT_OK
    uploaded = [p.relative_to(tmp_path / "dry").as_posix() for p in (tmp_path / "dry").rglob("*")]
    assert not [p for p in uploaded if p.endswith(".pyc") or "__pycache__" in p], uploaded


def test_dry_run_replaces_only_an_earlier_dry_run(repo_root, clean_build, tmp_path, capsys):
    out = tmp_path / "dry"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert dry_run(repo_root, clean_build, out) == publish.EXIT_USAGE
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    (out / "notes.txt").unlink()
    assert dry_run(repo_root, clean_build, out) == publish.EXIT_OK
    (out / BRANCH / "leftover.txt").write_text("from the first run")
    assert dry_run(repo_root, clean_build, out) == publish.EXIT_OK  # an earlier dry run: replaced
    assert not (out / BRANCH / "leftover.txt").exists() and (out / "plan.json").is_file()


def test_refuses_to_shrink_the_api_of_an_existing_branch(repo_root, clean_build, hub_cache, tmp_path, capsys, api_names):
    repo = Path(hub_cache) / REPO_CACHE_DIR
    current = repo / "snapshots" / (repo / "refs" / BRANCH).read_text().strip()
    dropped = next(n for n in api_names if n != "layers")
    set_all(clean_build, [n for n in api_names if n != dropped])
    assert dry_run(repo_root, clean_build, tmp_path / "dry", "--compare-to", str(current)) == publish.EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"would remove {dropped} from __all__" in err and f"bump `version` in build.toml to {VERSION + 1}" in err
    assert not (tmp_path / "dry").exists()


def test_refuses_api_additions_and_dropped_variants(repo_root, clean_build, tmp_path, capsys, api_names):
    current = tmp_path / "current"
    shutil.copytree(clean_build, current / "build")
    variants = verify.find_variants(current)
    # A variant the branch has and this build lacks: one of a torch this machine does not run (a fixed
    # name collided on a torch 2.12 machine, whose build has it).
    dropped = next(n for n in (f"torch2{m}-cxx11-cpu-x86_64-linux" for m in range(9, 99))
                   if n not in {v.name for v in variants})
    shutil.copytree(variants[0], current / "build" / dropped)
    set_all(clean_build, api_names + ["brand_new_op"])
    assert dry_run(repo_root, clean_build, tmp_path / "dry", "--compare-to", str(current)) == publish.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "would add brand_new_op" in err
    assert f"variant(s) this build lacks: {dropped}" in err


def test_same_api_on_existing_branch_is_accepted(repo_root, clean_build, tmp_path, capsys):
    assert dry_run(repo_root, clean_build, tmp_path / "dry", "--compare-to", str(clean_build)) == publish.EXIT_OK
    assert "API kept" in capsys.readouterr().out


# --- the real upload path, against a stand-in HfApi ----------------------------------------------


class FakeHub:
    """Records the HfApi calls publish makes; serves the current branch from a local tree."""

    def __init__(self, branch_tree: Path | None, *, repo_exists: bool = True):
        self.branch_tree, self.repo_exists = branch_tree, repo_exists
        self.calls: list[tuple[str, dict]] = []
        self.uploads: dict[str, dict[str, str]] = {}

    def list_repo_refs(self, repo_id, *, repo_type=None):
        from huggingface_hub.errors import RepositoryNotFoundError

        self.calls.append(("list_repo_refs", {"repo_id": repo_id, "repo_type": repo_type}))
        if not self.repo_exists:
            raise RepositoryNotFoundError("no such repo", response=SimpleNamespace(headers={}, status_code=404, request=None))
        names = ["main"] + ([BRANCH] if self.branch_tree else [])
        return SimpleNamespace(branches=[SimpleNamespace(name=n, target_commit="a" * 40) for n in names])

    def list_repo_files(self, repo_id, *, revision=None, repo_type=None):
        self.calls.append(("list_repo_files", {"revision": revision, "repo_type": repo_type}))
        return sorted(files_of(self.branch_tree))

    def hf_hub_download(self, repo_id, *, filename, revision=None, repo_type=None):
        self.calls.append(("hf_hub_download", {"filename": filename, "revision": revision, "repo_type": repo_type}))
        return str(self.branch_tree / filename)

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kw}))

    def create_branch(self, repo_id, **kw):
        self.calls.append(("create_branch", {"repo_id": repo_id, **kw}))

    def upload_folder(self, **kw):
        self.calls.append(("upload_folder", {k: v for k, v in kw.items() if k != "folder_path"}))
        self.uploads[kw["revision"]] = files_of(Path(kw["folder_path"]))
        return SimpleNamespace(commit_url=f"https://hub.invalid/{kw['revision']}")

    def names(self):
        return [c[0] for c in self.calls]


@pytest.fixture
def hub_online(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_publish_uploads_the_dry_run_trees(repo_root, clean_build, tmp_path, hub_online, capsys):
    assert dry_run(repo_root, clean_build, tmp_path / "dry") == publish.EXIT_OK
    current = tmp_path / "current"
    shutil.copytree(clean_build, current / "build")
    hub = FakeHub(current)
    argv = ["--repo-root", str(repo_root), "--build-dir", str(clean_build)]
    assert publish.main(argv, api=hub) == publish.EXIT_OK
    assert "create_branch" not in hub.names()  # the version branch exists already
    uploads = [kw for name, kw in hub.calls if name == "upload_folder"]
    assert [u["revision"] for u in uploads] == [BRANCH, "main"]
    assert all(u["repo_type"] == "kernel" and u["repo_id"] == REPO_ID for u in uploads)
    assert uploads[0]["delete_patterns"] == ["build/**", "benchmarks/**"]
    assert hub.uploads[BRANCH] == files_of(tmp_path / "dry" / BRANCH)
    assert hub.uploads["main"] == files_of(tmp_path / "dry" / "main")
    create = next(kw for name, kw in hub.calls if name == "create_repo")
    assert create["repo_type"] == "kernel" and create["exist_ok"] is True


def test_publish_creates_repo_and_branch_when_missing(repo_root, clean_build, hub_online):
    hub = FakeHub(None, repo_exists=False)
    assert publish.main(["--repo-root", str(repo_root), "--build-dir", str(clean_build)], api=hub) == publish.EXIT_OK
    assert hub.names()[-4:] == ["create_repo", "create_branch", "upload_folder", "upload_folder"]
    branch = next(kw for name, kw in hub.calls if name == "create_branch")
    assert branch["branch"] == BRANCH and branch["repo_type"] == "kernel"


def test_publish_uploads_nothing_when_the_api_would_shrink(repo_root, clean_build, tmp_path, hub_online, api_names):
    current = tmp_path / "current"
    shutil.copytree(clean_build, current / "build")
    set_all(clean_build, [n for n in api_names if n == "layers"])
    hub = FakeHub(current)
    assert publish.main(["--repo-root", str(repo_root), "--build-dir", str(clean_build)], api=hub) == publish.EXIT_REFUSED
    assert not {"create_repo", "create_branch", "upload_folder"} & set(hub.names())


def test_publish_needs_the_network(repo_root, clean_build, capsys):
    # conftest runs everything with HF_HUB_OFFLINE=1
    assert publish.main(["--repo-root", str(repo_root), "--build-dir", str(clean_build)]) == publish.EXIT_HUB
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err


# --- card pieces ---------------------------------------------------------------------------------


def test_read_all_is_static_and_strict(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("import torch\n__all__ = ['a', 'layers']\n__all__ += ('b',)\n")
    assert public_api.read_all(init) == ["a", "layers", "b"]
    init.write_text("__all__ = [n for n in dir()]\n")
    with pytest.raises(public_api.ApiError, match="literal list"):
        public_api.read_all(init)
    init.write_text("x = 1\n")
    with pytest.raises(public_api.ApiError, match="no __all__"):
        public_api.read_all(init)


def test_read_layers_finds_module_subclasses(tmp_path):
    (tmp_path / "layers.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class GeGLUMLP(nn.Module):\n    def forward(self, x): ...\n"
        "class GeGLUMLPTanh(GeGLUMLP):\n    pass\n"
        "class _Private(nn.Module):\n    pass\n"
        "class Config:\n    pass\n"
        "class Linear(torch.nn.Module):\n    pass\n"
    )
    assert public_api.read_layers(tmp_path) == ["GeGLUMLP", "GeGLUMLPTanh", "Linear"]



def test_symbols_read_layer_flags_and_signatures_without_importing(tmp_path):
    (tmp_path / "__init__.py").write_text(
        "from . import layers\nfrom .ops import act\nfrom .ops import helper as aid\n"
        "__all__ = ['act', 'aid', 'layers']\n")
    (tmp_path / "ops.py").write_text(
        "import torch\n"
        "def act(x: torch.Tensor, approximate: str = 'none') -> torch.Tensor:\n"
        "    \"\"\"First line\n    continues here.\n\n    Details.\"\"\"\n"
        "def helper(x):\n    return x\n")
    (tmp_path / "layers.py").write_text(
        "from torch import nn\n"
        "class Base(nn.Module):\n    \"\"\"A layer.\"\"\"\n    has_backward = True\n    can_torch_compile: bool = False\n"
        "class Child(Base):\n    can_torch_compile = True\n"
        "class Bare(nn.Module):\n    pass\n")
    got = public_api.symbols(tmp_path)
    assert got["schema_version"] == 1
    assert got["functions"] == [
        {"name": "act", "signature": "(x: torch.Tensor, approximate: str='none') -> torch.Tensor",
         "doc": "First line continues here."},
        {"name": "aid", "signature": "(x)", "doc": None}]
    assert got["layers"] == [
        {"name": "Base", "attributes": {"has_backward": True, "can_torch_compile": False}, "doc": "A layer."},
        {"name": "Child", "attributes": {"has_backward": True, "can_torch_compile": True}, "doc": None},
        {"name": "Bare", "attributes": {"has_backward": None, "can_torch_compile": None}, "doc": None}]
    (tmp_path / "layers.py").write_text("from torch import nn\nclass L(nn.Module):\n    has_backward = 1 == 1\n")
    with pytest.raises(public_api.ApiError, match="L.has_backward must be a literal"):
        public_api.symbols(tmp_path)

def _repo_copy(repo_root: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("build.toml", "CARD.md"):
        shutil.copy(repo_root / name, dst / name)
    (dst / "benchmarks" / "results").mkdir(parents=True)
    return dst


def test_card_benchmark_table_is_tolerant(repo_root, clean_build, tmp_path):
    root = _repo_copy(repo_root, tmp_path / "repo")
    results = root / "benchmarks" / "results"
    (results / "old.json").write_text(json.dumps([{"shape": "old", "ms": 9.0}]))
    newest = results / "h200.json"
    newest.write_text(json.dumps({"gpu": "H200", "rows": [
        {"shape": "4096x2048x8192", "provider": "fused", "ms": 0.12345, "extra": {"nested": 1}},
        {"shape": "4096x2048x8192", "provider": "eager", "ms": 0.5},
    ]}))
    os.utime(results / "old.json", (1, 1))
    text = card.render_repo_card(root, clean_build)
    assert "| shape | provider | ms |" in text and "| 4096x2048x8192 | fused | 0.1235 |" in text
    assert "gpu: H200" in text and "old" not in text.split("## Benchmarks")[1].split("##")[0]

    newest.write_text(json.dumps({"something": "else"}))  # unknown shape: no table, no crash
    assert "No benchmark results are published" in card.render_repo_card(root, clean_build)
    newest.write_text("{not json")
    assert "No benchmark results are published" in card.render_repo_card(root, clean_build)


def _harness_run(created: str, tokens: tuple[int, ...], eager_us: float) -> dict:
    rows = [{"op": "geglu_mlp", "shape": "gemma-2b", "M": m, "mode": "fwd", "provider": p, "status": "ok",
             "median_us": eager_us if p == "eager" else eager_us / 2} for m in tokens
            for p in ("eager", "compile", "liger", "ours-auto", "ours-triton")]
    return {"schema": "fused-geglu-bench/1", "created": created, "complete": True, "quick": False,
            "env": {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "commit": "abcdef0123"}, "rows": rows}


def test_card_shows_the_newest_full_harness_run(repo_root, clean_build, tmp_path):
    """The card's table is the newest full geglu_mlp harness run by the run's own ``created`` time
    (files in a fresh clone share one mtime, and the alphabetically last file was shown once: a host
    timing diff), one row per case with eager / compile / Liger / ours; a decode-only run, a quick
    run and other JSON files are not it. Functions exclude the exported submodules only."""
    root = _repo_copy(repo_root, tmp_path / "repo")
    results = root / "benchmarks" / "results"
    (results / "a-full.json").write_text(json.dumps(_harness_run("2026-12-04T10:00:00+00:00", (16, 8192), 100.0)))
    (results / "b-full-older.json").write_text(json.dumps(_harness_run("2026-12-03T10:00:00+00:00", (16, 8192), 7.0)))
    (results / "c-decode.json").write_text(json.dumps(_harness_run("2026-12-05T10:00:00+00:00", (16,), 5.0)))
    (results / "z-other.json").write_text(json.dumps([{"shape": "x", "ms": 1.0}]))
    for f in results.iterdir():
        os.utime(f, (1, 1))
    text = card.render_repo_card(root, clean_build).split("## Benchmarks")[1]
    assert "`benchmarks/results/a-full.json`" in text and "commit: abcdef0" in text, text
    assert "| op | shape | tokens | mode | eager µs | compile µs | liger µs | ours-auto µs | eager / ours |" in text
    assert "| geglu_mlp | gemma-2b | 8192 | fwd | 100 | 50 | 50 | 50 | 2.00x |" in text
    functions = card.render_repo_card(root, clean_build).split("## Functions")[1].split("##")[0]
    for name in ("geglu", "linear", "geglu_mlp", "gelu_and_mul"):
        assert f"- `{name}`" in functions
    assert "`reference`" not in functions and "`layers`" not in functions


def test_card_refuses_variants_with_different_apis(repo_root, clean_build):
    variants = verify.find_variants(clean_build)
    if len(variants) < 2:
        pytest.skip("needs two variants")
    init = variants[1] / "__init__.py"
    init.write_text(init.read_text() + "\n__all__ = ['layers']\n")
    with pytest.raises(card.CardError, match="disagree on __all__"):
        card.card_context(repo_root, clean_build)
