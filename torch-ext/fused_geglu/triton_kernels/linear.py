"""GEMM with a bias / GELU epilogue (nn.Linear layout): y = act(x @ weight.T + bias), and its backward.

Portable pointer-based Triton (no TMA descriptors), valid on Triton 3.6 and 3.9 and in the interpreter.
Conventions shared with mlp.py:
- a "2-D view" has unit column stride and any row stride; strides are passed, nothing is copied;
- operand row offsets are int64 (M * row_stride may pass 2^31);
- out-of-range tile rows / columns of the *operands* are wrapped (`% M`, `% N`) onto valid ones, so
  operand loads need masks only along the reduction dim (and none at all when it divides BLOCK_K,
  `EVEN_K`); stores are masked;
- fp32 accumulation; fp32 operands use `input_precision="ieee"` (exact fp32, no TF32), see
  `_common.dot_precision`;
- config lookups use the layer's problem dims: M = tokens, N = out features, K = in features; inside a
  kernel BLOCK_M / BLOCK_N tile the kernel's own output and BLOCK_K steps its reduction.
"""

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import (
    act_from_activation,
    dot_precision,
    gelu,
    gelu_grad,
    grouped_tile,
    load_tile,
    or_dummy,
    store_tile,
)
from .configs import MAX_SPLIT_K, get_config
from . import pdl as _pdl
from .pdl import launch_kwargs, let_dependents_start, pdl_enabled, wait_for_previous


