"""``linear(x, weight, bias, activation)``: a GEMM with the bias (and GELU) in its epilogue.

Forward: ``y = act(x @ weight.T + bias)`` in one kernel, any leading dims of ``x``. Backward:
``dx`` and ``dW`` as GEMMs, with the bias gradient reduced inside the ``dW`` kernel (Triton) or the
cuBLASLt BGRADB epilogue (CUDA), and GELU's derivative applied to the incoming gradient as it is
loaded, from the pre-activation saved by the forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _autocast, _checks, _dispatch, reference
from ._ops import ops
from ._opdef import _PLAIN, _tracing, custom_op, transformed
from ._views import rows
from .policy import backend_for, size_free

_GELU_APPROX = {"gelu": "none", "gelu_tanh": "tanh"}
_POLICY_OP = {"none": "linear", "gelu_tanh": "linear_gelu_tanh", "gelu": "linear_gelu"}


_picks: dict[tuple, str] = {}

# Devices where a plain ``linear`` (no activation, a [N] bias or none, auto backend) runs ATen's
# F.linear at every size, mapped to the backend name recorded for it ("torch", or "cpu" on CPU
# tensors): the public function's short path. Filled by the full path's first such call.
_ATEN_PLAIN: dict[torch.device, str] = {}


# Devices where a tanh-GELU ``linear`` (a [N] bias or none, auto backend) runs cuBLASLt with the GELU
# in its epilogue at every size, and the compiled library has that path as one no-graph op call
# (``linear_lt_infer``): the public function's short path for such calls. Filled by the full path's
# first such call, under the same conditions as ``_ATEN_PLAIN``.
_LT_GELU_TANH: set[torch.device] = set()


def _learn_lt_gelu_tanh(device: torch.device, chosen: str) -> None:
    if (chosen == "cuda" and not _dispatch.overridden() and size_free("linear_gelu_tanh", device)
            and _dispatch.compiled_has("linear_lt_infer", "cuda")):
        _LT_GELU_TANH.add(device)


def _learn_plain(device: torch.device, chosen: str) -> None:
    """Enter ``device`` in ``_ATEN_PLAIN`` when auto dispatch chose ATen for a plain call and the
    policy's choice there does not depend on the size (no rule of op "linear" bounds one), read
    while no environment override was set, since the short path runs only while none is."""
    if chosen in ("torch", "cpu") and not _dispatch.overridden() and size_free("linear", device):
        _ATEN_PLAIN[device] = chosen


def _pick(device: torch.device, backend: str, activation: str, m: int, addend: bool = False) -> str:
    """``backend`` is already resolved by ``_dispatch.requested``. Remembered per (device, backend,
    activation, M, addend), as geglu's ``_pick`` is; ``$FUSED_GEGLU_CUBLASLT`` is read on every call.
    ``addend``: the bias is a matrix of the output's shape."""
    if backend == "auto" and device.type == "cuda" and activation != "gelu" and _dispatch.cublaslt_forced():
        return "cuda"  # cuBLASLt has only a tanh-GELU epilogue: exact GELU never goes there
    key = (device, backend, activation, m, addend)
    choice = _picks.get(key)
    return choice if choice is not None else _dispatch.remember(_picks, key, _pick_uncached(device, backend, activation, m, addend))


