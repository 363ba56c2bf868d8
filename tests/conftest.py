"""Test fixtures: the kernel is loaded the way users load it, through ``kernels``.

``make test`` builds and stages first; this file points huggingface_hub at the staged cache in
offline mode *before* anything imports it (huggingface_hub reads these at import time), and
``kernel`` is ``kernels.get_kernel(REPO_ID, version=VERSION, trust_remote_code=True)``, ``REPO_ID`` and
``VERSION`` being this checkout's ``build.toml`` ``[general.hub] repo-id`` and ``[general] version``
(``org/fused-geglu`` and 1 here, a fork's own in a fork: ``make stage`` stages ``REPO_ID``'s ``refs/v<VERSION>``).

Without a GPU, ``TRITON_INTERPRET=1`` is set too, so the Triton kernels run on CPU tensors
(slowly: Triton tests keep sizes small there).
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
_GENERAL = tomllib.loads((REPO_ROOT / "build.toml").read_text())["general"]
REPO_ID = _GENERAL["hub"]["repo-id"]
VERSION = _GENERAL["version"]  # the kernel's major version: the branch v<VERSION>
REPO_CACHE_DIR = "kernels--" + REPO_ID.replace("/", "--")  # its folder in a Hub cache
HUB_CACHE = Path(os.environ.get("FUSED_GEGLU_TEST_CACHE", REPO_ROOT / ".hub-cache"))

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_CACHE"] = str(HUB_CACHE)
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, str(REPO_ROOT / "src"))  # fused_geglu_tools (the tooling, not the kernel)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _numerics

import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
# Under pytest-xdist every worker would start torch's default of one intra-op thread per core, so
# -n 15 on 16 cores runs 15 x 16 threads, which spin on the same cores and slow every worker's host
# work (references, Triton's compiles). Each worker gets its share of the cores instead.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200; results recorded in benchmarks/results)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def build_dir() -> Path:
    path = REPO_ROOT / "build"
    if not any(path.glob("*/metadata.json")):
        pytest.fail(f"no built variants in {path}: run `make build` (make test does it first)")
    return path


@pytest.fixture(scope="session")
def hub_cache(build_dir) -> Path:
    refs = HUB_CACHE / REPO_CACHE_DIR / "refs" / f"v{VERSION}"
    if not refs.is_file():
        pytest.fail(f"no staged snapshot at {HUB_CACHE}: run `make stage` (make test does it first)")
    return HUB_CACHE


@pytest.fixture(scope="session")
def kernel(hub_cache):
    import kernels

    return kernels.get_kernel(REPO_ID, version=VERSION, trust_remote_code=True)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def compiled(kernel, device) -> str:
    """The loaded variant's compiled backend for the test device's tensors ("cpu" or "cuda"), or a skip:
    a CUDA torch on a machine with no GPU loads the CUDA variant, whose compiled kernels take CUDA tensors
    only, so its CPU tensors have the ``torch`` backend (and Triton's interpreter) alone. Tests of what the
    compiled kernels do on the device ask for this (seen with torch 2.11+cu130 on the development CPU)."""
    if device not in kernel.available_backends(device):
        pytest.skip(f"the loaded variant ({kernel.__name__}) has no compiled kernels for {device} tensors")
    return device


@pytest.fixture
def triton_module(kernel):
    """The loaded kernel's Triton module by name (``"linear"`` is ``<kernel>.triton_kernels.linear``), or a
    skip where triton is not installed: a CPU torch from its own index comes without it, and the kernel
    then runs without its Triton paths (test_loading.py::test_torch_cpu_variant_loads_without_triton)."""
    import importlib

    def load(name: str):
        try:
            import triton  # noqa: F401
        except ImportError:
            pytest.skip("triton is not installed: the kernel's Triton modules cannot be imported")
        return importlib.import_module(f"{kernel.__name__}.triton_kernels.{name}")

    return load


@pytest.fixture(scope="session")
def backends(kernel, device) -> list[str]:
    """Every backend the loaded variant has for the test device (the tests run each)."""
    return kernel.available_backends(device)
