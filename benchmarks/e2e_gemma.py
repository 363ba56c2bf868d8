"""End-to-end: a Gemma-2B-sized model (random weights, a few layers) kernelized with fused-geglu,
against the same model unkernelized and under torch.compile, forward and training step (GPU).

    python benchmarks/e2e_gemma.py --out DIR [--layers 4] [--batch 4] [--seq 1024] [--reps 10] [--no-compile]

``--batch 1 --seq 16 --reps 50`` is a decode-sized step without CUDA graphs, where the host's time per
module call decides.

Loads the kernel from the staged offline cache (``make stage``), like the tests and the demo.
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--reps", type=int, default=10, help="timed calls per row (median)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    args = p.parse_args()
    import torch
    from kernels import Mode
    from transformers import GemmaConfig, GemmaForCausalLM

    from fused_geglu_tools.transformers import kernelize, unkernelize

    if not torch.cuda.is_available():
        print("e2e_gemma: needs a CUDA GPU; nothing measured")
        return 0
    torch.manual_seed(0)
    cfg = GemmaConfig(vocab_size=4096, hidden_size=2048, intermediate_size=16384, num_hidden_layers=args.layers,
                      num_attention_heads=8, num_key_value_heads=1, head_dim=256, max_position_embeddings=args.seq,
                      hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh")
    model = GemmaForCausalLM(cfg).to("cuda", torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    rows = []

    def fwd(m):
        def run():
            with torch.no_grad():
                return m(input_ids=ids).logits
        return run

    def train(m):
        def run():
            m.zero_grad(set_to_none=True)
            m(input_ids=ids, labels=ids).loss.backward()
        return run

    def measure(name, m, mode_train):
        m.train(mode_train)
        fn = train(m) if mode_train else fwd(m)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ms = _median_ms(fn, reps=args.reps)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        rows.append({"provider": name, "mode": "train" if mode_train else "fwd", "median_ms": ms, "peak_mb_above_start": peak})
        print(f"{name:22} {'train' if mode_train else 'fwd':6} {ms:9.2f} ms  peak +{peak:8.1f} MB", flush=True)

    model.eval()
    with torch.no_grad():
        ref_logits = model(input_ids=ids).logits.float()
    for train_mode in (False, True):
        measure("eager", model, train_mode)
    t0 = time.time()
    if not args.no_compile:
        compiled = torch.compile(model)  # compile of the unkernelized model: the baseline to beat
        for train_mode in (False, True):
            measure("compile", compiled, train_mode)
    compile_s = None if args.no_compile else time.time() - t0
    report = {}
    for train_mode in (False, True):
        model.train(train_mode)
        r = kernelize(model, mode=Mode.TRAINING if train_mode else Mode.INFERENCE, device="cuda", source="hub")
        report["train" if train_mode else "fwd"] = str(r)
        if not train_mode:
            with torch.no_grad():
                err = (model(input_ids=ids).logits.float() - ref_logits).norm() / ref_logits.norm()
            print(f"kernelized logits rel. diff vs unkernelized (bf16): {err:.3e}")
        measure("kernelized", model, train_mode)
    unkernelize(model)
    import triton
    import transformers

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "triton": triton.__version__, "transformers": transformers.__version__,
           "commit": os.environ.get("FUSED_GEGLU_COMMIT")}
    payload = {"config": {"hidden": 2048, "intermediate": 16384, "layers": args.layers, "batch": args.batch,
                          "seq": args.seq, "dtype": "bfloat16", "reps": args.reps},
               "env": env, "compile_s": compile_s, "kernelize": report,
               "logits_rel_diff": float(err), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"e2e-gemma2b-{time.strftime('%Y%m%d')}.json"
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
