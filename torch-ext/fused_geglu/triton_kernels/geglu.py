"""Pointwise GeGLU, forward and backward: out = gelu(gate) * up.

Memory bound. Each program owns a [BLOCK_M, BLOCK_N] tile (wide in the column direction, a few rows
deep) on a 2-D grid (row blocks on axis 0, which has no 65535 limit; column blocks on axis 1), so a
program moves BLOCK_M * BLOCK_N elements per tensor with no per-row loop, and small-M inputs still
spread across the GPU along the columns. Math is fp32 on upcast inputs; one rounding, at the store.
Row offsets are int64 (M * row_stride can pass 2^31). Every tensor is a 2-D view with unit column
stride; row strides are free, so the halves of a packed [M, 2N] tensor go in without a copy.

When every operand is contiguous (the MLP's own buffers, separate gate/up tensors) the launchers use
the flat kernels instead: one 1-D block of BLOCK elements per program, int32 offsets unless the
tensor passes 2^31 elements, and no mask at all when BLOCK divides the element count. That is the
shape of torch.compile's generated pointwise code, which measured 4.22-4.33 TB/s on the H200 where
the 2-D kernel reached 3.83-4.12 at [8192, 6912..16384] (pointwise-profile-h200-6ee2946.json); the
flat kernels then measured 4.18-4.37 TB/s there (pointwise-profile-h200-fc7f41e.json, both in
benchmarks/results/).
"""

import torch
import triton
import triton.language as tl

from ._common import act_from_approximate, gelu, gelu_and_grad
from .configs import get_config
from .launch import FastKernel


