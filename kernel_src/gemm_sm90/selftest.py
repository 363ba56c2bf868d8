"""GPU self-test and micro-benchmark of the compiled GEMM ops (cuBLASLt linear, sm90 GeGLU GEMM).

Run on an H200 after building the CUDA variant:

    import torch, selftest
    ops = torch.ops._fused_geglu_cuda_<uid>      # after importing / loading the built .so
    selftest.run(ops)                             # returns True when every check passed

or from the shell:  python selftest.py path/to/_fused_geglu_cuda_<uid>.abi3.so [--no-bench]

Accuracy: every result is compared with a float64 reference on the same inputs; the error metric
is max|y - ref| / max|ref|. A check passes when our error <= 2 x PyTorch's error for the same
dtype (the same computation done with torch ops in that dtype) + a small per-dtype floor.
One failing case is reported and the run goes on.
"""

from __future__ import annotations

import math
import sys
import traceback

import torch
import torch.nn.functional as F

FLOOR = {torch.bfloat16: 2e-3, torch.float16: 5e-4, torch.float32: 1e-6}
_results: list[tuple[str, str, str]] = []  # (name, status, detail)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    den = ref.abs().max().item()
    if den == 0:
        den = 1.0
    return (y.double() - ref).abs().max().item() / den


def _record(name: str, ok: bool, detail: str) -> None:
    _results.append((name, "ok" if ok else "FAIL", detail))
    print(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def _check(name: str, pairs: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]], dtype) -> None:
    """pairs: (label, ours, torch_same_dtype, ref64)."""
    ok = True
    parts = []
    for label, ours, theirs, ref in pairs:
        if not torch.isfinite(ours).all():
            ok = False
            parts.append(f"{label}: non-finite")
            continue
        e_o, e_t = rel_err(ours, ref), rel_err(theirs, ref)
        good = e_o <= 2 * e_t + FLOOR[dtype]
        ok &= good
        parts.append(f"{label} err {e_o:.2e} (torch {e_t:.2e})")
    _record(name, ok, "; ".join(parts))


def _guard(name: str, fn) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - report and keep going
        msg = str(e).strip().splitlines()
        _record(name, False, f"{type(e).__name__}: {msg[0] if msg else ''}")
        traceback.print_exc(limit=2)
        torch.cuda.synchronize()


def _gelu64(v: torch.Tensor, approximate: int) -> torch.Tensor:
    return F.gelu(v, approximate="tanh" if approximate else "none")


def _x(m, k, dtype, mode, dev):
    """x [m, k] with the given layout: 'contig', 'padded' (row stride k + 8), 'step2' (x[::2])."""
    if mode == "contig":
        return torch.randn(m, k, device=dev, dtype=dtype)
    if mode == "padded":
        return torch.randn(m, k + 8, device=dev, dtype=dtype)[:, :k]
    return torch.randn(2 * m, k, device=dev, dtype=dtype)[::2]


# ------------------------------------------------------------------------------------------ tests
def test_linear(ops, dev) -> None:
    print("linear_lt", flush=True)
    cases = [(1, 64, 128), (37, 136, 200), (300, 1000, 769), (2048, 4096, 4096)]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m, k, n in cases:
            for act in (0, 1):
                for has_bias, has_pre, mode in ((True, False, "contig"), (False, False, "padded"),
                                                (True, True, "step2"), (False, True, "contig")):
                    if has_pre and (act == 0 or n % 8):
                        continue
                    name = (f"linear_lt {str(dtype)[6:]} M={m} K={k} N={n} act={act} "
                            f"bias={int(has_bias)} pre={int(has_pre)} x={mode}")

                    def body(m=m, k=k, n=n, act=act, has_bias=has_bias, has_pre=has_pre, mode=mode,
                             dtype=dtype):
                        x = _x(m, k, dtype, mode, dev)
                        w = torch.randn(n, k, device=dev, dtype=dtype) / math.sqrt(k)
                        b = torch.randn(n, device=dev, dtype=dtype) if has_bias else None
                        out = torch.full((m, n), float("nan"), device=dev, dtype=dtype)
                        pre = torch.full((m, n), float("nan"), device=dev, dtype=dtype) if has_pre else None
                        ops.linear_lt(out, x, w, b, act, pre)
                        ref_pre = x.double() @ w.double().t() + (b.double() if has_bias else 0)
                        ref = _gelu64(ref_pre, 1) if act else ref_pre
                        t_pre = F.linear(x, w, b)
                        t_out = F.gelu(t_pre, approximate="tanh") if act else t_pre
                        pairs = [("out", out, t_out, ref)]
                        if has_pre:
                            pairs.append(("preact", pre, t_pre, ref_pre))
                        _check(name, pairs, dtype)

                    _guard(name, body)


