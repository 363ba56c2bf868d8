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

# The `kernels` console script's entry point, run with this Python (works for --target installs too;
# kernels 0.19 moved it from kernels.cli to kernels._internals.cli).
KERNELS_CLI = [sys.executable, "-c", "import sys; from importlib.metadata import entry_points as e; "
               "sys.exit(next(iter(e(group='console_scripts', name='kernels'))).load()())"]


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
    # kernels 0.17.2's `info` on a repo id lists the Hub tree even with HF_HUB_OFFLINE=1, so offline
    # it is pointed at the staged snapshot folder (a repo with build/), which is what the cache holds.
    repo_dir = hub_cache / ("kernels--" + REPO_ID.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / (repo_dir / "refs" / f"v{VERSION}").read_text().strip()
    for target in ([str(build_dir.parent)], [str(snapshot)]):
        proc = subprocess.run([*KERNELS_CLI, "info", *target, "--json"], capture_output=True, text=True)
        if "ModuleNotFoundError" in proc.stderr and "kernels" not in proc.stderr.splitlines()[-1]:
            # The GPU machine's wheels carry kernels without its CLI's own dependencies (cryptography).
            pytest.skip(f"the kernels CLI cannot import its dependencies here: {proc.stderr.splitlines()[-1]}")
        assert proc.returncode == 0, f"kernels info {target}: {proc.stderr[-2000:]}"
        info = json.loads(proc.stdout)
        assert "fused-geglu" in json.dumps(info), info



def _as_written(sig) -> str:
    """A signature as its ``def`` line reads (the kernel's modules keep annotations as strings: PEP 563)."""
    import inspect

    def annotation(a):
        return a if isinstance(a, str) else inspect.formatannotation(a)

    params, star = [], False
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
        star = star or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += f": {annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f"={p.default!r}"
        params.append(text)
    ret = "" if sig.return_annotation is sig.empty else f" -> {annotation(sig.return_annotation)}"
    return f"({', '.join(params)}){ret}"


def test_symbols_json_describes_the_loaded_kernel(kernel, build_dir):
    """Each variant's symbols.json (read from the sources at build time) says what the imported kernel has:
    the functions of ``__all__`` with their real signatures, the layers with their real flags."""
    import inspect

    from fused_geglu_tools.public_api import SYMBOLS
    from fused_geglu_tools.verify import find_variants

    per_variant = {v.name: json.loads((v / SYMBOLS).read_text()) for v in find_variants(build_dir)}
    symbols = next(iter(per_variant.values()))
    assert all(s == symbols for s in per_variant.values()), "variants disagree on their symbols.json"
    assert [f["name"] for f in symbols["functions"]] == [
        n for n in kernel.__all__ if not inspect.ismodule(getattr(kernel, n))]
    for entry in symbols["functions"]:
        assert entry["signature"] == _as_written(inspect.signature(getattr(kernel, entry["name"]))), entry
    assert {layer["name"]: layer["attributes"] for layer in symbols["layers"]} == {
        name: {"has_backward": cls.has_backward, "can_torch_compile": cls.can_torch_compile}
        for name, cls in vars(kernel.layers).items()
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module) and cls.__module__ == kernel.layers.__name__
        and not name.startswith("_")}


