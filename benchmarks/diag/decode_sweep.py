"""Decode (M <= 16) launch configs of the Triton gate+up and down kernels, timed cold.

tune.py times one kernel on one set of weights, so at Gemma3-1B (47.8 MB of weights against a 60 MB
L2) it tuned the decode kernels on weights read from L2. This script times the whole MLP call as the
capture rule runs it (`geglu_mlp(..., backend="triton")`: gate+up kernel, then the down GEMM with its
split-K slices summed in place, PDL as shipped) inside one CUDA graph of n calls over n weight sets
that together hold at least 4x L2, so every call reads its weights from DRAM, as a decode step does.

1. screen: each candidate config of one kernel with the other kernel's shipped config, one round;
2. rounds: the `--keep` best of each kernel, plus the shipped pair, `--rounds` interleaved rounds;
3. pairs: the best 3 x 3 combinations, the shipped pair and eager, `--rounds` interleaved rounds.
Every output is compared with the shipped pair's (max abs difference, recorded) and with float64.

    python3 benchmarks/diag/decode_sweep.py --out DIR [--shapes gemma3-1b] [--tokens 16] [--rounds 7]

The run at 7771557 also swept down configs that read their weight before the PDL wait (a kernel option
since removed; triton_kernels/pdl.py has the numbers).

Writes DIR/decode-sweep.json (env, per shape: candidates, screen, rounds, pairs, and the winner as a
configs_sm90.json "tuned" entry). Not the product benchmark (benchmarks/compare.py).
"""

from __future__ import annotations

import importlib
import itertools
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import (  # noqa: E402
    SHAPES, copy_gbs, decode_parser, decode_weight_sets, eager_mlp, load_kernel, save_results,
)
from decode_pdl import graph_of, time_replays  # noqa: E402

SMEM_LIMIT = 220 * 1024  # below sm90's 227 KB opt-in, leaving room for Triton's own scratch


def gateup_candidates():
    """Gate+up: one program per BLOCK_N columns of I, both weights per K step."""
    for bn, bk, w, s in itertools.product((32, 64, 128), (64, 128, 256), (2, 4, 8), (3, 4, 5, 6)):
        if (16 * bk + 2 * bk * bn) * 2 * s > SMEM_LIMIT or (bn == 128 and w == 2) or (bn < 128 and w == 8):
            continue
        yield {"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "num_warps": w, "num_stages": s,
               "SPLIT_K": 1}


def down_candidates():
    """Down GEMM: output tiles of BLOCK_N columns of H, K (= I) split into SPLIT_K slices (1: none)."""
    for bn, bk, sk, w, s in itertools.product((16, 32, 64, 128), (128, 256), (1, 4, 6, 8, 12), (2, 4), (3, 4, 6)):
        if (16 * bk + bk * bn) * 2 * s > SMEM_LIMIT or (bn >= 64 and w == 2) or (bn == 16 and w == 4):
            continue
        if (bk == 128 and s == 3) or (bk == 256 and s == 6):  # about 3-5 steps of 16-32 KB in flight
            continue
        yield {"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "num_warps": w, "num_stages": s,
               "SPLIT_K": sk}


def name_of(cfg: dict) -> str:
    s = f"{cfg['BLOCK_N']}x{cfg['BLOCK_K']}w{cfg['num_warps']}s{cfg['num_stages']}"
    return s + (f"k{cfg['SPLIT_K']}" if cfg.get("SPLIT_K", 1) != 1 else "")


class Table:
    """The tuned M <= 16 entries of configs_sm90.json for one shape, replaced in memory."""

    def __init__(self, cfgmod, tokens: int, h: int, i: int):
        self.cfgmod = cfgmod
        self.table = cfgmod._load_json((9, 0))["tuned"]
        bucket = cfgmod.m_bucket(tokens)
        self.keys = {"gateup_fwd": f"M={bucket},N={i},K={h}", "linear_fwd": f"M={bucket},N={h},K={i}"}
        self.shipped = {k: self.table[k][key] for k, key in self.keys.items()}

    def set(self, gateup: dict | None, down: dict | None) -> None:
        for kern, cfg in (("gateup_fwd", gateup), ("linear_fwd", down)):
            self.table[kern][self.keys[kern]] = (self.cfgmod.KernelConfig.from_dict(cfg) if cfg
                                                 else self.shipped[kern])
        self.cfgmod._gpu_config.cache_clear()

    def restore(self) -> None:
        self.set(None, None)


