"""Every Triton launch configuration of ``configs_sm90.json`` fits an sm90 SM's shared memory, as Triton
compiles it, and ``configs._smem_estimate`` (what ``fit_config`` shrinks configs by) is an upper bound of it.

A config that does not fit fails at its first launch with ``OutOfResources`` on the GPU (four fp32 configs
did on the H200 in 2026-12, before ``fit_config`` counted fp32's layout conversion). Triton compiles for a
named target without a GPU, so this runs on CPU machines: ``benchmarks/diag/triton_smem.py --quick`` calls
each launcher with each (kernel, config) fitted per dtype, through a compile-only driver, in a process of its
own with Triton's interpreter off (the test process has it on: its kernels are interpreted functions).
``--quick`` compiles the constexpr variant that stages the most per (kernel, config, dtype); the script
without it compiles every variant (636 compiles with triton 3.6, 2026-12-05: all fit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_every_sm90_config_fits_and_the_estimate_bounds_it(kernel, hub_cache, repo_root, tmp_path):
    pytest.importorskip("triton.backends.nvidia", reason="Triton without its NVIDIA backend cannot compile for sm90")
    out = tmp_path / "smem.json"
    env = {**os.environ, "TRITON_INTERPRET": "0", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}
    proc = subprocess.run([sys.executable, "benchmarks/diag/triton_smem.py", "--quick", "--dtypes", "bfloat16,float32",
                           "--out", str(out)], cwd=repo_root, env=env, capture_output=True, text=True, timeout=1200)
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    kernels = {r["kernel"] for r in rows}
    assert {"linear_fwd", "linear_fwd_act", "linear_bwd_input", "linear_bwd_weight", "gateup_fwd", "dh_bwd"} <= kernels
    over = [r for r in rows if not r["fits"]]
    assert not over and proc.returncode == 0, json.dumps(over[:5], indent=1) + proc.stderr[-2000:]
    # fit_config trusts the estimate: an estimate below what Triton stages could pass a config that fails.
    under = [(r["kernel"], r["jit"], r["dtype"], r["config"], r["shared"], r["estimate"]) for r in rows
             if r["estimate"] and r["estimate"] < r["shared"]]
    assert not under, under