def _pick_uncached(device: torch.device, backend: str, activation: str, m: int, addend: bool) -> str:
    lt_ok = activation != "gelu" and _dispatch.compiled_has("linear_lt", "cuda")
    if backend == "auto":
        if device.type == "cuda" and addend and _dispatch.compiled_has("linear_lt", "cuda"):
            # An addend (any activation: its GELU runs as a pass after the GEMM) is cuBLASLt's C
            # operand, read once in the epilogue; ATen's addmm copies it into the output and then
            # runs the GEMM with beta 1 over that copy, one [M, N] write and read more.
            return "cuda"
        if device.type == "cuda":
            # Measured (policy_sm90.json), per activation: ATen's addmm (cuBLASLt with the BIAS
            # epilogue), this project's cuBLASLt call (GELU_AUX_BIAS epilogue) or Triton.
            # Without a rule (a GPU with no policy file): ATen, which the Triton GEMM lost to by
            # 29-39 % at M = 8192 on the H200 and 2.9-3.4x in a tanh-GELU training step (the
            # default until 2026-12-05); Triton runs where a rule names it or when asked for by name.
            choice = backend_for(_POLICY_OP[activation], device, "torch", m=m)
            if choice == "cuda" and not lt_ok:
                choice = "torch"
            if _dispatch.has_backend(device, choice):
                return choice
        # CPU tensors: the compiled CPU backend, else ATen, as every other op does. Triton on CPU is only
        # its interpreter (TRITON_INTERPRET=1, a debugging aid: slow, and Triton's interpreter mis-computes
        # bf16 tl.dot), so it runs there only when asked for by name: a variant with no compiled CPU
        # backend (torch-cpu, the CUDA ones) used to reach it here and return garbage in bf16. CUDA
        # tensors whose measured pick is missing (a rule naming Triton where it is not installed): ATen
        # ("cuda" is cuBLASLt, never a fallback).
        for cand in ("cpu", "torch") if device.type == "cpu" else ("torch",):
            if _dispatch.has_backend(device, cand):
                return cand
    if backend == "cuda":
        _dispatch.check_available("linear", device, backend, needs_compiled=("linear_lt",))
        if activation == "gelu" and not addend:
            raise ValueError("backend 'cuda' (cuBLASLt) has no exact-GELU epilogue; use activation="
                             "'gelu_tanh' or backend='triton'")
    else:
        _dispatch.check_available("linear", device, backend)
    return backend


def _gelu_pass(y, activation: str, keep: bool):
    """GELU over a GEMM's output ``y``: ``(out, preact)``. In place (no new buffer) unless ``y`` is
    kept as the pre-activation for the backward."""
    approx = _GELU_APPROX[activation]
    if keep:
        return F.gelu(y, approximate=approx), y
    return torch._C._nn.gelu_(y, approximate=approx), None


def _aten_forward(x2, weight, bias, activation: str, keep: bool):
    """ATen: one addmm (the bias in cuBLASLt's epilogue on CUDA; an addend [M, N] as addmm's input),
    then the GELU pass. Returns (out, preact or None); no extra copy."""
    y = F.linear(x2, weight, bias)
    if activation == "none":
        return y, None
    return _gelu_pass(y, activation, keep)


def _seq_first(x: torch.Tensor) -> bool:
    """x is [B, S, K] with unit last stride and rows that no 2-D view covers: a sequence-first
    activation seen batch-first (``x[S, B, K].transpose(0, 1)``). ATen's linear runs bmm and then
    the bias add as a separate pass over the output there; copying x to rows first moves [M, K]."""
    if x.dim() != 3 or x.stride(2) != 1 or x.shape[0] < 2 or x.shape[1] < 2:
        return False
    return x.stride(0) != x.stride(1) * x.shape[1] and x.stride(1) >= x.shape[2] > 0


