"""Offline tuning: time a few candidate configs per shape on the current GPU and write the winners into
``configs_sm{major}{minor}.json`` ("tuned" table). Never called on a user's path.

    python torch-ext/fused_geglu/triton_kernels/tune.py --kernel gateup_fwd --shape 8192,3072,768 [--write]

Shapes are (M, N, K) in the lookup convention of configs.py (linear_*: tokens, out, in features;
gateup_fwd / dh_bwd: tokens, I, H; geglu_*: rows, cols, 0).
"""

import argparse
import importlib
import json
import os
import sys

import torch

if __package__ in (None, ""):
    # Run as a script: load this folder as a standalone package (without the parent fused_geglu package,
    # whose __init__ may need the compiled extension) so that the relative imports below work.
    import importlib.util

    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = importlib.util.spec_from_file_location(
        "_fused_geglu_triton_kernels", os.path.join(_here, "__init__.py"), submodule_search_locations=[_here]
    )
    _pkg = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _pkg
    _spec.loader.exec_module(_pkg)
    __package__ = _spec.name

from . import configs as _configs  # noqa: E402
from .configs import KernelConfig, config_supports, shape_key  # noqa: E402

_GEMM_CANDIDATES = [
    KernelConfig(128, 256, 64, 8, 8, 3),
    KernelConfig(128, 128, 64, 8, 8, 4),
    KernelConfig(128, 128, 64, 8, 8, 3),
    KernelConfig(128, 128, 64, 8, 4, 4),
    KernelConfig(64, 256, 64, 8, 8, 4),
    KernelConfig(128, 64, 64, 8, 4, 4),
    KernelConfig(64, 128, 64, 8, 4, 4),
    KernelConfig(64, 64, 128, 8, 4, 4),
    KernelConfig(16, 64, 128, 1, 4, 4),
    KernelConfig(16, 128, 128, 1, 4, 5),
    KernelConfig(16, 32, 256, 1, 4, 4),
    KernelConfig(32, 64, 128, 4, 4, 4),
]
# Decode sizes (M <= 64): weight-bandwidth bound, so narrow N tiles (more programs) and deep pipelines;
# the linear kernels also try K splits (SPLIT_K 0 = two programs per SM).
_SKINNY_CANDIDATES = [
    KernelConfig(16, 64, 128, 1, 4, 4),
    KernelConfig(16, 32, 128, 1, 4, 4),
    KernelConfig(16, 32, 256, 1, 4, 4),
    KernelConfig(16, 64, 256, 1, 4, 3),
    KernelConfig(16, 128, 128, 1, 4, 4),
    KernelConfig(16, 16, 256, 1, 2, 5),
]
_SKINNY_SPLIT_CANDIDATES = _SKINNY_CANDIDATES + [
    KernelConfig(16, 64, 128, 1, 4, 4, SPLIT_K=0),
    KernelConfig(16, 32, 128, 1, 4, 4, SPLIT_K=0),
    KernelConfig(16, 64, 256, 1, 4, 3, SPLIT_K=0),
    KernelConfig(16, 128, 128, 1, 4, 4, SPLIT_K=0),
    KernelConfig(16, 64, 128, 1, 4, 4, SPLIT_K=4),
    KernelConfig(16, 128, 64, 1, 4, 4, SPLIT_K=8),
]
_POINTWISE_CANDIDATES = [
    KernelConfig(BLOCK_M=bm, BLOCK_N=bn, num_warps=w)
    for bm, bn, w in [(1, 2048, 4), (2, 1024, 4), (4, 1024, 4), (4, 1024, 8), (8, 1024, 8), (4, 2048, 8),
                      (8, 2048, 8), (16, 1024, 8), (2, 4096, 8), (16, 512, 4)]
]

# The flat kernels take BLOCK_M * BLOCK_N elements per program as one 1-D block (BLOCK_M = 1).
_FLAT_POINTWISE_CANDIDATES = [
    KernelConfig(BLOCK_M=1, BLOCK_N=bn, num_warps=w)
    for bn, w in [(512, 2), (1024, 4), (1024, 8), (2048, 4), (2048, 8), (4096, 8), (4096, 16)]
]


