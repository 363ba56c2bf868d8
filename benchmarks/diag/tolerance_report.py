"""What the tests' tolerance floors must cover: a summary of $FUSED_GEGLU_TOLERANCE_LOG files.

    FUSED_GEGLU_TOLERANCE_LOG=/tmp/tol/log make test        # or the GPU session's test phase
    python3 benchmarks/diag/tolerance_report.py /tmp/tol/log.* [--floor bf16=2e-3 ...] [--worst 8]

`tests/_numerics.assert_close` passes where ours <= FACTOR x eager + floor, on the relative Frobenius
error and (with 4 x floor) on the max error. Per comparison the floor it needed is
max(rel - FACTOR x eager_rel, (max - FACTOR x eager_max) / 4), 0 where FACTOR x eager alone covered it.
Printed per (device, dtype): the count, how many needed any floor, the largest need in units of the
dtype's eps, and, with --floor, how many comparisons a candidate floor would fail; then the worst rows.
"""

from __future__ import annotations

import argparse
import collections
import json

EPS = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def need(r: dict) -> float:
    f = r["factor"]
    return max(0.0, r["rel"] - f * r["eager_rel"], (r["max"] - f * r["eager_max"]) / 4)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("--floor", action="append", default=[], help="DTYPE=VALUE, a candidate floor to count failures of")
    p.add_argument("--worst", type=int, default=8)
    args = p.parse_args(argv)
    floors = {k: float(v) for k, v in (f.split("=") for f in args.floor)}
    floors = {{"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(k, k): v for k, v in floors.items()}
    rows = [json.loads(line) for path in args.logs for line in open(path) if line.strip()]
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["device"], r["dtype"])].append(r)
    print(f"{'device':6} {'dtype':9} {'n':>7} {'need>0':>7} {'max need/eps':>13} {'p99.9/eps':>10}  candidate floor: fails")
    for (dev, dt), rs in sorted(groups.items()):
        needs = sorted(need(r) / EPS[dt] for r in rs)
        cand = floors.get(dt)
        fails = "" if cand is None else f"{cand:g}: {sum(need(r) > cand for r in rs)}"
        print(f"{dev:6} {dt:9} {len(rs):7d} {sum(n > 0 for n in needs):7d} {needs[-1]:13.3f} "
              f"{needs[int(0.999 * (len(needs) - 1))]:10.3f}  {fails}")
    print()
    for (dev, dt), rs in sorted(groups.items()):
        for r in sorted(rs, key=need, reverse=True)[:args.worst]:
            if need(r) == 0:
                break
            print(f"{dev} {dt} need {need(r) / EPS[dt]:.3f} eps  rel {r['rel']:.3g} (eager {r['eager_rel']:.3g}) "
                  f"max {r['max']:.3g} (eager {r['eager_max']:.3g})  {r['what']}  {r['test']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