@triton.jit
def _add_bias(acc, bias_ptr, stride_bm, offs_m, offs_n, M, N, HAS_BIAS: tl.constexpr):
    """HAS_BIAS 1: a vector [N] over every row; 2: an addend [M, N] (row stride stride_bm); 0: none."""
    if HAS_BIAS == 1:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    elif HAS_BIAS == 2:
        mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        ptrs = bias_ptr + offs_m.to(tl.int64)[:, None] * stride_bm + offs_n[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _linear_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, preact_ptr,  # x [M, K], w [N, K], bias [N] or [M, N], out/preact [M, N]
    M, N, K,
    stride_xm, stride_wn, stride_om, stride_pm, stride_bm,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, STORE_PREACT: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = (offs_m % M).to(tl.int64)
    bn = (offs_n % N).to(tl.int64)
    wait_for_previous(PDL)  # decode: x is the previous kernel's output
    a_ptrs = x_ptr + am[:, None] * stride_xm + rk[None, :]  # [BM, BK]
    b_ptrs = w_ptr + bn[None, :] * stride_wn + rk[:, None]  # [BK, BN] = W.T tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = rk < K - k0
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    acc = _add_bias(acc, bias_ptr, stride_bm, offs_m, offs_n, M, N, HAS_BIAS)
    if STORE_PREACT:
        store_tile(preact_ptr, stride_pm, offs_m, offs_n, M, N, acc)
    store_tile(out_ptr, stride_om, offs_m, offs_n, M, N, gelu(acc, ACT))


@triton.jit
def _linear_splitk_kernel(
    x_ptr, w_ptr, part_ptr,  # x [M, K], w [N, K], part [SPLIT, M, N] fp32 partial sums
    M, N, K, K_PER_SPLIT,
    stride_xm, stride_wn,
    EVEN_K: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False, TRIGGER_AT_START: tl.constexpr = False,
    # FUSE_REDUCE: the epilogue runs here (operands as in _splitk_reduce_kernel), by the last program of
    # each output tile to finish; counter_ptr holds one int32 per tile, zero at launch, zero again after.
    FUSE_REDUCE: tl.constexpr = False, counter_ptr=None, bias_ptr=None, out_ptr=None, preact_ptr=None,
    stride_om=0, stride_pm=0, stride_bm=0,
    HAS_BIAS: tl.constexpr = 0, ACT: tl.constexpr = 0, STORE_PREACT: tl.constexpr = False,
):
    # Skinny M (decode): an [M, N] output has too few tiles to keep every SM streaming the weight,
    # so each program also takes one K slice and stores its fp32 partial sum; _splitk_reduce_kernel
    # (or, FUSE_REDUCE, the tile's last program) adds the slices in a fixed order and runs the epilogue.
    let_dependents_start(PDL, TRIGGER_AT_START)  # PDL: the reduction may take SM slots from here or
    pid_n, pid_m, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_s * K_PER_SPLIT + tl.arange(0, BLOCK_K)  # absolute k of this slice's first step
    am = (offs_m % M).to(tl.int64)
    bn = (offs_n % N).to(tl.int64)
    wait_for_previous(PDL)  # decode: x is the gate+up kernel's h
    a_ptrs = x_ptr + am[:, None] * stride_xm + rk[None, :]  # [BM, BK]
    b_ptrs = w_ptr + bn[None, :] * stride_wn + rk[:, None]  # [BK, BN] = W.T tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        if EVEN_K:  # every slice is whole: K is a multiple of K_PER_SPLIT (itself of BLOCK_K)
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = rk + k0 < K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    let_dependents_start(PDL, not TRIGGER_AT_START)  # from here (pdl.TRIGGER_AT_START)
    store_tile(part_ptr + pid_s.to(tl.int64) * M * N, N, offs_m, offs_n, M, N, acc)
    if FUSE_REDUCE:
        # Count this slice in once all its threads have stored it (barrier, then one release-acquire
        # atomic); the program that brings the count to SPLIT sees every slice and reduces the tile.
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(0) + pid_n
        split = tl.num_programs(2)
        if tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel") == split - 1:
            _splitk_epilogue(part_ptr, bias_ptr, out_ptr, preact_ptr, M, N, split, offs_m, offs_n,
                             stride_om, stride_pm, stride_bm, HAS_BIAS, ACT, STORE_PREACT, ".cg", BLOCK_M, BLOCK_N)
            tl.atomic_xchg(counter_ptr + tile, 0)  # re-armed for the tile's next use


@triton.jit
def _splitk_epilogue(part_ptr, bias_ptr, out_ptr, preact_ptr, M, N, SPLIT, offs_m, offs_n,
                     stride_om, stride_pm, stride_bm, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                     STORE_PREACT: tl.constexpr, CACHE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Sum of the SPLIT fp32 slices in slice order, then bias, pre-activation store and activation: the
    same operations in the same order wherever it runs, so both reductions give the same bits. CACHE
    ".cg" reads the slices from L2 (other programs of the same kernel wrote them)."""
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    ptrs = part_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(0, SPLIT):
        acc += tl.load(ptrs + s * M * N, mask=mask, other=0.0, cache_modifier=CACHE)
    acc = _add_bias(acc, bias_ptr, stride_bm, offs_m, offs_n, M, N, HAS_BIAS)
    if STORE_PREACT:
        store_tile(preact_ptr, stride_pm, offs_m, offs_n, M, N, acc)
    store_tile(out_ptr, stride_om, offs_m, offs_n, M, N, gelu(acc, ACT))


@triton.jit
def _splitk_reduce_kernel(
    part_ptr, bias_ptr, out_ptr, preact_ptr,  # part [SPLIT, M, N] fp32; bias [N] or [M, N]; out/preact [M, N]
    M, N, SPLIT,
    stride_om, stride_pm, stride_bm,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, STORE_PREACT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
):
    wait_for_previous(PDL)  # the partial sums are the previous kernel's output
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    _splitk_epilogue(part_ptr, bias_ptr, out_ptr, preact_ptr, M, N, SPLIT, offs_m, offs_n,
                     stride_om, stride_pm, stride_bm, HAS_BIAS, ACT, STORE_PREACT, "", BLOCK_M, BLOCK_N)


@triton.jit
def _linear_bwd_input_kernel(
    dx_ptr, gy_ptr, w_ptr, pre_ptr,  # dx [M, K]; grad_y, preact [M, N]; w [N, K]
    M, N, K,
    stride_dxm, stride_gym, stride_wn, stride_pm,
    ACT: tl.constexpr, EVEN_N: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # Output tile [BLOCK_M (tokens), BLOCK_N (in features K)]; reduction over out features N in BLOCK_K.
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rr = tl.arange(0, BLOCK_K)
    am = (offs_m % M).to(tl.int64)
    bk = offs_k % K
    g_ptrs = gy_ptr + am[:, None] * stride_gym + rr[None, :]  # [BM, BR]
    p_ptrs = pre_ptr + am[:, None] * stride_pm + rr[None, :]
    b_ptrs = w_ptr + rr.to(tl.int64)[:, None] * stride_wn + bk[None, :]  # [BR, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, N, BLOCK_K):
        if EVEN_N:
            g = tl.load(g_ptrs)
            b = tl.load(b_ptrs)
            if ACT != 0:
                p = tl.load(p_ptrs)
        else:
            r_ok = rr < N - r0
            g = tl.load(g_ptrs, mask=r_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=r_ok[:, None], other=0.0)
            if ACT != 0:
                p = tl.load(p_ptrs, mask=r_ok[None, :], other=0.0)
        if ACT != 0:
            # g = grad_y * gelu'(preact), formed in registers and rounded to the operand dtype for the MMA.
            g = (g.to(tl.float32) * gelu_grad(p.to(tl.float32), ACT)).to(b.dtype)
        acc = tl.dot(g, b, acc, input_precision=DOT_PREC)
        g_ptrs += BLOCK_K
        p_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_wn
    store_tile(dx_ptr, stride_dxm, offs_m, offs_k, M, K, acc)


@triton.jit
def _wgrad_loop(
    gy_ptr, pre_ptr, x_ptr, M, stride_gym, stride_pm, stride_xm, an, bk,
    ACT: tl.constexpr, WITH_DB: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # dW tile [BLOCK_M (out features), BLOCK_N (in features)] = sum over tokens of g.T @ x.
    rt = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    db = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for t0 in range(0, M, BLOCK_K):
        tok = t0 + rt
        t_ok = tok < M
        tok64 = tok.to(tl.int64)
        g = tl.load(gy_ptr + tok64[None, :] * stride_gym + an[:, None], mask=t_ok[None, :], other=0.0)  # [BM, BT]
        xb = tl.load(x_ptr + tok64[:, None] * stride_xm + bk[None, :], mask=t_ok[:, None], other=0.0)  # [BT, BN]
        if ACT != 0:
            p = tl.load(pre_ptr + tok64[None, :] * stride_pm + an[:, None], mask=t_ok[None, :], other=0.0)
            g32 = g.to(tl.float32) * gelu_grad(p.to(tl.float32), ACT)
            if WITH_DB:
                db += tl.sum(g32, axis=1)
            g = g32.to(xb.dtype)
        elif WITH_DB:
            db += tl.sum(g.to(tl.float32), axis=1)
        acc = tl.dot(g, xb, acc, input_precision=DOT_PREC)
    return acc, db


@triton.jit
def _linear_bwd_weight_kernel(
    dw_ptr, db_ptr, gy_ptr, x_ptr, pre_ptr,  # dw [N, K], db [N], grad_y/preact [M, N], x [M, K]
    M, N, K,
    stride_dwn, stride_gym, stride_xm, stride_pm,
    ACT: tl.constexpr, HAS_DB: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(N, BLOCK_M), tl.cdiv(K, BLOCK_N), GROUP_M)
    offs_n = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # out features (rows of dW)
    offs_k = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # in features (cols of dW)
    an = offs_n % N
    bk = offs_k % K
    if HAS_DB:
        if pid_n == 0:
            # The programs of the first in-feature column also reduce the bias gradient: the column sums
            # of g come from the A tiles they already hold, so there is no separate pass over grad_y.
            acc, db = _wgrad_loop(gy_ptr, pre_ptr, x_ptr, M, stride_gym, stride_pm, stride_xm, an, bk,
                                  ACT, True, DOT_PREC, BLOCK_M, BLOCK_N, BLOCK_K)
            tl.store(db_ptr + offs_n, db.to(db_ptr.dtype.element_ty), mask=offs_n < N)
        else:
            acc, db = _wgrad_loop(gy_ptr, pre_ptr, x_ptr, M, stride_gym, stride_pm, stride_xm, an, bk,
                                  ACT, False, DOT_PREC, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        acc, db = _wgrad_loop(gy_ptr, pre_ptr, x_ptr, M, stride_gym, stride_pm, stride_xm, an, bk,
                              ACT, False, DOT_PREC, BLOCK_M, BLOCK_N, BLOCK_K)
    store_tile(dw_ptr, stride_dwn, offs_n, offs_k, N, K, acc)


def linear_fwd(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
    activation: str, preact_out: Optional[torch.Tensor], tile_counters: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """out[M, N] = act(x[M, K] @ weight[N, K].T + bias); act in {"none", "gelu", "gelu_tanh"}; bias is
    a vector [N], an addend [M, N] (unit last stride) or None.

    When `preact_out` [M, N] is given (activation != "none"), also stores x @ W.T + b for the backward.
    Bias and GELU are applied on the fp32 accumulator before the single store.

    `tile_counters` (int32, at least `splitk_counters(M, N)` of them, all zero when this runs on the
    stream; zero again afterwards): where K is split, the last program of each output tile sums the
    slices, so no reduction kernel is launched. The MLP passes them, zeroed by its gate+up kernel."""
    act = act_from_activation(activation)
    m, k = x.shape
    n = weight.shape[0]
    if m == 0 or n == 0:
        return out
    if k == 0:  # empty reduction: act(bias) (or act(0)); keeps the kernel free of a K == 0 case
        pre = torch.zeros((m, n), device=x.device, dtype=torch.float32)
        if bias is not None:
            pre += bias.float()
        if preact_out is not None:
            preact_out.copy_(pre)
        out.copy_(torch.nn.functional.gelu(pre, approximate="tanh" if act == 2 else "none") if act else pre)
        return out
    has_bias = 0 if bias is None else (2 if bias.dim() == 2 else 1)
    if has_bias == 2 and (bias.shape != (m, n) or (n > 1 and bias.stride(1) != 1)):
        raise ValueError(f"an addend bias must be [{m}, {n}] with unit last stride, got {tuple(bias.shape)} "
                         f"strides {bias.stride()}")
    if has_bias == 1 and bias.stride(0) != 1:
        bias = bias.contiguous()  # the kernel reads a bias vector at unit stride (a strided slice: N values)
    stride_bm = bias.stride(0) if has_bias == 2 else 0
    cfg = get_config("linear_fwd_act" if act else "linear_fwd", x.device, x.dtype, m, n, k)
    tiles = triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(n, cfg.BLOCK_N)
    split, k_per_split = _k_slices(cfg, tiles, k, x.device)
    if tile_counters is not None and tile_counters.numel() < tiles:
        raise ValueError(f"tile_counters holds {tile_counters.numel()} counters, this launch needs {tiles}")
    pdl = pdl_enabled(x.device, m)
    if split > 1:
        part = torch.empty((split, m, n), device=x.device, dtype=torch.float32)
        fuse = tile_counters is not None
        _linear_splitk_kernel[(triton.cdiv(n, cfg.BLOCK_N), triton.cdiv(m, cfg.BLOCK_M), split)](
            x, weight, part, m, n, k, k_per_split, x.stride(0), weight.stride(0),
            EVEN_K=k % k_per_split == 0, DOT_PREC=dot_precision(x.dtype),
            BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, PDL=pdl,
            TRIGGER_AT_START=_pdl.TRIGGER_AT_START,
            FUSE_REDUCE=fuse, counter_ptr=tile_counters, bias_ptr=or_dummy(bias, out), out_ptr=out,
            preact_ptr=or_dummy(preact_out, out), stride_om=out.stride(0),
            stride_pm=preact_out.stride(0) if preact_out is not None else 0, stride_bm=stride_bm,
            HAS_BIAS=has_bias, ACT=act, STORE_PREACT=preact_out is not None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_kwargs(pdl),
        )
        if fuse:
            return out
        # The reduction moves split * M * N fp32 values: a few KB at decode sizes, one fixed tile.
        _splitk_reduce_kernel[(triton.cdiv(m, 16), triton.cdiv(n, 128))](
            part, or_dummy(bias, out), out, or_dummy(preact_out, out), m, n, split,
            out.stride(0), preact_out.stride(0) if preact_out is not None else 0, stride_bm,
            HAS_BIAS=has_bias, ACT=act, STORE_PREACT=preact_out is not None,
            BLOCK_M=16, BLOCK_N=128, PDL=pdl, num_warps=4, **launch_kwargs(pdl),
        )
        return out
    grid = (tiles,)
    _linear_fwd_kernel[grid](
        x, weight, or_dummy(bias, out), out, or_dummy(preact_out, out), m, n, k,
        x.stride(0), weight.stride(0), out.stride(0),
        preact_out.stride(0) if preact_out is not None else 0, stride_bm,
        HAS_BIAS=has_bias, ACT=act, STORE_PREACT=preact_out is not None,
        EVEN_K=k % cfg.BLOCK_K == 0, DOT_PREC=dot_precision(x.dtype),
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_kwargs(pdl),
    )
    return out


# The MLP's decode sizes (M <= this) fold the split-K reduction into the down GEMM (tile_counters).
FUSED_REDUCE_MAX_M = 64


def splitk_counters(m: int, n: int) -> int:
    """How many tile counters `linear_fwd` may use for an [m, n] output: one per 16 x 16 tile, the
    smallest tile any config has (configs.fit_config keeps BLOCK_M and BLOCK_N >= 16)."""
    return triton.cdiv(m, 16) * triton.cdiv(n, 16)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: any small number, so that CPU tests take the split path
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _k_slices(cfg, tiles: int, k: int, device: torch.device) -> tuple:
    """(number of K slices, K per slice) for `cfg.SPLIT_K` (0 = two programs per SM); every slice
    is a whole number of BLOCK_K steps and none is empty."""
    if cfg.SPLIT_K == 1:
        return 1, k
    want = cfg.SPLIT_K or triton.cdiv(2 * _sm_count(device), tiles)
    k_blocks = triton.cdiv(k, cfg.BLOCK_K)
    split = max(1, min(want, k_blocks, MAX_SPLIT_K))
    k_per_split = triton.cdiv(k_blocks, split) * cfg.BLOCK_K
    return triton.cdiv(k, k_per_split), k_per_split


def linear_bwd_input(
    dx: torch.Tensor, grad_y: torch.Tensor, weight: torch.Tensor,
    preact: Optional[torch.Tensor], activation: str,
) -> torch.Tensor:
    """dx[M, K] = g @ weight[N, K], g = grad_y (activation "none") or grad_y * gelu'(preact), the latter
    formed while loading the A tiles (never materialised). `preact` is required unless activation is "none"."""
    act = act_from_activation(activation)
    m, n = grad_y.shape
    k = weight.shape[1]
    if m == 0 or k == 0:
        return dx
    if n == 0:
        return dx.zero_()
    cfg = get_config("linear_bwd_input", grad_y.device, grad_y.dtype, m, n, k)
    grid = (triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(k, cfg.BLOCK_N),)
    pre = or_dummy(preact if act else None, grad_y)
    _linear_bwd_input_kernel[grid](
        dx, grad_y, weight, pre, m, n, k,
        dx.stride(0), grad_y.stride(0), weight.stride(0), pre.stride(0),
        ACT=act, EVEN_N=n % cfg.BLOCK_K == 0, DOT_PREC=dot_precision(weight.dtype),
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dx


def linear_bwd_weight(
    dw: torch.Tensor, db: Optional[torch.Tensor], grad_y: torch.Tensor, x: torch.Tensor,
    preact: Optional[torch.Tensor], activation: str,
):
    """dw[N, K] = g.T @ x[M, K] and, if `db` [N] is given (fp32 buffer fine), db = g.sum(0), in the
    same kernel (the k-block-0 programs also reduce g's column sums). g as in `linear_bwd_input`."""
    act = act_from_activation(activation)
    m, n = grad_y.shape
    k = x.shape[1]
    if m == 0:
        dw.zero_()
        if db is not None:
            db.zero_()
        return dw, db
    if n == 0:
        return dw, db
    if k == 0:  # no dW tile to host the bias reduction
        if db is not None:
            g = grad_y.float()
            if act:
                g = g * _gelu_grad_torch(preact.float(), act)
            db.copy_(g.sum(0))
        return dw, db
    cfg = get_config("linear_bwd_weight", grad_y.device, grad_y.dtype, m, n, k)
    grid = (triton.cdiv(n, cfg.BLOCK_M) * triton.cdiv(k, cfg.BLOCK_N),)
    pre = or_dummy(preact if act else None, grad_y)
    _linear_bwd_weight_kernel[grid](
        dw, or_dummy(db, dw), grad_y, x, pre, m, n, k,
        dw.stride(0), grad_y.stride(0), x.stride(0), pre.stride(0),
        ACT=act, HAS_DB=db is not None, DOT_PREC=dot_precision(x.dtype),
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dw, db


def _gelu_grad_torch(x: torch.Tensor, act: int) -> torch.Tensor:
    """Host-side gelu' for the degenerate K == 0 bias-grad case only."""
    if act == 1:
        return 0.5 * (1 + torch.erf(x * 0.7071067811865476)) + x * 0.3989422804014327 * torch.exp(-0.5 * x * x)
    z = 0.7978845608028654 * (x + 0.044715 * x ** 3)
    s = torch.sigmoid(2 * z)
    return s + 2 * x * s * (1 - s) * 0.7978845608028654 * (1 + 0.134145 * x * x)