def _batched_lt_ok(x, weight, bias, requested: str, keep: bool) -> bool:
    """Whether an inference call runs cuBLASLt on B strided batches of a sequence-first x: the bias
    (and tanh GELU) in the epilogue of one GEMM, no copy of x. Auto dispatch or backend "cuda"
    only (backend "torch" means ATen); the saved pre-activation of a training step keeps rows.
    Each batch is a GEMM of its own that reads the whole weight, where rows of x (one [M, K] copy)
    read it once per row tile of all M rows: with few rows per batch and a weight the L2 does not
    hold, with four or more batches of few rows each, or with eight or more batches of up to 64 rows
    of a gate/up-shaped weight of any size, the copy costs less (policy op
    "linear_seqfirst", measured per batch count B, rows per batch S, M = B * S, weight size and
    shape: ``n_per_k`` = N // K is 2 or more for the gate and up projections, whose one 2-D GEMM
    has enough output tiles at M <= 512, or M <= 1024 for a weight twice the L2, where the down
    projection's does not); either way the GEMM is cuBLASLt's, so backend "cuda" follows the same
    rule. ``benchmarks/diag/seqfirst_score.py`` scores the rule against every stored run."""
    if not (not keep and bias is not None and bias.dim() == 1 and requested in ("auto", "cuda") and x.is_cuda
            and _seq_first(x) and _dispatch.compiled_has("linear_lt", "cuda")):
        return False
    b, s, _ = x.shape
    n, k = weight.shape
    return backend_for("linear_seqfirst", x.device, "batched", b=b, s=s, m=b * s,
                       weight_mb=n * k * weight.element_size() >> 20, n_per_k=n // k) == "batched"


def _forward(x, weight, bias, activation: str, save_preact: bool, backend: str, chosen: str | None = None):
    """``(out, preact)`` on real tensors; preact is None unless kept for the backward.
    ``backend`` is already resolved by ``_dispatch.requested``; ``chosen``, when given, is its
    ``_pick`` at this size."""
    requested = backend
    keep = save_preact and activation != "none"
    n = weight.shape[0]
    device = x.device
    if _batched_lt_ok(x, weight, bias, requested, keep):
        backend = chosen or _pick(device, requested, activation, x.shape[0] * x.shape[1])
        if backend in ("torch", "cuda"):
            return _batched_lt(x, weight, bias, activation), None
    x2 = rows(x)
    m = x2.shape[0]
    addend = bias is not None and bias.dim() > 1
    if addend:
        bias = rows(bias)  # [M, N] rows of an addend of the output's shape
    backend = chosen or _pick(device, backend, activation, m, addend)
    preact = None
    if m == 0:
        out = x2.new_empty((0, n))
    elif backend in ("triton", "cuda"):
        out = torch.empty((m, n), dtype=x.dtype, device=device)
        bias_then_gelu = backend == "cuda" and activation != "none" and (
            (keep and n % 8) or x.dtype == torch.float32 or addend)
        if keep and not bias_then_gelu:
            preact = torch.empty((m, n), dtype=x.dtype, device=device)
        if backend == "triton":
            from .triton_kernels import linear as tk

            tk.linear_fwd(out, x2, weight, bias, activation, preact)
        elif bias_then_gelu:
            # The BIAS epilogue, then ATen's GELU as a second pass, where the GELU epilogue will not
            # do: its aux output (the saved pre-activation) needs a 16-byte-aligned leading
            # dimension, and in fp32 its GELU is ~20x less accurate than ATen's (H200, 2026-12-03:
            # relative error 2.2e-6 vs 1.1e-7), far below bf16/fp16 output rounding but not fp32's.
            # With an addend too: whether cuBLASLt applies its GELU after adding C is not relied on.
            ops.linear_lt(out, x2, weight, bias, 0, None)
            out, preact = _gelu_pass(out, activation, keep)
        else:
            ops.linear_lt(out, x2, weight, bias, 0 if activation == "none" else 1, preact)
    else:
        out, preact = _aten_forward(x2, weight, bias, activation, keep)
    _dispatch.record("linear", backend)
    return (out if x.dim() == 2 else out.view(*x.shape[:-1], n)), preact


def _batched_lt(x, weight, bias, activation: str) -> torch.Tensor:
    """cuBLASLt over the B batches of a sequence-first x [B, S, K] (see :func:`_seq_first`): the
    weight and bias broadcast over the batch, out [B, S, N] contiguous. Tanh GELU in the epilogue
    in bf16/fp16, else after it (as ``_forward`` does: exact GELU has no epilogue, fp32's is coarse)."""
    b, s, _ = x.shape
    n = weight.shape[0]
    out = torch.empty((b * s, n), dtype=x.dtype, device=x.device)
    in_epilogue = activation == "gelu_tanh" and x.dtype != torch.float32
    ops.linear_lt(out, x, weight, bias, 1 if in_epilogue else 0, None)
    if activation != "none" and not in_epilogue:
        out = _gelu_pass(out, activation, False)[0]
    _dispatch.record("linear", "cuda")
    return out.view(b, s, n)


@custom_op("linear_fwd_op", mutates_args=())
def linear_fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
                  save_preact: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    out, preact = _forward(x, weight, bias, activation, save_preact, _dispatch.requested(backend))
    return out, (preact if preact is not None else x.new_empty((0,)))


@linear_fwd_op.register_fake
def _(x, weight, bias, activation, save_preact, backend):
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    keep = save_preact and activation != "none"
    n = weight.shape[0]
    return x.new_empty((*x.shape[:-1], n)), x.new_empty((m, n) if keep else (0,))


def _db_shape(has_bias: bool, addend: bool, m: int, n: int) -> tuple[int, ...]:
    return ((m, n) if addend else (n,)) if has_bias else (0,)


@custom_op("linear_bwd_op", mutates_args=())
def linear_bwd_op(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, preact: torch.Tensor,
                  has_bias: bool, addend: bool, activation: str,
                  backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx, dW and the bias gradient: per output feature for a bias vector, or for an addend ([M, N]
    rows of the output's shape) the gradient at the pre-activation itself."""
    g2, x2 = rows(grad_out), rows(x)
    m = x2.shape[0]
    backend = _pick(x.device, _dispatch.requested(backend), activation, m, addend)
    n, k = weight.shape
    reduce_db = has_bias and not addend
    dx = torch.empty((m, k), dtype=x.dtype, device=x.device)
    dw = torch.empty((n, k), dtype=weight.dtype, device=weight.device)
    db = torch.empty(_db_shape(has_bias, addend, m, n), dtype=weight.dtype, device=weight.device)
    if m == 0:
        dw.zero_()
        db.zero_()
    elif backend == "triton":
        from .triton_kernels import linear as tk

        pre = preact if activation != "none" else None
        tk.linear_bwd_input(dx, g2, weight, pre, activation)
        db32 = torch.empty((n,), dtype=torch.float32, device=x.device) if reduce_db else None
        tk.linear_bwd_weight(dw, db32, g2, x2, pre, activation)
        if reduce_db:
            db.copy_(db32)
        elif addend:  # the kernels apply GELU' as they load; the addend's gradient needs it stored
            db.copy_(g2 if pre is None else torch.ops.aten.gelu_backward(g2, pre, approximate=_GELU_APPROX[activation]))
    else:
        g = g2
        if activation != "none":
            # ATen's fused GELU backward: one pass, fp32 math inside, eager's own numerics.
            g = torch.ops.aten.gelu_backward(g2, preact, approximate=_GELU_APPROX[activation])
        torch.mm(g, weight, out=dx)
        if addend:
            db.copy_(g)
        if backend == "cuda":
            ops.linear_lt_bwd_weight(dw, db if reduce_db else None, g, x2)  # BGRADB epilogue
        else:
            torch.mm(g.t(), x2, out=dw)
            if reduce_db:
                db.copy_(g.sum(0, dtype=torch.float32))  # fp32 accumulation, no fp32 copy of g
    return dx.view(*x.shape), dw, db


@linear_bwd_op.register_fake
def _(grad_out, x, weight, preact, has_bias, addend, activation, backend):
    n = weight.shape[0]
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(_db_shape(has_bias, addend, m, n))


def _setup(ctx, inputs, output):
    x, weight, bias, activation, save_preact, backend = inputs
    _, preact = output
    ctx.save_for_backward(x, weight, preact)
    ctx.has_bias, ctx.activation, ctx.backend = bias is not None, activation, backend
    ctx.bias_shape = None if bias is None else bias.shape


def _backward(ctx, grad_out, _grad_preact):
    x, weight, preact = ctx.saved_tensors
    addend = ctx.has_bias and len(ctx.bias_shape) > 1
    dx, dw, db = linear_bwd_op(grad_out.contiguous(), x, weight, preact, ctx.has_bias, addend, ctx.activation,
                               ctx.backend)
    return dx, dw, (db.view(ctx.bias_shape) if ctx.has_bias else None), None, None, None


linear_fwd_op.register_autograd(_backward, setup_context=_setup)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None, backend: str | None = None) -> torch.Tensor:
    """``act(x @ weight.T + bias)`` with the bias and activation applied in the GEMM epilogue.

    x: [..., K]; weight: [N, K] (``nn.Linear`` layout); bias: [N], or an addend of the output's
    shape [..., N] (a residual, say: the GEMM reads it in its epilogue, as cuBLASLt's C on CUDA), or
    None; activation: None, ``"gelu"`` (exact) or ``"gelu_tanh"``, applied after the bias.
    Differentiable in x, weight and bias. Under ``torch.autocast`` (float16 or bfloat16) every operand is
    cast to its dtype first, as ``F.linear`` casts them (``_autocast``).
    """
    if (activation is None and backend is None and not torch.compiler.is_compiling()
            and type(x) in _PLAIN and type(weight) in _PLAIN and (bias is None or type(bias) in _PLAIN)):
        # The common call: ATen's addmm is the implementation at every size on this device (see
        # _learn_plain), nothing overrides the policy, and x is contiguous. F.linear runs on the
        # caller's tensors after the checks it does not make the way the named ones do (it would
        # take integer or float64 tensors, a 1-D weight and a broadcasting bias; the bias's dtype
        # is checked here rather than left to whichever ATen route runs); its own refusals (dtypes
        # and devices of x and weight, feature counts) are reworded below. About 1 µs of Python
        # against the full path's 6 (development CPU, 2026-12-04).
        device = x.device
        chosen = _ATEN_PLAIN.get(device)
        if (chosen is not None and x.dtype in _checks.FLOAT_DTYPES and x.is_contiguous() and weight.dim() == 2
                and weight.device == device  # F.linear takes a "meta" weight with a CPU x (and returns garbage)
                and (bias is None or (bias.shape == weight.shape[:1] and bias.dtype == x.dtype
                                      and bias.device == device))
                and not _dispatch.overridden()
                and torch._C._len_torch_dispatch_stack() == 0
                and (_dispatch.CPP_AUTOGRAD or not torch.is_grad_enabled()
                     or not (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)))):
            try:
                out = F.linear(x, weight, bias)
            except RuntimeError:
                _check_args(x, weight, bias, "none")  # the named error for what F.linear refused
                raise
            _dispatch.record("linear", chosen)
            return out
    if _autocast.ANY() and isinstance(x, torch.Tensor) and _autocast.enabled(x.device):
        # As F.linear under autocast: every operand in its dtype (the plain short path above is F.linear).
        amp = _autocast.target(x.device)
        if amp and _autocast.castable(x, weight, bias):
            return _autocast.without(x.device, linear, *_autocast.cast(amp, x, weight, bias),
                                     activation=activation, backend=backend)
    # is_compiling() first: dynamo would otherwise guard on the set's contents, and the first eager
    # CUDA call that fills it would recompile every graph traced before (tests/test_compile.py).
    if (not torch.compiler.is_compiling() and activation == "gelu_tanh" and backend is None
            and type(x) in _PLAIN and x.device in _LT_GELU_TANH):
        out = _lt_gelu_tanh_call(x, weight, bias)
        if out is not None:
            return out
    activation = "none" if activation is None else activation
    if not _checks.linear_args_ok(x, weight, bias, activation):
        _check_args(x, weight, bias, activation)
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    backend = _dispatch.requested(backend)
    if not torch.compiler.is_compiling() and transformed():  # torch.func / forward AD: ATen's ops compose
        return reference.linear_ref(x, weight, bias, None if activation == "none" else activation, dtype=x.dtype)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if _tracing((x, weight, bias)):
        return linear_fwd_op(x, weight, bias, activation, needs_grad, backend)[0]
    k = weight.shape[1]
    addend = bias is not None and bias.dim() > 1
    chosen = _pick(x.device, backend, activation, x.numel() // k if k else 0, addend)
    if activation == "none" and backend == "auto" and not addend and x.device not in _ATEN_PLAIN:
        _learn_plain(x.device, chosen)
    elif activation == "gelu_tanh" and backend == "auto" and not addend and x.device not in _LT_GELU_TANH:
        _learn_lt_gelu_tanh(x.device, chosen)
    if chosen == "torch" or chosen == "cpu":
        if x.is_contiguous() and (not addend or x.dim() == 2) and (not needs_grad or _dispatch.CPP_AUTOGRAD):
            # ATen is the implementation: its own ops, and when training its own autograd nodes. A
            # contiguous N-D x reaches the same addmm inside F.linear, without two views here. A
            # strided x is made rows first (below), as the op path does: one addmm with the bias in
            # its epilogue, and the same GEMM (same bits) whichever path runs.
            out = F.linear(x, weight, bias)
            if activation != "none":
                approx = _GELU_APPROX[activation]
                out = F.gelu(out, approximate=approx) if needs_grad else torch._C._nn.gelu_(out, approximate=approx)
            _dispatch.record("linear", chosen)
            return out
    if not needs_grad:
        return _forward(x, weight, bias, activation, False, backend, chosen)[0]  # eager inference: no op dispatch
    if _dispatch.CPP_AUTOGRAD and x.numel():
        out = _train_with_cpp_nodes(x, weight, bias, activation, chosen)
        if out is not None:
            return out
    out, _ = linear_fwd_op(x, weight, bias, activation, needs_grad, backend)
    return out


def _lt_gelu_tanh_call(x, weight, bias) -> torch.Tensor | None:
    """The short path of a tanh-GELU call on a device in ``_LT_GELU_TANH``: one compiled op call,
    ``linear_lt_infer`` (no graph recorded) or ``linear_lt_train`` (a C++ autograd node), with the
    kernels and bits of the full path's cuBLASLt route. None where that route would not run them
    (an override, a tracer or a transform, a strided x or weight, an addend, an empty x, a training
    step the C++ node does not take) or the checks below fail: the full path decides and words
    the error. The op's own refusals (dtypes of x and weight, feature counts) are reworded."""
    device = x.device
    if not (type(weight) in _PLAIN and x.dtype in _checks.FLOAT_DTYPES and x.is_contiguous() and x.numel()
            and weight.dim() == 2 and weight.device == device and weight.stride(-1) == 1
            and (bias is None or (type(bias) in _PLAIN and bias.shape == weight.shape[:1] and bias.dtype == x.dtype
                                  and bias.device == device))
            and not _dispatch.overridden() and torch._C._len_torch_dispatch_stack() == 0 and not transformed()):
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        # _train_with_cpp_nodes' conditions for the node with the GELU in its epilogue
        if not (_dispatch.CPP_AUTOGRAD and x.dtype != torch.float32 and weight.shape[0] % 8 == 0
                and _dispatch.compiled_has_autograd("linear_lt_train", "cuda")):
            return None
        op = ops.linear_lt_train
    else:
        op = ops.linear_lt_infer
    try:
        out = op(x, weight, bias, 1)
    except RuntimeError:
        _check_args(x, weight, bias, "gelu_tanh")  # the named error for what the op refused
        raise
    _dispatch.record("linear", "cuda")
    return out


def _train_with_cpp_nodes(x, weight, bias, activation: str, chosen: str) -> torch.Tensor | None:
    """An eager training step whose autograd nodes are C++, where the Python node would run the same
    kernels: ATen's own ``linear`` (+ GELU) where ATen is the chosen implementation (a strided N-D
    x, which the Python node would copy to rows first, or an addend with an N-D x), or
    ``linear_lt_train`` (kernel_src/autograd_nodes/linear_lt_train.cpp) where the cuBLASLt path
    would run with the GELU in its epilogue, or with an addend. None: keep the Python node."""
    if chosen in ("torch", "cpu"):
        out = F.linear(rows(x), weight, rows(bias) if bias is not None and bias.dim() > 1 else bias)
        if activation != "none":
            out = F.gelu(out, approximate=_GELU_APPROX[activation])
        _dispatch.record("linear", chosen)
        return out.view(*x.shape[:-1], weight.shape[0])
    if chosen != "cuda" or not x.is_contiguous() or not _dispatch.compiled_has_autograd("linear_lt_train", "cuda"):
        return None
    if bias is not None and bias.dim() > 1:
        # An addend: cuBLASLt's C operand, then the GELU (either flavour) as ATen's pass on the output,
        # what _forward's cuBLASLt path does with one.
        if not bias.is_contiguous():
            return None
        out = ops.linear_lt_train(x, weight, bias, {"none": 0, "gelu_tanh": 1, "gelu": 2}[activation])
    elif activation == "none" or (x.dtype != torch.float32 and weight.shape[0] % 8 == 0):
        out = ops.linear_lt_train(x, weight, bias, 0 if activation == "none" else 1)
    else:
        return None
    _dispatch.record("linear", "cuda")
    return out


def _check_args(x, weight, bias, activation) -> None:
    """The named checks: each failure says which argument and what was expected."""
    _checks.tensor("x", x, min_ndim=1)
    _checks.tensor("weight", weight, ndim=2)
    _checks.same_dtype_device("x", x, weight=weight, bias=bias)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} input features (shape {tuple(x.shape)}) but weight "
                         f"expects {weight.shape[1]} (shape {tuple(weight.shape)})")
    if bias is not None:
        _checks.linear_bias("bias", bias, x, weight.shape[0])
    _checks.activation(activation)
