"""Decode (M = 16): can the two decode kernels stream their weights at the rate a read-only kernel gets?

decode_fused.py --read-sweep measured one read-only kernel taking Gemma3-1B's 47.8 MB of weights in
12.95 us (1.13x the large-copy floor) with 8 programs per SM and evict-first loads, while the shipped
gate+up kernel alone takes 11.3 us for its 31.8 MB (2.8 TB/s). This script times stand-ins for the two
decode kernels with the knobs the shipped ones lack, alone and as a pair:

- `gu`: the gate+up GeGLU GEMM, optionally split over K (H) with the slices of gate and up summed by the
  last program of each column tile (deterministic: slice order), then GELU(gate) * up; more programs
  in flight without a reduction kernel;
- `dn`: the down GEMM, split over K (I) the same way (the shipped kernel's in-GEMM sum);
- both with optional `evict_first` on the weight loads (read once per step; x, h and partials stay);
- `--prefetch`: the gate+up kernel also pulls w_down (its share per program, a chunk per K step) into L2
  with an `evict_last` hint, so that the down GEMM finds it there (it fits: 15.9 MB at Gemma3-1B). The PDL
  prefetch of 85f3c03 lost because the gate+up stream evicted the lines first (triton_kernels/pdl.py).
  At b939f9a the share was read into registers (`evict_last` / normal loads): 37-38 us per MLP, the loop
  waiting on each load (that variant is gone; its results are in benchmarks/results); since f5ff874 it is
  one `prefetch.global.L2::evict_last` per 128-byte line (`pf-asm` pairs).

Sections: `gu` screen (one round) then the best `--keep` with the shipped gate+up kernel and a
read-only floor of the same bytes over `--rounds` interleaved rounds; the same for `dn`; then the best
3 x 3 pairs (gu then dn, plain launches) against the shipped MLP and eager, checked against float64.
CUDA graphs of n calls over n weight sets holding at least 4x L2.

    python3 benchmarks/diag/decode_stream.py --out DIR [--shapes gemma3-1b] [--rounds 7]
"""

from __future__ import annotations

import itertools
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
from decode_fused import _gelu_tanh, read  # noqa: E402
from decode_pdl import graph_of, time_replays  # noqa: E402


