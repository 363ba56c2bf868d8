"""Decode (M = 16) as one kernel: how far could it go below the shipped gate+up kernel + down GEMM?

The shipped decode is two kernels (gate+up GeGLU, then the down GEMM with its split-K slices summed in
place, PDL between them). Gemma3-1B sits at about 1.7x its weight-read floor (47.8 MB at the large-copy
rate). Before building a one-kernel decode this script measures what such a structure can reach:

- `read3`: one kernel that only reads the three weights (flat, each program a contiguous chunk of
  each), 132 or 264 programs: the rate a single streaming kernel gets on these sizes;
- `read2+read1`: the same bytes in two kernels (gate and up, then down): what the kernel boundary costs;
- `gateup` and `down`: the shipped kernels on their own (`backend="triton"` internals);
- `shipped`: the whole shipped MLP call;
- `fused-atomic`: a prototype one-kernel MLP. Program p computes h for its slice of I (both gate and up
  rows of that slice), then multiplies it by the matching column slice of w_down and adds the
  [M, H] fp32 partial into an accumulator with atomics. The graph zeroes the accumulator before and
  converts it to bf16 after (two more nodes, counted): an upper bound for a product version that
  would fold both into the kernel. Non-deterministic summation order: a probe, not a product path;
- `fused-ws`: the same kernel writing partials to a workspace [P, M, H] and a second kernel summing
  them in program order (deterministic).
- `eager`.

Every variant runs in one CUDA graph of n calls over n weight sets holding at least 4x L2 (so weights
come from DRAM, as in a decode step); µs per call, `--rounds` interleaved rounds of `--reps` replays.

    python3 benchmarks/diag/decode_fused.py --out DIR [--shapes gemma3-1b,gemma-2b,gemma2-9b]
"""

from __future__ import annotations

import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import (  # noqa: E402
    decode_parser, decode_setup, decode_shapes, eager_mlp, print_timed, save_results,
)
from decode_pdl import graph_of, time_replays  # noqa: E402


