"""Shared memory of every Triton launch configuration for sm90, compiled without a GPU.

A launch whose kernel needs more shared memory than an SM has fails with Triton's ``OutOfResources`` at the
first call; the H200 found four such fp32 configs in 2026-12 (``configs._smem_estimate``'s note). Triton
compiles for a target it is told (``GPUTarget("cuda", 90, 32)``) on a machine with no GPU, so this runs
each launcher of ``triton_kernels/`` with every (kernel, config) of ``configs_sm90.json``, fitted for each
operand dtype as a launch on the H200 fits it (``fit_config``, 232448 bytes), through a stand-in driver that
compiles and never launches, and reads the compiled kernel's ``shared`` bytes.

    TRITON_INTERPRET=0 python3 benchmarks/diag/triton_smem.py [--out FILE] [--dtypes bfloat16,float16,float32]
                                                            [--quick]

``--quick``: per (kernel, config, dtype) only the constexpr variant that stages the most (GELU epilogue with
pre-activation stores, biases, PDL where the size takes it); without it every variant below. Prints one line
per compile and exits non-zero when any kernel needs more than the limit. The kernel is loaded as users load it
(``kernels.get_kernel`` from the staged cache), with Triton's interpreter off.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("triton_smem.py compiles for a GPU target: run it with TRITON_INTERPRET=0")
os.environ["TRITON_INTERPRET"] = "0"
# The stand-in driver compiles and cannot launch, and the kernel's direct launch (triton_kernels/launch.py)
# asks a compiled kernel for its launcher after the first call; Triton's own path (read at import) never does.
os.environ["FUSED_GEGLU_TRITON_FAST_LAUNCH"] = "0"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _diag import load_kernel  # noqa: E402

SM90_SMEM = 232448  # bytes of shared memory one block may opt into on an H100/H200 (sm90)
SM90_SMS = 132  # the H100 SXM's count; only split-K's slice count reads it
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class CompileOnlyDriver:
    """What Triton's JIT asks of the active driver before it compiles: device, stream and target. A
    launch is never reached: ``JITFunction.run`` is wrapped to compile (``warmup=True``) and record."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda

    def is_active(self):
        return True


def _install_compile_only(records: list) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(CompileOnlyDriver(GPUTarget("cuda", 90, 32)))
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        t0 = time.perf_counter()
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        records.append({"jit": self.fn.__name__, "shared": int(kernel.metadata.shared),
                        "num_warps": kernel.metadata.num_warps, "num_stages": kernel.metadata.num_stages,
                        "compile_s": round(time.perf_counter() - t0, 2)})
        return kernel

    JITFunction.run = compile_only
    print(f"triton {triton.__version__}, target sm90, limit {SM90_SMEM} bytes", flush=True)


def _table_configs(configs_mod) -> list[tuple[str, str, int, object]]:
    """(kernel, where in the table, an M of its bucket, KernelConfig) for every entry of configs_sm90.json."""
    data = json.loads(Path(configs_mod.__file__).with_name("configs_sm90.json").read_text())
    out = []
    for kernel, rules in data.get("defaults", {}).items():
        for rule in rules:
            m = rule.get("m_max") or 8192
            out.append((kernel, f"defaults m_max={rule.get('m_max')}", m, configs_mod.KernelConfig.from_dict(rule["config"])))
    for kernel, table in data.get("tuned", {}).items():
        for key, cfg in table.items():
            m = int(key.split(",")[0].split("=")[1])
            out.append((kernel, f"tuned {key}", m, configs_mod.KernelConfig.from_dict(cfg)))
    return out


