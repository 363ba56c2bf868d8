"""GeGLU pointwise: ``gelu(gate) * up`` as torch.library custom ops with autograd.

Two forms share the kernels: separate ``(gate, up)`` tensors, and the packed ``x = [..., 2d]``
(gate first, as kernels-community/activation), whose halves reach the kernels as strided views and
whose gradient is written into one ``[..., 2d]`` buffer, so neither direction copies.
"""

from __future__ import annotations

import torch

from . import _checks, _dispatch, reference
from ._ops import ops
from ._opdef import _tracing, custom_op, transformed
from ._views import rows
from .policy import backend_for
from .reference import gelu

_APPROX_CODE = {"none": 0, "tanh": 1}
_POLICY_OP = {"fwd": "geglu_fwd", "bwd": "geglu_bwd", "bwd_inplace": "geglu_bwd_inplace"}


_picks: dict[tuple, str] = {}


def _pick(device: torch.device, backend: str | None, direction: str = "fwd", numel: int = 0,
          dense: bool = False) -> str:
    """``dense``: every operand is contiguous, so both compiled and Triton backends run their flat
    kernels (the packed form's halves are strided views and run the row kernels).

    Remembered per (device, backend, direction, size, layout): the answer depends on nothing else
    (the policy files and the variant's ops are fixed once loaded), and a decode-size call's host
    time is what it waits on."""
    if backend is None:
        backend = _dispatch.requested(None)
    key = (device, backend, direction, numel, dense)
    choice = _picks.get(key)
    return choice if choice is not None else _dispatch.remember(_picks, key, _pick_uncached(device, backend, direction, numel, dense))


def _pick_uncached(device: torch.device, backend: str, direction: str, numel: int, dense: bool) -> str:
    backend = _dispatch.requested(backend)
    if backend == "auto":
        if device.type == "cuda":
            # Measured per size and layout (policy_sm90.json).
            choice = backend_for(_POLICY_OP[direction], device, "cuda", numel=numel, dense=int(dense))
            if _dispatch.has_backend(device, choice):
                return choice
        for cand in _dispatch.AUTO_ORDER.get(device.type, ("torch",)):
            if _dispatch.has_backend(device, cand):
                return cand
    _dispatch.check_available("geglu", device, backend)
    return backend


# ---- launchers: fill preallocated 2-D outputs -------------------------------------------------

_triton_geglu = None


def _triton():
    """``triton_kernels.geglu``, imported on first use (Triton may be absent) and then kept: an import
    statement in the launchers cost 0.4 µs per call even with the module loaded."""
    global _triton_geglu
    if _triton_geglu is None:
        from .triton_kernels import geglu as tk

        _triton_geglu = tk
    return _triton_geglu


def _fwd_into(out2, gate2, up2, approximate: str, backend: str) -> None:
    if out2.shape[0] == 0:
        return
    if backend in ("cuda", "cpu"):
        ops.geglu_fwd(out2, gate2, up2, _APPROX_CODE[approximate])
    elif backend == "triton":
        _triton().geglu_fwd(out2, gate2, up2, approximate)
    else:
        _by_row_blocks(_torch_fwd, approximate, out2, gate2, up2)


def _bwd_into(dgate2, dup2, grad2, gate2, up2, approximate: str, backend: str) -> None:
    if grad2.shape[0] == 0:
        return
    if backend in ("cuda", "cpu"):
        ops.geglu_bwd(dgate2, dup2, grad2, gate2, up2, _APPROX_CODE[approximate])
    elif backend == "triton":
        _triton().geglu_bwd(dgate2, dup2, grad2, gate2, up2, approximate)
    else:
        _by_row_blocks(_torch_bwd, approximate, dgate2, dup2, grad2, gate2, up2)


# ---- the "torch" backend: ATen in fp32, each result rounded once on its store -----------------

# On CPU tensors the "torch" backend works in row blocks of about this many elements. Its fp32
# intermediates are as large as the operands, and glibc serves allocations above its mmap threshold
# (at most 32 MB) straight from the OS: unblocked, a [2048, 4096] bf16 call page-faulted fresh 32 MB
# temporaries in on every call and streamed them through memory. In blocks of 4 MB (fp32) they reuse
# the allocator's chunks and stay in cache: there the forward took 54.3 -> 9.6 ms (eager's 9.0) and a
# training step 138 -> 33.8 ms (eager's 24.7), 2 cores; at 2M elements blocks gained nothing
# (benchmarks/RESULTS.md, "CPU tensors: the compiled CPU backend against eager"). Each output element
# depends only on the same element of the inputs, so blocks compute the same values, in place too (in
# the last bit they may not: ATen's vector loops run a block's last elements through their scalar
# forms, as they already do at their own thread splits).
_CPU_BLOCK = 1 << 20