@triton.jit
def _geglu_fwd_kernel(
    out_ptr, gate_ptr, up_ptr,  # [M, N] each, unit column stride
    M, N,
    stride_out, stride_gate, stride_up,  # row strides (elements)
    ACT: tl.constexpr,  # 1 = erf, 2 = tanh
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_N), BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    r = rows.to(tl.int64)[:, None]
    c = cols[None, :]
    g = tl.load(gate_ptr + r * stride_gate + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + r * stride_up + c, mask=mask, other=0.0).to(tl.float32)
    h = gelu(g, ACT) * u
    tl.store(out_ptr + r * stride_out + c, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_bwd_kernel(
    grad_gate_ptr, grad_up_ptr, h_ptr,  # outputs [M, N] (h only with STORE_H)
    grad_out_ptr, gate_ptr, up_ptr,  # inputs [M, N]; may be the outputs themselves (in place)
    M, N,
    stride_gg, stride_gu, stride_h, stride_go, stride_gate, stride_up,
    ACT: tl.constexpr, STORE_H: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_N), BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    r = rows.to(tl.int64)[:, None]
    c = cols[None, :]
    dy = tl.load(grad_out_ptr + r * stride_go + c, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + r * stride_gate + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + r * stride_up + c, mask=mask, other=0.0).to(tl.float32)
    act, dact = gelu_and_grad(g, ACT)
    # d/dgate = dy * up * gelu'(gate);  d/dup = dy * gelu(gate)
    tl.store(grad_gate_ptr + r * stride_gg + c, (dy * u * dact).to(grad_gate_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_up_ptr + r * stride_gu + c, (dy * act).to(grad_up_ptr.dtype.element_ty), mask=mask)
    if STORE_H:
        tl.store(h_ptr + r * stride_h + c, (act * u).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _flat_offsets(BLOCK: tl.constexpr, INT64: tl.constexpr):
    if INT64:
        return tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def _geglu_fwd_flat_kernel(
    out_ptr, gate_ptr, up_ptr, numel,  # contiguous, numel elements each
    ACT: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr, INT64: tl.constexpr,
):
    offs = _flat_offsets(BLOCK, INT64)
    if EVEN:  # BLOCK divides numel: no mask, so every access is a full 16-byte vector
        g = tl.load(gate_ptr + offs).to(tl.float32)
        u = tl.load(up_ptr + offs).to(tl.float32)
        tl.store(out_ptr + offs, (gelu(g, ACT) * u).to(out_ptr.dtype.element_ty))
    else:
        mask = offs < numel
        g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, (gelu(g, ACT) * u).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_bwd_flat_kernel(
    grad_gate_ptr, grad_up_ptr, h_ptr, grad_out_ptr, gate_ptr, up_ptr, numel,  # as _geglu_bwd_kernel
    ACT: tl.constexpr, STORE_H: tl.constexpr,
    BLOCK: tl.constexpr, EVEN: tl.constexpr, INT64: tl.constexpr,
):
    offs = _flat_offsets(BLOCK, INT64)
    if EVEN:
        dy = tl.load(grad_out_ptr + offs).to(tl.float32)
        g = tl.load(gate_ptr + offs).to(tl.float32)
        u = tl.load(up_ptr + offs).to(tl.float32)
        act, dact = gelu_and_grad(g, ACT)
        tl.store(grad_gate_ptr + offs, (dy * u * dact).to(grad_gate_ptr.dtype.element_ty))
        tl.store(grad_up_ptr + offs, (dy * act).to(grad_up_ptr.dtype.element_ty))
        if STORE_H:
            tl.store(h_ptr + offs, (act * u).to(h_ptr.dtype.element_ty))
    else:
        mask = offs < numel
        dy = tl.load(grad_out_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        act, dact = gelu_and_grad(g, ACT)
        tl.store(grad_gate_ptr + offs, (dy * u * dact).to(grad_gate_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_up_ptr + offs, (dy * act).to(grad_up_ptr.dtype.element_ty), mask=mask)
        if STORE_H:
            tl.store(h_ptr + offs, (act * u).to(h_ptr.dtype.element_ty), mask=mask)


def _flat(*tensors) -> bool:
    """Whether every operand is one dense block (row stride == column count)."""
    for t in tensors:
        if t is not None and not t.is_contiguous():
            return False
    return True


_FWD = FastKernel(_geglu_fwd_kernel)
_BWD = FastKernel(_geglu_bwd_kernel)
_FWD_FLAT = FastKernel(_geglu_fwd_flat_kernel)
_BWD_FLAT = FastKernel(_geglu_bwd_flat_kernel)

# (kernel, device, dtype, M, N) -> the launch's grid, block constexprs and warps: the config lookup and
# the arithmetic below once per size (an eager call in the noarch build waits on this host time).
_plans: dict[tuple, tuple] = {}


def _plan(kernel: str, device: torch.device, dtype: torch.dtype, m: int, n: int) -> tuple:
    key = (kernel, device, dtype, m, n)
    plan = _plans.get(key)
    if plan is None:
        cfg = get_config(kernel, device, dtype, m, n)
        if kernel.endswith("_flat"):
            numel, block = m * n, cfg.BLOCK_M * cfg.BLOCK_N  # the flat kernels' configs keep BLOCK_M = 1
            plan = ((triton.cdiv(numel, block),), (block, numel % block == 0, numel + block >= 2**31), cfg.num_warps)
        else:
            plan = ((triton.cdiv(m, cfg.BLOCK_M), triton.cdiv(n, cfg.BLOCK_N)), (cfg.BLOCK_M, cfg.BLOCK_N),
                    cfg.num_warps)
        if len(_plans) > 4096:  # sizes vary with the token count: keep the table bounded
            _plans.clear()
        _plans[key] = plan
    return plan


def geglu_fwd(out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, approximate: str) -> torch.Tensor:
    """out[M, N] = gelu(gate) * up, gelu exact ("none") or tanh ("tanh"). 2-D views, unit column stride."""
    act = act_from_approximate(approximate)
    m, n = gate.shape
    if m == 0 or n == 0:
        return out
    if _flat(out, gate, up):
        grid, blocks, warps = _plan("geglu_fwd_flat", gate.device, gate.dtype, m, n)
        _FWD_FLAT(grid, (out, gate, up, m * n, act, *blocks), warps)
        return out
    grid, blocks, warps = _plan("geglu_fwd", gate.device, gate.dtype, m, n)
    _FWD(grid, (out, gate, up, m, n, out.stride(0), gate.stride(0), up.stride(0), act, *blocks), warps)
    return out


def geglu_bwd(
    grad_gate: torch.Tensor, grad_up: torch.Tensor,
    grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, approximate: str,
):
    """grad_gate = grad_out * up * gelu'(gate), grad_up = grad_out * gelu(gate). All [M, N] 2-D views;
    grad_gate / grad_up may be the two halves of one [M, 2N] buffer."""
    act = act_from_approximate(approximate)
    m, n = gate.shape
    if m == 0 or n == 0:
        return grad_gate, grad_up
    _launch_bwd(grad_gate, grad_up, None, grad_out, gate, up, act)
    return grad_gate, grad_up


def geglu_bwd_inplace(gate: torch.Tensor, up: torch.Tensor, grad_out: torch.Tensor, approximate: str) -> None:
    """In place, element by element: gate <- grad_gate, up <- grad_up, grad_out <- h = gelu(gate) * up.
    Every stored value depends on all three loaded ones, so each element is read before it is written."""
    act = act_from_approximate(approximate)
    if gate.shape[0] == 0 or gate.shape[1] == 0:
        return
    _launch_bwd(gate, up, grad_out, grad_out, gate, up, act)


def geglu_bwd_h(grad_gate: torch.Tensor, grad_up: torch.Tensor, grad_out: torch.Tensor, gate: torch.Tensor,
                up: torch.Tensor, approximate: str) -> None:
    """grad_gate, grad_up <- the gradients (buffers of their own: gate/up stay as they are), and
    grad_out <- h = gelu(gate) * up in place."""
    act = act_from_approximate(approximate)
    if gate.shape[0] == 0 or gate.shape[1] == 0:
        return
    _launch_bwd(grad_gate, grad_up, grad_out, grad_out, gate, up, act)


def _launch_bwd(grad_gate, grad_up, h, grad_out, gate, up, act: int) -> None:
    m, n = gate.shape
    store_h = h is not None
    h = grad_gate if h is None else h  # a stand-in pointer, never written without STORE_H
    if _flat(grad_gate, grad_up, h, grad_out, gate, up):
        grid, blocks, warps = _plan("geglu_bwd_flat", gate.device, gate.dtype, m, n)
        _BWD_FLAT(grid, (grad_gate, grad_up, h, grad_out, gate, up, m * n, act, store_h, *blocks), warps)
        return
    grid, blocks, warps = _plan("geglu_bwd", gate.device, gate.dtype, m, n)
    _BWD(grid, (grad_gate, grad_up, h, grad_out, gate, up, m, n,
                grad_gate.stride(0), grad_up.stride(0), h.stride(0) if store_h else 0,
                grad_out.stride(0), gate.stride(0), up.stride(0), act, store_h, *blocks), warps)
