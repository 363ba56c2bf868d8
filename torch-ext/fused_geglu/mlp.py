"""``geglu_mlp``: the whole ``down(gelu(gate(x)) * up(x))`` block, forward and backward.

Paths (``last_backend("geglu_mlp")`` names the one that ran):
- ``"triton"``: one gate+up kernel reads each x tile once for both weights and writes only
  ``h`` (plus the gate/up pre-activations when training); the down GEMM adds its bias in the
  epilogue. Backward: the ``dh = dy @ W_down`` GEMM computes dgate/dup in its epilogue and
  re-emits ``h`` for ``dW_down``, so ``h`` is never saved.
- ``"cuda:sm90"`` (Hopper): the CUTLASS gate+up GEMM with the GeGLU epilogue
  (``kernel_src/gemm_sm90``), reading both weights where they are, then the down GEMM;
  when training it also writes the gate/up pre-activations the backward needs.
- ``"<pointwise>+gemm"`` (``"cuda+gemm"``, ``"cpu+gemm"``, ``"torch+gemm"``): vendor GEMMs
  (cuBLAS / ATen) around this project's GeGLU pointwise kernel. The auto policy on CUDA uses it
  wherever measurements say the fused kernel would lose (``configs``' dispatch table). With the
  CUDA pointwise kernel the forward, the training forward and (up to ``ONE_CALL_BWD_MAX_ELEMS``)
  the backward are each one compiled call (``kernel_src/geglu_cuda/mlp_gemm.cpp``).

Saved for backward: x, and the gate/up pre-activations (``2·M·I`` values), or nothing but x
with ``recompute=True`` (one more gate+up GEMM in the backward). The backward turns the saved
pre-activations into their gradients in place, so it holds at most one more ``M·I`` buffer, and
frees each as soon as its last GEMM has read it; a second backward through the same graph
(``retain_graph=True``) is refused with an error rather than computed from overwritten values.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn.functional as F

from . import _autocast, _checks, _dispatch, policy, reference
from . import geglu as _geglu
from . import sm90_weights
from ._ops import HAS_COMPILED_OPS, ops
from ._opdef import _PLAIN, _tracing, custom_op, transformed
from ._views import rows


# The auto route on CUDA tensors in a build without the compiled CUDA library (the noarch torch-cuda
# build, which every CUDA torch without a compiled variant loads): ATen's GEMMs (cuBLAS) around the
# pointwise kernel auto picks (Triton's, or ATen's), the "cuda" route's structure with what this
# build has. Until 2026-12-05 such builds ran the fused Triton MLP at every size, which the H200
# measured 5-20 % slower than eager at M = 8192 and up to 1.4x at M = 1024 ("ours-triton" rows of
# the harness); that kernel keeps the sizes where it won (decode under CUDA-graph capture).
GEMM_ROUTE = "gemm"


def _pick(device: torch.device, backend: str, m: int, h: int, i: int, capturing: int | None = None) -> str:
    """``backend`` is already resolved by ``_dispatch.requested``. Under auto on CUDA tensors the
    answer may be ``GEMM_ROUTE``, which is not a backend a caller can name."""
    if backend == "auto":
        if device.type == "cuda":
            choice = policy.mlp_backend_for(m, h, i, device, capturing)  # measured: policy_sm90.json
            if _dispatch.has_backend(device, choice):
                return choice
            return GEMM_ROUTE  # "cuda" without the compiled library, or "triton" without Triton
        return "cpu" if _dispatch.has_backend(device, "cpu") else "torch"
    _dispatch.check_available("geglu_mlp", device, backend)
    return backend


# (device, M, H, I, capturing) -> (backend, pointwise) of an auto call: the policy walks below once per
# size rather than on every call (in the noarch build, where no compiled call hides it, an eager call
# waits on this host time).
_auto_routes: dict[tuple, tuple[str, str]] = {}


def _auto_route(key: tuple) -> tuple[str, str]:
    """``(backend, pointwise)`` for an auto call: ``_pick``'s backend, and the pointwise kernel the
    vendor-GEMM route runs between its GEMMs (whichever measured faster at this size: geglu_fwd's
    rules). From 14abf27 to f9bebc9 the noarch route took ATen's pointwise for forwards of at most 1M
    M x I elements outside capture, when Triton's launcher cost more host time than ATen's three calls;
    with the pointwise kernels launched through ``triton_kernels/launch.py`` Triton's is the cheaper
    on the host as well (H100, M = 16: 49-50 against 56-57 µs of host time per MLP call, CUDA-event span
    60 / 85 / 120 against 68 / 96 / 130 µs; ``benchmarks/RESULTS.md``, "Triton launches and the noarch
    route's host time")."""
    device, m, h, i, capturing = key
    backend = _pick(device, "auto", m, h, i, capturing)
    pointwise = _geglu._pick(device, "auto", "fwd", m * i, True) if backend in ("cuda", GEMM_ROUTE) else backend
    return _dispatch.remember(_auto_routes, key, (backend, pointwise))


def _sm90_launch(m: int, h: int, device: torch.device, save_preact: bool, capturing: int | None,
                 auto: bool) -> tuple[bool, str | None]:
    """Whether the CUDA backend runs the CUTLASS gate+up GEMM at this size, and with which launch:
    under the auto policy only where the policy names a launch; for a forced backend everywhere, with
    the forced rules' launch where the policy names none (None: the op's own size heuristic). The
    callers check first that the compiled op exists and takes these operands."""
    launch = policy.sm90_mlp_launch(m, h, device, save_preact, capturing)
    if launch is not None:
        return True, launch
    return (False, None) if auto else (True, policy.sm90_forced_launch(m, h, device))


# Pointwise backends whose forward kernel may write h over gate: each element is read by the
# thread (or program) that later overwrites it, loads first, and neither declares the operands
# restrict (the C++ CPU loop does, so it gets its own buffer).
_H_OVER_GATE = ("cuda", "triton", "torch")


# The cuBLAS + pointwise sequences (forward, training forward, backward) are issued from one compiled
# call each (kernel_src/geglu_cuda/mlp_gemm.cpp): the same kernels in the same order as the Python
# sequences below, minus their interpreter and dispatcher time, which is what a decode step or a
# small training step waits on. $FUSED_GEGLU_ONE_CALL=0 (read at load) issues them from Python, for
# measuring; the GPU tests switch this flag to compare the two bit for bit.
ONE_CALL = os.environ.get("FUSED_GEGLU_ONE_CALL", "1").strip().lower() not in ("0", "no", "off", "false")
# Called from Python, the compiled in-place backward cannot free gate/up early (the caller holds them
# until it returns), where the Python sequence frees dgate before allocating dW_up: one M x I buffer
# more at the step's peak. Below this many M x I elements (32 MB in bf16; M = 1024 at Gemma-2B's width)
# that is small beside the weight gradients and host time matters; above it the GEMMs dominate and
# memory is the concern. The bound does not apply where the backward may free them: the C++ training
# node (it hands over the only references, unless saved-tensor hooks hold them) and the traced
# backward (``geglu_mlp_gemm_bwd_keep``: it leaves gate/up alone and frees its own buffers in order).
ONE_CALL_BWD_MAX_ELEMS = 1 << 24
# Where an eager training step would run those compiled calls (or, on Hopper, the CUTLASS gate+up
# forward before the compiled backward), the whole step goes to ``geglu_mlp_train``, whose autograd
# node is C++ (kernel_src/autograd_nodes/mlp_train.cpp; ``_dispatch.CPP_AUTOGRAD``). On CPU tensors the
# CPU variant's node runs the ATen GEMMs around the CPU pointwise kernels.
_GEMM_POINTWISE = (-2, 1, 0)  # geglu_mlp_train's launch arguments for the vendor-GEMM forward


def _gemm_forward(x2, wg, wu, wd, bg, bu, bd, approximate, pointwise, keep_preact: bool):
    """``(y, gate, up)``. Without ``keep_preact`` h is written over gate (gate is dead once h
    exists), so the forward holds two M x I buffers instead of three; gate/up are then None."""
    if pointwise == "cuda" and ONE_CALL:
        code = 0 if approximate == "none" else 1
        if not keep_preact and _dispatch.compiled_has("geglu_mlp_gemm", "cuda"):
            return ops.geglu_mlp_gemm(x2, wg, wu, wd, bg, bu, bd, code), None, None
        if keep_preact and _dispatch.compiled_has("geglu_mlp_gemm_train", "cuda"):
            return ops.geglu_mlp_gemm_train(x2, wg, wu, wd, bg, bu, bd, code)
    # F.linear on 2-D input with a bias is addmm (cuBLASLt's BIAS epilogue on CUDA); it also skips
    # the Python-level ``Tensor.__matmul__`` wrapper that ``a @ w.t()`` goes through.
    gate, up = F.linear(x2, wg, bg), F.linear(x2, wu, bu)
    h = torch.empty_like(gate) if keep_preact or pointwise not in _H_OVER_GATE else gate
    _geglu._fwd_into(h, gate, up, approximate, pointwise)
    if not keep_preact:
        gate = up = None  # up is freed here, before the down GEMM allocates y
    return F.linear(h, wd, bd), gate, up


def _forward(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate: str, save_preact: bool,
             backend: str):
    """The forward on real tensors: ``(y, gate, up)``, gate/up None unless ``save_preact``.
    ``backend`` is already resolved by ``_dispatch.requested`` ("auto" or a backend name)."""
    x2 = rows(x)
    m, (i, h) = x2.shape[0], w_gate.shape
    auto = backend == "auto"
    device = x.device
    if auto:
        # Every rule below depends on graph capture: one driver query per call serves them.
        capturing = policy.capturing(device)
        key = (device, m, h, i, capturing)
        backend, pointwise = _auto_routes.get(key) or _auto_route(key)
    else:
        capturing = None
        backend = pointwise = _pick(device, backend, m, h, i)
    gate = up = None
    if m == 0:
        y = x2.new_empty((0, h))
    elif backend == "triton":
        from .triton_kernels import linear as tk_linear
        from .triton_kernels import mlp as tk_mlp

        hid = torch.empty((m, i), dtype=x.dtype, device=device)
        if save_preact:
            gate = torch.empty((m, i), dtype=x.dtype, device=device)
            up = torch.empty((m, i), dtype=x.dtype, device=device)
        # Decode: the down GEMM's split-K slices are summed by its own last program per tile, on
        # counters the gate+up kernel zeroes (no reduction kernel, no memset).
        counters = (torch.empty(tk_linear.splitk_counters(m, h), dtype=torch.int32, device=device)
                    if m <= tk_linear.FUSED_REDUCE_MAX_M else None)
        tk_mlp.gateup_fwd(hid, x2, w_gate, w_up, b_gate, b_up, approximate, gate, up, zero_out=counters)
        y = torch.empty((m, h), dtype=x.dtype, device=device)
        tk_linear.linear_fwd(y, hid, w_down, b_down, "none", None, tile_counters=counters)
    elif backend == "cuda" and _dispatch.compiled_has("geglu_gateup_sm90", "cuda") \
            and sm90_weights.usable(x2, w_gate, w_up) \
            and (sm90 := _sm90_launch(m, h, device, save_preact, capturing, auto))[0]:
        # Hopper: CUTLASS gate+up GEMM with the GeGLU epilogue (the tile and tile order the policy
        # measured best at this size; where a forced backend runs it outside the policy's sizes, the
        # launch that lost least there, or the op's own heuristic), then cuBLAS down. Training also
        # takes gate/up from it.
        launch = sm90[1]
        if save_preact or not _dispatch.compiled_has("geglu_mlp_sm90", "cuda"):
            hid, gate, up = sm90_weights.gateup_sm90(ops, x2, w_gate, w_up, b_gate, b_up, approximate, launch,
                                                     save_preact)
            y = F.linear(hid, w_down, b_down)
        else:  # inference: both GEMMs from one compiled call (host time is what decode waits on)
            y = sm90_weights.mlp_sm90(ops, x2, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, launch)
        backend = "cuda:sm90"
    else:
        # pointwise: under auto, the one _auto_route picked for the vendor-GEMM route; a forced backend
        # runs its own.
        y, gate, up = _gemm_forward(x2, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, pointwise,
                                    save_preact)
        backend = f"{pointwise}+gemm"
    _dispatch.record("geglu_mlp", backend)
    return (y if x.dim() == 2 else y.view(*x.shape[:-1], h)), gate, up


@custom_op("geglu_mlp_fwd_op", mutates_args=())
def geglu_mlp_fwd_op(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                     b_gate: torch.Tensor | None, b_up: torch.Tensor | None, b_down: torch.Tensor | None,
                     approximate: str, save_preact: bool, backend: str
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, gate, up = _forward(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, save_preact,
                           _dispatch.requested(backend))
    # Outputs of a custom op may not alias each other: a fresh placeholder for each missing one.
    return y, (gate if gate is not None else x.new_empty((0,))), (up if up is not None else x.new_empty((0,)))


@geglu_mlp_fwd_op.register_fake
def _(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, save_preact, backend):
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    i, h = w_gate.shape
    pre = (m, i) if save_preact else (0,)
    return x.new_empty((*x.shape[:-1], h)), x.new_empty(pre), x.new_empty(pre)


def _mlp_backward(grad_y, x, w_gate, w_up, w_down, b_gate, b_up, preact: list, approximate: str,
                  recompute: bool, has_b_down: bool, backend: str, inplace: bool):
    """The backward. ``preact`` is ``[gate, up]``, the saved pre-activations; the list is emptied
    so that this function holds the only references it was given. ``inplace``: overwrite gate/up
    with their gradients and free each as soon as its last GEMM has read it (eager autograd only,
    see ``_backward``); otherwise leave them as they are (a traced graph's values) and write the
    gradients to buffers of their own."""
    gate, up = preact
    preact.clear()
    x2, dy = rows(x), rows(grad_y)
    m, (i, h) = x2.shape[0], w_gate.shape
    requested = _dispatch.requested(backend)
    backend = _pick(x.device, requested, m, h, i)
    dt, dev = x.dtype, x.device
    if m == 0:
        zeros = [torch.zeros_like(w) for w in (w_gate, w_up, w_down)]
        biases = [torch.zeros((n,), dtype=dt, device=dev) if present else x.new_empty((0,))
                  for n, present in ((i, b_gate is not None), (i, b_up is not None), (h, has_b_down))]
        return (torch.empty_like(x), *zeros, *biases)
    # Order and aliasing keep the peak at three M x I buffers (the saved gate/up and one more):
    # dgate / dup overwrite gate / up in place, and h is written over the buffer it is made from.
    # Where gate/up must be kept (``fresh``), the kernels that can write the gradients elsewhere do
    # (one pass, no copies: the compiled training step's backward); the others get copies.
    fresh = not inplace and not recompute
    if recompute:
        gate = up = None  # the placeholders; fresh buffers below
    if backend == "triton":
        from .triton_kernels import mlp as tk_mlp

        hid = torch.empty((m, i), dtype=dt, device=dev)
        if recompute:
            gate = torch.empty((m, i), dtype=dt, device=dev)
            up = torch.empty((m, i), dtype=dt, device=dev)
            tk_mlp.gateup_fwd(hid, x2, w_gate, w_up, b_gate, b_up, approximate, gate, up)
        dgate, dup = (torch.empty_like(gate), torch.empty_like(up)) if fresh else (gate, up)
        # dh stays on chip; its epilogue writes dgate/dup (over gate/up unless fresh) and re-emits h.
        tk_mlp.dh_bwd(dgate, dup, None if recompute else hid, dy, w_down, gate, up, approximate)
        _dispatch.record("geglu_mlp_backward", "triton")
    else:
        if recompute:
            gate, up = F.linear(x2, w_gate, b_gate), F.linear(x2, w_up, b_up)
        # The policy (cached) first: the operand checks run only where it names a launch.
        launch = sm90_weights.dh_launch(policy.sm90_dh_launch(m, h, dev)) if backend == "cuda" else None
        if launch is not None and not (_dispatch.compiled_has("geglu_dh_sm90", "cuda")
                                       and sm90_weights.dh_usable(dy, w_down, gate, up)):
            launch = None
        pointwise = None
        if launch is None:
            # As in the forward: under the auto policy the pointwise is whichever measured faster.
            pointwise = _geglu._pick(dev, "auto", "bwd_inplace", m * i, True) \
                if requested == "auto" and backend in ("cuda", GEMM_ROUTE) else backend
        # One compiled call: in place up to the element bound (see ONE_CALL_BWD_MAX_ELEMS); the
        # keep form, which frees its own buffers in order, at any size.
        one_call = (pointwise == "cuda" and ONE_CALL and (fresh or m * i <= ONE_CALL_BWD_MAX_ELEMS)
                    and _dispatch.compiled_has("geglu_mlp_gemm_bwd_keep" if fresh else "geglu_mlp_gemm_bwd", "cuda"))
        if fresh and launch is not None:
            gate, up = gate.clone(), up.clone()  # the sm90 dh kernel works in place only
        if launch is not None:
            # Hopper: dh = dy @ w_down stays in registers; the GEMM's epilogue turns gate/up into
            # dgate/dup in place and writes h (kernel_src/gemm_sm90/geglu_dh_sm90.h).
            hid = torch.empty((m, i), dtype=dt, device=dev)
            ops.geglu_dh_sm90(gate, up, hid, dy, w_down, 0 if approximate == "none" else 1, *launch)
            dgate, dup = gate, up
        elif one_call:
            # The sequence below from one compiled call (same kernels, same order, same bits); where
            # gate/up must be kept, the form that writes the gradients to buffers of its own.
            run = ops.geglu_mlp_gemm_bwd_keep if fresh else ops.geglu_mlp_gemm_bwd
            dx, *grads = run(dy, x2, w_gate, w_up, w_down, gate, up, 0 if approximate == "none" else 1,
                             b_gate is not None, b_up is not None, has_b_down)
            _dispatch.record("geglu_mlp_backward", "cuda")
            return (dx.view(x.shape), *grads)
        else:
            hid = dy @ w_down  # dh, turned into h by the pointwise below
            if fresh:
                dgate, dup = torch.empty_like(gate), torch.empty_like(up)
                _geglu._bwd_h(dgate, dup, hid, gate, up, approximate, pointwise)
            else:
                _geglu._bwd_inplace(gate, up, hid, approximate, pointwise)
                dgate, dup = gate, up
        _dispatch.record("geglu_mlp_backward", "cuda:sm90" if launch is not None
                         else f"{pointwise}+gemm" if backend == GEMM_ROUTE else backend)
    del gate, up  # dgate/dup hold the buffers still needed (the same ones unless fresh)
    d_w_down = dy.t() @ hid
    del hid
    dx = dgate @ w_gate
    dx.addmm_(dup, w_up)
    # Each M x I gradient goes as soon as its last reader has run: with all three weight
    # gradients and dx allocated, only dup is still alive (Gemma2-9B at M = 8192: the step's
    # peak was here, gate + up + dx + three dW).
    d_w_gate = dgate.t() @ x2
    db_gate = dgate.sum(0, dtype=torch.float32).to(dt) if b_gate is not None else x.new_empty((0,))
    del dgate
    d_w_up = dup.t() @ x2
    db_up = dup.sum(0, dtype=torch.float32).to(dt) if b_up is not None else x.new_empty((0,))
    del dup
    db_down = dy.sum(0, dtype=torch.float32).to(dt) if has_b_down else x.new_empty((0,))
    return dx.view(x.shape), d_w_gate, d_w_up, d_w_down, db_gate, db_up, db_down


@custom_op("geglu_mlp_bwd_op", mutates_args=())
def geglu_mlp_bwd_op(grad_y: torch.Tensor, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                     w_down: torch.Tensor, b_gate: torch.Tensor | None, b_up: torch.Tensor | None,
                     gate: torch.Tensor, up: torch.Tensor, approximate: str, recompute: bool,
                     has_b_down: bool, backend: str
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                torch.Tensor, torch.Tensor]:
    """The backward as a functional op, for graphs (torch.compile): the saved pre-activations are
    graph values it must not overwrite."""
    return _mlp_backward(grad_y, x, w_gate, w_up, w_down, b_gate, b_up, [gate, up], approximate,
                         recompute, has_b_down, backend, inplace=False)


@geglu_mlp_bwd_op.register_fake
def _(grad_y, x, w_gate, w_up, w_down, b_gate, b_up, gate, up, approximate, recompute, has_b_down, backend):
    i, h = w_gate.shape
    return (x.new_empty(x.shape), w_gate.new_empty(w_gate.shape), w_up.new_empty(w_up.shape),
            w_down.new_empty(w_down.shape),
            x.new_empty((i,) if b_gate is not None else (0,)),
            x.new_empty((i,) if b_up is not None else (0,)),
            x.new_empty((h,) if has_b_down else (0,)))


def _setup(ctx, inputs, output):
    x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, save_preact, backend = inputs
    _, gate, up = output
    ctx.preact_on_ctx = getattr(ctx, "private_saved", False) and not _saved_tensor_hooks_active()
    if ctx.preact_on_ctx:
        # Eager autograd with no saved-tensor hooks: gate/up are this node's own buffers (never
        # handed out, no grad_fn, so no reference cycle), kept on ctx rather than saved so that the
        # backward can free them part-way (saved tensors live until the backward returns). Under
        # hooks (activation checkpointing, offloading) they are saved, so the hooks see them.
        ctx.save_for_backward(x, w_gate, w_up, w_down, b_gate, b_up)
        ctx.preact = [gate, up]
    else:
        ctx.save_for_backward(x, w_gate, w_up, w_down, b_gate, b_up, gate, up)
    ctx.approximate, ctx.backend = approximate, backend
    ctx.recompute = not save_preact
    ctx.has_bias = (b_gate is not None, b_up is not None, b_down is not None)


def _saved_tensor_hooks_active() -> bool:
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is None or top(False) is not None  # unknown: assume hooks, keep them in charge


def _backward(ctx, grad_y, _g_gate, _g_up):
    if getattr(ctx, "preact_consumed", False):
        raise RuntimeError(
            "geglu_mlp: a second backward through the same graph is not supported: the first one turned "
            "the saved gate/up pre-activations into their gradients in place (memory). Call "
            "geglu_mlp(..., recompute=True) (a kernelized model: its modules' own forward) to run backward "
            "through one graph more than once (retain_graph=True).")
    on_ctx = getattr(ctx, "preact_on_ctx", False)
    if on_ctx:
        x, w_gate, w_up, w_down, b_gate, b_up = ctx.saved_tensors
        preact = ctx.preact
    else:
        x, w_gate, w_up, w_down, b_gate, b_up, gate, up = ctx.saved_tensors
        preact = [gate, up]
        del gate, up
    head = (grad_y.contiguous(), x, w_gate, w_up, w_down, b_gate, b_up)
    tail = (ctx.approximate, ctx.recompute, ctx.has_bias[2], ctx.backend)
    if _tracing(head) or not getattr(ctx, "private_saved", False):
        dx, dwg, dwu, dwd, dbg, dbu, dbd = geglu_mlp_bwd_op(*head, *preact, *tail)
    elif ctx.recompute:  # nothing saved but x: the graph can be differentiated again
        dx, dwg, dwu, dwd, dbg, dbu, dbd = _mlp_backward(*head, list(preact), *tail, inplace=True)
    else:
        # Eager autograd through geglu_mlp: the saved gate/up were never handed to the caller
        # (DualOp private outputs), so they are this graph's own buffers; the backward turns them
        # into dgate/dup in place (two M x I buffers fewer at the peak) and, when they are kept on
        # ctx, frees each as soon as it is used up (ctx lets go, _mlp_backward empties the list
        # it is given). Either way a second backward through the graph (retain_graph=True) is
        # refused above instead of reading gradients as pre-activations; autograd's own
        # saved-tensor version check would not catch it under saved-tensor hooks.
        ctx.preact_consumed = True
        if on_ctx:
            ctx.preact = None
        dx, dwg, dwu, dwd, dbg, dbu, dbd = _mlp_backward(*head, preact, *tail, inplace=True)
    bg, bu, bd = ctx.has_bias
    return (dx, dwg, dwu, dwd, dbg if bg else None, dbu if bu else None, dbd if bd else None,
            None, None, None)


geglu_mlp_fwd_op.register_autograd(_backward, setup_context=_setup, private_outputs=(1, 2))


def _check_args(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate) -> None:
    """The named checks: each failure says which argument and what was expected."""
    _checks.tensor("x", x, min_ndim=1)
    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        _checks.tensor(name, w, ndim=2)
    _checks.same_dtype_device("x", x, w_gate=w_gate, w_up=w_up, w_down=w_down, b_gate=b_gate, b_up=b_up,
                              b_down=b_down)
    i, h = w_gate.shape
    if x.shape[-1] != h:
        raise ValueError(f"x has {x.shape[-1]} features (shape {tuple(x.shape)}) but w_gate expects {h} "
                         f"(shape {tuple(w_gate.shape)})")
    _checks.shape("w_up", w_up, (i, h), "same as w_gate")
    _checks.shape("w_down", w_down, (h, i), "(hidden, intermediate) = w_gate.T's shape")
    for name, b, n in (("b_gate", b_gate, i), ("b_up", b_up, i), ("b_down", b_down, h)):
        if b is not None:
            _checks.tensor(name, b)
            _checks.shape(name, b, (n,), "one per output feature")
    _checks.approximate(approximate)


def _cpp_training_launch(x, w_gate, w_up, backend: str):
    """``((tile, swizzle, raster), forward name, backward name)`` where an eager training step with
    saved pre-activations may run as ``geglu_mlp_train`` (the launch the Python path would take,
    with the compiled one-call backward), else None. ``backend`` is resolved ("auto" or a name)."""
    device = x.device
    if not (_dispatch.CPP_AUTOGRAD and ONE_CALL and x.is_contiguous() and _dispatch.compiled_has_autograd(
            "geglu_mlp_train", device.type)):
        return None
    i, h = w_gate.shape
    m = x.numel() // h if h else 0
    if m == 0:
        return None
    # Up to the element bound only where saved-tensor hooks hold gate/up (the node frees them part-way
    # otherwise, kernel_src/autograd_nodes/mlp_train.cpp).
    if device.type == "cuda" and m * i > ONE_CALL_BWD_MAX_ELEMS and _saved_tensor_hooks_active():
        return None
    capturing = policy.capturing(device) if backend == "auto" and device.type == "cuda" else None
    return _training_launch(device, backend, m, h, i, capturing,
                            lambda: sm90_weights.usable(x.view(m, h), w_gate, w_up))


def _training_launch(device: torch.device, backend: str, m: int, h: int, i: int, capturing: int | None,
                     sm90_takes: Callable[[], bool]):
    """The C++ training node's sequence at these sizes (``_cpp_training_launch``'s result), for the
    eager node and for a traced step's plan alike; ``sm90_takes()``: whether the CUTLASS gate+up GEMM
    takes the operands (asked only where its launch would run)."""
    if device.type == "cpu":
        return (_GEMM_POINTWISE, "cpu+gemm", "cpu") if _pick(device, backend, m, h, i) == "cpu" else None
    auto = backend == "auto"
    if auto and capturing is not None:  # the policy's pick, remembered per size (as _forward's)
        key = (device, m, h, i, capturing)
        picked = (_auto_routes.get(key) or _auto_route(key))[0]
    else:
        picked = _pick(device, backend, m, h, i, capturing)
    # The backward must be the one-call sequence: no sm90 dh launch and (under the auto policy) the
    # CUDA in-place pointwise kernel.
    if (picked != "cuda"
            or sm90_weights.dh_launch(policy.sm90_dh_launch(m, h, device)) is not None
            or (auto and _geglu._pick(device, "auto", "bwd_inplace", m * i, True) != "cuda")):
        return None
    if _dispatch.compiled_has("geglu_gateup_sm90", "cuda") and sm90_takes():
        run, launch = _sm90_launch(m, h, device, True, capturing, auto)
        if run:
            return sm90_weights.parse_launch(launch), "cuda:sm90", "cuda"
    if auto and _geglu._pick(device, "auto", "fwd", m * i, True) != "cuda":
        return None
    return _GEMM_POINTWISE, "cuda+gemm", "cuda"


# ---- eager inference: one compiled call ---------------------------------------------------------
# A call with no graph to record and the auto policy runs, per size, one of two compiled sequences
# (sm90 gate+up + cuBLAS down, or cuBLAS / ATen GEMMs around the compiled pointwise). geglu_mlp_infer
# (kernel_src/autograd_nodes/mlp_infer.cpp) runs either from one op call, with the per-call checks in
# C++; here remains what C++ cannot see (tensor subclasses, tracing, environment overrides) and the
# plan: which sequence ``_forward`` would pick at this size, remembered per (device, dtype, x.numel(),
# w_gate.shape) for both graph-capture states (the policy may pick differently under capture).

_infer_plans: dict[tuple, tuple] = {}
_NO_PLANS = (None, None)


def _infer_plan(device: torch.device, dtype: torch.dtype, m: int, h: int, i: int, capturing: int):
    """``(label, tile, swizzle, raster)``: what ``_forward`` runs for an auto, no-graph call on a
    contiguous x of these sizes when its operands are ones the sequence takes, as
    geglu_mlp_infer's launch arguments; None where it runs anything else (Triton)."""
    if m == 0 or i == 0 or not ONE_CALL or not _dispatch.compiled_has_autograd("geglu_mlp_infer", device.type):
        return None  # geglu_mlp_infer declines an empty intermediate: the general path has it
    backend = _pick(device, "auto", m, h, i, capturing)
    if device.type == "cpu":
        return ("cpu+gemm", *_GEMM_POINTWISE) if backend == "cpu" else None
    if backend != "cuda":
        return None
    # sm90_weights.usable's conditions that hold for every call with this key; the ones on pointers
    # and strides are geglu_mlp_infer's to check (it declines, and the general path runs).
    if (_dispatch.compiled_has("geglu_mlp_sm90", "cuda") and dtype in (torch.bfloat16, torch.float16)
            and i % 8 == 0 and h % 8 == 0 and policy.device_capability(device) == (9, 0)):
        run, launch = _sm90_launch(m, h, device, False, capturing, True)
        if run:
            return ("cuda:sm90", *sm90_weights.parse_launch(launch))
    if _geglu._pick(device, "auto", "fwd", m * i, True) == "cuda" and _dispatch.compiled_has("geglu_mlp_gemm", "cuda"):
        return ("cuda+gemm", *_GEMM_POINTWISE)
    return None


def _infer_plans_for(x: torch.Tensor, w_gate: torch.Tensor, key: tuple) -> tuple:
    """Both capture states' plans for ``key``, remembered; none for a call the general path must
    check (w_gate not 2-D, x's features not w_gate's), and then nothing is remembered."""
    if w_gate.dim() != 2 or x.dim() < 1:
        return _NO_PLANS
    i, h = w_gate.shape
    if x.shape[-1] != h or h == 0 or x.device.type not in ("cuda", "cpu"):
        return _NO_PLANS
    m = x.numel() // h
    plans = tuple(_infer_plan(x.device, x.dtype, m, h, i, capturing) for capturing in (0, 1))
    if x.device.type == "cpu":
        plans = (plans[0], plans[0])
    _dispatch.remember(_infer_plans, key, plans)
    return plans


def _infer(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate):
    """y from geglu_mlp_infer, or None where the general path must run: a tensor subclass or a
    tracer, no plan at this size, or a call the op declines (it needs a graph, or its operands are
    not ones the planned sequence takes; the general path then also makes the named checks)."""
    code = 1 if approximate == "tanh" else 0 if approximate == "none" else None
    if (code is None or type(x) not in _PLAIN or type(w_gate) not in _PLAIN or type(w_up) not in _PLAIN
            or type(w_down) not in _PLAIN or (b_gate is not None and type(b_gate) not in _PLAIN)
            or (b_up is not None and type(b_up) not in _PLAIN) or (b_down is not None and type(b_down) not in _PLAIN)
            or torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()):
        return None
    # A call that records a graph: the op would decline it (after its dispatch), so do not ask. The
    # H100 and H200 harnesses had auto's M = 16 training step 6-17 µs behind a forced backend="cuda"
    # step (same launch, same C++ node) in most rows; this attempt was part of the difference.
    if torch.is_grad_enabled() and (x.requires_grad or w_gate.requires_grad or w_up.requires_grad
                                    or w_down.requires_grad or (b_gate is not None and b_gate.requires_grad)
                                    or (b_up is not None and b_up.requires_grad)
                                    or (b_down is not None and b_down.requires_grad)):
        return None
    key = (x.device, x.dtype, x.numel(), w_gate.shape)
    plans = _infer_plans.get(key) or _infer_plans_for(x, w_gate, key)
    plan = plans[0]
    if plans[1] is not plan and policy.capturing(key[0]):
        plan = plans[1]
    if plan is None:
        return None
    label, tile, swizzle, raster = plan
    y = ops.geglu_mlp_infer(x, w_gate, w_up, w_down, b_gate, b_up, b_down, code, tile, swizzle, raster)
    if y is not None:
        _dispatch.record("geglu_mlp", label)
    return y


def geglu_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
              b_gate: torch.Tensor | None = None, b_up: torch.Tensor | None = None,
              b_down: torch.Tensor | None = None, approximate: str = "tanh", recompute: bool = False,
              backend: str | None = None) -> torch.Tensor:
    """``down(gelu(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)) + b_down``, differentiable.

    x: [..., H]; w_gate, w_up: [I, H]; w_down: [H, I] (the host module's ``nn.Linear`` weights,
    used as they are); biases [I], [I], [H] or None. ``recompute=True`` saves only x for the
    backward and recomputes the gate/up pre-activations there. Under ``torch.autocast`` (float16 or
    bfloat16) every operand is cast to its dtype first, as ``F.linear`` casts them (``_autocast``).
    """
    if not torch.compiler.is_compiling() and transformed():  # torch.func / forward AD: ATen's ops compose
        if not _checks.mlp_args_ok(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate):
            _check_args(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate)
        _dispatch.requested(backend)
        return reference.geglu_mlp_ref(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, dtype=x.dtype)
    if _autocast.ANY() and isinstance(x, torch.Tensor) and _autocast.enabled(x.device):
        # The three projections as autocast's linear computes them: every operand in its dtype.
        amp = _autocast.target(x.device)
        if amp and _autocast.castable(x, w_gate, w_up, w_down, b_gate, b_up, b_down):
            return _autocast.without(x.device, geglu_mlp,
                                     *_autocast.cast(amp, x, w_gate, w_up, w_down, b_gate, b_up, b_down),
                                     approximate=approximate, recompute=recompute, backend=backend)
    if backend is None and HAS_COMPILED_OPS and not _dispatch.overridden():
        y = _infer(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate)
        if y is not None:
            return y
    if not _checks.mlp_args_ok(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate):
        _check_args(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate)
    if w_gate.stride(-1) != 1:
        w_gate = w_gate.contiguous()
    if w_up.stride(-1) != 1:
        w_up = w_up.contiguous()
    if w_down.stride(-1) != 1:
        w_down = w_down.contiguous()
    args = (x, w_gate, w_up, w_down, b_gate, b_up, b_down)
    needs_grad = False
    if torch.is_grad_enabled():
        for t in args:
            if t is not None and t.requires_grad:
                needs_grad = True
                break
    backend = _dispatch.requested(backend)
    tracing = _tracing(args)
    if not needs_grad and not tracing:
        # Inference in eager mode: straight to the implementation (no op dispatch, no placeholder
        # outputs); at decode sizes the host time per call is what the GPU waits on.
        return _forward(*args, approximate, False, backend)[0]
    if tracing and (not needs_grad or not recompute) and backend == "auto":
        # A graph being traced: the compiled ops as its nodes where a plan exists (mlp_traced).
        if torch.compiler.is_compiling():
            return mlp_traced.step(*args, approximate, needs_grad)
        if torch._C._len_torch_dispatch_stack() > 0:  # another tracer (make_fx, export): plain Python
            # (a tensor subclass in eager mode keeps the custom op)
            y = (mlp_traced.training if needs_grad else mlp_traced.inference)(*args, approximate)
            if y is not None:
                return y
    route = _cpp_training_launch(x, w_gate, w_up, backend) if needs_grad and not recompute and not tracing else None
    if route is not None:
        launch, forward_name, backward_name = route
        y = ops.geglu_mlp_train(*args, 0 if approximate == "none" else 1, *launch)
        _dispatch.record("geglu_mlp", forward_name)
        # Recorded here: the C++ node's backward cannot report itself, and it runs exactly this one.
        _dispatch.record("geglu_mlp_backward", backward_name)
        return y
    y, _, _ = geglu_mlp_fwd_op(*args, approximate, needs_grad and not recompute, backend)
    return y


# The traced route plans with this module's launch rules: imported once they are defined.
from . import mlp_traced  # noqa: E402