@triton.jit
def _chunk_sum(ptr, n, pid, CHUNK, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    """fp32 sums (per lane) of elements [pid*CHUNK, (pid+1)*CHUNK) of the flat tensor ptr[n], two
    independent BLOCK loads per step."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    offs = tl.arange(0, BLOCK)
    start = pid.to(tl.int64) * CHUNK
    for s in range(0, CHUNK, 2 * BLOCK):
        o0 = start + s + offs
        o1 = o0 + BLOCK
        v0 = tl.load(ptr + o0, mask=(o0 < n) & (s + offs < CHUNK), other=0.0, eviction_policy=EVICT)
        v1 = tl.load(ptr + o1, mask=(o1 < n) & (s + BLOCK + offs < CHUNK), other=0.0, eviction_policy=EVICT)
        acc += v0.to(tl.float32) + v1.to(tl.float32)
    return acc


@triton.jit
def _read_kernel(a_ptr, b_ptr, c_ptr, out_ptr, na, nb, nc, CHUNK_A, CHUNK_B, CHUNK_C,
                 HAS_B: tl.constexpr, HAS_C: tl.constexpr, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    """Program p reads elements [p*CHUNK, (p+1)*CHUNK) of each flat tensor and stores one sum."""
    pid = tl.program_id(0)
    acc = _chunk_sum(a_ptr, na, pid, CHUNK_A, BLOCK, EVICT)
    if HAS_B:
        acc += _chunk_sum(b_ptr, nb, pid, CHUNK_B, BLOCK, EVICT)
    if HAS_C:
        acc += _chunk_sum(c_ptr, nc, pid, CHUNK_C, BLOCK, EVICT)
    tl.store(out_ptr + pid, tl.sum(acc))


def read(tensors, out, programs: int, block: int = 4096, warps: int = 8, evict: str = ""):
    ts = list(tensors) + [tensors[0]] * (3 - len(tensors))
    ns = [t.numel() for t in ts]
    chunks = [-(-n // programs) for n in ns]
    chunks = [-(-c // (2 * block)) * 2 * block for c in chunks]
    _read_kernel[(programs,)](ts[0], ts[1], ts[2], out, *ns, *chunks,
                              HAS_B=len(tensors) > 1, HAS_C=len(tensors) > 2, BLOCK=block, EVICT=evict,
                              num_warps=warps)


@triton.jit
def _gelu_tanh(x):
    # 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
    u = 1.5957691216057308 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-u))


@triton.jit
def _fused_kernel(x_ptr, wg_ptr, wu_ptr, wd_ptr, acc_ptr, M, I, H, SLICE,
                  stride_xm, stride_wg, stride_wu, stride_wd, stride_pp,
                  ATOMIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    ri = tl.arange(0, BLOCK_I)
    offs_i = pid * SLICE + ri
    i_ok = (ri < SLICE) & (offs_i < I)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    rk = tl.arange(0, BLOCK_K)
    bi = offs_i.to(tl.int64)
    acc_g = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k_ok = k0 + rk < H
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + rk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        bg = tl.load(wg_ptr + bi[None, :] * stride_wg + (k0 + rk)[:, None],
                     mask=i_ok[None, :] & k_ok[:, None], other=0.0)
        bu = tl.load(wu_ptr + bi[None, :] * stride_wu + (k0 + rk)[:, None],
                     mask=i_ok[None, :] & k_ok[:, None], other=0.0)
        acc_g = tl.dot(a, bg, acc_g)
        acc_u = tl.dot(a, bu, acc_u)
    h = (_gelu_tanh(acc_g) * acc_u).to(x_ptr.dtype.element_ty)  # rounded as the stored h is
    rh = tl.arange(0, BLOCK_H)
    if ATOMIC:
        out_base = acc_ptr
    else:
        out_base = acc_ptr + pid.to(tl.int64) * stride_pp
    for n0 in range(0, H, BLOCK_H):
        n_ok = n0 + rh < H
        wdt = tl.load(wd_ptr + (n0 + rh).to(tl.int64)[None, :] * stride_wd + offs_i[:, None],
                      mask=i_ok[:, None] & n_ok[None, :], other=0.0)  # [BLOCK_I, BLOCK_H] = w_down.T tile
        part = tl.dot(h, wdt)
        ptrs = out_base + offs_m[:, None] * H + (n0 + rh)[None, :]
        if ATOMIC:
            tl.atomic_add(ptrs, part, mask=m_ok[:, None] & n_ok[None, :], sem="relaxed")
        else:
            tl.store(ptrs, part, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _sum_partials_kernel(ws_ptr, y_ptr, P, MH, stride_pp, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MH
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(0, P):
        acc += tl.load(ws_ptr + p * stride_pp + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


class Fused:
    def __init__(self, m, h, i, dev, slice_, block_i, atomic, block_k=128, block_h=64, warps=4, stages=4):
        self.slice, self.block_i, self.atomic = slice_, block_i, atomic
        self.programs = -(-i // slice_)
        self.block_k, self.block_h, self.warps, self.stages = block_k, block_h, warps, stages
        self.acc = torch.zeros(m * h if atomic else self.programs * m * h, device=dev, dtype=torch.float32)

    def __call__(self, x, wg, wu, wd):
        m, h = x.shape
        i = wg.shape[0]
        if self.atomic:
            self.acc.zero_()
        _fused_kernel[(self.programs,)](
            x, wg, wu, wd, self.acc, m, i, h, self.slice,
            x.stride(0), wg.stride(0), wu.stride(0), wd.stride(0), m * h,
            ATOMIC=self.atomic, BLOCK_M=16, BLOCK_I=self.block_i, BLOCK_K=self.block_k, BLOCK_H=self.block_h,
            num_warps=self.warps, num_stages=self.stages)
        if self.atomic:
            return self.acc.view(m, h).to(x.dtype)
        y = torch.empty(m, h, device=x.device, dtype=x.dtype)
        _sum_partials_kernel[(triton.cdiv(m * h, 512),)](self.acc, y, self.programs, m * h, m * h, BLOCK=512)
        return y


def _variants(shipped, gateup_only, down_only, sink, sms, m, h, i, dev) -> dict:
    """label: (fn(x, wg, wu, wd), whether its output is an MLP output to check)."""
    variants = {
        "shipped": (shipped, True),
        "eager": (eager_mlp, True),
        "gateup": (gateup_only, False),
        "down": (down_only, False),
    }
    for progs in (sms, 2 * sms):
        variants[f"read3/p{progs}"] = (lambda x, wg, wu, wd, P=progs: read((wg, wu, wd), sink, P), False)
        variants[f"read2+read1/p{progs}"] = (
            lambda x, wg, wu, wd, P=progs: (read((wg, wu), sink, P), read((wd,), sink, P)), False)
    sl_even = -(-i // sms + 7) // 8 * 8  # the fewest programs that still fill every SM once
    for sl, bi in ((64, 64), (32, 32), (sl_even, triton.next_power_of_2(sl_even))):
        for atomic in (True, False):
            for bh in (64, 128):
                if -(-i // sl) > 2 * sms or sl > bi:
                    continue
                lab = f"fused-{'atomic' if atomic else 'ws'}/s{sl}b{bi}h{bh}"
                variants[lab] = (Fused(m, h, i, dev, sl, bi, atomic, block_h=bh), True)
    return variants


def main() -> None:
    p = decode_parser(__doc__)
    p.add_argument("--read-sweep", action="store_true",
                   help="only the read-only kernels, over programs per SM, block, warps and eviction hint")
    args = p.parse_args()
    k, tk_mlp, tk_linear, dev, copy_rate, sms = decode_setup()
    dt = torch.bfloat16
    results = {}
    for shape, h, i, sets, per_set, refs in decode_shapes(args, dev, dt):
        m, n = args.tokens, len(sets)
        sink = torch.empty(4 * sms, device=dev, dtype=torch.float32)
        hbuf = [torch.randn(m, i, device=dev, dtype=dt) for _ in sets]

        def shipped(x, wg, wu, wd):
            return k.geglu_mlp(x, wg, wu, wd, backend="triton")

        it = {"n": 0}

        def gateup_only(x, wg, wu, wd):
            j = it["n"] % n
            it["n"] += 1
            return tk_mlp.gateup_fwd(hbuf[j], x, wg, wu, None, None, "tanh", None, None)

        def down_only(x, wg, wu, wd):
            j = it["n"] % n
            it["n"] += 1
            y = torch.empty(m, h, device=dev, dtype=dt)
            return tk_linear.linear_fwd(y, hbuf[j], wd, None, "none", None)

        if args.read_sweep:
            variants = {"shipped": (shipped, True)}
            for per_sm in (2, 4, 8, 16):
                for block in (2048, 4096, 8192):
                    for warps in (4, 8):
                        for ev in ("", "evict_first"):
                            if block // (32 * warps) > 64:  # more than 128 B per thread per load
                                continue
                            lab = f"read3/p{per_sm * sms}b{block}w{warps}{'ef' if ev else ''}"
                            variants[lab] = (lambda x, wg, wu, wd, P=per_sm * sms, B=block, W=warps, E=ev:
                                             read((wg, wu, wd), sink, P, B, W, E), False)
        else:
            variants = _variants(shipped, gateup_only, down_only, sink, sms, m, h, i, dev)

        entries = {}
        for lab, (fn, check) in variants.items():
            try:
                g, outs = graph_of(fn, sets)
            except Exception as e:  # a variant Triton cannot compile or capture: recorded, skipped
                print(f"  {shape} {lab}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                entries[lab] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                continue
            err = None
            if check:
                err = max(((o.double() - r).abs().max() / r.abs().max()).item() for o, r in zip(outs, refs))
            entries[lab] = {"graph": g, "rel_err": err}
        times = {lab: [] for lab, e in entries.items() if "graph" in e}
        for r in range(args.rounds):
            order = list(times) if r % 2 == 0 else list(reversed(times))
            for lab in order:
                times[lab] += [t / n for t in time_replays(entries[lab]["graph"], args.reps)]
        floor = per_set / (copy_rate * 1e9) * 1e6
        rows = {}
        for lab, e in entries.items():
            if lab not in times:
                rows[lab] = e
                continue
            t = sorted(times[lab])
            rows[lab] = {"median_us": statistics.median(t), "p20_us": t[len(t) // 5], "p80_us": t[4 * len(t) // 5],
                         "rel_err": e["rel_err"], "of_floor": statistics.median(t) / floor}
        results[shape] = {"H": h, "I": i, "tokens": m, "n_sets": n, "floor_us": floor, "rows": rows}
        print(f"{shape}: floor {floor:.2f} us (copy {copy_rate:.0f} GB/s), {n} sets", flush=True)
        print_timed(rows, floor)
        del entries, sets, refs
        torch.cuda.empty_cache()
    save_results(args.out, "decode-fused.json", results, copy_rate, args)


if __name__ == "__main__":
    main()
