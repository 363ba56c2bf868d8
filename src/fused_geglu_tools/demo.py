"""``fused-geglu demo``: load the staged kernel through ``kernels`` exactly as a user would, run
every op on random data against a float64 reference, kernelize a tiny Gemma, and (on a GPU) show
the speed against eager PyTorch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .buildconfig import BuildConfigError, hub_repo_id, hub_version
from .cli import repo_root


def _rel_err(out, ref) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm())


def _ops_table(k, torch, device: str) -> list[tuple[str, str, str, float]]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    m, h, i = (1024, 1152, 6912) if device == "cuda" else (64, 96, 256)
    g = torch.Generator(device="cpu").manual_seed(int(time.time()))

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    x = rnd(m, h)
    wg, wu, wd = rnd(i, h, scale=h**-0.5), rnd(i, h, scale=h**-0.5), rnd(h, i, scale=i**-0.5)
    b = rnd(i)
    rows = []
    gate, up = rnd(m, i, scale=2.0), rnd(m, i)
    rows.append(("geglu (erf)", k.geglu(gate, up, "none"), k.reference.geglu_ref(gate, up, "none"), "geglu"))
    packed = torch.cat([gate, up], -1)
    rows.append(("geglu_packed (tanh)", k.geglu_packed(packed, "tanh"), k.reference.geglu_packed_ref(packed, "tanh"),
                 "gelu_and_mul"))
    rows.append(("gelu_and_mul", k.gelu_and_mul(torch.empty_like(gate), packed),
                 k.reference.geglu_packed_ref(packed, "none"), "gelu_and_mul"))
    rows.append(("gelu_tanh_and_mul", k.gelu_tanh_and_mul(torch.empty_like(gate), packed),
                 k.reference.geglu_packed_ref(packed, "tanh"), "gelu_and_mul"))
    rows.append(("linear +bias +gelu_tanh", k.linear(x, wg, b, "gelu_tanh"),
                 k.reference.linear_ref(x, wg, b, "gelu_tanh"), "linear"))
    rows.append(("geglu_mlp (tanh)", k.geglu_mlp(x, wg, wu, wd), k.reference.geglu_mlp_ref(x, wg, wu, wd), "geglu_mlp"))
    table = []
    for name, ours, ref, op in rows:
        table.append((name, f"{tuple(ours.shape)} {str(dtype).replace('torch.', '')}", k.last_backend(op) or "?",
                      _rel_err(ours, ref)))
    return table


def _speed(k, torch) -> list[tuple[str, float, float]]:
    import torch.nn.functional as F

    out = []
    for (m, h, i) in ((8192, 2048, 16384), (1024, 1152, 6912)):
        x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
        ws = [torch.randn(i, h, device="cuda", dtype=torch.bfloat16) * h**-0.5,
              torch.randn(i, h, device="cuda", dtype=torch.bfloat16) * h**-0.5,
              torch.randn(h, i, device="cuda", dtype=torch.bfloat16) * i**-0.5]

        def eager():
            return F.linear(F.gelu(F.linear(x, ws[0]), approximate="tanh") * F.linear(x, ws[1]), ws[2])

        def ours():
            return k.geglu_mlp(x, *ws, approximate="tanh")

        times = []
        for fn in (eager, ours):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            samples = []
            for _ in range(20):
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            times.append(sorted(samples)[len(samples) // 2] * 1e3)
        out.append((f"geglu_mlp fwd M={m} H={h} I={i} bf16", times[0], times[1]))
    return out


def _kernelize_gemma(torch, device: str, repo_id: str, version: int) -> None:
    try:
        from transformers import GemmaConfig, GemmaForCausalLM
    except ImportError as exc:
        print(f"(transformers not installed: {exc}; skipping the kernelize demo)")
        return
    from kernels import Mode

    from . import transformers as integration

    torch.manual_seed(0)
    cfg = GemmaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                      initializer_range=0.5)  # large random weights, so greedy decoding is not degenerate
    model = GemmaForCausalLM(cfg).to(device).eval()
    prompt = torch.randint(0, 128, (1, 8), device=device)
    with torch.no_grad():
        before = model.generate(prompt, max_new_tokens=12, do_sample=False)
        logits_before = model(prompt).logits
    report = integration.kernelize(model, mode=Mode.INFERENCE, device=device, source="hub", repo_id=repo_id,
                                   version=version)
    print(report)
    with torch.no_grad():
        after = model.generate(prompt, max_new_tokens=12, do_sample=False)
        logits_after = model(prompt).logits
    diff = float((logits_after - logits_before).abs().max() / logits_before.abs().max())
    print(f"tiny Gemma, logits max rel. difference kernelized vs unkernelized: {diff:.2e}")
    same = torch.equal(before, after)
    print(f"tiny Gemma, greedy tokens unkernelized: {before[0, 8:].tolist()}")
    print(f"tiny Gemma, greedy tokens kernelized:   {after[0, 8:].tolist()}  -> identical: {same}")
    if not same:
        raise SystemExit("kernelized model generated different tokens")


def main(argv: list[str]) -> int:
    root = repo_root()
    p = argparse.ArgumentParser(prog="fused-geglu demo", description=__doc__)
    p.add_argument("--cache", type=Path, default=root / ".hub-cache")
    p.add_argument("--repo-id", default=None, help="default: build.toml [general.hub] repo-id")
    args = p.parse_args(argv)
    try:
        args.repo_id = args.repo_id or hub_repo_id(root)
        version = hub_version(root)  # the branch v<version> that `fused-geglu stage` staged
    except BuildConfigError as exc:
        print(f"fused-geglu demo: error: {exc}", file=sys.stderr)
        return 1
    # Offline, from the staged snapshot: must be set before huggingface_hub is imported.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_CACHE"] = str(args.cache)
    import kernels
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    k = kernels.get_kernel(args.repo_id, version=version, trust_remote_code=True)
    variant = Path(k.__file__).parent
    print(f"loaded {args.repo_id}@v{version} through kernels.get_kernel (offline, staged cache {args.cache})")
    print(f"  variant:  {variant.name}")
    print(f"  ops id:   {k.OPS_ID}  (compiled library: {'yes' if k.HAS_COMPILED_OPS else 'no, Triton/ATen only'})")
    print(f"  device:   {device}; backends available: {', '.join(k.available_backends(device))}")
    print()
    print(f"{'op':26} {'shape, dtype':24} {'backend that ran':18} rel. error vs float64")
    for name, shape, backend, err in _ops_table(k, torch, device):
        print(f"{name:26} {shape:24} {backend:18} {err:.2e}")
    print()
    _kernelize_gemma(torch, device, args.repo_id, version)
    if device == "cuda":
        print()
        print(f"{'speed (median of 20, CUDA events)':48} {'eager us':>10} {'fused us':>10} {'speed-up':>9}")
        for name, eager_us, ours_us in _speed(k, torch):
            print(f"{name:48} {eager_us:10.1f} {ours_us:10.1f} {eager_us / ours_us:8.2f}x")
    else:
        print("(no GPU here: speed is shown by `make bench` on a CUDA machine)")
    return 0