def _by_row_blocks(fn, approximate: str, *ts) -> None:
    """``fn(*ts, approximate)`` over 2-D ``ts`` of one shape: at once off the CPU or up to twice
    ``_CPU_BLOCK`` elements, else on row slices of about ``_CPU_BLOCK`` elements each."""
    rows, cols = ts[0].shape
    if rows * cols <= 2 * _CPU_BLOCK or ts[0].device.type != "cpu":
        fn(*ts, approximate)
        return
    step = max(1, _CPU_BLOCK // cols)
    for start in range(0, rows, step):
        fn(*(t[start:start + step] for t in ts), approximate)


def _torch_fwd(out2, gate2, up2, approximate: str) -> None:
    # mul promotes up2 and casts once on the store (see _torch_bwd_h)
    torch.mul(gelu(gate2.float(), approximate), up2, out=out2)


def _torch_bwd(dgate2, dup2, grad2, gate2, up2, approximate: str) -> None:
    g = gate2.float()
    torch.mul(torch.ops.aten.gelu_backward(grad2.float(), g, approximate=approximate), up2, out=dgate2)
    torch.mul(gelu(g, approximate), grad2, out=dup2)


def _torch_bwd_h(dgate2, dup2, grad2, gate2, up2, approximate: str) -> None:
    """The "torch" backend's MLP backward pointwise: dgate2, dup2 <- the gradients and grad2 <- h, where
    dgate2/dup2 may be gate2/up2 themselves (in place).

    fp32 math with each result rounded once on its store, as the compiled kernels do: ATen's one-pass
    gelu_backward forms dy * gelu'(gate) (eager's own derivative), gelu(gate) is formed once for dup and
    h, and a mixed-dtype mul reads the half-precision operand without a cast pass. Until 2026-12-05 the
    derivative came from a dozen fp32 elementwise ops (reference.gelu_grad), and the in-place form went
    through three temporaries and three copies: on CPU tensors, where torch-cpu and the CUDA builds run
    this, a bf16 training step took up to 1.8x eager's time (M = 2048, H = 1024, I = 4096, 2 cores).
    Eager's own numerics (ops in bf16, each rounding) would cost fewer passes; they also left a bf16 FSDP
    training run of 2 SGD steps at 3.4x eager's loss error from float64 (test_fsdp), past the 2x allowed."""
    _by_row_blocks(_torch_bwd_h_block, approximate, dgate2, dup2, grad2, gate2, up2)


def _torch_bwd_h_block(dgate2, dup2, grad2, gate2, up2, approximate: str) -> None:
    g, dy = gate2.float(), grad2.float()  # in fp32 these are the tensors themselves: read before overwritten
    gl = gelu(g, approximate)
    d = torch.ops.aten.gelu_backward(dy, g, approximate=approximate)  # dy * gelu'(gate)
    # dup needs dy, which h overwrites; h needs up, which an in-place dup overwrites: dup goes to a
    # temporary when it replaces up.
    in_place = dup2.data_ptr() == up2.data_ptr()
    dup = torch.mul(gl, dy) if in_place else torch.mul(gl, grad2, out=dup2)
    torch.mul(d, up2, out=dgate2)
    torch.mul(gl, up2, out=grad2)
    if in_place:
        dup2.copy_(dup)


def _bwd_h(dgate2, dup2, grad2, gate2, up2, approximate: str, backend: str) -> None:
    """The training MLP's backward pointwise where gate/up must stay as they are (a traced graph's
    values): dgate2, dup2 <- the gradients, grad2 <- h in place. One pass over the three inputs,
    where copying gate/up first and running the in-place kernel would be two."""
    if grad2.shape[0] == 0:
        return
    if backend == "cuda" and _dispatch.compiled_has("geglu_bwd_h", "cuda"):
        ops.geglu_bwd_h(dgate2, dup2, grad2, gate2, up2, _APPROX_CODE[approximate])
    elif backend == "triton":
        _triton().geglu_bwd_h(dgate2, dup2, grad2, gate2, up2, approximate)
    elif backend == "cuda":  # a library built before geglu_bwd_h: copies, then the in-place kernel
        dgate2.copy_(gate2)
        dup2.copy_(up2)
        _bwd_inplace(dgate2, dup2, grad2, approximate, backend)
    elif backend == "torch":
        _torch_bwd_h(dgate2, dup2, grad2, gate2, up2, approximate)
    else:
        h = torch.empty_like(grad2)
        _fwd_into(h, gate2, up2, approximate, backend)
        _bwd_into(dgate2, dup2, grad2, gate2, up2, approximate, backend)
        grad2.copy_(h)


def _bwd_inplace(gate2, up2, grad2, approximate: str, backend: str) -> None:
    """The training MLP's backward pointwise, in place: gate2 <- dgate, up2 <- dup, grad2 <- h.
    Saves the three M x I buffers a separate backward + recomputed h would allocate."""
    if grad2.shape[0] == 0:
        return
    if backend == "cuda" and _dispatch.compiled_has("geglu_bwd_inplace", "cuda"):
        ops.geglu_bwd_inplace(gate2, up2, grad2, _APPROX_CODE[approximate])
    elif backend == "triton":
        _triton().geglu_bwd_inplace(gate2, up2, grad2, approximate)
    elif backend == "torch":
        _torch_bwd_h(gate2, up2, grad2, gate2, up2, approximate)
    else:  # the CPU kernels have no in-place form: compute into temporaries, then copy
        dgate, dup, h = torch.empty_like(gate2), torch.empty_like(up2), torch.empty_like(grad2)
        _fwd_into(h, gate2, up2, approximate, backend)
        _bwd_into(dgate, dup, grad2, gate2, up2, approximate, backend)
        gate2.copy_(dgate)
        up2.copy_(dup)
        grad2.copy_(h)


# ---- separate (gate, up) ------------------------------------------------------------------------

@custom_op("geglu_fwd_op", mutates_args=())
def geglu_fwd_op(gate: torch.Tensor, up: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    backend = _pick(gate.device, backend, "fwd", gate.numel(), gate.is_contiguous() and up.is_contiguous())
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    _fwd_into(rows(out), rows(gate), rows(up), approximate, backend)
    _dispatch.record("geglu", backend)
    return out


@geglu_fwd_op.register_fake
def _(gate, up, approximate, backend):
    return gate.new_empty(gate.shape)


@custom_op("geglu_bwd_op", mutates_args=())
def geglu_bwd_op(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, approximate: str,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    backend = _pick(gate.device, backend, "bwd", gate.numel(),
                    grad_out.is_contiguous() and gate.is_contiguous() and up.is_contiguous())
    dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    dup = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    _bwd_into(rows(dgate), rows(dup), rows(grad_out), rows(gate), rows(up), approximate, backend)
    return dgate, dup


@geglu_bwd_op.register_fake
def _(grad_out, gate, up, approximate, backend):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _geglu_setup(ctx, inputs, output):
    gate, up, approximate, backend = inputs
    ctx.save_for_backward(gate, up)
    ctx.approximate, ctx.backend = approximate, backend


def _geglu_backward(ctx, grad_out):
    gate, up = ctx.saved_tensors
    dgate, dup = geglu_bwd_op(grad_out, gate, up, ctx.approximate, ctx.backend)
    return dgate, dup, None, None


geglu_fwd_op.register_autograd(_geglu_backward, setup_context=_geglu_setup)


# ---- packed x = [..., 2d] ---------------------------------------------------------------------

def _halves(x2: torch.Tensor):
    d = x2.shape[-1] // 2
    return x2[:, :d], x2[:, d:]


@custom_op("geglu_packed_fwd_op", mutates_args=())
def geglu_packed_fwd_op(x: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    backend = _pick(x.device, backend, "fwd", x.numel() // 2)
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    gate2, up2 = _halves(rows(x))
    _fwd_into(rows(out), gate2, up2, approximate, backend)
    _dispatch.record("gelu_and_mul", backend)
    return out


@geglu_packed_fwd_op.register_fake
def _(x, approximate, backend):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@custom_op("geglu_packed_bwd_op", mutates_args=())
def geglu_packed_bwd_op(grad_out: torch.Tensor, x: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    backend = _pick(x.device, backend, "bwd", x.numel() // 2)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dgate2, dup2 = _halves(rows(dx))
    gate2, up2 = _halves(rows(x))
    _bwd_into(dgate2, dup2, rows(grad_out), gate2, up2, approximate, backend)
    return dx


@geglu_packed_bwd_op.register_fake
def _(grad_out, x, approximate, backend):
    return x.new_empty(x.shape)


def _packed_setup(ctx, inputs, output):
    x, approximate, backend = inputs
    ctx.save_for_backward(x)
    ctx.approximate, ctx.backend = approximate, backend


def _packed_backward(ctx, grad_out):
    (x,) = ctx.saved_tensors
    return geglu_packed_bwd_op(grad_out, x, ctx.approximate, ctx.backend), None, None


geglu_packed_fwd_op.register_autograd(_packed_backward, setup_context=_packed_setup)


@custom_op("gelu_and_mul_out_op", mutates_args=("out",))
def gelu_and_mul_out_op(out: torch.Tensor, x: torch.Tensor, approximate: str, backend: str) -> None:
    backend = _pick(x.device, backend, "fwd", out.numel())
    gate2, up2 = _halves(rows(x))
    _fwd_into(rows(out), gate2, up2, approximate, backend)  # rows: also with no features (out [..., 0])
    _dispatch.record("gelu_and_mul", backend)


@gelu_and_mul_out_op.register_fake
def _(out, x, approximate, backend):
    return None


# ---- eager calls: one compiled op call each ----------------------------------------------------

def _compiled_entry(device: torch.device, backend: str, numel: int, dense: bool, grad: bool, node: str) -> str | None:
    """The compiled pointwise backend ("cuda" / "cpu") where an eager call would run it, so the one-call
    C++ entry runs the same kernel, else None. Without a graph to record (``grad`` False): where the
    forward's pick is compiled (kernel_src/autograd_nodes/geglu_infer.cpp). A training step: where
    both directions' picks are the same compiled backend and this variant has the C++ node ``node``
    (kernel_src/autograd_nodes/geglu_train.cpp, the same kernels as the Python node)."""
    fwd = _pick(device, backend, "fwd", numel, dense)
    if fwd != "cuda" and fwd != "cpu":
        return None
    if not grad:
        return fwd if _dispatch.compiled_has("geglu_infer", device.type) else None
    if not _dispatch.CPP_AUTOGRAD or numel == 0 or _pick(device, backend, "bwd", numel, dense) != fwd:
        return None
    return fwd if _dispatch.compiled_has_autograd(node, device.type) else None


def _packed(x: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    """``geglu_packed`` on checked arguments (``backend`` resolved)."""
    if x.is_contiguous() and not _tracing((x,)):
        grad = x.requires_grad and torch.is_grad_enabled()
        # The Python ops' picks for the packed form: the halves are strided views (not dense).
        entry = _compiled_entry(x.device, backend, x.numel() // 2, False, grad, "geglu_packed_train")
        if entry is not None:
            code = _APPROX_CODE[approximate]
            out = ops.geglu_packed_train(x, code) if grad else ops.geglu_packed_infer(x, code)
            _dispatch.record("gelu_and_mul", entry)
            return out
    return geglu_packed_fwd_op(x, approximate, backend)


# ---- public functions -------------------------------------------------------------------------

def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none",
          backend: str | None = None) -> torch.Tensor:
    """``gelu(gate) * up`` for ``gate``, ``up`` of one shape [..., d]; differentiable.

    ``approximate``: ``"none"`` (exact, erf) or ``"tanh"``. Math in fp32, output in the input dtype.
    """
    if not _checks.geglu_args_ok(gate, up, approximate):
        _check_geglu(gate, up, approximate)
    backend = _dispatch.requested(backend)
    if not torch.compiler.is_compiling() and transformed():  # torch.func / forward AD: ATen's ops compose
        return reference.geglu_ref(gate, up, approximate, dtype=gate.dtype)
    if gate.is_contiguous() and up.is_contiguous() and not _tracing((gate, up)):
        grad = (gate.requires_grad or up.requires_grad) and torch.is_grad_enabled()
        entry = _compiled_entry(gate.device, backend, gate.numel(), True, grad, "geglu_train")
        if entry is not None:
            code = _APPROX_CODE[approximate]
            out = ops.geglu_train(gate, up, code) if grad else ops.geglu_infer(gate, up, code)
            _dispatch.record("geglu", entry)
            return out
        if not grad:  # what the op's eager path would do, without asking _tracing again
            return geglu_fwd_op.impl(gate, up, approximate, backend)
    return geglu_fwd_op(gate, up, approximate, backend)


def _check_geglu(gate, up, approximate) -> None:
    """The named checks: each failure says which argument and what was expected."""
    _checks.tensor("gate", gate, min_ndim=1)
    _checks.tensor("up", up, min_ndim=1)
    _checks.same_dtype_device("gate", gate, up=up)
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    _checks.approximate(approximate)


def _check_packed(x: torch.Tensor, name: str = "x") -> None:
    _checks.tensor(name, x, min_ndim=1)
    if x.shape[-1] % 2:
        raise ValueError(f"{name} must have an even last dimension [..., 2*d] (gate, then up), "
                         f"got shape {tuple(x.shape)}")


def geglu_packed(x: torch.Tensor, approximate: str = "none", backend: str | None = None) -> torch.Tensor:
    """``gelu(x[..., :d]) * x[..., d:]`` for ``x = [..., 2d]``; differentiable, returns a new tensor."""
    if not _checks.packed_args_ok(x, approximate):
        _check_packed(x)
        _checks.approximate(approximate)
    backend = _dispatch.requested(backend)
    if not torch.compiler.is_compiling() and transformed():  # torch.func / forward AD: ATen's ops compose
        return reference.geglu_packed_ref(x, approximate, dtype=x.dtype)
    return _packed(x, approximate, backend)


def _out_overlaps_x() -> ValueError:
    return ValueError("out shares memory with x: gelu_and_mul reads x while it writes out, so out must be a "
                      "tensor of its own (clone x, or use geglu_packed(x))")


def _gelu_and_mul(out: torch.Tensor, x: torch.Tensor, approximate: str, backend: str | None) -> torch.Tensor:
    if not (_checks.packed_args_ok(x, approximate) and _checks.packed_out_ok(out, x)):
        _check_packed(x)
        _checks.tensor("out", out)
        _checks.same_dtype_device("x", x, out=out)
        _checks.shape("out", out, (*x.shape[:-1], x.shape[-1] // 2), "x.shape[:-1] + (x.shape[-1] // 2,)")
        if not out.is_contiguous():
            raise ValueError(f"out must be contiguous, got strides {out.stride()}")
    backend = _dispatch.requested(backend)
    if not torch.compiler.is_compiling() and transformed():  # torch.func / forward AD: ATen's ops compose
        return out.copy_(reference.geglu_packed_ref(x, approximate, dtype=x.dtype))
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        if out.requires_grad and out.grad_fn is None:
            raise ValueError("out is a leaf tensor that requires grad, and gelu_and_mul writes into out in place; "
                             "pass an out that does not require grad, or use geglu_packed(x) for a new tensor")
        # Differentiable path: copy_ records the copy in the graph, so out carries the gradient (and an
        # out that already has a history gets the write recorded, not hidden from autograd).
        out.copy_(_packed(x, approximate, backend))
        return out
    tracing = _tracing((out, x))
    entry = None
    if x.is_contiguous() and not tracing:
        entry = _compiled_entry(x.device, backend, out.numel(), False, False, "")
    # (The compiled entry makes this test itself, in C++: both operands are dense there.)
    if entry is None and not tracing and _checks.memory_overlaps(out, x):
        raise _out_overlaps_x()
    try:
        if entry is not None:
            ops.geglu_packed_into(out, x, _APPROX_CODE[approximate])
            _dispatch.record("gelu_and_mul", entry)
        else:
            gelu_and_mul_out_op(out, x, approximate, backend)
    except RuntimeError as e:
        if "refer to a single memory location" not in str(e):
            raise
        raise _out_overlaps_x() from None
    if not tracing:
        # The kernels write out's memory behind autograd's back: bump its version as ATen's out= ops do,
        # so a graph that saved out (y = w * out) refuses its backward instead of using the new values.
        torch.autograd.graph.increment_version(out)
    return out


def gelu_and_mul(out: torch.Tensor, x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """kernels-community/activation-compatible: ``out = gelu(x[..., :d]) * x[..., d:]`` (exact GELU)."""
    return _gelu_and_mul(out, x, "none", backend)


def gelu_tanh_and_mul(out: torch.Tensor, x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """kernels-community/activation-compatible: as :func:`gelu_and_mul` with tanh GELU."""
    return _gelu_and_mul(out, x, "tanh", backend)