def test_linear_bwd(ops, dev) -> None:
    print("linear_lt_bwd_weight", flush=True)
    cases = [(1, 128, 64), (37, 200, 136), (1000, 769, 512), (4096, 4096, 4096)]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m, n, k in cases:
            for has_db, fp32_out, mode in ((True, False, "contig"), (False, False, "padded"),
                                           (True, True, "step2")):
                if fp32_out and dtype == torch.float32:
                    continue
                odt = torch.float32 if fp32_out else dtype
                name = (f"linear_lt_bwd_weight {str(dtype)[6:]} M={m} N={n} K={k} db={int(has_db)} "
                        f"dw={str(odt)[6:]} x={mode}")

                def body(m=m, n=n, k=k, has_db=has_db, odt=odt, mode=mode, dtype=dtype):
                    x = _x(m, k, dtype, mode, dev)
                    gy = _x(m, n, dtype, "contig", dev)
                    dw = torch.full((n, k), float("nan"), device=dev, dtype=odt)
                    db = torch.full((n,), float("nan"), device=dev, dtype=odt) if has_db else None
                    ops.linear_lt_bwd_weight(dw, db, gy, x)
                    ref_dw = gy.double().t() @ x.double()
                    pairs = [("dw", dw, (gy.t() @ x).to(odt), ref_dw)]
                    if has_db:
                        pairs.append(("db", db, gy.sum(0).to(odt), gy.double().sum(0)))
                    _check(name, pairs, dtype)

                _guard(name, body)


def _geglu_inputs(m, h, i, dtype, dev, bias, mode="contig"):
    x = _x(m, h, dtype, mode, dev)
    wg = torch.randn(i, h, device=dev, dtype=dtype) / math.sqrt(h)
    wu = torch.randn(i, h, device=dev, dtype=dtype) / math.sqrt(h)
    bg = torch.randn(i, device=dev, dtype=dtype) if bias else None
    bu = torch.randn(i, device=dev, dtype=dtype) if bias else None
    return x, wg, wu, bg, bu


def test_geglu_gateup(ops, dev) -> None:
    print("geglu_gateup_sm90", flush=True)
    cases = [(1, 64, 8), (77, 136, 200), (1000, 1024, 1000), (4096, 4096, 11008), (333, 2048, 5632)]
    for dtype in (torch.bfloat16, torch.float16):
        for m, h, i in cases:
            for approx in (0, 1):
                for has_bias, has_pre, mode in ((False, False, "contig"), (True, True, "padded"),
                                                (True, False, "step2")):
                    name = (f"geglu_gateup_sm90 {str(dtype)[6:]} M={m} H={h} I={i} approx={approx} "
                            f"bias={int(has_bias)} pre={int(has_pre)} x={mode}")

                    def body(m=m, h=h, i=i, approx=approx, has_bias=has_bias, has_pre=has_pre,
                             mode=mode, dtype=dtype):
                        x, wg, wu, bg, bu = _geglu_inputs(m, h, i, dtype, dev, has_bias, mode)
                        out = torch.full((m, i), float("nan"), device=dev, dtype=dtype)
                        pg = torch.full((m, i), float("nan"), device=dev, dtype=dtype) if has_pre else None
                        pu = torch.full((m, i), float("nan"), device=dev, dtype=dtype) if has_pre else None
                        ops.geglu_gateup_sm90(out, x, wg, wu, bg, bu, approx, pg, pu)
                        g64 = x.double() @ wg.double().t() + (bg.double() if has_bias else 0)
                        u64 = x.double() @ wu.double().t() + (bu.double() if has_bias else 0)
                        ref = _gelu64(g64, approx) * u64
                        tg, tu = F.linear(x, wg, bg), F.linear(x, wu, bu)
                        t_out = F.gelu(tg, approximate="tanh" if approx else "none") * tu
                        pairs = [("h", out, t_out, ref)]
                        if has_pre:
                            pairs += [("gate", pg, tg, g64), ("up", pu, tu, u64)]
                        _check(name, pairs, dtype)

                    _guard(name, body)

    # Precondition errors must name the argument (and not crash the process).
    def expect_error(name, fn, needle):
        def body():
            try:
                fn()
            except RuntimeError as e:
                _record(name, needle in str(e), f"raised: {str(e).splitlines()[0][:120]}")
                return
            _record(name, False, "no error raised")

        _guard(name, body)

    bf = torch.bfloat16
    x = torch.randn(16, 100, device=dev, dtype=bf)
    expect_error("geglu_gateup_sm90 rejects H % 8 != 0",
                 lambda: ops.geglu_gateup_sm90(torch.empty(16, 16, device=dev, dtype=bf), x,
                                               torch.randn(16, 100, device=dev, dtype=bf),
                                               torch.randn(16, 100, device=dev, dtype=bf), None, None, 0, None, None),
                 "x")
    x = torch.randn(16, 64, device=dev, dtype=bf)
    expect_error("geglu_gateup_sm90 rejects I % 8 != 0",
                 lambda: ops.geglu_gateup_sm90(torch.empty(16, 12, device=dev, dtype=bf), x,
                                               torch.randn(12, 64, device=dev, dtype=bf),
                                               torch.randn(12, 64, device=dev, dtype=bf), None, None, 0, None, None),
                 "I and H")
    expect_error("geglu_gateup_sm90 rejects a misaligned x",
                 lambda: ops.geglu_gateup_sm90(torch.empty(16, 16, device=dev, dtype=bf),
                                               torch.randn(16 * 64 + 1, device=dev, dtype=bf)[1:].view(16, 64),
                                               torch.randn(16, 64, device=dev, dtype=bf),
                                               torch.randn(16, 64, device=dev, dtype=bf), None, None, 0, None, None),
                 "x")
    w = torch.randn(16, 64, device=dev, dtype=bf)
    expect_error("geglu_gateup_sm90 rejects w_gate and w_up as one tensor",
                 lambda: ops.geglu_gateup_sm90(torch.empty(16, 16, device=dev, dtype=bf), x, w, w, None, None, 0,
                                               None, None),
                 "distinct")
    expect_error("geglu_gateup_sm90 rejects w_gate and w_up with different row strides",
                 lambda: ops.geglu_gateup_sm90(torch.empty(16, 16, device=dev, dtype=bf), x,
                                               torch.randn(16, 128, device=dev, dtype=bf)[:, :64], w, None, None, 0,
                                               None, None),
                 "row stride")


