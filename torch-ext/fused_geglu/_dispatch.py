"""Which implementation runs an op, and a record of which one did.

Backends:
- ``"cuda"``: compiled CUDA kernels of the ``torch{XY}-cxx11-cu{ZZZ}`` variant;
- ``"triton"``: the Triton kernels in ``triton_kernels/`` (CUDA tensors; CPU tensors only under
  ``TRITON_INTERPRET=1``, which is how the tests exercise them without a GPU);
- ``"cpu"``: compiled C++ kernels of the ``torch{XY}-cxx11-cpu`` variant, with ATen GEMMs;
- ``"torch"``: plain ATen composition, always available (the reference-grade fallback).

Choice order: the call's ``backend=`` argument, else ``$FUSED_GEGLU_BACKEND``, else ``auto``:
the per-op policy below, which only ever picks backends that exist for the device.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

from ._ops import HAS_COMPILED_OPS, OPS_ID

BACKENDS = ("cuda", "triton", "cpu", "torch")
ENV_VAR = "FUSED_GEGLU_BACKEND"

_last: dict[str, str] = {}


def _has_kernel(op: str, dispatch_key: str) -> bool:
    if not HAS_COMPILED_OPS:
        return False
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"{OPS_ID}::{op}", dispatch_key)
    except RuntimeError:
        return False


@lru_cache(maxsize=None)
def compiled_has(op: str, device_type: str) -> bool:
    """Whether the compiled library registered ``op`` for ``device_type`` ("cpu"/"cuda")."""
    return _has_kernel(op, {"cpu": "CPU", "cuda": "CUDA"}[device_type])


@lru_cache(maxsize=None)
def triton_usable(device_type: str) -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    if device_type == "cuda":
        return True
    return os.environ.get("TRITON_INTERPRET") == "1"


def cublaslt_enabled() -> bool:
    """The cuBLASLt linear (kernel_src/linear_cublaslt) is opt-in: ``FUSED_GEGLU_CUBLASLT=1``.

    It crashed on the H200 on 2026-12-02 (a static libstdc++ inside the extension, fixed in the
    builder); since 2026-12-03 it passes every linear test there and runs within 1 % of ``addmm``,
    which is ATen's own cuBLASLt BIAS-epilogue call. With no measured win it stays opt-in; by
    default ``linear`` on CUDA uses ATen (policy_sm90.json).
    """
    return os.environ.get("FUSED_GEGLU_CUBLASLT") == "1" and compiled_has("linear_lt", "cuda")


def available_backends(device) -> list[str]:
    """Backends that can run on ``device`` in this variant, fastest-first."""
    device_type = torch.device(device).type
    out = []
    if device_type == "cuda" and compiled_has("geglu_fwd", "cuda"):
        out.append("cuda")
    if device_type in ("cuda", "cpu") and triton_usable(device_type):
        out.append("triton")
    if device_type == "cpu" and compiled_has("geglu_fwd", "cpu"):
        out.append("cpu")
    out.append("torch")
    return out


def requested(backend: str | None) -> str:
    value = backend if backend is not None else os.environ.get(ENV_VAR, "auto")
    if value not in (*BACKENDS, "auto"):
        raise ValueError(f"backend must be one of {('auto', *BACKENDS)}, got {value!r}")
    return value


def check_available(op: str, device: torch.device, backend: str, needs_compiled: tuple[str, ...] = ()) -> None:
    avail = available_backends(device)
    missing_op = backend in ("cuda", "cpu") and not all(compiled_has(name, device.type) for name in needs_compiled)
    if backend not in avail or missing_op:
        raise ValueError(
            f"backend {backend!r} cannot run {op} on {device.type} tensors in this build "
            f"(variant ops id {OPS_ID}); available: {avail}"
        )


def record(op: str, backend: str) -> None:
    _last[op] = backend


def last_backend(op: str) -> str | None:
    """The backend that ran ``op`` ("geglu", "gelu_and_mul", "linear", "geglu_mlp") most recently."""
    return _last.get(op)
