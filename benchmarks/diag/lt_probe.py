"""One call of the cuBLASLt linear (``linear_lt``) and its weight-gradient op, checked against ATen.

Run under benchmarks/diag/segv_trace.c (LD_PRELOAD) to get a native backtrace if it crashes."""
import os
import sys

import torch
import kernels

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _diag import REPO_ID, VERSION  # noqa: E402

k = kernels.get_kernel(REPO_ID, version=VERSION, trust_remote_code=True)
ops = getattr(torch.ops, k.OPS_ID)
print("loaded", k.OPS_ID, flush=True)
torch.manual_seed(0)
x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, device="cuda", dtype=torch.bfloat16)
y = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
ops.linear_lt(y, x, w, b, 0, None)
torch.cuda.synchronize()
ref = torch.addmm(b.double(), x.double(), w.double().t())
print("linear_lt ok, rel err", ((y.double() - ref).norm() / ref.norm()).item(), flush=True)
gy = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
dw = torch.empty_like(w)
db = torch.empty_like(b)
ops.linear_lt_bwd_weight(dw, db, gy, x)
torch.cuda.synchronize()
rdw = gy.double().t() @ x.double()
print("linear_lt_bwd_weight ok, rel err", ((dw.double() - rdw).norm() / rdw.norm()).item(),
      ((db.double() - gy.double().sum(0)).norm() / gy.double().sum(0).norm()).item(), flush=True)
print("exiting", flush=True)
