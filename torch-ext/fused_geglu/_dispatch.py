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

# Eager training steps that run this variant's compiled kernels (or ATen's) get C++ autograd nodes
# (kernel_src/autograd_nodes) instead of the Python autograd.Function of their custom op: the same
# kernels in the same order, without the Python that a small training step waits on.
# $FUSED_GEGLU_CPP_AUTOGRAD=0 (read at load) keeps the Python nodes, for measuring; the tests switch
# this flag to compare the two bit for bit.
CPP_AUTOGRAD = os.environ.get("FUSED_GEGLU_CPP_AUTOGRAD", "1").strip().lower() not in ("0", "no", "off", "false")


def _has_kernel(op: str, dispatch_key: str) -> bool:
    if not HAS_COMPILED_OPS:
        return False
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"{OPS_ID}::{op}", dispatch_key)
    except RuntimeError:
        return False


_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


@lru_cache(maxsize=None)
def compiled_has(op: str, device_type: str) -> bool:
    """Whether the compiled library registered ``op`` for ``device_type`` ("cpu"/"cuda"; any other
    device type, "meta" say, has no compiled kernels)."""
    key = _DISPATCH_KEYS.get(device_type)
    return key is not None and _has_kernel(op, key)


@lru_cache(maxsize=None)
def compiled_has_autograd(op: str, device_type: str) -> bool:
    """Whether the compiled library registered an autograd kernel (a C++ autograd node) for ``op``
    on ``device_type`` tensors: such ops are registered for one Autograd key only."""
    key = _DISPATCH_KEYS.get(device_type)
    return key is not None and _has_kernel(op, "Autograd" + key)


@lru_cache(maxsize=None)
def triton_usable(device_type: str) -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    if device_type == "cuda":
        return True
    return os.environ.get("TRITON_INTERPRET") == "1"


def cublaslt_forced() -> bool:
    """``FUSED_GEGLU_CUBLASLT=1``: auto dispatch sends every ``linear`` it can (no activation, or
    tanh GELU) to the cuBLASLt kernel (kernel_src/linear_cublaslt), whatever the policy says.

    Without it the measured policy decides (policy_sm90.json: ``linear``, ``linear_gelu_tanh``), and
    ``backend="cuda"`` asks for cuBLASLt explicitly.
    """
    return env("FUSED_GEGLU_CUBLASLT") == "1" and compiled_has("linear_lt", "cuda")


@lru_cache(maxsize=None)
def _available(device_type: str) -> tuple[str, ...]:
    out = []
    if device_type == "cuda" and compiled_has("geglu_fwd", "cuda"):
        out.append("cuda")
    if device_type in ("cuda", "cpu") and triton_usable(device_type):
        out.append("triton")
    if device_type == "cpu" and compiled_has("geglu_fwd", "cpu"):
        out.append("cpu")
    out.append("torch")
    return tuple(out)


# What ``auto`` falls back to where no measured rule decides, fastest first, per device type. Not Triton
# on CPU tensors: there it is only its interpreter (TRITON_INTERPRET=1), a debugging aid that runs when
# asked for by name.
AUTO_ORDER = {"cuda": ("cuda", "triton", "torch"), "cpu": ("cpu", "torch")}


def available_backends(device) -> list[str]:
    """Backends that can run on ``device`` in this variant, fastest-first."""
    return list(_available(device.type if isinstance(device, torch.device) else torch.device(device).type))


def has_backend(device: torch.device, backend: str) -> bool:
    """``backend in available_backends(device)`` without building the list (a per-call path)."""
    return backend in _available(device.type)


_REQUESTABLE = frozenset((*BACKENDS, "auto"))

# os.environ's own store, keyed by encoded names: os.environ.get encodes the name and decodes the
# value on every read (0.6 µs here), and every public call reads one or two variables. Writes through
# os.environ (monkeypatch.setenv included) update this same dict, so a read here is never stale.
# The names the per-call paths read are encoded once, here. env() never writes to this dict: dynamo
# traces it inside a compiled caller, and a dict that grew after the first trace failed that trace's
# guard, one recompile of every compiled function that was the process's first reader (found at
# c8a298a by test_fullgraph_dynamic_no_recompile run on its own). For the same reason dynamo is not
# shown this dict at all: it guarded on its length and keys, so setting any environment variable
# (a library's, a launcher's) between two calls recompiled every graph holding a kernel op, up to
# the recompile limit. Traced code reads os.environ, which dynamo reads once, when it traces.
_ENV_STORE = getattr(os.environ, "_data", None) if os.name == "posix" else None
# The variables that can change an auto pick, read per call: the backend, cuBLASLt for every linear,
# and the sm90 MLP launch (policy.sm90_mlp_launch).
_OVERRIDES = (ENV_VAR, "FUSED_GEGLU_CUBLASLT", "FUSED_GEGLU_SM90_MLP")
_ENV_KEYS: dict[str, object] = (
    {} if _ENV_STORE is None else {name: os.environ.encodekey(name) for name in _OVERRIDES})

_OVERRIDE_KEYS = tuple(_ENV_KEYS.values())


def env(name: str) -> str | None:
    """``os.environ.get(name)``, read on every eager call (a variable set at run time takes effect);
    a compiled graph reads it when traced (``torch._dynamo.reset()`` to trace again after a change)."""
    key = _ENV_KEYS.get(name)
    if key is None or torch.compiler.is_compiling():  # another name, not posix, or traced: the plain read
        return os.environ.get(name)
    value = _ENV_STORE.get(key)
    return None if value is None else os.environ.decodevalue(value)


def overridden() -> bool:
    """Whether a variable that can change an auto pick is set, whatever its value
    (``$FUSED_GEGLU_BACKEND``, ``$FUSED_GEGLU_CUBLASLT``, ``$FUSED_GEGLU_SM90_MLP``): the short paths
    that skip the pick run only while none is."""
    if _ENV_STORE is None or torch.compiler.is_compiling():
        return any(name in os.environ for name in _OVERRIDES)
    k = _OVERRIDE_KEYS
    return k[0] in _ENV_STORE or k[1] in _ENV_STORE or k[2] in _ENV_STORE


def requested(backend: str | None) -> str:
    value = backend if backend is not None else (env(ENV_VAR) or "auto")
    if type(value) is not str or value not in _REQUESTABLE:
        raise ValueError(f"backend must be one of {('auto', *BACKENDS)}, got {value!r}")
    return value


def check_available(op: str, device: torch.device, backend: str, needs_compiled: tuple[str, ...] = ()) -> None:
    if has_backend(device, backend) and (backend not in ("cuda", "cpu") or all(
            compiled_has(name, device.type) for name in needs_compiled)):
        return
    raise ValueError(
        f"backend {backend!r} cannot run {op} on {device.type} tensors in this build "
        f"(variant ops id {OPS_ID}); available: {available_backends(device)}"
    )


PICKS_MAX = 65536  # sizes vary with the token count: a pick table is cleared when it grows past this


def remember(table: dict, key: tuple, choice: str) -> str:
    """Store a backend pick in an op's table of remembered picks (``geglu._picks``, ``linear._picks``):
    the answer depends only on the key, since the policy files and the variant's ops are fixed once
    loaded. The table stays bounded."""
    if len(table) > PICKS_MAX:
        table.clear()
    table[key] = choice
    return choice


def record(op: str, backend: str) -> None:
    _last[op] = backend


def last_backend(op: str) -> str | None:
    """The backend that ran ``op`` ("geglu", "gelu_and_mul", "linear", "geglu_mlp",
    "geglu_mlp_backward") most recently."""
    return _last.get(op)