def test_kernels_describe_api_reads_symbols_json(hub_cache, build_dir):
    """kernels 0.19's ``describe-api`` on the local build and on the staged Hub snapshot, offline."""
    from fused_geglu_tools.public_api import SYMBOLS

    symbols = json.loads((next(build_dir.glob(f"*/{SYMBOLS}"))).read_text())
    repo_dir = hub_cache / ("kernels--" + REPO_ID.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / (repo_dir / "refs" / f"v{VERSION}").read_text().strip()
    for target in (build_dir.parent, snapshot):
        proc = subprocess.run([*KERNELS_CLI, "describe-api", str(target), "--json"], capture_output=True, text=True)
        if "invalid choice: 'describe-api'" in proc.stderr:
            pytest.skip(f"kernels {kernels.__version__} has no describe-api (added in 0.19)")
        assert proc.returncode == 0, proc.stderr[-2000:]
        described = json.loads(proc.stdout)
        assert (described["functions"], described["layers"]) == (symbols["functions"], symbols["layers"]), target


def test_loaded_variant_offers_every_backend_this_machine_has(kernel, device):
    """The suite checks every backend the loaded variant offers and skips the others, so a variant that
    silently lost one (its compiled ops not loaded, Triton not found) would turn its tests into skips
    and still pass. Here that is a failure: this machine's variant is a compiled one (make builds it),
    and Triton runs on CUDA tensors, or on CPU ones under TRITON_INTERPRET=1 (conftest sets it)."""
    import importlib.util

    if os.environ.get("FUSED_GEGLU_TEST_NOARCH") == "1":  # `make test`'s second pass, over torch-cpu
        assert not kernel.HAS_COMPILED_OPS and "_noarch_" in kernel.__name__, kernel.__name__
        assert set(kernel.available_backends(device)) >= {"torch"}
        return
    assert kernel.HAS_COMPILED_OPS, f"the loaded variant ({kernel.__name__}) has no compiled ops"
    # The variant's compiled backend, for its own device's tensors: the CUDA variant has no compiled CPU
    # kernels (a CUDA torch on a machine with no GPU loads it, and its CPU tensors get "torch").
    variant = "cuda" if kernel.__name__.startswith("_fused_geglu_cuda_") else "cpu"
    want = {"torch"} | ({variant} if variant == device else set())
    if importlib.util.find_spec("triton") is not None and (device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
        want.add("triton")
    assert want <= set(kernel.available_backends(device)), kernel.available_backends(device)


# The builds a release publishes: a full build/ here (the compiled CPU variant of this torch, torch-cpu,
# torch-cuda; test_builder checks they are built) and the GPU machine's compiled CUDA variant.
GPU_BUILD = "torch211-cxx11-cu130-x86_64-linux"
NOARCH_BUILDS = ("torch-cpu", "torch-cuda")


@pytest.mark.parametrize("minor", range(9, 17))
def test_every_torch_version_finds_a_build(build_dir, minor):
    """kernels' own resolver, asked about torch versions this machine does not have: a CPU torch of any
    version loads a build (the compiled one of its version where one is published, else the ATen-only
    torch-cpu), a CUDA torch the compiled CUDA build of its versions (of its CUDA release or an earlier minor
    of that major), else the Triton torch-cuda. Before
    torch-cpu existed (2026-12-05) a CPU torch of any version but 2.13 found none: "no compatible variant"."""
    from fused_geglu_tools.kernels_internals import resolve_for
    from fused_geglu_tools.variants import Variant

    names = sorted({p.name for p in build_dir.iterdir() if (p / "metadata.json").is_file()} | {GPU_BUILD, *NOARCH_BUILDS})
    compiled = {(v.backend, v.torch, v.cuda): n for n in names if not (v := Variant.parse(n)).noarch}
    version = f"2.{minor}"
    cpu = resolve_for(names, "cpu", version)
    assert cpu[0] == compiled.get(("cpu", (2, minor), None), "torch-cpu") and cpu[-1] == "torch-cpu", cpu
    # A CUDA build serves its CUDA release and every later minor of that major (torch 2.15 from PyPI is
    # CUDA 13.2; the builder names a build after nvcc's older release, builder._cuda_variant).
    for cuda in ((12, 8), (13, 0), (13, 2)):
        got = resolve_for(names, "cuda", version, f"{cuda[0]}.{cuda[1]}")
        usable = sorted(c for (b, t, c) in compiled if b == "cuda" and t == (2, minor) and c[0] == cuda[0] and c <= cuda)
        want = compiled[("cuda", (2, minor), usable[-1])] if usable else "torch-cuda"
        assert got[0] == want and got[-1] == "torch-cuda", (cuda, got)
    # Every compiled build is x86_64: an aarch64 machine (a Grace CPU, a GH200) takes the noarch builds.
    assert resolve_for(names, "cpu", version, cpu="aarch64") == ["torch-cpu"]
    assert resolve_for(names, "cuda", version, "13.0", cpu="aarch64") == ["torch-cuda"]


def test_torch_cpu_variant_loads_without_triton(build_dir, tmp_path):
    """torch-cpu alone, as a CPU torch with no compiled build loads it, in a process where ``triton`` cannot
    be imported (CPU torch wheels do not bring it): the functions, their gradients and a layer compute
    against float64. The whole kernel-facing suite runs on it too (`make test`'s second pass)."""
    if not (build_dir / "torch-cpu" / "metadata.json").is_file():
        pytest.skip("build/ has no torch-cpu: built with --backends cuda (the GPU machine's script)")
    repo = tmp_path / "repo"
    (repo / "build").mkdir(parents=True)
    import shutil

    shutil.copytree(build_dir / "torch-cpu", repo / "build" / "torch-cpu")
    code = f"""
import sys
sys.modules["triton"] = None  # import triton raises ImportError
from pathlib import Path
import kernels, torch, torch.nn.functional as F
# A CUDA torch (here without a GPU) resolves the cuda backend by default: a user of one asks for cpu.
k = kernels.get_local_kernel(Path({str(repo)!r}), **({{"backend": "cpu"}} if torch.version.cuda else {{}}))
assert "_cpu_noarch_" in k.__name__ and not k.HAS_COMPILED_OPS, k.__name__
assert k.available_backends("cpu") == ["torch"], k.available_backends("cpu")
torch.manual_seed(0)
x = torch.randn(3, 5, 24, requires_grad=True)
wg, wu = (torch.randn(40, 24) * 24 ** -0.5).requires_grad_(), (torch.randn(40, 24) * 24 ** -0.5).requires_grad_()
wd = (torch.randn(24, 40) * 40 ** -0.5).requires_grad_()
y = k.geglu_mlp(x, wg, wu, wd, approximate="none")
y.backward(torch.ones_like(y))
xd, gd, ud, dd = (t.detach().double().requires_grad_() for t in (x, wg, wu, wd))
r = F.linear(F.gelu(F.linear(xd, gd)) * F.linear(xd, ud), dd)
r.backward(torch.ones_like(r))
errs = [float((a - b).abs().max() / b.abs().max()) for a, b in ((y.detach(), r.detach()), (x.grad, xd.grad), (wg.grad, gd.grad), (wd.grad, dd.grad))]
assert max(errs) < 1e-5, errs
z = k.linear(x, wd.T.contiguous(), torch.randn(40), activation="gelu_tanh")
assert z.shape == (3, 5, 40) and k.last_backend("linear") == "torch"
host = torch.nn.Module()
host.gate_proj, host.up_proj, host.down_proj = torch.nn.Linear(24, 40, bias=False), torch.nn.Linear(24, 40, bias=False), torch.nn.Linear(40, 24, bias=False)
host.act_fn = torch.nn.GELU(approximate="tanh")
eager = host.down_proj(host.act_fn(host.gate_proj(x)) * host.up_proj(x))
fused = k.layers.GeGLUMLP.forward(host, x)
assert k.last_backend("geglu_mlp") == "torch+gemm", k.last_backend("geglu_mlp")
print(float((fused - eager).abs().max()))
"""
    proc = _run(code, HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.split()[-1]) < 1e-5
