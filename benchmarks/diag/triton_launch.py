"""Host cost of a Triton launch against ATen's ops, in the build that leans on Triton most (GPU only).

    python3 benchmarks/diag/triton_launch.py --out DIR [--rounds 7]

The noarch ``torch-cuda`` build has no compiled entries, so a no-graph call pays Python and Triton's
launcher for every kernel. This times, host side only (GPU kept busy, median of 200 calls, interleaved
rounds), one GeGLU forward of [M, I] (M = 16 and 1024, Gemma3-1B's I) done four ways:

- ``aten3``: the torch backend's pointwise, ``torch.mul(F.gelu(gate.float()), up, out=h)`` (3 ATen ops);
- ``eager2``: eager's ``F.gelu(gate) * up`` (2 ops);
- ``tk_wrapper``: this kernel's Triton launcher (``triton_kernels.geglu.geglu_fwd``: config lookup, grid,
  then ``kernel[grid](...)``);
- ``jit_only``: ``kernel[grid](...)`` with the arguments ready (Triton's binder, cache lookup and launch);
- ``compiled_run``: the compiled kernel's C launcher called directly (what remains below Triton's Python);
- ``fast_kernel``: ``triton_kernels/launch.py``'s ``FastKernel`` (its key, then that launcher), where the
  build has it;

and the public calls around them: ``k.geglu`` and ``k.geglu_mlp`` (auto, no grad) against eager's MLP, plus a
trivial ATen op (the dispatcher's floor on this host at this moment). Last, ``geglu_mlp`` at M = 16 for every
shape with and without the policy's ``geglu_mlp_gemm_pointwise`` rule (dropped in-process), host time and
CUDA-event span per call against eager's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from _diag import SHAPES, eager_mlp, environment, host_us, load_kernel, span_us as _span_us


def _pieces(k, m: int, h: int, i: int) -> dict:
    dev = torch.device("cuda")
    tk = importlib.import_module(k.__name__ + ".triton_kernels.geglu")
    cfgs = importlib.import_module(k.__name__ + ".triton_kernels.configs")
    g = torch.randn(m, i, device=dev, dtype=torch.bfloat16)
    u = torch.randn_like(g)
    o = torch.empty_like(g)
    x = torch.randn(m, h, device=dev, dtype=torch.bfloat16)
    wg, wu = (torch.randn(i, h, device=dev, dtype=torch.bfloat16) * h**-0.5 for _ in range(2))
    wd = torch.randn(h, i, device=dev, dtype=torch.bfloat16) * i**-0.5
    numel = m * i
    cfg = cfgs.get_config("geglu_fwd_flat", dev, g.dtype, m, i)
    block = cfg.BLOCK_M * cfg.BLOCK_N
    fa = dict(BLOCK=block, EVEN=numel % block == 0, INT64=numel + block >= 2**31, num_warps=cfg.num_warps)
    grid = (triton.cdiv(numel, fa["BLOCK"]),)
    kern = tk._geglu_fwd_flat_kernel
    compiled = kern[grid](o, g, u, numel, ACT=2, **fa)
    fast = getattr(tk, "_FWD_FLAT", None)  # triton_kernels/launch.py's FastKernel, where the build has it
    compiled._init_handles()
    knobs = importlib.import_module("triton").knobs
    stream = torch.cuda.current_stream().cuda_stream
    # All parameters in signature order (constexprs too), as JITFunction.run passes them.
    args = (o, g, u, numel, 2, fa["BLOCK"], fa["EVEN"], fa["INT64"])

    def compiled_run():
        compiled.run(grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, None,
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)

    compiled_run()
    ref = F.gelu(g.float(), approximate="tanh") * u.float()
    torch.cuda.synchronize()
    assert torch.allclose(o.float(), ref, atol=2e-2, rtol=2e-2), "direct launch gave wrong values"
    return {
        "trivial": lambda: torch.ops.aten.alias.default(o),
        "aten3": lambda: torch.mul(F.gelu(g.float(), approximate="tanh"), u, out=o),
        "eager2": lambda: F.gelu(g, approximate="tanh") * u,
        "tk_wrapper": lambda: tk.geglu_fwd(o, g, u, "tanh"),
        "jit_only": lambda: kern[grid](o, g, u, numel, ACT=2, **fa),
        "compiled_run": compiled_run,
        **({"fast_kernel": lambda: fast(grid, args, fa["num_warps"])} if fast is not None else {}),
        "get_config": lambda: cfgs.get_config("geglu_fwd_flat", dev, g.dtype, m, i),
        "k.geglu": lambda: k.geglu(g, u, approximate="tanh"),
        "k.geglu_mlp": lambda: k.geglu_mlp(x, wg, wu, wd, approximate="tanh"),
        "eager_mlp": lambda: eager_mlp(x, wg, wu, wd),
    }


def _without_rule(k, rule: str):
    """The loaded kernel's policy with ``rule`` dropped (its remembered decisions and routes cleared);
    returns the function that puts it back."""
    policy = importlib.import_module(k.__name__ + ".policy")
    mlp = importlib.import_module(k.__name__ + ".mlp")
    real = policy._rules

    def rules(capability):
        d = dict(real(capability))
        d.pop(rule, None)
        return d

    def reset(fn):
        policy._rules = fn
        policy._decisions.clear()
        mlp._auto_routes.clear()

    reset(rules)
    return lambda: reset(real)


def _route_rule(k, rounds: int, tokens: int = 16) -> dict:
    """The noarch MLP route at ``tokens`` rows with its small-size pointwise rule (ATen's pointwise) and
    without it (Triton's), against eager: host µs and CUDA-event span µs per call, every shape."""
    out = {}
    for name, (h, i) in SHAPES.items():
        x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
        wg, wu = (torch.randn(i, h, device="cuda", dtype=torch.bfloat16) * h**-0.5 for _ in range(2))
        wd = torch.randn(h, i, device="cuda", dtype=torch.bfloat16) * i**-0.5
        ours = lambda: k.geglu_mlp(x, wg, wu, wd, approximate="tanh")  # noqa: E731
        variants = {"eager": lambda: eager_mlp(x, wg, wu, wd), "ours (rule)": ours, "ours (no rule)": ours}
        samples = {v: {"host": [], "span": [], "route": None} for v in variants}
        for _ in range(rounds):
            for v, fn in variants.items():
                restore = _without_rule(k, "geglu_mlp_gemm_pointwise") if v == "ours (no rule)" else None
                try:
                    fn()
                    samples[v]["route"] = k.last_backend("geglu_mlp") if v != "eager" else "eager"
                    samples[v]["host"].append(host_us(fn, n=100))
                    samples[v]["span"].append(_span_us(fn))
                finally:
                    if restore:
                        restore()
        out[name] = {v: {"route": d["route"], "host_us": statistics.median(d["host"]), "span_us": statistics.median(d["span"]),
                         "host_rounds": d["host"], "span_rounds": d["span"]} for v, d in samples.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", default="16,1024")
    args = ap.parse_args()
    k = load_kernel()
    h, i = SHAPES["gemma3-1b"]
    rows = {}
    with torch.no_grad():
        for m in (int(t) for t in args.tokens.split(",")):
            pieces = _pieces(k, m, h, i)
            for fn in pieces.values():
                fn()
            k.geglu_mlp(torch.randn(m, h, device="cuda", dtype=torch.bfloat16),
                        *(torch.randn(i, h, device="cuda", dtype=torch.bfloat16) for _ in range(2)),
                        torch.randn(h, i, device="cuda", dtype=torch.bfloat16), approximate="tanh")
            routes = {"geglu_mlp": k.last_backend("geglu_mlp"), "geglu": None}
            pieces["k.geglu"]()
            routes["geglu"] = k.last_backend("geglu")
            samples = {name: [] for name in pieces}
            for _ in range(args.rounds):
                for name, fn in pieces.items():
                    samples[name].append(host_us(fn, n=200))
            rows[f"M={m}"] = {"routes": routes, **{name: {"median_us": statistics.median(v), "rounds": v}
                                                  for name, v in samples.items()}}
        rule = _route_rule(k, args.rounds)
    env = environment()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / f"triton-launch-{env['commit'][:7] or 'local'}.json"
    out.write_text(json.dumps({"environment": env, "kernel": k.OPS_ID, "shape": "gemma3-1b", "rows": rows,
                               "route_rule_m16": rule}, indent=1))
    for mk, row in rows.items():
        print(f"{mk} routes {row['routes']}")
        for name, v in row.items():
            if name != "routes":
                print(f"  {name:14s} {v['median_us']:7.2f} us  (rounds {min(v['rounds']):.2f}-{max(v['rounds']):.2f})")
    print("geglu_mlp at M = 16, with and without the route's small-size pointwise rule (host us / span us):")
    for shape, row in rule.items():
        print(f"  {shape:10s} " + "  ".join(f"{v}: {d['route']} {d['host_us']:.1f} / {d['span_us']:.1f}" for v, d in row.items()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