def _variants(kernel: str, quick: bool) -> list[dict]:
    """The launcher arguments that change what a kernel stages, most demanding first."""
    if kernel in ("linear_fwd", "linear_fwd_act"):
        acts = ["gelu_tanh", "gelu"] if kernel == "linear_fwd_act" else ["none"]
        full = [{"activation": a, "bias": b, "preact": a != "none" and p, "counters": c}
                for a in acts for b in (True, False) for p in (True, False) for c in (True, False)]
    elif kernel in ("linear_bwd_input", "linear_bwd_weight"):
        full = [{"activation": a, "db": d} for a in ("gelu_tanh", "gelu", "none") for d in (True, False)]
    elif kernel == "gateup_fwd":
        full = [{"approximate": a, "bias": b, "store": s} for a in ("tanh", "none") for s in (True, False)
                for b in (True, False)]
    elif kernel == "dh_bwd":
        full = [{"approximate": a, "store_h": s} for a in ("tanh", "none") for s in (True, False)]
    else:  # pointwise
        full = [{"approximate": a} for a in ("tanh", "none")]
    seen, out = set(), []
    for v in full[:1] if quick else full:
        key = json.dumps(v, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def _launch(tk, kernel: str, m: int, dtype: torch.dtype, v: dict) -> None:
    """One call of the launcher that runs ``kernel``, on small CPU tensors of the config's M bucket
    (N = K = 2048: split-K takes its slices, every tile is whole)."""
    n = k = 2048
    e = dict(dtype=dtype)
    if kernel in ("linear_fwd", "linear_fwd_act"):
        act = v["activation"]
        counters = torch.zeros(tk.linear.splitk_counters(m, n), dtype=torch.int32) if v["counters"] else None
        tk.linear.linear_fwd(torch.empty(m, n, **e), torch.empty(m, k, **e), torch.empty(n, k, **e),
                             torch.empty(n, **e) if v["bias"] else None, act,
                             torch.empty(m, n, **e) if v["preact"] else None, counters)
    elif kernel == "linear_bwd_input":
        act = v["activation"]
        tk.linear.linear_bwd_input(torch.empty(m, k, **e), torch.empty(m, n, **e), torch.empty(n, k, **e),
                                   torch.empty(m, n, **e) if act != "none" else None, act)
    elif kernel == "linear_bwd_weight":
        act = v["activation"]
        tk.linear.linear_bwd_weight(torch.empty(n, k, **e), torch.empty(n, dtype=torch.float32) if v["db"] else None,
                                    torch.empty(m, n, **e), torch.empty(m, k, **e),
                                    torch.empty(m, n, **e) if act != "none" else None, act)
    elif kernel == "gateup_fwd":
        b = (lambda: torch.empty(n, **e)) if v["bias"] else (lambda: None)
        store = v["store"]
        tk.mlp.gateup_fwd(torch.empty(m, n, **e), torch.empty(m, k, **e), torch.empty(n, k, **e),
                          torch.empty(n, k, **e), b(), b(), v["approximate"],
                          torch.empty(m, n, **e) if store else None, torch.empty(m, n, **e) if store else None)
    elif kernel == "dh_bwd":
        tk.mlp.dh_bwd(torch.empty(m, n, **e), torch.empty(m, n, **e), torch.empty(m, n, **e) if v["store_h"] else None,
                      torch.empty(m, k, **e), torch.empty(k, n, **e), torch.empty(m, n, **e), torch.empty(m, n, **e),
                      v["approximate"])
    elif kernel in ("geglu_fwd", "geglu_fwd_flat"):
        # The flat kernel takes contiguous operands, the 2-D one row-strided views (halves of [M, 2N]).
        both = torch.empty(m, 2 * n, **e)
        gate, up = (torch.empty(m, n, **e), torch.empty(m, n, **e)) if kernel.endswith("flat") else (both[:, :n], both[:, n:])
        tk.geglu.geglu_fwd(torch.empty(m, n, **e), gate, up, v["approximate"])
    elif kernel in ("geglu_bwd", "geglu_bwd_flat"):
        both = torch.empty(m, 2 * n, **e)
        gate, up = (torch.empty(m, n, **e), torch.empty(m, n, **e)) if kernel.endswith("flat") else (both[:, :n], both[:, n:])
        tk.geglu.geglu_bwd(torch.empty(m, n, **e), torch.empty(m, n, **e), torch.empty(m, n, **e), gate, up,
                           v["approximate"])
    else:
        raise ValueError(f"no launcher for {kernel}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="write every compile's record here (JSON)")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--quick", action="store_true", help="the most demanding constexpr variant only")
    p.add_argument("--kernels", default=None, help="comma-separated kernel names of configs.KERNELS (default all)")
    args = p.parse_args()
    k = load_kernel()
    tk = importlib.import_module(f"{k.__name__}.triton_kernels")
    for sub in ("configs", "linear", "mlp", "geglu", "pdl"):
        importlib.import_module(f"{k.__name__}.triton_kernels.{sub}")
    configs, pdl = tk.configs, tk.pdl
    records: list = []
    _install_compile_only(records)
    # As on an H200: the table's config, fitted to its shared memory for the operand size; 132 SMs; PDL at
    # decode sizes (compute capability 9).
    chosen: dict = {}
    for mod in (tk.linear, tk.mlp, tk.geglu):
        mod.get_config = lambda kernel, device, dtype, m, n, kk=0: chosen["cfg"]
    tk.linear._sm_count = lambda device: SM90_SMS
    pdl_on = lambda device, m: m <= pdl.PDL_MAX_M  # noqa: E731
    for mod in (tk.linear, tk.mlp):
        if hasattr(mod, "pdl_enabled"):
            mod.pdl_enabled = pdl_on
    wanted = set(args.kernels.split(",")) if args.kernels else None
    rows, over, done = [], 0, set()
    for kernel, where, m, table_cfg in _table_configs(configs):
        if wanted is not None and kernel not in wanted:
            continue
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            elem = torch.empty((), dtype=dtype).element_size()
            cfg = configs.fit_config(kernel, table_cfg, elem, SM90_SMEM)
            for v in _variants(kernel, args.quick):
                key = (kernel, m <= pdl.PDL_MAX_M, dname, json.dumps(dataclasses.asdict(cfg), sort_keys=True),
                       json.dumps(v, sort_keys=True))
                if key in done:
                    continue
                done.add(key)
                chosen["cfg"] = cfg
                start = len(records)
                _launch(tk, kernel, m, dtype, v)
                estimate = configs._smem_estimate(kernel, cfg, elem) if kernel not in configs.POINTWISE_KERNELS else 0
                for r in records[start:]:
                    row = {"kernel": kernel, "table": where, "M": m, "dtype": dname, "variant": v,
                           "config": dataclasses.asdict(cfg), "estimate": estimate, **r,
                           "fits": r["shared"] <= SM90_SMEM}
                    over += not row["fits"]
                    rows.append(row)
                    print(f"{'OVER ' if not row['fits'] else ''}{kernel:17} {dname:8} M={m:<5} {r['jit']:26} "
                          f"shared {r['shared']:6d} (estimate {estimate:6d}) "
                          f"{cfg.BLOCK_M}x{cfg.BLOCK_N}x{cfg.BLOCK_K} s{cfg.num_stages} w{cfg.num_warps} "
                          f"split {cfg.SPLIT_K} {json.dumps(v)} {r['compile_s']} s", flush=True)
    import triton

    summary = {"triton": triton.__version__, "torch": torch.__version__, "kernel": k.__name__, "limit": SM90_SMEM,
               "compiles": len(rows), "over_limit": over,
               "max_shared": max((r["shared"] for r in rows), default=0),
               "estimate_below_actual": sum(1 for r in rows if r["estimate"] and r["estimate"] < r["shared"])}
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