def _make_call(kernel, m, n, k, dtype, dev):
    """Allocate operands once; return a zero-arg callable running `kernel` on them."""
    from . import geglu, linear, mlp

    r = lambda *s: torch.randn(*s, device=dev, dtype=dtype)  # noqa: E731
    if kernel == "geglu_fwd":
        x, out = r(m, 2 * n), r(m, n)
        return lambda: geglu.geglu_fwd(out, x[:, :n], x[:, n:], "tanh"), 3 * m * n * x.element_size(), 0
    if kernel == "geglu_bwd":
        x, dy, dx = r(m, 2 * n), r(m, n), r(m, 2 * n)
        return (lambda: geglu.geglu_bwd(dx[:, :n], dx[:, n:], dy, x[:, :n], x[:, n:], "tanh"),
                5 * m * n * x.element_size(), 0)
    if kernel == "geglu_fwd_flat":  # contiguous operands, as the MLP's own buffers
        g, u, out = r(m, n), r(m, n), r(m, n)
        return lambda: geglu.geglu_fwd(out, g, u, "tanh"), 3 * m * n * g.element_size(), 0
    if kernel == "geglu_bwd_flat":  # the MLP's in-place backward: 3 tensors read, 3 written
        g, u, dy = r(m, n), r(m, n), r(m, n)
        return lambda: geglu.geglu_bwd_inplace(g, u, dy, "tanh"), 6 * m * n * g.element_size(), 0
    fl = 2 * m * n * k
    if kernel == "linear_fwd":
        x, w, b, out = r(m, k), r(n, k), r(n), r(m, n)
        return lambda: linear.linear_fwd(out, x, w, b, "none", None), 0, fl
    if kernel == "linear_fwd_act":
        x, w, b, out, pre = r(m, k), r(n, k), r(n), r(m, n), r(m, n)
        return lambda: linear.linear_fwd(out, x, w, b, "gelu_tanh", pre), 0, fl
    if kernel == "linear_bwd_input":
        dy, w, pre, dx = r(m, n), r(n, k), r(m, n), r(m, k)
        return lambda: linear.linear_bwd_input(dx, dy, w, pre, "gelu_tanh"), 0, fl
    if kernel == "linear_bwd_weight":
        dy, x, pre, dw = r(m, n), r(m, k), r(m, n), r(n, k)
        db = torch.empty(n, device=dev, dtype=torch.float32)
        return lambda: linear.linear_bwd_weight(dw, db, dy, x, pre, "gelu_tanh"), 0, fl
    if kernel == "gateup_fwd":
        x, wg, wu, h, gu = r(m, k), r(n, k), r(n, k), r(m, n), r(m, 2 * n)
        return lambda: mlp.gateup_fwd(h, x, wg, wu, None, None, "tanh", gu[:, :n], gu[:, n:]), 0, 2 * fl
    if kernel == "dh_bwd":
        dy, wd, gu, d, h = r(m, k), r(k, n), r(m, 2 * n), r(m, 2 * n), r(m, n)
        return lambda: mlp.dh_bwd(d[:, :n], d[:, n:], h, dy, wd, gu[:, :n], gu[:, n:], "tanh"), 0, fl
    raise ValueError(f"unknown kernel {kernel!r}")


def tune(kernel, shapes, dtype=torch.bfloat16, candidates=None, verbose=True):
    """Return {shape_key: best config dict} for `kernel` over `shapes` [(M, N, K), ...]."""
    import triton.testing

    dev = torch.device("cuda")
    smem = _configs._device_smem(torch.cuda.current_device())
    elem = torch.empty((), dtype=dtype).element_size()
    mods = [importlib.import_module(f"{__package__}.{x}") for x in ("geglu", "linear", "mlp")]
    best = {}
    for m, n, k in shapes:
        call, nbytes, flops = _make_call(kernel, m, n, k, dtype, dev)
        results = []
        for cfg in candidates or _candidates(kernel, m):
            if not config_supports(kernel, cfg, elem, smem):
                continue
            # Force this candidate: the launchers resolve get_config through their module globals.
            for mod in mods:
                mod.get_config = lambda *a, _c=cfg, **kw: _c
            try:
                # Decode sizes are timed as CUDA-graph replays: that is how they run in serving,
                # and plain launches would time the launch overhead instead of the kernels.
                if m <= _configs.SKINNY_M_MAX:
                    ms = triton.testing.do_bench_cudagraph(call, rep=100)
                else:
                    ms = triton.testing.do_bench(call, warmup=25, rep=100)
            except Exception as e:  # out of resources etc.
                if verbose:
                    print(f"  {cfg}: failed ({type(e).__name__}: {str(e)[:80]})")
                continue
            finally:
                for mod in mods:
                    mod.get_config = _configs.get_config
            rate = f"{nbytes / ms / 1e9:.0f} GB/s" if nbytes else f"{flops / ms / 1e9:.0f} TFLOP/s"
            if verbose:
                print(f"  {kernel} {(m, n, k)} {cfg}: {ms * 1e3:.1f} us  {rate}")
            results.append((ms, cfg))
        if results:
            ms, cfg = min(results, key=lambda t: t[0])
            best[shape_key(m, n, k)] = cfg.to_dict()
            print(f"best {kernel} {(m, n, k)}: {cfg} {ms * 1e3:.1f} us")
    return best


def _candidates(kernel, m):
    if kernel in ("geglu_fwd_flat", "geglu_bwd_flat"):
        return _FLAT_POINTWISE_CANDIDATES
    if kernel in _configs.POINTWISE_KERNELS:
        return _POINTWISE_CANDIDATES
    if m <= _configs.SKINNY_M_MAX:
        return _SKINNY_SPLIT_CANDIDATES if kernel in _configs.SPLIT_K_KERNELS else _SKINNY_CANDIDATES
    return _GEMM_CANDIDATES


def write(kernel, best, capability=None):
    """Merge `best` into the JSON of this GPU's capability (creating it if needed)."""
    cap = capability or torch.cuda.get_device_capability()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"configs_sm{cap[0]}{cap[1]}.json")
    data = json.load(open(path)) if os.path.exists(path) else {"defaults": {}, "tuned": {}}
    data.setdefault("tuned", {}).setdefault(kernel, {}).update(best)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    _configs._load_json.cache_clear()
    print(f"wrote {len(best)} entries for {kernel} to {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", required=True, choices=_configs.KERNELS)
    p.add_argument("--shape", action="append", required=True, help="M,N,K (repeatable)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--write", action="store_true", help="merge the winners into configs_smXY.json")
    a = p.parse_args()
    shapes = [tuple(int(v) for v in s.split(",")) for s in a.shape]
    best = tune(a.kernel, shapes, getattr(torch, a.dtype))
    print(json.dumps(best, indent=2))
    if a.write:
        write(a.kernel, best)


if __name__ == "__main__":
    main()
