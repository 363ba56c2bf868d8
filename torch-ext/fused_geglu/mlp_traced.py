"""A traced step of ``geglu_mlp``: the compiled ops as the graph's own nodes.

A graph traced for training (torch.compile) gets ``geglu_mlp_train_fwd`` (the C++ training node's
forward, without a node) and, in its backward, ``geglu_mlp_gemm_bwd_keep`` (the one-call backward
leaving the graph's gate/up alone), with the launch planned once, here, from the static sizes. The
compiled graph then calls the compiled ops directly: no custom op's dispatch layers and no Python
launch choice per call, which cost about 90 µs per forward and 150 µs per backward call on the H200's
host (benchmarks/results/traced-op-host-h200-119ef4d.json) in a step the host already limits.
Symbolic sizes (dynamic=True), a forced backend and anything the C++ node would not run keep the
custom ops (``mlp.geglu_mlp_fwd_op``), which choose per call. $FUSED_GEGLU_ONE_CALL=0 also keeps them.
Inference likewise: ``geglu_mlp_fwd_planned`` runs geglu_mlp_infer's plan (:func:`inference`).

The plans are ``mlp``'s own launch rules (``_training_launch``, ``_infer_plan``), so a traced step
runs what an eager step of the same sizes runs.

Which devices' traced graphs take this route: ``TRACED_OPS_DEVICES``, from $FUSED_GEGLU_TRACED_OPS
(read at load). Unset: CPU tensors only. On CUDA tensors the route's tests pass (H100, 222b46f) and
it saves about 190 µs of host time per small compiled training step (H200, 2bfe0d4), but end to end a
kernelized+compiled Gemma showed no consistent gain at three widths, so CUDA graphs keep the custom
ops by default (README, "A whole kernelized model"; benchmarks/results/h200-tests-*.md).
"1": every device; "0": none (measuring, a way back).
"""

from __future__ import annotations

import os

import torch

from . import _dispatch, sm90_weights
from . import mlp as _mlp  # imported by mlp after its own definitions: the launch rules are there
from ._opdef import backward_outside_dynamo
from ._ops import add_op_namespace_prefix, ops


def devices_from_env(value: str | None) -> frozenset[str]:
    """The device types whose traced graphs take this route, for a value of $FUSED_GEGLU_TRACED_OPS."""
    value = (value or "").strip().lower()
    if value in ("", "cpu"):
        return frozenset({"cpu"})
    if value in ("1", "yes", "on", "true", "all"):
        return frozenset({"cpu", "cuda"})
    if value in ("0", "no", "off", "false", "none"):
        return frozenset()
    raise ValueError(f"$FUSED_GEGLU_TRACED_OPS={value!r}: expected unset or 'cpu' (CPU tensors only), "
                     "'1' (every device) or '0' (none)")


TRACED_OPS_DEVICES = devices_from_env(os.environ.get("FUSED_GEGLU_TRACED_OPS"))


def plan(device: torch.device, m: int, h: int, i: int, sm90_shapes: bool) -> tuple[int, int, int] | None:
    """``(tile, swizzle, raster)`` for ``geglu_mlp_train_fwd`` where the auto policy's eager training
    step would run the C++ node's launch, else None. The policy's no-capture choice: a graph traced
    for CUDA-graph replay (reduce-overhead) runs the same capture-safe kernels."""
    if m == 0 or not (_dispatch.compiled_has("geglu_mlp_train_fwd", device.type)
                      and _dispatch.compiled_has("geglu_mlp_gemm_bwd_keep", device.type)):
        return None
    route = _mlp._training_launch(device, "auto", m, h, i, 0 if device.type == "cuda" else None, lambda: sm90_shapes)
    return None if route is None else route[0]


@torch.compiler.allow_in_graph
def step(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate: str, train: bool):
    """The traced forward (:func:`training` or :func:`inference`) as one node of dynamo's graph.
    Dynamo does not look inside: the plan needs the sizes as numbers, which dynamo's symbolic sizes do
    not always say they are not. The AOT tracer that follows runs it on fake tensors, where they do, and
    records the ops it calls; the custom op where there is no plan."""
    args = (x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate)
    y = training(*args) if train else inference(*args)
    if y is None:
        y = _mlp.geglu_mlp_fwd_op(*args, train, "auto")[0]
    return y