def test_graph_capture(ops, dev) -> None:
    """Each op captured into a CUDA graph (after one eager warm-up on the capture stream)."""
    print("CUDA graph capture", flush=True)

    def body():
        dtype = torch.bfloat16
        m, h, i = 256, 512, 1024
        x, wg, wu, bg, bu = _geglu_inputs(m, h, i, dtype, dev, True)
        out_h = torch.empty(m, i, device=dev, dtype=dtype)
        pg, pu = torch.empty(m, i, device=dev, dtype=dtype), torch.empty(m, i, device=dev, dtype=dtype)
        out_l = torch.empty(m, i, device=dev, dtype=dtype)
        pre_l = torch.empty(m, i, device=dev, dtype=dtype)
        dw = torch.empty(i, h, device=dev, dtype=dtype)
        db = torch.empty(i, device=dev, dtype=dtype)
        gy = torch.randn(m, i, device=dev, dtype=dtype)

        def step():
            ops.geglu_gateup_sm90(out_h, x, wg, wu, bg, bu, 0, pg, pu)
            ops.linear_lt(out_l, x, wg, bg, 1, pre_l)
            ops.linear_lt_bwd_weight(dw, db, gy, x)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()  # warm-up: plans, workspace, kernel attributes
        torch.cuda.current_stream().wait_stream(s)
        ref = [t.clone() for t in (out_h, pg, pu, out_l, pre_l, dw, db)]
        for t in (out_h, pg, pu, out_l, pre_l, dw, db):
            t.fill_(float("nan"))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            step()
        g.replay()
        torch.cuda.synchronize()
        same = all(torch.equal(a, r) for a, r in zip((out_h, pg, pu, out_l, pre_l, dw, db), ref))
        _record("graph capture + replay (all ops)", same, "bit-identical to eager" if same else "differs from eager")

    _guard("graph capture + replay (all ops)", body)


