"""The staged build loads through every offline path users have."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import kernels
import pytest
import torch

from conftest import REPO_ID, VERSION


def test_get_kernel_from_staged_cache(kernel, hub_cache):
    assert kernel.__name__.startswith("_fused_geglu_")
    assert "layers" in kernel.__all__
    for fn in ("geglu", "gelu_and_mul", "gelu_tanh_and_mul", "linear", "geglu_mlp"):
        assert callable(getattr(kernel, fn))
    assert str(hub_cache) in kernel.__file__, "must come from the staged snapshot"
    # kernels picks the variant by torch's build, not by the GPUs present: a CUDA torch loads the CUDA
    # variant on a machine with no GPU too.
    expected = "cuda" if torch.version.cuda else "cpu"
    assert f"_fused_geglu_{expected}_" in kernel.__name__


def test_has_and_install_kernel_offline(hub_cache):
    assert kernels.has_kernel(REPO_ID, version=VERSION, trust_remote_code=True)
    path = kernels.install_kernel(REPO_ID, version=VERSION, local_files_only=True, trust_remote_code=True)
    assert (path / "metadata.json").is_file() or any(path.rglob("metadata.json"))


def test_missing_version_is_reported(hub_cache):
    import pytest

    with pytest.raises(Exception, match=str(VERSION + 1)):  # a version that was not staged
        kernels.get_kernel(REPO_ID, version=VERSION + 1, trust_remote_code=True)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items()}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env)


def test_local_kernels_override(build_dir):
    # A separate process: one process can hold one copy of an ops namespace.
    code = (
        "import kernels, torch\n"
        f"k = kernels.get_kernel({REPO_ID!r}, version={VERSION})\n"
        "g = torch.randn(3, 5)\n"
        "print(k.__file__)\n"
        "print(float((k.geglu(g, g) - k.reference.geglu_ref(g, g)).abs().max()))\n"
    )
    proc = _run(code, LOCAL_KERNELS=f"{REPO_ID}={build_dir}", HF_HUB_OFFLINE="1", HF_HUB_CACHE="/nonexistent")
    assert proc.returncode == 0, proc.stderr[-3000:]
    path, err = proc.stdout.split()
    assert path.startswith(str(build_dir)) and float(err) < 1e-5


def test_kernels_info_cli(hub_cache, build_dir):
    """`kernels info` on the local checkout and, offline, on the staged Hub snapshot."""
    # The `kernels` console script's entry point, run with this Python (works for --target installs too;
    # kernels 0.19 moved it from kernels.cli to kernels._internals.cli).
    cli = [sys.executable, "-c", "import sys; from importlib.metadata import entry_points as e; "
           "sys.exit(next(iter(e(group='console_scripts', name='kernels'))).load()())"]
    # kernels 0.17.2's `info` on a repo id lists the Hub tree even with HF_HUB_OFFLINE=1, so offline
    # it is pointed at the staged snapshot folder (a repo with build/), which is what the cache holds.
    repo_dir = hub_cache / ("kernels--" + REPO_ID.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / (repo_dir / "refs" / f"v{VERSION}").read_text().strip()
    for target in ([str(build_dir.parent)], [str(snapshot)]):
        proc = subprocess.run([*cli, "info", *target, "--json"], capture_output=True, text=True)
        if "ModuleNotFoundError" in proc.stderr and "kernels" not in proc.stderr.splitlines()[-1]:
            # The GPU machine's wheels carry kernels without its CLI's own dependencies (cryptography).
            pytest.skip(f"the kernels CLI cannot import its dependencies here: {proc.stderr.splitlines()[-1]}")
        assert proc.returncode == 0, f"kernels info {target}: {proc.stderr[-2000:]}"
        info = json.loads(proc.stdout)
        assert "fused-geglu" in json.dumps(info), info


def test_loaded_variant_offers_every_backend_this_machine_has(kernel, device):
    """The suite checks every backend the loaded variant offers and skips the others, so a variant that
    silently lost one (its compiled ops not loaded, Triton not found) would turn its tests into skips
    and still pass. Here that is a failure: this machine's variant is a compiled one (make builds it),
    and Triton runs on CUDA tensors, or on CPU ones under TRITON_INTERPRET=1 (conftest sets it)."""
    import importlib.util

    assert kernel.HAS_COMPILED_OPS, f"the loaded variant ({kernel.__name__}) has no compiled ops"
    # The variant's compiled backend, for its own device's tensors: the CUDA variant has no compiled CPU
    # kernels (a CUDA torch on a machine with no GPU loads it, and its CPU tensors get "torch").
    variant = "cuda" if kernel.__name__.startswith("_fused_geglu_cuda_") else "cpu"
    want = {"torch"} | ({variant} if variant == device else set())
    if importlib.util.find_spec("triton") is not None and (device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
        want.add("triton")
    assert want <= set(kernel.available_backends(device)), kernel.available_backends(device)
