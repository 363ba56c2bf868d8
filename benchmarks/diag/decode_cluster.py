"""Decode (M <= 16) as one CUDA kernel with cluster-shared h (`kernel_src/decode_sm90`), against the
shipped path.

The shipped decode under CUDA graphs is two Triton kernels (gate+up, then the split-K down GEMM);
`decode_fused.py` measured that two read-only kernels already cost more than the 1.3x target allows at
Gemma3-1B, and that a one-kernel Triton prototype lost on its fp32 partials. The compiled op
`geglu_mlp_decode_sm90` is the one-kernel design: h shared within 4-CTA clusters, one fp32 partial per
cluster, summed after a grid barrier.

First a correctness pass outside graphs (M = 1, 5, 16; biases on and off; tanh and erf GELU; bf16 and
fp16): error against float64 next to eager's own error. Then, per shape, one CUDA graph of n calls over
n weight sets (4x L2, so weights come from DRAM) per variant, µs per call over interleaved rounds:

- `shipped`: `geglu_mlp` with the auto policy (what a user gets under graphs);
- `eager`;
- `cluster`: the one-kernel op, ring depth by size (8 stages while the grid fits one CTA per SM);
- `cluster/s8`, `cluster/s4`: an 8- or 4-stage ring;
- `cluster diag=1` / `diag=2` / `diag=3`: timing only ($FUSED_GEGLU_DECODE_DIAG, read when the graph
  is captured): the weight stream without the MMAs / without the partials and the final sum /
  without either; `diag=4` / `diag=7`: the same without loading x's columns with each phase-1 tile
  (wrong results, timing only).

    python3 benchmarks/diag/decode_cluster.py --out DIR [--shapes gemma3-1b,gemma-2b,gemma2-9b]
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import decode_parser, decode_setup, decode_shapes, eager_mlp, print_timed, save_results  # noqa: E402
from decode_pdl import graph_of, time_replays  # noqa: E402


def reference(x, wg, wu, wd, bg, bu, bd, approximate):
    d = [t.double() if t is not None else None for t in (x, wg, wu, wd, bg, bu, bd)]
    h = F.gelu(F.linear(d[0], d[1], d[4]), approximate=approximate) * F.linear(d[0], d[2], d[5])
    return F.linear(h, d[3], d[6])


def check(ops, dev) -> list[dict]:
    rows = []
    for dt in (torch.bfloat16, torch.float16):
        for h, i in ((1152, 6912), (256, 512)):
            for m in (1, 5, 16):
                for bias in (False, True):
                    for approximate in ("tanh", "none"):
                        x = torch.randn(m, h, device=dev, dtype=dt)
                        wg, wu = (torch.randn(i, h, device=dev, dtype=dt) * h**-0.5 for _ in range(2))
                        wd = torch.randn(h, i, device=dev, dtype=dt) * i**-0.5
                        bg, bu, bd = ((torch.randn(n, device=dev, dtype=dt) if bias else None) for n in (i, i, h))
                        ref = reference(x, wg, wu, wd, bg, bu, bd, approximate)
                        partials = torch.empty(i // 256 * 16 * h, device=dev, dtype=torch.float32)
                        barrier = torch.zeros(1, device=dev, dtype=torch.int64)
                        code = 1 if approximate == "tanh" else 0
                        y = ops.geglu_mlp_decode_sm90(x, wg, wu, wd, bg, bu, bd, code, partials, barrier, 8)
                        y2 = ops.geglu_mlp_decode_sm90(x, wg, wu, wd, bg, bu, bd, code, partials, barrier, 4)
                        y3 = ops.geglu_mlp_decode_sm90(x, wg, wu, wd, bg, bu, bd, code, partials, barrier, 0)
                        ye = F.linear(F.gelu(F.linear(x, wg, bg), approximate=approximate) * F.linear(x, wu, bu), wd, bd)
                        scale = ref.abs().max().item()
                        err = max((y.double() - ref).abs().max().item(), (y2.double() - ref).abs().max().item()) / scale
                        eerr = (ye.double() - ref).abs().max().item() / scale
                        same = bool(torch.equal(y, y2) and torch.equal(y, y3))  # one summation order
                        calls = int(barrier.item()) // (i // 64)
                        row = {"dtype": str(dt).removeprefix("torch."), "H": h, "I": i, "M": m, "bias": bias,
                               "approximate": approximate, "rel_err": err, "eager_rel_err": eerr,
                               "bitwise_same_across_calls": same, "barrier_calls": calls}
                        rows.append(row)
                        bad = err > 2 * eerr + 1e-6 or not same or calls != 3
                        print(f"  check {'FAIL' if bad else 'ok  '} {row}", flush=True)
    return rows


def main() -> None:
    p = decode_parser(__doc__)
    p.add_argument("--skip-check", action="store_true")
    args = p.parse_args()
    k, _, _, dev, copy_rate, _ = decode_setup()
    ops = importlib.import_module(k.__name__ + "._ops").ops
    checks = [] if args.skip_check else check(ops, dev)
    dt = torch.bfloat16
    results = {"checks": checks}
    for shape, h, i, sets, per_set, refs in decode_shapes(args, dev, dt):
        n = len(sets)
        partials = torch.empty(i // 256 * 16 * h, device=dev, dtype=torch.float32)
        barrier = torch.zeros(1, device=dev, dtype=torch.int64)

        def cluster(stages, diag=0):
            def fn(x, wg, wu, wd):
                os.environ["FUSED_GEGLU_DECODE_DIAG"] = str(diag)
                return ops.geglu_mlp_decode_sm90(x, wg, wu, wd, None, None, None, 1, partials, barrier, stages)
            return fn

        variants = {
            "shipped": lambda x, wg, wu, wd: k.geglu_mlp(x, wg, wu, wd),
            "eager": eager_mlp,
            "cluster": cluster(0),
            "cluster/s8": cluster(8),
            "cluster/s4": cluster(4),
            "cluster diag=1": cluster(0, diag=1),
            "cluster diag=2": cluster(0, diag=2),
            "cluster diag=3": cluster(0, diag=3),
            "cluster diag=4": cluster(0, diag=4),
            "cluster diag=7": cluster(0, diag=7),
        }
        entries = {}
        for lab, fn in variants.items():
            try:
                g, outs = graph_of(fn, sets)
            except Exception as e:  # recorded, skipped
                print(f"  {shape} {lab}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                entries[lab] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                continue
            os.environ.pop("FUSED_GEGLU_DECODE_DIAG", None)
            err = None if "diag" in lab else \
                max(((o.double() - r).abs().max() / r.abs().max()).item() for o, r in zip(outs, refs))
            entries[lab] = {"graph": g, "rel_err": err}
        times = {lab: [] for lab, e in entries.items() if "graph" in e}
        for r in range(args.rounds):
            for lab in (list(times) if r % 2 == 0 else list(reversed(times))):
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
        results[shape] = {"H": h, "I": i, "tokens": args.tokens, "n_sets": n, "floor_us": floor, "rows": rows}
        print(f"{shape}: floor {floor:.2f} us (copy {copy_rate:.0f} GB/s), {n} sets", flush=True)
        print_timed(rows, floor)
        del entries, sets, refs
        torch.cuda.empty_cache()
    save_results(args.out, "decode-cluster.json", results, copy_rate, args)


if __name__ == "__main__":
    main()