# ------------------------------------------------------------------------------------------ bench
def _time_ms(fn, warmup: int = 10, reps: int = 50) -> float:
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(start, end):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return ts[len(ts) // 2]


def bench(ops, dev) -> None:
    rows = []

    def add(op, shape, dtype, flops, ours, base_name, base):
        def body():
            t_o, t_b = _time_ms(ours), _time_ms(base)
            rows.append((op, shape, str(dtype)[6:], t_o, flops / t_o / 1e9, base_name, t_b, t_b / t_o))

        _guard(f"bench {op} {shape}", body)

    for dtype in (torch.bfloat16, torch.float16):
        for m, k, n in [(8192, 4096, 4096), (4096, 4096, 14336), (512, 4096, 4096)]:
            x = torch.randn(m, k, device=dev, dtype=dtype)
            w = torch.randn(n, k, device=dev, dtype=dtype)
            b = torch.randn(n, device=dev, dtype=dtype)
            out = torch.empty(m, n, device=dev, dtype=dtype)
            pre = torch.empty(m, n, device=dev, dtype=dtype)
            gy = torch.randn(m, n, device=dev, dtype=dtype)
            dw = torch.empty(n, k, device=dev, dtype=dtype)
            db = torch.empty(n, device=dev, dtype=dtype)
            f = 2.0 * m * n * k
            shp = f"{m}x{k}x{n}"
            add("linear_lt bias", shp, dtype, f, lambda: ops.linear_lt(out, x, w, b, 0, None),
                "addmm", lambda: torch.addmm(b, x, w.t()))
            add("linear_lt gelu+aux", shp, dtype, f, lambda: ops.linear_lt(out, x, w, b, 1, pre),
                "linear+gelu", lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))
            add("linear_lt_bwd_weight+db", shp, dtype, f, lambda: ops.linear_lt_bwd_weight(dw, db, gy, x),
                "gy^T@x + sum", lambda: (gy.t() @ x, gy.sum(0)))
        for m, h, i in [(8192, 4096, 11008), (8192, 3584, 14336), (4096, 2048, 16384), (512, 4096, 11008)]:
            x, wg, wu, bg, bu = _geglu_inputs(m, h, i, dtype, dev, False)
            wcat = torch.cat([wg, wu], 0)
            out = torch.empty(m, i, device=dev, dtype=dtype)
            pg, pu = torch.empty(m, i, device=dev, dtype=dtype), torch.empty(m, i, device=dev, dtype=dtype)
            f = 2.0 * m * 2 * i * h
            shp = f"M{m} H{h} I{i}"

            def two_mm(x=x, wg=wg, wu=wu):
                return F.gelu(x @ wg.t()) * (x @ wu.t())

            def cat_mm(x=x, wcat=wcat):
                g, u = (x @ wcat.t()).chunk(2, dim=-1)
                return F.gelu(g) * u

            add("geglu_gateup_sm90", shp, dtype, f, lambda: ops.geglu_gateup_sm90(out, x, wg, wu, None, None, 0, None, None),
                "2 mm + gelu*mul", two_mm)
            add("geglu_gateup_sm90", shp, dtype, f, lambda: ops.geglu_gateup_sm90(out, x, wg, wu, None, None, 0, None, None),
                "cat mm + gelu*mul", cat_mm)
            add("geglu_gateup_sm90 +gate,up", shp, dtype, f,
                lambda: ops.geglu_gateup_sm90(out, x, wg, wu, None, None, 0, pg, pu), "2 mm + gelu*mul", two_mm)
    print()
    print(f"{'op':28s} {'shape':22s} {'dtype':9s} {'ours ms':>9s} {'TFLOP/s':>8s}  {'baseline':18s} "
          f"{'base ms':>9s} {'speedup':>7s}")
    for op, shp, dt, t_o, tf, bn, t_b, sp in rows:
        print(f"{op:28s} {shp:22s} {dt:9s} {t_o:9.3f} {tf:8.1f}  {bn:18s} {t_b:9.3f} {sp:7.2f}x")


def run(ops, do_bench: bool = True) -> bool:
    """Runs every check (and the benchmark table); returns True when all checks passed."""
    _results.clear()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    for test in (test_linear, test_linear_bwd, test_geglu_gateup, test_graph_capture):
        test(ops, dev)
    n_fail = sum(1 for _, st, _ in _results if st != "ok")
    print(f"\n{len(_results) - n_fail}/{len(_results)} checks passed")
    for name, st, detail in _results:
        if st != "ok":
            print(f"  FAIL {name}: {detail}")
    if do_bench:
        bench(ops, dev)
    return n_fail == 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: selftest.py path/to/_fused_geglu_cuda_<uid>*.so [--no-bench]")
    so = sys.argv[1]
    torch.ops.load_library(so)
    import os

    ns = os.path.basename(so).split(".")[0]
    ok = run(getattr(torch.ops, ns), do_bench="--no-bench" not in sys.argv)
    sys.exit(0 if ok else 1)
