"""Score the "linear_seqfirst" rules of a policy file against stored seqfirst_route.py runs.

For every case of every run, the rules pick "batched" or "rows" from the same sizes `linear` passes
(b, s, m, weight_mb, n_per_k); the case's time under that pick is compared with the faster of the
two (graph replay, the GPU time). The rows route's time is the one `linear` takes by rows: the 2-D
cuBLASLt epilogue with tanh GELU, else ATen's addmm (then ATen's GELU for the exact one, which
cuBLASLt lacks). A case missing either time is left out. A case is a miss when the pick is
more than --slack slower than the other route. CPU only: no GPU, no kernel build.

  python3 benchmarks/diag/seqfirst_score.py benchmarks/results/seqfirst-route-*.json.gz
  python3 benchmarks/diag/seqfirst_score.py --policy old_policy.json RUN.json.gz --all
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "torch-ext", "fused_geglu")
DEFAULT_POLICY = os.path.join(PACKAGE, "policy_sm90.json")


def _rule_engine():
    """``policy.first_match`` from the source tree, the function `linear` asks. Only policy.py and
    _dispatch.py are imported: the package's __init__ needs the build's generated ``_ops``, which
    stands in here as a module that says no compiled library is present."""
    pkg = types.ModuleType("fused_geglu")
    pkg.__path__ = [PACKAGE]
    ops = types.ModuleType("fused_geglu._ops")
    ops.HAS_COMPILED_OPS, ops.OPS_ID = False, "none"
    sys.modules.setdefault("fused_geglu", pkg)
    sys.modules.setdefault("fused_geglu._ops", ops)
    from fused_geglu.policy import first_match

    return first_match


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def sizes_of(case: dict) -> dict[str, int]:
    """The sizes `linear._batched_lt_ok` passes, for a bf16 weight [N, K]."""
    n, k = case["N"], case["K"]
    return {"b": case["B"], "s": case["S"], "m": case["B"] * case["S"],
            "weight_mb": n * k * 2 >> 20, "n_per_k": n // k}


def score(run: dict, rules: list, slack: float = 0.05, first_match=None):
    """(name, case, pick, its time, the other route's time, miss) per case of ``run``;
    ``first_match`` is the rule engine (the source tree's unless given: tests pass the loaded
    kernel's)."""
    first_match = first_match or _rule_engine()
    for name, case in run["rows"].items():
        routes = case["routes"]
        graph = {r: routes[r]["graph"]["median_us"] for r in routes if "graph" in routes[r]}
        # by rows, `linear` runs cuBLASLt only for the tanh GELU epilogue (it has no exact GELU)
        rows_route = "rows+lt" if name.endswith("/gelu_tanh") else "rows+addmm"
        if "batched" not in graph or rows_route not in graph:
            continue
        times = {"batched": graph["batched"], "rows": graph[rows_route]}
        pick = first_match(rules, "batched", sizes_of(case))
        other = "rows" if pick == "batched" else "batched"
        yield name, case, pick, times[pick], times[other], times[pick] / min(times.values()) > 1 + slack


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="seqfirst-route JSON files (.json or .json.gz)")
    p.add_argument("--policy", default=DEFAULT_POLICY)
    p.add_argument("--slack", type=float, default=0.05, help="a pick this much slower is a miss")
    p.add_argument("--all", action="store_true", help="print every case, not only the misses")
    args = p.parse_args()
    rules = load(args.policy)["linear_seqfirst"]
    for path in args.runs:
        cases = list(score(load(path), rules, args.slack))
        misses = [c for c in cases if c[-1]]
        print(f"{os.path.basename(path)}: {len(misses)} of {len(cases)} cases more than "
              f"{args.slack:.0%} slower than the other route")
        for name, case, pick, t_pick, t_other, miss in cases:
            if miss or args.all:
                print(f"  {'MISS' if miss else '    '} {name:34s} M={case['M']:5d} {pick:7s} {t_pick:6.1f} us,"
                      f" other {t_other:6.1f} ({t_pick / t_other:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