@triton.jit
def _stream_kernel(x_ptr, wa_ptr, wb_ptr, out_ptr, part_ptr, cnt_ptr, M, N, K, K_PER,
                   stride_xm, stride_wa, stride_wb, stride_om,
                   GEGLU: tl.constexpr, SPLIT: tl.constexpr, EVICT: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   pf_ptr=None, pf_n=0, pf_sink=None, PF: tl.constexpr = False, PF_BLOCK: tl.constexpr = 2048):
    """out[M, N] = geglu(x @ wa.T, x @ wb.T) (GEGLU) or x @ wa.T; wa/wb [N, K]; K split in SPLIT slices
    of K_PER (a multiple of BLOCK_K); partials [2, SPLIT, M, N] fp32; one counter per column tile.
    PF: each program also prefetches its share of the flat tensor pf_ptr[pf_n] into L2 (evict_last),
    PF_BLOCK elements per K step, so that the next kernel finds it there (the down weight)."""
    pid_n, pid_s = tl.program_id(0), tl.program_id(1)
    if PF:
        # One lane per 128-byte line (64 two-byte elements).
        pf_off = ((pid_s * tl.num_programs(0) + pid_n).to(tl.int64) * tl.cdiv(K_PER, BLOCK_K) * PF_BLOCK
                  + tl.arange(0, PF_BLOCK // 64) * 64)
        pf_acc = tl.zeros((PF_BLOCK // 64,), dtype=tl.int32)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    bn = (offs_n % N).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    k_lo = pid_s * K_PER
    acc_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_lo + K_PER, BLOCK_K):
        k_ok = k0 + rk < K
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + rk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        wa = tl.load(wa_ptr + bn[None, :] * stride_wa + (k0 + rk)[:, None], mask=k_ok[:, None], other=0.0,
                     eviction_policy=EVICT)
        acc_a = tl.dot(a, wa, acc_a)
        if PF:
            # A prefetch writes no register, so the loop does not wait for it (loading the share into
            # registers instead cost 37-38 us per MLP at b939f9a: the loop stalled on every load).
            pf_acc += tl.inline_asm_elementwise(
                "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l",
                [pf_ptr + tl.minimum(pf_off, pf_n - 1)], dtype=tl.int32, is_pure=False, pack=1)
            pf_off += PF_BLOCK
        if GEGLU:
            wb = tl.load(wb_ptr + bn[None, :] * stride_wb + (k0 + rk)[:, None], mask=k_ok[:, None], other=0.0,
                         eviction_policy=EVICT)
            acc_b = tl.dot(a, wb, acc_b)
    if PF:
        tl.store(pf_sink + pid_s * tl.num_programs(0) + pid_n, tl.sum(pf_acc))
    mask = m_ok[:, None] & n_ok[None, :]
    o_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    if SPLIT == 1:
        if GEGLU:
            tl.store(o_ptrs, (_gelu_tanh(acc_a) * acc_b).to(out_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(o_ptrs, acc_a.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        plane = M * N
        p_ptrs = part_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.store(p_ptrs + pid_s * plane, acc_a, mask=mask)
        if GEGLU:
            tl.store(p_ptrs + (SPLIT + pid_s) * plane, acc_b, mask=mask)
        tl.debug_barrier()
        if tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1:
            sa = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            sb = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(0, SPLIT):
                sa += tl.load(p_ptrs + s * plane, mask=mask, other=0.0, cache_modifier=".cg")
                if GEGLU:
                    sb += tl.load(p_ptrs + (SPLIT + s) * plane, mask=mask, other=0.0, cache_modifier=".cg")
            if GEGLU:
                tl.store(o_ptrs, (_gelu_tanh(sa) * sb).to(out_ptr.dtype.element_ty), mask=mask)
            else:
                tl.store(o_ptrs, sa.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)


class Stream:
    """One configured launch of _stream_kernel for fixed (M, N, K); owns its partials and counters."""

    def __init__(self, m, n, k, dev, geglu, bn, bk, split, warps, stages, evict):
        self.geglu, self.bn, self.bk, self.warps, self.stages, self.evict = geglu, bn, bk, warps, stages, evict
        k_blocks = triton.cdiv(k, bk)
        split = max(1, min(split, k_blocks))
        self.k_per = triton.cdiv(k_blocks, split) * bk
        self.split = triton.cdiv(k, self.k_per)
        self.part = torch.empty(2 * self.split * m * n if self.split > 1 else 1, device=dev, dtype=torch.float32)
        self.cnt = torch.zeros(triton.cdiv(n, bn), device=dev, dtype=torch.int32)

    def __call__(self, out, x, wa, wb=None, prefetch=None):
        m, k = x.shape
        n = wa.shape[0]
        wb = wa if wb is None else wb
        grid = (triton.cdiv(n, self.bn), self.split)
        pf = {}
        if prefetch is not None:  # prefetch: a tensor for the next kernel, pulled into L2 on the way
            programs, steps = grid[0] * grid[1], triton.cdiv(self.k_per, self.bk)
            block = max(2048, triton.next_power_of_2(triton.cdiv(prefetch.numel(), programs * steps)))
            sink = torch.empty(programs, device=x.device, dtype=torch.int32)
            pf = dict(pf_ptr=prefetch, pf_n=prefetch.numel(), pf_sink=sink, PF=True, PF_BLOCK=block)
        _stream_kernel[grid](
            x, wa, wb, out, self.part, self.cnt, m, n, k, self.k_per,
            x.stride(0), wa.stride(0), wb.stride(0), out.stride(0),
            GEGLU=self.geglu, SPLIT=self.split, EVICT=self.evict, BLOCK_M=16, BLOCK_N=self.bn, BLOCK_K=self.bk,
            num_warps=self.warps, num_stages=self.stages, **pf)
        return out


def label(c: dict) -> str:
    return (f"{c['bn']}x{c['bk']}w{c['warps']}s{c['stages']}k{c['split']}"
            + ("ef" if c["evict"] else ""))


def candidates(kind: str):
    splits = (1, 2, 3, 4) if kind == "gu" else (4, 6, 8, 12, 16)
    for bn, bk, split, warps, ev in itertools.product((16, 32), (128, 256), splits, (2, 4), ("", "evict_first")):
        if bn == 16 and warps == 4:
            continue
        yield {"bn": bn, "bk": bk, "split": split, "warps": warps, "stages": 4 if bk == 128 else 3, "evict": ev}


def main() -> None:
    p = decode_parser(__doc__)
    p.add_argument("--keep", type=int, default=6)
    p.add_argument("--prefetch", action="store_true",
                   help="no screens: the best pairs of a754502, with and without the gate+up kernel reading "
                        "w_down into L2 (prefetch.global.L2::evict_last) for the down GEMM")
    args = p.parse_args()
    k, tk_mlp, tk_linear, dev, copy_rate, sms = decode_setup()
    dt = torch.bfloat16
    results = {}
    for shape, h, i, sets, per_set, refs in decode_shapes(args, dev, dt):
        m, n = args.tokens, len(sets)
        hrefs = [torch.nn.functional.gelu(s[0].double() @ s[1].double().T, approximate="tanh")
                 * (s[0].double() @ s[2].double().T) for s in sets]
        hbufs = [r.to(dt) for r in hrefs]  # the down GEMM's input, one per set (the graph rotates sets)
        sink = torch.empty(16 * sms, device=dev, dtype=torch.float32)
        rotate = {"j": 0}

        def next_set() -> int:
            j = rotate["j"] % n
            rotate["j"] += 1
            return j

        def shipped_gu(x, wg, wu, wd):
            return tk_mlp.gateup_fwd(torch.empty(m, i, device=dev, dtype=dt), x, wg, wu, None, None, "tanh",
                                     None, None)

        def shipped_dn(x, wg, wu, wd):
            return tk_linear.linear_fwd(torch.empty(m, h, device=dev, dtype=dt), hbufs[next_set()], wd, None,
                                        "none", None)

        def rel_err(outs, want):
            return max(((o.double() - r).abs().max() / r.abs().max()).item() for o, r in zip(outs, want))

        def build(fn, want=None):
            try:
                rotate["j"] = 0
                g, outs = graph_of(fn, sets)
            except Exception as e:  # a config Triton cannot compile here: recorded, skipped
                return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            return {"graph": g, "rel_err": rel_err(outs, want) if want is not None else None}

        def timed(entries: dict, rounds: int) -> dict:
            live = {lab: e for lab, e in entries.items() if "graph" in e}
            times = {lab: [] for lab in live}
            for r in range(rounds):
                for lab in (list(live) if r % 2 == 0 else list(reversed(live))):
                    times[lab] += [t / n for t in time_replays(live[lab]["graph"], args.reps)]
            out = {}
            for lab, e in entries.items():
                if lab not in times:
                    out[lab] = {"error": e["error"]}
                    continue
                t = sorted(times[lab])
                out[lab] = {"median_us": statistics.median(t), "p20_us": t[len(t) // 5],
                            "p80_us": t[4 * len(t) // 5], "rel_err": e["rel_err"]}
            return out

        shape_res = {"H": h, "I": i, "tokens": m, "n_sets": n, "floor_us": per_set / (copy_rate * 1e9) * 1e6}
        best = {}
        if args.prefetch:  # the two best of each from decode-stream-h200-a754502.json, no screen
            best = {"gu": [(label(c), c) for c in (
                        {"bn": 32, "bk": 128, "split": 1, "warps": 2, "stages": 4, "evict": ""},
                        {"bn": 32, "bk": 128, "split": 1, "warps": 2, "stages": 4, "evict": "evict_first"})],
                    "dn": [(label(c), c) for c in (
                        {"bn": 32, "bk": 256, "split": 8, "warps": 4, "stages": 3, "evict": ""},
                        {"bn": 32, "bk": 128, "split": 6, "warps": 4, "stages": 4, "evict": ""})]}
        for kind in () if args.prefetch else ("gu", "dn"):
            cfgs = {label(c): c for c in candidates(kind)}
            entries = {}
            for lab, c in cfgs.items():
                if kind == "gu":
                    st = Stream(m, i, h, dev, True, c["bn"], c["bk"], c["split"], c["warps"], c["stages"], c["evict"])
                    fn = (lambda x, wg, wu, wd, st=st: st(torch.empty(m, i, device=dev, dtype=dt), x, wg, wu))
                    want = hrefs
                else:
                    st = Stream(m, h, i, dev, False, c["bn"], c["bk"], c["split"], c["warps"], c["stages"], c["evict"])
                    fn = (lambda x, wg, wu, wd, st=st: st(torch.empty(m, h, device=dev, dtype=dt),
                                                          hbufs[next_set()], wd))
                    want = [hb.double() @ s[3].double().T for hb, s in zip(hbufs, sets)]
                entries[lab] = build(fn, want)
                entries[lab]["cfg"] = c
            screen = timed(entries, 1)
            keep = [lab for _, lab in sorted((v["median_us"], lab) for lab, v in screen.items() if "median_us" in v)]
            keep = keep[: args.keep]
            finals = {lab: entries[lab] for lab in keep}
            finals["shipped"] = build(shipped_gu if kind == "gu" else shipped_dn)
            # The read-only floor of this kernel's weight bytes, with the best read config of feebdba.
            finals["read-floor"] = build(lambda x, wg, wu, wd, gu=kind == "gu":
                                         read((wg, wu) if gu else (wd,), sink, 8 * sms, 2048, 8, "evict_first"))
            rounds = timed(finals, args.rounds)
            shape_res[kind] = {"screen": screen, "rounds": rounds, "configs": {lab: cfgs[lab] for lab in keep}}
            best[kind] = [(lab, cfgs[lab]) for lab in
                          sorted((lab for lab in keep), key=lambda lab: rounds[lab]["median_us"])[:3]]
            print(f"{shape} {kind}: " + " | ".join(f"{lab} {v['median_us']:.2f}" for lab, v in
                                                   sorted(rounds.items(), key=lambda kv: kv[1].get("median_us", 1e9))),
                  flush=True)
            for e in entries.values():
                e.pop("graph", None)
            torch.cuda.empty_cache()
        pairs = {"shipped": build(lambda x, wg, wu, wd: k.geglu_mlp(x, wg, wu, wd, backend="triton"), refs),
                 "eager": build(eager_mlp, refs)}
        prefetches = ("none", "asm") if args.prefetch else ("none",)  # "asm": prefetch instructions
        for (gl, gc), (dl, dc), pf in itertools.product(best["gu"], best["dn"], prefetches):
            gu = Stream(m, i, h, dev, True, gc["bn"], gc["bk"], gc["split"], gc["warps"], gc["stages"], gc["evict"])
            dn = Stream(m, h, i, dev, False, dc["bn"], dc["bk"], dc["split"], dc["warps"], dc["stages"], dc["evict"])

            def pair(x, wg, wu, wd, gu=gu, dn=dn, pf=pf):
                # pf: the gate+up kernel also reads w_down with this L2 hint, for the down GEMM to find
                hid = gu(torch.empty(m, i, device=dev, dtype=dt), x, wg, wu, prefetch=None if pf == "none" else wd)
                return dn(torch.empty(m, h, device=dev, dtype=dt), hid, wd)

            pairs[f"{gl}+{dl}" + ("" if pf == "none" else f"+pf-{pf}")] = build(pair, refs)
        pairs["read3-floor"] = build(lambda x, wg, wu, wd: read((wg, wu, wd), sink, 8 * sms, 2048, 8, "evict_first"))
        shape_res["pairs"] = timed(pairs, args.rounds)
        results[shape] = shape_res
        print(f"{shape}: floor {shape_res['floor_us']:.2f} us", flush=True)
        print_timed(shape_res["pairs"])
        del sets, refs, hrefs, hbufs
        torch.cuda.empty_cache()
    save_results(args.out, "decode-stream.json", results, copy_rate, args)


if __name__ == "__main__":
    main()
