"""``linear(x, weight, bias, activation)``: a GEMM with the bias (and GELU) in its epilogue.

Forward: ``y = act(x @ weight.T + bias)`` in one kernel, any leading dims of ``x``. Backward:
``dx`` and ``dW`` as GEMMs, with the bias gradient reduced inside the ``dW`` kernel (Triton) or the
cuBLASLt BGRADB epilogue (CUDA), and GELU's derivative applied to the incoming gradient as it is
loaded, from the pre-activation saved by the forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _checks, _dispatch
from ._ops import ops
from ._opdef import custom_op
from ._views import rows
from .policy import backend_for
from .reference import gelu_grad

_GELU_APPROX = {"gelu": "none", "gelu_tanh": "tanh"}


def _pick(device: torch.device, backend: str, activation: str, m: int) -> str:
    backend = _dispatch.requested(backend)
    if backend == "auto":
        avail = _dispatch.available_backends(device)
        # cuBLASLt has only a tanh-GELU epilogue; exact GELU goes to Triton.
        if "cuda" in avail and _dispatch.cublaslt_enabled() and activation != "gelu":
            return "cuda"
        if device.type == "cuda":
            # Measured (policy_sm90.json): the split-K Triton GEMM at decode sizes, ATen's addmm
            # (cuBLASLt with the BIAS epilogue, the same fusion) above them.
            choice = backend_for("linear" if activation == "none" else "linear_act", device, "triton", m=m)
            if choice in avail:
                return choice
        for cand in ("triton", "cpu", "torch"):
            if cand in avail:
                return cand
    if backend == "cuda":
        _dispatch.check_available("linear", device, backend, needs_compiled=("linear_lt",))
        if not _dispatch.cublaslt_enabled():
            raise ValueError("backend 'cuda' for linear (cuBLASLt) is opt-in: set FUSED_GEGLU_CUBLASLT=1")
        if activation == "gelu":
            raise ValueError("backend 'cuda' (cuBLASLt) has no exact-GELU epilogue; use activation="
                             "'gelu_tanh' or backend='triton'")
    else:
        _dispatch.check_available("linear", device, backend)
    return backend


def _aten_forward(x2, weight, bias, activation, preact):
    y = torch.addmm(bias, x2, weight.t()) if bias is not None else x2 @ weight.t()
    if activation == "none":
        return y
    if preact is not None:
        preact.copy_(y)
    return F.gelu(y, approximate=_GELU_APPROX[activation])


@custom_op("linear_fwd_op", mutates_args=())
def linear_fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
                  save_preact: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = rows(x)
    m, n = x2.shape[0], weight.shape[0]
    backend = _pick(x.device, backend, activation, m)
    keep = save_preact and activation != "none"
    preact = torch.empty((m, n) if keep else (0,), dtype=x.dtype, device=x.device)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m > 0:
        if backend == "triton":
            from .triton_kernels import linear as tk

            tk.linear_fwd(out, x2, weight, bias, activation, preact if keep else None)
        elif backend == "cuda":
            if keep and n % 8:
                # cuBLASLt's aux output (the saved pre-activation) needs a 16-byte-aligned leading
                # dimension; for other widths the BIAS epilogue writes it and GELU is a second pass.
                ops.linear_lt(preact, x2, weight, bias, 0, None)
                out.copy_(F.gelu(preact, approximate=_GELU_APPROX[activation]))
            else:
                ops.linear_lt(out, x2, weight, bias, 0 if activation == "none" else 1, preact if keep else None)
        else:
            out.copy_(_aten_forward(x2, weight, bias, activation, preact if keep else None))
    _dispatch.record("linear", backend)
    return out.view(*x.shape[:-1], n), preact


@linear_fwd_op.register_fake
def _(x, weight, bias, activation, save_preact, backend):
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    keep = save_preact and activation != "none"
    n = weight.shape[0]
    return x.new_empty((*x.shape[:-1], n)), x.new_empty((m, n) if keep else (0,))


@custom_op("linear_bwd_op", mutates_args=())
def linear_bwd_op(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, preact: torch.Tensor,
                  has_bias: bool, activation: str, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g2, x2 = rows(grad_out), rows(x)
    backend = _pick(x.device, backend, activation, x2.shape[0])
    n, k = weight.shape
    dx = torch.empty((x2.shape[0], k), dtype=x.dtype, device=x.device)
    dw = torch.empty((n, k), dtype=weight.dtype, device=weight.device)
    db = torch.empty((n,) if has_bias else (0,), dtype=weight.dtype, device=weight.device)
    if x2.shape[0] == 0:
        dw.zero_()
        db.zero_()
    elif backend == "triton":
        from .triton_kernels import linear as tk

        pre = preact if activation != "none" else None
        tk.linear_bwd_input(dx, g2, weight, pre, activation)
        db32 = torch.empty((n,), dtype=torch.float32, device=x.device) if has_bias else None
        tk.linear_bwd_weight(dw, db32, g2, x2, pre, activation)
        if has_bias:
            db.copy_(db32)
    else:
        g = g2
        if activation != "none":
            g = (g2.float() * gelu_grad(preact.float(), _GELU_APPROX[activation])).to(x.dtype)
        torch.mm(g, weight, out=dx)
        if backend == "cuda" and _dispatch.cublaslt_enabled():
            ops.linear_lt_bwd_weight(dw, db if has_bias else None, g, x2)  # BGRADB epilogue
        else:
            torch.mm(g.t(), x2, out=dw)
            if has_bias:
                db.copy_(g.float().sum(0))
    return dx.view(*x.shape), dw, db


@linear_bwd_op.register_fake
def _(grad_out, x, weight, preact, has_bias, activation, backend):
    n = weight.shape[0]
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty((n,) if has_bias else (0,))


def _setup(ctx, inputs, output):
    x, weight, bias, activation, save_preact, backend = inputs
    _, preact = output
    ctx.save_for_backward(x, weight, preact)
    ctx.has_bias, ctx.activation, ctx.backend = bias is not None, activation, backend


def _backward(ctx, grad_out, _grad_preact):
    x, weight, preact = ctx.saved_tensors
    dx, dw, db = linear_bwd_op(grad_out.contiguous(), x, weight, preact, ctx.has_bias, ctx.activation, ctx.backend)
    return dx, dw, (db if ctx.has_bias else None), None, None, None


linear_fwd_op.register_autograd(_backward, setup_context=_setup)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None, backend: str | None = None) -> torch.Tensor:
    """``act(x @ weight.T + bias)`` with the bias and activation applied in the GEMM epilogue.

    x: [..., K]; weight: [N, K] (``nn.Linear`` layout); bias: [N] or None; activation: None,
    ``"gelu"`` (exact) or ``"gelu_tanh"``. Differentiable in x, weight and bias.
    """
    _checks.tensor("x", x, min_ndim=1)
    _checks.tensor("weight", weight, ndim=2)
    _checks.same_dtype_device("x", x, weight=weight, bias=bias)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} input features (shape {tuple(x.shape)}) but weight "
                         f"expects {weight.shape[1]} (shape {tuple(weight.shape)})")
    if bias is not None:
        _checks.tensor("bias", bias)
        _checks.shape("bias", bias, (weight.shape[0],), "weight.shape[0]")
    activation = _checks.activation(activation)
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias))
    out, _ = linear_fwd_op(x, weight, bias, activation, needs_grad, _dispatch.requested(backend))
    return out