def main() -> None:
    p = decode_parser(__doc__)
    p.add_argument("--keep", type=int, default=6)
    p.add_argument("--max-candidates", type=int, default=0, help="per kernel, 0 = all (a quick look: 10)")
    args = p.parse_args()
    k = load_kernel()
    cfgmod = importlib.import_module(k.__name__ + ".triton_kernels.configs")
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    copy_rate = copy_gbs(dev)

    def mlp(x, wg, wu, wd):
        return k.geglu_mlp(x, wg, wu, wd, backend="triton")

    results = {}
    for shape in args.shapes.split(","):
        h, i = SHAPES[shape]
        sets, per_set, refs = decode_weight_sets(h, i, args.tokens, dev, dt)
        n = len(sets)
        eager_err = max(((eager_mlp(*s).double() - r).abs().max() / r.abs().max()).item()
                        for s, r in zip(sets, refs))
        table = Table(cfgmod, args.tokens, h, i)
        shipped = {kk: v.to_dict() for kk, v in table.shipped.items()}
        base_out = None
        graphs: dict = {}

        def build(label: str, gateup: dict | None, down: dict | None):
            nonlocal base_out
            table.set(gateup, down)
            try:
                g, outs = graph_of(mlp, sets)
            except Exception as e:  # a config Triton cannot compile here (resources): recorded, skipped
                print(f"  {label}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                return None
            finally:
                table.restore()
            err = max(((o.double() - r).abs().max() / r.abs().max()).item() for o, r in zip(outs, refs))
            diff = 0.0 if base_out is None else max((o.float() - b.float()).abs().max().item()
                                                    for o, b in zip(outs, base_out))
            if base_out is None:
                base_out = outs
            return {"graph": g, "rel_err": err, "max_abs_diff_vs_shipped": diff}

        def timed(entries: dict, rounds: int) -> dict:
            times = {lab: [] for lab in entries}
            for r in range(rounds):
                order = list(entries) if r % 2 == 0 else list(reversed(entries))
                for lab in order:
                    times[lab] += [t / n for t in time_replays(entries[lab]["graph"], args.reps)]
            return {lab: {"median_us": statistics.median(t), "p20_us": sorted(t)[len(t) // 5],
                          "p80_us": sorted(t)[4 * len(t) // 5], "rel_err": entries[lab]["rel_err"],
                          "max_abs_diff_vs_shipped": entries[lab]["max_abs_diff_vs_shipped"]}
                    for lab, t in times.items()}

        graphs["shipped"] = build("shipped", None, None)
        cands = {"gateup": list(gateup_candidates()), "down": list(down_candidates())}
        if args.max_candidates:
            cands = {kk: v[:: max(1, len(v) // args.max_candidates)] for kk, v in cands.items()}
        screen = {}
        for kern, lst in cands.items():
            entries = {"shipped": graphs["shipped"]}
            for cfg in lst:
                lab = f"{kern}:{name_of(cfg)}"
                e = build(lab, cfg if kern == "gateup" else None, cfg if kern == "down" else None)
                if e is not None:
                    e["cfg"] = cfg
                    entries[lab] = e
            t = timed(entries, 1)
            screen[kern] = t
            best = sorted((v["median_us"], lab) for lab, v in t.items() if lab != "shipped")[: args.keep]
            print(f"{shape} screen {kern}: shipped {t['shipped']['median_us']:.2f} | "
                  + " ".join(f"{lab.split(':')[1]}={us:.2f}" for us, lab in best), flush=True)
            graphs.update({lab: entries[lab] for _, lab in best})
            for lab in entries:
                if lab not in graphs:
                    entries[lab]["graph"] = None
            torch.cuda.empty_cache()
        rounds = timed({lab: e for lab, e in graphs.items()}, args.rounds)
        top = {kern: [lab for _, lab in sorted((v["median_us"], lab) for lab, v in rounds.items()
                                               if lab.startswith(kern + ":"))[:3]] for kern in cands}
        pairs_in = {"shipped": graphs["shipped"]}
        for gl, dl in itertools.product(top["gateup"], top["down"]):
            e = build(f"{gl}+{dl}", graphs[gl]["cfg"], graphs[dl]["cfg"])
            if e is not None:
                e["cfg"] = {"gateup_fwd": graphs[gl]["cfg"], "linear_fwd": graphs[dl]["cfg"]}
                pairs_in[f"{gl}+{dl}"] = e
        pairs_in["eager"] = {"graph": graph_of(eager_mlp, sets)[0], "rel_err": eager_err,
                             "max_abs_diff_vs_shipped": None}
        pairs = timed(pairs_in, args.rounds)
        win = min((v["median_us"], lab) for lab, v in pairs.items() if lab != "eager")[1]
        floor = per_set / (copy_rate * 1e9) * 1e6
        results[shape] = {
            "H": h, "I": i, "tokens": args.tokens, "n_sets": n, "floor_us": floor, "eager_rel_err": eager_err,
            "shipped": shipped, "candidates": {kk: len(v) for kk, v in cands.items()},
            "screen": screen, "rounds": rounds, "pairs": pairs,
            "pair_configs": {lab: e.get("cfg") for lab, e in pairs_in.items() if lab not in ("shipped", "eager")},
            "winner": win,
        }
        print(f"{shape}: floor {floor:.1f} us, eager {pairs['eager']['median_us']:.2f}, shipped "
              f"{pairs['shipped']['median_us']:.2f} [{pairs['shipped']['p20_us']:.2f}-{pairs['shipped']['p80_us']:.2f}]"
              f", best {win} {pairs[win]['median_us']:.2f} [{pairs[win]['p20_us']:.2f}-{pairs[win]['p80_us']:.2f}]",
              flush=True)
        for lab, v in sorted(pairs.items(), key=lambda kv: kv[1]["median_us"]):
            print(f"   {v['median_us']:7.2f}  err {v['rel_err']:.2e}  {lab}")
        del graphs, pairs_in, sets, refs
        torch.cuda.empty_cache()
    save_results(args.out, "decode-sweep.json", results, copy_rate, args)


if __name__ == "__main__":
    main()
