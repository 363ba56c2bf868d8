"""Fused GeGLU MLP pieces: the gate/up GEMM with a GeGLU epilogue, and the dh GEMM with a dGeGLU epilogue.

Weights are the host module's own tensors in nn.Linear layout (no repacking): w_gate, w_up [I, H],
w_down [H, I]. The down projection forward is `linear.linear_fwd` (bias epilogue). Conventions (views,
int64 offsets, wrapped operand rows, "ieee" fp32 dots) are those of linear.py. Config lookups use
(M = tokens, N = I, K = H) for both kernels.
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import (
    act_from_approximate,
    dot_precision,
    gelu,
    gelu_and_grad,
    grouped_tile,
    load_tile,
    or_dummy,
    store_tile,
)
from .configs import get_config
from .geglu import geglu_fwd
from . import pdl as _pdl
from .pdl import let_dependents_start, pdl_enabled


@triton.jit
def _gateup_fwd_kernel(
    h_ptr, x_ptr, wg_ptr, wu_ptr, bg_ptr, bu_ptr, gate_ptr, up_ptr,
    # h/gate/up [M, I]; x [M, H]; wg/wu [I, H]; bg/bu [I]
    M, I, H,
    stride_hm, stride_xm, stride_wg, stride_wu, stride_gm, stride_um,
    HAS_BG: tl.constexpr, HAS_BU: tl.constexpr, STORE_PREACT: tl.constexpr,
    ACT: tl.constexpr, EVEN_K: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PDL: tl.constexpr = False, TRIGGER_AT_START: tl.constexpr = False,
    zero_ptr=None, n_zero=0, ZERO: tl.constexpr = False,
):
    # Decode (PDL, triton_kernels/pdl.py): the down GEMM's programs may take SM slots from here (or from
    # the end of the main loop) and wait there for h.
    let_dependents_start(PDL, TRIGGER_AT_START)
    if ZERO:  # program 0 zeroes the down GEMM's split-K tile counters (linear.linear_fwd)
        if tl.program_id(0) == 0:
            for z in range(0, n_zero, 256):
                offs_z = z + tl.arange(0, 256)
                tl.store(zero_ptr + offs_z, tl.zeros((256,), dtype=tl.int32), mask=offs_z < n_zero)
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(I, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = (offs_m % M).to(tl.int64)
    bn = (offs_n % I).to(tl.int64)
    a_ptrs = x_ptr + am[:, None] * stride_xm + rk[None, :]  # [BM, BK]
    g_ptrs = wg_ptr + bn[None, :] * stride_wg + rk[:, None]  # [BK, BN] = W_gate.T tile
    u_ptrs = wu_ptr + bn[None, :] * stride_wu + rk[:, None]  # [BK, BN] = W_up.T tile
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        # One x tile feeds both weight tiles: x is read once for gate and up.
        if EVEN_K:
            a = tl.load(a_ptrs)
            bg = tl.load(g_ptrs)
            bu = tl.load(u_ptrs)
        else:
            k_ok = rk < H - k0
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            bg = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)
            bu = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
        acc_g = tl.dot(a, bg, acc_g, input_precision=DOT_PREC)
        acc_u = tl.dot(a, bu, acc_u, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    let_dependents_start(PDL, not TRIGGER_AT_START)
    n_ok = offs_n < I
    if HAS_BG:
        acc_g += tl.load(bg_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BU:
        acc_u += tl.load(bu_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if STORE_PREACT:
        store_tile(gate_ptr, stride_gm, offs_m, offs_n, M, I, acc_g)
        store_tile(up_ptr, stride_um, offs_m, offs_n, M, I, acc_u)
    store_tile(h_ptr, stride_hm, offs_m, offs_n, M, I, gelu(acc_g, ACT) * acc_u)


@triton.jit
def _dgeglu_epilogue(acc, dg_ptr, du_ptr, h_ptr, gate_ptr, up_ptr, offs_m, offs_n, M, I,
                     stride_dgm, stride_dum, stride_hm, stride_gm, stride_um,
                     STORE_H: tl.constexpr, ACT: tl.constexpr):
    """dh tile (fp32, never stored) -> dgate = dh * up * gelu'(gate), dup = dh * gelu(gate), and
    h = gelu(gate) * up re-emitted for the dW_down GEMM (so h is never saved). The factors that need
    only gate/up are formed first, in the layout they were loaded in; h is stored from there."""
    g = load_tile(gate_ptr, stride_gm, offs_m, offs_n, M, I)
    u = load_tile(up_ptr, stride_um, offs_m, offs_n, M, I)
    act, dact = gelu_and_grad(g, ACT)
    if STORE_H:
        store_tile(h_ptr, stride_hm, offs_m, offs_n, M, I, act * u)
    store_tile(dg_ptr, stride_dgm, offs_m, offs_n, M, I, acc * (u * dact))
    store_tile(du_ptr, stride_dum, offs_m, offs_n, M, I, acc * act)


@triton.jit
def _dh_bwd_kernel(
    dg_ptr, du_ptr, h_ptr, gy_ptr, wd_ptr, gate_ptr, up_ptr,
    # dgate/dup/h/gate/up [M, I]; grad_y [M, H]; w_down [H, I]
    M, I, H,
    stride_dgm, stride_dum, stride_hm, stride_gym, stride_wdh, stride_gm, stride_um,
    STORE_H: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # Output tile [BLOCK_M (tokens), BLOCK_N (intermediate)], reduction over H in BLOCK_K steps. The tile
    # is kept as two [BLOCK_M, BLOCK_N / 2] accumulators sharing each A tile, so that the epilogue (which
    # loads gate and up and keeps several fp32 temporaries) runs one half at a time: with a single
    # 128x128 accumulator ptxas spills ~1 KB/thread at 8 warps (Triton 3.6 and 3.9, sm90); split, none.
    HALF: tl.constexpr = BLOCK_N // 2
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(I, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = pid_n * BLOCK_N + tl.arange(0, HALF)
    offs_n1 = offs_n0 + HALF
    rk = tl.arange(0, BLOCK_K)
    am = (offs_m % M).to(tl.int64)
    a_ptrs = gy_ptr + am[:, None] * stride_gym + rk[None, :]  # [BM, BK]
    # [BK, HALF] tiles of w_down (I contiguous)
    b0_ptrs = wd_ptr + rk.to(tl.int64)[:, None] * stride_wdh + (offs_n0 % I)[None, :]
    b1_ptrs = wd_ptr + rk.to(tl.int64)[:, None] * stride_wdh + (offs_n1 % I)[None, :]
    acc0 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b0 = tl.load(b0_ptrs)
            b1 = tl.load(b1_ptrs)
        else:
            k_ok = rk < H - k0
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b0 = tl.load(b0_ptrs, mask=k_ok[:, None], other=0.0)
            b1 = tl.load(b1_ptrs, mask=k_ok[:, None], other=0.0)
        acc0 = tl.dot(a, b0, acc0, input_precision=DOT_PREC)
        acc1 = tl.dot(a, b1, acc1, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K
        b0_ptrs += BLOCK_K * stride_wdh
        b1_ptrs += BLOCK_K * stride_wdh
    _dgeglu_epilogue(acc0, dg_ptr, du_ptr, h_ptr, gate_ptr, up_ptr, offs_m, offs_n0, M, I,
                     stride_dgm, stride_dum, stride_hm, stride_gm, stride_um, STORE_H, ACT)
    _dgeglu_epilogue(acc1, dg_ptr, du_ptr, h_ptr, gate_ptr, up_ptr, offs_m, offs_n1, M, I,
                     stride_dgm, stride_dum, stride_hm, stride_gm, stride_um, STORE_H, ACT)


def gateup_fwd(
    h_out: torch.Tensor, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
    b_gate: Optional[torch.Tensor], b_up: Optional[torch.Tensor], approximate: str,
    gate_out: Optional[torch.Tensor], up_out: Optional[torch.Tensor],
    zero_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """h_out[M, I] = gelu(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up) in one GEMM pass with two fp32
    accumulators (x[M, H] read once). If gate_out / up_out [M, I] are given (both or neither), the
    pre-activations are stored as well. `zero_out` (int32) is set to zero on the way, by the same kernel:
    the down GEMM's split-K tile counters, so that they cost no launch of their own."""
    act = act_from_approximate(approximate)
    if (gate_out is None) != (up_out is None):
        raise ValueError("gate_out and up_out must be given together")
    m, hdim = x.shape
    i = w_gate.shape[0]
    if zero_out is not None and (m == 0 or i == 0 or hdim == 0):
        zero_out.zero_()  # no kernel launch below to do it
    if m == 0 or i == 0:
        return h_out
    if hdim == 0:  # empty reduction: the pre-activations are the biases (or 0)
        g = (b_gate if b_gate is not None else x.new_zeros(i)).to(x.dtype).expand(m, i)
        u = (b_up if b_up is not None else x.new_zeros(i)).to(x.dtype).expand(m, i)
        if gate_out is not None:
            gate_out.copy_(g)
            up_out.copy_(u)
        return geglu_fwd(h_out, g.contiguous(), u.contiguous(), approximate)
    # The kernel reads each bias at unit stride; a strided slice (of a packed [2I] bias, say) is I values.
    if b_gate is not None and b_gate.stride(0) != 1:
        b_gate = b_gate.contiguous()
    if b_up is not None and b_up.stride(0) != 1:
        b_up = b_up.contiguous()
    cfg = get_config("gateup_fwd", x.device, x.dtype, m, i, hdim)
    grid = (triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(i, cfg.BLOCK_N),)
    store = gate_out is not None
    pdl = pdl_enabled(x.device, m)
    _gateup_fwd_kernel[grid](
        h_out, x, w_gate, w_up, or_dummy(b_gate, h_out), or_dummy(b_up, h_out),
        or_dummy(gate_out, h_out), or_dummy(up_out, h_out),
        m, i, hdim,
        h_out.stride(0), x.stride(0), w_gate.stride(0), w_up.stride(0),
        gate_out.stride(0) if store else 0, up_out.stride(0) if store else 0,
        HAS_BG=b_gate is not None, HAS_BU=b_up is not None, STORE_PREACT=store,
        ACT=act, EVEN_K=hdim % cfg.BLOCK_K == 0, DOT_PREC=dot_precision(x.dtype),
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        PDL=pdl, TRIGGER_AT_START=_pdl.TRIGGER_AT_START,
        zero_ptr=zero_out, n_zero=zero_out.numel() if zero_out is not None else 0, ZERO=zero_out is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return h_out


def dh_bwd(
    dgate_out: torch.Tensor, dup_out: torch.Tensor, h_out: Optional[torch.Tensor],
    grad_y: torch.Tensor, w_down: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, approximate: str,
):
    """dh = grad_y[M, H] @ w_down[H, I] (fp32, in registers only); writes dgate = dh * up * gelu'(gate),
    dup = dh * gelu(gate) and, when h_out is given, h = gelu(gate) * up. dgate_out / dup_out may be the
    two halves of one [M, 2I] buffer (row stride 2I)."""
    act = act_from_approximate(approximate)
    m, hdim = grad_y.shape
    i = w_down.shape[1]
    if m == 0 or i == 0:
        return dgate_out, dup_out, h_out
    if hdim == 0:
        dgate_out.zero_()
        dup_out.zero_()
        if h_out is not None:
            geglu_fwd(h_out, gate, up, approximate)
        return dgate_out, dup_out, h_out
    cfg = get_config("dh_bwd", grad_y.device, grad_y.dtype, m, i, hdim)
    grid = (triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(i, cfg.BLOCK_N),)
    _dh_bwd_kernel[grid](
        dgate_out, dup_out, or_dummy(h_out, dgate_out), grad_y, w_down, gate, up,
        m, i, hdim,
        dgate_out.stride(0), dup_out.stride(0), h_out.stride(0) if h_out is not None else 0,
        grad_y.stride(0), w_down.stride(0), gate.stride(0), up.stride(0),
        STORE_H=h_out is not None, ACT=act, EVEN_K=hdim % cfg.BLOCK_K == 0,
        DOT_PREC=dot_precision(grad_y.dtype),
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dgate_out, dup_out, h_out