def training(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate: str):
    """y from the two compiled ops, or None where the custom ops must run (the module's docstring)."""
    i, h = w_gate.shape
    sizes = (*x.shape, i, h)
    if not (x.device.type in TRACED_OPS_DEVICES and _mlp.ONE_CALL and x.is_contiguous()
            and all(type(v) is int for v in sizes)):
        return None
    m = x.numel() // h if h else 0
    sm90_shapes = x.device.type == "cuda" and m > 0 and sm90_weights.shapes_usable(x.view(m, h), w_gate, w_up)
    launch = plan(x.device, m, h, i, sm90_shapes)
    if launch is None:
        return None
    y, _, _ = ops.geglu_mlp_train_fwd(x, w_gate, w_up, w_down, b_gate, b_up, b_down,
                                      0 if approximate == "none" else 1, *launch)
    return y


def inference(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate: str):
    """y from ``geglu_mlp_fwd_planned`` (geglu_mlp_infer's sequences as a graph node) with the plan of
    an eager no-grad call of these sizes, or None: symbolic sizes, no plan, or a plan that differs
    under CUDA-graph capture (decode sizes: the Triton kernels there), which only the custom op,
    choosing per call, can follow into a captured graph."""
    i, h = w_gate.shape
    if (x.device.type not in TRACED_OPS_DEVICES or not x.is_contiguous() or h == 0
            or not all(type(v) is int for v in (*x.shape, i, h))
            or not _dispatch.compiled_has("geglu_mlp_fwd_planned", x.device.type)):
        return None
    m = x.numel() // h
    plans = [_mlp._infer_plan(x.device, x.dtype, m, h, i, capturing) for capturing in (0, 1)]
    if plans[0] is None or (x.device.type == "cuda" and plans[1] != plans[0]):
        return None
    _, tile, swizzle, raster = plans[0]
    return ops.geglu_mlp_fwd_planned(x, w_gate, w_up, w_down, b_gate, b_up, b_down,
                                     0 if approximate == "none" else 1, tile, swizzle, raster)


def _register_fakes_and_autograd() -> None:
    """Fake kernels of the three ops and the training forward's autograd, where this variant has them."""
    if not hasattr(ops, "geglu_mlp_train_fwd"):
        return
    fwd, bwd = add_op_namespace_prefix("geglu_mlp_train_fwd"), add_op_namespace_prefix("geglu_mlp_gemm_bwd_keep")

    @torch.library.register_fake(fwd)
    def _(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, tile, swizzle, raster):
        i, h = w_gate.shape
        m = x.numel() // h
        return x.new_empty((*x.shape[:-1], w_down.shape[0])), x.new_empty((m, i)), x.new_empty((m, i))

    @torch.library.register_fake(add_op_namespace_prefix("geglu_mlp_fwd_planned"))
    def _(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, tile, swizzle, raster):
        return x.new_empty((*x.shape[:-1], w_down.shape[0]))

    @torch.library.register_fake(bwd)
    def _(dy, x, w_gate, w_up, w_down, gate, up, approximate, has_b_gate, has_b_up, has_b_down):
        i, h = w_gate.shape
        return (x.new_empty(x.shape), w_gate.new_empty(w_gate.shape), w_up.new_empty(w_up.shape),
                w_down.new_empty(w_down.shape), x.new_empty((i,) if has_b_gate else (0,)),
                x.new_empty((i,) if has_b_up else (0,)), x.new_empty((h,) if has_b_down else (0,)))

    def setup_context(ctx, inputs, output):
        x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate = inputs[:8]
        _, gate, up = output
        ctx.save_for_backward(x, w_gate, w_up, w_down, gate, up)
        ctx.approximate = approximate
        ctx.has_bias = (b_gate is not None, b_up is not None, b_down is not None)

    def backward(ctx, grad_y, _g_gate, _g_up):
        x, w_gate, w_up, w_down, gate, up = ctx.saved_tensors
        h = w_gate.shape[1]
        bg, bu, bd = ctx.has_bias
        dx, dwg, dwu, dwd, dbg, dbu, dbd = ops.geglu_mlp_gemm_bwd_keep(
            grad_y.reshape(-1, h).contiguous(), x.view(-1, h), w_gate, w_up, w_down, gate, up, ctx.approximate,
            bg, bu, bd)
        return (dx.view(x.shape), dwg, dwu, dwd, dbg if bg else None, dbu if bu else None, dbd if bd else None,
                None, None, None, None)

    torch.library.register_autograd(fwd, backward_outside_dynamo(backward), setup_context=setup_context)


_register_fakes_and_autograd()
