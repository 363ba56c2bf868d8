"""torch.autocast for the GEMM ops and the layers: compute what autocast's ``linear`` computes.

Under autocast, ``F.linear`` casts every floating operand (not float64) to the autocast dtype and returns
its result in that dtype; GELU and the product are not on autocast's lists and run in their inputs' dtype.
``linear`` and ``geglu_mlp`` (and the layers that call them) follow the same rule, on every backend: they
cast x, the weights and the biases, then run with autocast off, so that the ops inside (ATen GEMMs on some
backends, Triton or CUTLASS on others) see operands already cast and nothing is cast twice. The casts are
differentiable: float32 parameters get float32 gradients, as from autocast's own casts. Before 2026-12-05
the result's dtype depended on the backend (the ATen paths were cast by autocast inside, the Triton and
cuBLASLt ones computed in float32), and the layers ran the host's forward under any autocast.

The casts go through autocast's weight cache where the variant has its compiled library (the ``autocast_cast``
op, kernel_src/autograd_nodes/autocast_cast.cpp): a float32 parameter is cast once per autocast region, as
autocast's ``linear`` casts it, not once per call. A decode loop inside one ``with torch.autocast(...)`` then
reads the half-precision copy each step (with a cast per call the MLP took 2.7x eager's time on the
development CPU). The noarch variant, which has no compiled library, and traced code (torch.compile; the graph
makes its own casts) cast per call with ``.to``.
"""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES
from ._ops import HAS_COMPILED_OPS, ops

# Whether any autocast is on (one C call, about 0.12 µs on the development CPU; dynamo traces it and
# guards on it). The ops ask it before anything else, so a call outside autocast pays only this.
ANY = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)
_COMPUTED = (torch.float16, torch.bfloat16)


def enabled(device: torch.device) -> bool:
    """``torch.is_autocast_enabled(device.type)``, after the cheaper test for any autocast at all (the
    per-device query costs about 0.15 µs more, and a decode step asks it per layer)."""
    return ANY() and torch.is_autocast_enabled(device.type)


def target(device: torch.device) -> torch.dtype | None | bool:
    """None when autocast is off for ``device``'s type; its dtype when the kernels compute in it
    (float16, bfloat16); False for any other autocast dtype (callers then leave the call to ATen)."""
    if not enabled(device):
        return None
    get_dtype = getattr(torch, "get_autocast_dtype", None)
    dtype = get_dtype(device.type) if get_dtype is not None else None
    return dtype if dtype in _COMPUTED else False


def castable(*tensors) -> bool:
    """Whether autocast would cast every one of these (None aside): tensors of a float dtype the
    kernels take (float64 is not cast by autocast, and the call then fails as F.linear's would)."""
    return all(t is None or (isinstance(t, torch.Tensor) and t.dtype in FLOAT_DTYPES) for t in tensors)


def _cached_cast_op():
    """The compiled library's ``autocast_cast`` op, or None (noarch variant, or a build before it)."""
    if not HAS_COMPILED_OPS:
        return None
    try:
        return ops.autocast_cast
    except (AttributeError, RuntimeError):
        return None


_CACHED_CAST = _cached_cast_op()


def cast(dtype: torch.dtype, *tensors) -> list:
    """The tensors (None stays None) cast to ``dtype``, differentiably; float32 parameters through
    autocast's weight cache where the compiled library has it (callers are under autocast, ``castable``)."""
    if _CACHED_CAST is not None and not torch.compiler.is_compiling():
        tensors = _CACHED_CAST(list(tensors), dtype)
    # Whatever the cache left (or the noarch variant): a plain cast. (The dtype test first: a call of
    # .to that has nothing to do still costs about 0.7 µs, and a decode step's MLP passes seven operands.)
    return [t if t is None or t.dtype == dtype else t.to(dtype) for t in tensors]


_SET_ENABLED = getattr(torch, "set_autocast_enabled", None)


def without(device: torch.device, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with autocast off on ``device``'s type (callers: autocast is on there).

    Eager calls switch the flag itself: ``torch.autocast(enabled=False)`` as a context costs about 3.7 µs
    (its dtype, cache and nesting bookkeeping, none of which a call that casts nothing needs), of the
    23 µs the autocast path added to a small MLP call on the development CPU. Traced code (dynamo,
    torch.export) keeps the context, which tracing understands."""
    if _SET_ENABLED is None or torch.compiler.is_compiling():
        with torch.autocast(device.type, enabled=False):
            return fn(*args, **kwargs)
    kind = device.type
    _SET_ENABLED(kind, False)
    try:
        return fn(*args, **kwargs)
    finally:
        _SET_ENABLED(kind, True)
