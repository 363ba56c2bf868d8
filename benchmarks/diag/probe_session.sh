#!/usr/bin/env bash
# One device call for kernel diagnosis (after `benchmarks/h200_session.sh build`, same machine):
# the native-crash probe of the cuBLASLt library, then benchmarks/diag/kernel_probe.py.
#   bash benchmarks/h200_session.sh build && bash benchmarks/diag/probe_session.sh [sections]
set -uo pipefail
OUT=${OUT:-/tmp/fg-out}
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
gcc -shared -fPIC -O1 -o /tmp/segv_trace.so benchmarks/diag/segv_trace.c
cat > /tmp/lt_probe.py <<'PY'
import os, sys, tomllib, torch, kernels
general = tomllib.loads(open("build.toml").read())["general"]
k = kernels.get_kernel(general["hub"]["repo-id"], version=general["version"], trust_remote_code=True)
ops = getattr(torch.ops, k.OPS_ID)
print("loaded", k.OPS_ID, flush=True)
x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
if sys.argv[1] in ("geglu", "lt"):
    out = torch.empty_like(x)
    ops.geglu_fwd(out, x, x, 1); torch.cuda.synchronize(); print("geglu ok", flush=True)
if sys.argv[1] == "lt":
    w = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16); b = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
    ops.linear_lt(y, x, w, b, 0, None); torch.cuda.synchronize()
    print("linear_lt ok, max err", (y.float() - torch.addmm(b, x, w.t()).float()).abs().max().item(), flush=True)
print("exiting", flush=True)
PY
: > "$OUT/segv.log"
for mode in load geglu lt; do
  echo "== $mode" >> "$OUT/segv.log"
  LD_PRELOAD=/tmp/segv_trace.so timeout 60 python3 /tmp/lt_probe.py $mode >> "$OUT/segv.log" 2>&1
  echo "== $mode exit $?" >> "$OUT/segv.log"
done
grep -E "^== |ok|Error|error" "$OUT/segv.log" | head -20
timeout ${PROBE_TIMEOUT:-400} python3 benchmarks/diag/kernel_probe.py --out "$OUT" ${1:+--sections $1} 2>&1 | tee "$OUT/probe.log" | tail -${PROBE_TAIL:-90}
