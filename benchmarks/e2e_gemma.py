"""End-to-end: a Gemma-2B-sized model (random weights, a few layers; other widths by flag) kernelized with fused-geglu,
against the same model unkernelized and under torch.compile, forward and training step (GPU).

    python benchmarks/e2e_gemma.py --out DIR [--layers 4] [--batch 4] [--seq 1024] [--reps 10] [--rounds 3]
                                   [--no-compile] [--hidden 2048 --intermediate 16384]

Four providers, each a copy of one model (the same weights): ``eager``, ``kernelized`` (fused-geglu's
kernelize), ``compile`` (``torch.compile`` of the whole unkernelized model) and ``kernelized+compile``
(kernelize with ``Mode.TORCH_COMPILE``, then ``torch.compile`` of the whole model: what a user who
compiles anyway gets from the kernel). They are timed in two pairs, eager against kernelized and
compile against kernelized+compile, each pair in alternating rounds so that the paired difference per
round is free of the host's drift; each row's peak memory is taken from a base without gradients.

``--batch 1 --seq 16 --reps 50`` is a decode-sized step without CUDA graphs, where the host's time per
module call decides.

``--model modernbert`` times a ModernBERT masked LM instead (exact GELU, one packed ``Wi`` per MLP, replaced by
the ``PackedGeGLUMLP`` layer); ModernBERT-large's widths are ``--hidden 1024 --intermediate 2624``.

``--autocast``: the model kept in float32 and every call under ``torch.autocast("cuda", bfloat16)``, one region
per timed call (a training step's, Trainer's ``bf16=True``), against eager's own autocast.

Loads the kernel from the staged offline cache (``make stage``), like the tests and the demo.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_CACHE", str(ROOT / ".hub-cache"))
sys.path.insert(0, str(ROOT / "src"))


def _median_ms(fn, reps: int = 10, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _kernel_profile(torch, fn, steps: int = 3) -> dict:
    """Over ``steps`` calls of ``fn`` (after two unprofiled calls), per step: GPU time by kernel name,
    and the host's self time by op (CPU events: ATen ops, Python custom ops, autograd nodes)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    by_kernel, by_host = {}, {}
    for e in prof.events():
        table, us = ((by_kernel, e.device_time_total) if e.device_type == torch.autograd.DeviceType.CUDA
                     else (by_host, e.self_cpu_time_total))
        n, total = table.get(e.name, (0, 0.0))
        table[e.name] = (n + 1, total + us)

    def top(table):
        return sorted(((k, n // steps, us / steps) for k, (n, us) in table.items()), key=lambda t: -t[2])

    kernels, host = top(by_kernel), top(by_host)
    return {"gpu_ms": sum(t[2] for t in kernels) / 1e3, "kernels": sum(t[1] for t in kernels), "top": kernels[:25],
            "host_self_ms": sum(t[2] for t in host) / 1e3, "host_top": host[:40]}


def _host_profile(torch, fwd, model, kernelized, calls: int = 30) -> dict:
    """Where a forward's host time goes: eager, kernelized, and a third copy whose MLP forward calls
    the kernel's ``geglu_mlp`` directly (no layer), all in eval mode. Per variant:
    - the CPU time inside each MLP module's ``__call__`` during whole forwards (forward pre-hook to
      forward hook, no synchronisation: on a host-bound step, the host's cost of one MLP call with
      the rest of the model running between calls);
    - the same MLP module called back to back on the layer's real input ("tight loop", what the
      per-op diagnostics measure), for the difference the surrounding model makes;
    - the profiler's top CPU ops of one forward."""
    from types import MethodType

    import kernels

    from fused_geglu_tools.buildconfig import hub_repo_id, hub_version

    k = kernels.get_kernel(hub_repo_id(ROOT), version=hub_version(ROOT), trust_remote_code=True)

    def direct(self, x):
        return k.geglu_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, approximate="tanh")

    op_model = copy.deepcopy(model)
    for layer in op_model.model.layers:
        layer.mlp.forward = MethodType(direct, layer.mlp)
    # The compiled inference op alone, its launch resolved once: what the public function's Python
    # adds in the model, where the op path is the CUTLASS one (sm90).
    raw_model = None
    if k.last_backend("geglu_mlp") == "cuda:sm90":
        pol = sys.modules[f"{k.__name__}.policy"]
        sw = sys.modules[f"{k.__name__}.sm90_weights"]
        rows_m = fwd.m
        launch = sw.parse_launch(pol.sm90_mlp_launch(rows_m, model.config.hidden_size, torch.device("cuda", 0)))
        raw = getattr(torch.ops, k.OPS_ID).geglu_mlp_sm90

        def raw_op(self, x):
            y = raw(x.view(rows_m, x.shape[-1]), self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight,
                    None, None, None, 1, *launch)
            return y.view(x.shape)

        raw_model = copy.deepcopy(model)
        for layer in raw_model.model.layers:
            layer.mlp.forward = MethodType(raw_op, layer.mlp)
    captured = []
    grab = model.model.layers[0].mlp.register_forward_pre_hook(lambda mod, args: captured.append(args[0]))
    fwd(model.eval())()
    grab.remove()
    x_mlp = captured[0]
    out = {}
    variants = (("eager", model), ("kernelized", kernelized), ("direct-op", op_model),
                *((("raw-op", raw_model),) if raw_model is not None else ()))
    for gc_off in (False, True):
        if gc_off:  # whether Python's cyclic collector, run by allocation counts, lands in the MLP calls
            gc.collect()
            gc.disable()
        try:
            for name, m in variants:
                out[name + ("/gc-off" if gc_off else "")] = _host_profile_one(torch, fwd, m, x_mlp, calls,
                                                                              with_table=not gc_off)
        finally:
            gc.enable()
    for name, r in out.items():
        print(f"{name:17} MLP call host time: in the model {r['mlp_call_host_us_in_model_median']:.1f} us "
              f"(median of {r['mlp_calls_in_model']}), tight loop {r['mlp_call_host_us_tight_loop_median']:.1f} us; "
              f"forward enqueue {r['forward_host_us']:.0f} us", flush=True)
    return out


def _host_profile_one(torch, fwd, m, x_mlp, calls: int, with_table: bool) -> dict:
    """One variant of :func:`_host_profile`."""

    m.eval()
    mlps = [layer.mlp for layer in m.model.layers]
    spent, started = [], {}
    handles = []
    for mlp in mlps:
        handles.append(mlp.register_forward_pre_hook(
            lambda mod, args: started.__setitem__(id(mod), time.perf_counter())))
        handles.append(mlp.register_forward_hook(
            lambda mod, args, res: spent.append((time.perf_counter() - started[id(mod)]) * 1e6)))
    run = fwd(m)
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    spent.clear()
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    host_per_fwd = (time.perf_counter() - t0) / calls * 1e6  # enqueue time, before the final sync
    torch.cuda.synchronize()
    in_model = list(spent)
    spent.clear()
    with torch.no_grad():
        for _ in range(200):
            mlps[0](x_mlp)
    torch.cuda.synchronize()
    tight = spent[20:]
    for h in handles:
        h.remove()
    cpu = []
    if with_table:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        cpu = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
    return {
        "mlp_call_host_us_in_model_median": statistics.median(in_model),
        "mlp_call_host_us_tight_loop_median": statistics.median(tight),
        "mlp_calls_in_model": len(in_model),
        "forward_host_us": host_per_fwd,
        "top_cpu_self_us": [(e.key, e.count, e.self_cpu_time_total) for e in cpu],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--model", choices=("gemma", "modernbert"), default="gemma",
                   help="gemma: GemmaForCausalLM (tanh GELU); modernbert: ModernBertForMaskedLM (packed Wi, exact GELU)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048, help="hidden size (Gemma3-1B: 1152 with --intermediate 6912)")
    p.add_argument("--intermediate", type=int, default=16384)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--reps", type=int, default=10, help="timed calls per row and round (median)")
    p.add_argument("--rounds", type=int, default=3,
                   help="eager and kernelized rows alternate over this many rounds (the host drifts between rows)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile's mode for both compiled rows (reduce-overhead: CUDA graphs, the decode form)")
    p.add_argument("--modes", default="fwd,train", help="which steps to time: fwd, train or both")
    p.add_argument("--kernel-profile", action="store_true",
                   help="also: one profiled step per provider and mode, its GPU time by kernel (top 25)")
    p.add_argument("--autocast", action="store_true",
                   help="float32 model, each call under torch.autocast('cuda', bfloat16) (mixed-precision training)")
    p.add_argument("--host-profile", action="store_true",
                   help="also: host time inside each MLP module's call (forward hooks), and a torch.profiler "
                        "table of one forward, eager and kernelized")
    args = p.parse_args()
    if args.model != "gemma" and args.host_profile:
        p.error("--host-profile times Gemma's MLP (gate_proj/up_proj/down_proj): use it with --model gemma")
    import torch
    from kernels import Mode
    import transformers

    from fused_geglu_tools.transformers import kernelize

    if not torch.cuda.is_available():
        print("e2e_gemma: needs a CUDA GPU; nothing measured")
        return 0
    torch.manual_seed(0)
    if args.model == "modernbert":
        # ModernBERT's own attention pattern (global every third layer, a 128-token window between).
        cfg = transformers.ModernBertConfig(
            vocab_size=4096, hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
            max_position_embeddings=max(args.seq, 128), pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
        model = transformers.ModernBertForMaskedLM(cfg)
    else:
        cfg = transformers.GemmaConfig(
            vocab_size=4096, hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
            max_position_embeddings=args.seq, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh")
        model = transformers.GemmaForCausalLM(cfg)
    model = model.to("cuda", torch.float32 if args.autocast else torch.bfloat16)

    def amp():  # one autocast region per call with --autocast (a no-op context without)
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.autocast)
    kernelized = copy.deepcopy(model)  # the same weights; kernelized below, per mode
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    rows = []

    def fwd(m):
        def run():
            with torch.no_grad(), amp():
                return m(input_ids=ids).logits
        return run

    def train(m):
        def run():
            m.zero_grad(set_to_none=True)
            with amp():
                loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
        return run

    def measure(name, m, mode_train, rnd=0):
        m.train(mode_train)
        fn = train(m) if mode_train else fwd(m)
        for other in providers.values():  # no gradients left from an earlier row in the peak's base
            other.zero_grad(set_to_none=True)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ms = _median_ms(fn, reps=args.reps)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        mode = "train" if mode_train else "fwd"
        rows.append({"provider": name, "mode": mode, "round": rnd, "median_ms": ms, "peak_mb_above_start": peak})
        print(f"{name:22} {mode:6} round {rnd} {ms:9.2f} ms  peak +{peak:8.1f} MB", flush=True)

    def logits_error(m):
        m.eval()
        with torch.no_grad(), amp():
            return float((m(input_ids=ids).logits.float() - ref_logits).norm() / ref_logits.norm())

    def kernelize_for(m, train_mode, compiled):
        mode = Mode.TRAINING if train_mode else Mode.INFERENCE
        m.train(train_mode)
        return str(kernelize(m, mode=mode | Mode.TORCH_COMPILE if compiled else mode, device="cuda", source="hub"))

    model.eval()
    with torch.no_grad(), amp():
        ref_logits = model(input_ids=ids).logits.float()
    providers = {"eager": model, "kernelized": kernelized}
    pairs = [("eager", "kernelized")]
    kernel_compiled = None
    if not args.no_compile:
        # One dynamo cache entry per model copy, mode and call form: more than the default limit of 8.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        kernel_compiled = copy.deepcopy(model)
        providers["compile"] = torch.compile(model, mode=args.compile_mode)  # unkernelized: the baseline to beat
        providers["kernelized+compile"] = torch.compile(kernel_compiled, mode=args.compile_mode)
        pairs.append(("compile", "kernelized+compile"))
    report, errors, compile_s, kernel_profile = {}, {}, {}, {}
    modes = [m for m in ("fwd", "train") if m in args.modes.split(",")]
    for train_mode in [m == "train" for m in modes]:
        mode = "train" if train_mode else "fwd"
        report[mode] = kernelize_for(kernelized, train_mode, compiled=False)
        if kernel_compiled is not None:
            report[mode + "+compile"] = kernelize_for(kernel_compiled, train_mode, compiled=True)
        for first, second in pairs:
            if first == "compile":  # the first call compiles: its time is reported, not measured
                for name in (first, second):
                    m = providers[name]
                    m.train(train_mode)
                    t0 = time.time()
                    (train(m) if train_mode else fwd(m))()
                    torch.cuda.synchronize()
                    compile_s[f"{name}/{mode}"] = time.time() - t0
                print(f"first calls (compile) {mode}: " + ", ".join(
                    f"{k.split('/')[0]} {v:.1f} s" for k, v in compile_s.items() if k.endswith(mode)), flush=True)
            for rnd in range(args.rounds):
                pair = (first, second) if rnd % 2 == 0 else (second, first)
                for name in pair:
                    measure(name, providers[name], train_mode, rnd)
        if args.kernel_profile:
            for name, m in providers.items():
                m.train(train_mode)
                kernel_profile[f"{name}/{mode}"] = _kernel_profile(torch, train(m) if train_mode else fwd(m))
                top = kernel_profile[f"{name}/{mode}"]
                print(f"{name} {mode}: GPU {top['gpu_ms']:.2f} ms in {top['kernels']} kernels; top: "
                      + "; ".join(f"{k[:60]} x{n} {us:.0f} us" for k, n, us in top["top"][:6]), flush=True)
                print(f"{name} {mode}: host self {top['host_self_ms']:.2f} ms (profiled); top: "
                      + "; ".join(f"{k[:50]} x{n} {us:.0f} us" for k, n, us in top["host_top"][:12]), flush=True)
        if not train_mode:  # after the forward rows, so that the compiled forwards' first call was timed above
            errors = {name: logits_error(m) for name, m in providers.items() if name != "eager"}
            print("logits rel. diff vs unkernelized eager (bf16): "
                  + ", ".join(f"{k} {v:.3e}" for k, v in errors.items()))
    fwd.m = args.batch * args.seq  # rows of each MLP call, for _host_profile's raw-op variant
    profile = _host_profile(torch, fwd, model, kernelized) if args.host_profile else None
    summary = {}
    for mode in modes:
        per = {name: [r["median_ms"] for r in rows if r["provider"] == name and r["mode"] == mode]
               for name in providers}
        summary[mode] = {name: statistics.median(v) for name, v in per.items() if v}
        # The paired difference is what to read on a noisy host: the two run back to back in each round.
        for first, second in pairs:
            paired = [b - a for b, a in zip(per[second], per[first])]
            summary[mode][f"{second}_minus_{first}_ms_by_round"] = paired
            summary[mode][f"{second}_minus_{first}_ms_median"] = statistics.median(paired) if paired else None
        print(f"{mode}: median over rounds " + ", ".join(f"{k} {v:.3f} ms" for k, v in summary[mode].items()
                                                         if k in providers)
              + "".join(f"; paired {b} - {a} {summary[mode][f'{b}_minus_{a}_ms_median']:+.3f} ms"
                        for a, b in pairs if summary[mode][f"{b}_minus_{a}_ms_median"] is not None))
    # Graph breaks split the compiled model around an op dynamo cannot trace; there should be none.
    breaks = {} if args.no_compile else {k: v for k, v in torch._dynamo.utils.counters["graph_break"].items()}
    if breaks:
        print(f"graph breaks: {breaks}")
    import triton
    import transformers

    from fused_geglu_tools.bench import _run_cmd

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "driver": _run_cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
           "triton": triton.__version__, "transformers": transformers.__version__,
           "commit": os.environ.get("FUSED_GEGLU_COMMIT"),
           # The kernel's switches in force (FUSED_GEGLU_TRACED_OPS=1: CUDA graphs call the compiled ops).
           "switches": {k: v for k, v in sorted(os.environ.items())
                        if k.startswith("FUSED_GEGLU_") and k not in ("FUSED_GEGLU_COMMIT", "FUSED_GEGLU_DIRTY")}}
    payload = {"config": {"model": args.model, "hidden": args.hidden, "intermediate": args.intermediate, "layers": args.layers, "batch": args.batch,
                          "seq": args.seq, "dtype": "float32+autocast_bf16" if args.autocast else "bfloat16", "reps": args.reps, "rounds": args.rounds,
                          "compile_mode": args.compile_mode, "modes": modes},
               "env": env, "compile_s": compile_s, "kernelize": report,
               "logits_rel_diff": errors, "graph_breaks": breaks, "kernel_profile": kernel_profile,
               "summary": summary, "rows": rows, "host_profile": profile}
    args.out.mkdir(parents=True, exist_ok=True)
    width = "gemma2b" if (args.hidden, args.intermediate) == (2048, 16384) else f"h{args.hidden}i{args.intermediate}"
    width = width if args.model == "gemma" else f"{args.model}-h{args.hidden}i{args.intermediate}"
    tag = (f"-{args.compile_mode}" if args.compile_mode else "") + ("-autocast" if args.autocast else "")
    path = args.out / f"e2e-{width}-{time.strftime('%Y%m%d')}-b{args.batch}s{args.seq}{tag}.json"
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
