"""The cuBLASLt linear's candidate pick (kernel_src/linear_cublaslt/algo_pick.h): with
$FUSED_GEGLU_LT_CANDIDATES above 1, a shape's first call outside graph capture times the heuristic's
first candidates and keeps one; a call in capture, under deterministic algorithms, or whose output is
its own addend times nothing; a later size in the same bucket reuses the winner. With the default (1)
nothing is timed. Whatever is picked, the product is right. The variable is read when a shape's plan
is built, so each test sets it and uses shapes no other test uses. CUDA tensors only: on the CPU
machine these skip (7 passed on an H100 at 417c42a, benchmarks/results/h100-tests-417c42a-cpubuilt.log.gz)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from _numerics import assert_close

# Shapes no other test uses, so each test's first call builds a fresh plan in the session's cache.
_K, _N = 1544, 2312


@pytest.fixture
def timing_on(monkeypatch):
    monkeypatch.setenv("FUSED_GEGLU_LT_CANDIDATES", "4")


def _ops_or_skip(kernel, device):
    if device != "cuda":
        pytest.skip("the cuBLASLt linear takes CUDA tensors; this machine has no GPU")
    if not importlib.import_module(f"{kernel.__name__}._dispatch").compiled_has("linear_lt", "cuda"):
        pytest.skip(f"the loaded variant ({kernel.__name__}) has no compiled cuBLASLt linear")
    return getattr(torch.ops, kernel.OPS_ID)


def _stats(ops) -> dict:
    plans, timed, from_bucket, not_first, single, candidates = ops.linear_lt_plan_stats()
    return {"plans": plans, "timed": timed, "from_bucket": from_bucket, "not_first": not_first,
            "single": single, "candidates": candidates}


def _operands(m: int, k: int, n: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k**-0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
    return x, w, b


def _check(out, x, w, b, what):
    ref = F.linear(x.double(), w.double(), b.double() if b is not None else None)
    assert_close(out, ref, F.linear(x, w, b), what=what)


def _delta(after: dict, before: dict) -> dict:
    return {key: after[key] - before[key] for key in before}


def test_first_call_in_capture_times_nothing_and_the_next_eager_call_times_once(kernel, device, timing_on):
    ops = _ops_or_skip(kernel, device)
    x, w, b = _operands(300, _K, _N, seed=1)
    out = torch.empty(300, _N, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # the stream's workspace and the handle exist before the capture
        xs, ws, bs = _operands(8, 64, 96, seed=0)
        ops.linear_lt(torch.empty(8, 96, device="cuda", dtype=torch.bfloat16), xs, ws, bs, 0, None)
    torch.cuda.synchronize()
    s0 = _stats(ops)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # a timing here would synchronise inside the capture
        ops.linear_lt(out, x, w, b, 0, None)
    s1 = _stats(ops)
    assert {**_delta(s1, s0), "single": 0} == {"plans": 1, "timed": 0, "from_bucket": 0, "not_first": 0,
                                               "single": 0, "candidates": 0}
    graph.replay()
    torch.cuda.synchronize()
    _check(out, x, w, b, "linear_lt captured before its shape was timed")
    eager_out = torch.empty_like(out)
    ops.linear_lt(eager_out, x, w, b, 0, None)
    ops.linear_lt(eager_out, x, w, b, 0, None)  # settled: the second call times nothing
    torch.cuda.synchronize()
    d = _delta(_stats(ops), s1)
    assert d["plans"] == 0 and d["timed"] <= 1 and d["from_bucket"] == 0, d
    assert s1["candidates"] == 4
    _check(eager_out, x, w, b, "linear_lt after the timing")
    out.zero_()
    graph.replay()  # the graph keeps the algorithm it was captured with
    torch.cuda.synchronize()
    _check(out, x, w, b, "the captured graph replayed after the timing")


def test_a_later_size_in_the_bucket_reuses_the_winner(kernel, device, timing_on):
    ops = _ops_or_skip(kernel, device)
    x1, w, b = _operands(200, _K + 8, _N, seed=2)
    x2 = torch.randn(230, _K + 8, device="cuda", dtype=torch.bfloat16)  # 200 and 230 round up to 256
    s0 = _stats(ops)
    y1 = torch.empty(200, _N, device="cuda", dtype=torch.bfloat16)
    ops.linear_lt(y1, x1, w, b, 1, None)
    s1 = _stats(ops)
    y2 = torch.empty(230, _N, device="cuda", dtype=torch.bfloat16)
    ops.linear_lt(y2, x2, w, b, 1, None)
    s2 = _stats(ops)
    torch.cuda.synchronize()
    assert _delta(s1, s0)["plans"] == 1 and _delta(s2, s1)["plans"] == 1
    if _delta(s1, s0)["timed"] == 1 and _delta(s2, s1)["single"] == 0:
        assert _delta(s2, s1)["timed"] == 0 and _delta(s2, s1)["from_bucket"] == 1, (s0, s1, s2)
    for y, x in ((y1, x1), (y2, x2)):
        ref = F.gelu(F.linear(x.double(), w.double(), b.double()), approximate="tanh")
        assert_close(y, ref, F.gelu(F.linear(x, w, b), approximate="tanh"), what=f"linear_lt tanh GELU M={x.shape[0]}")


def test_weight_gradient_sizes_share_a_bucket_and_stay_right(kernel, device, timing_on):
    ops = _ops_or_skip(kernel, device)
    for m in (100, 120):  # the rows are the GEMM's k here: both round up to 128
        x, w, _ = _operands(m, _K + 16, _N, seed=m)
        g = torch.randn(m, _N, device="cuda", dtype=torch.bfloat16)
        dw, db = torch.empty_like(w), torch.empty(_N, device="cuda", dtype=torch.bfloat16)
        ops.linear_lt_bwd_weight(dw, db, g, x)
        torch.cuda.synchronize()
        assert_close(dw, g.double().t() @ x.double(), g.t() @ x, what=f"dW M={m}")
        assert_close(db, g.double().sum(0), g.sum(0), what=f"db M={m}")


def test_deterministic_algorithms_keep_the_heuristics_first(kernel, device, timing_on):
    ops = _ops_or_skip(kernel, device)
    x, w, b = _operands(96, _K + 24, _N, seed=3)
    out = torch.empty(96, _N, device="cuda", dtype=torch.bfloat16)
    was, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        s0 = _stats(ops)
        ops.linear_lt(out, x, w, b, 0, None)
        torch.cuda.synchronize()
        d = _delta(_stats(ops), s0)
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
    assert {**d, "single": 0} == {"plans": 1, "timed": 0, "from_bucket": 0, "not_first": 0, "single": 0,
                                  "candidates": 0}, d
    _check(out, x, w, b, "linear_lt under deterministic algorithms")


def test_an_output_that_is_its_own_addend_is_not_timed_into_a_wrong_sum(kernel, device, timing_on):
    """Timing re-runs the call: with out as its own addend (C is D), each run would add the product
    again. Such a call is never timed, so the result is addend + x w^T once."""
    ops = _ops_or_skip(kernel, device)
    x, w, _ = _operands(64, _K + 32, _N, seed=4)
    addend = torch.randn(64, _N, device="cuda", dtype=torch.bfloat16)
    out = addend.clone()
    s0 = _stats(ops)
    ops.linear_lt(out, x, w, out, 0, None)
    torch.cuda.synchronize()
    assert _delta(_stats(ops), s0)["timed"] == 0
    ref = addend.double() + x.double() @ w.double().t()
    assert_close(out, ref, addend + x @ w.t(), what="linear_lt with out as its own addend")


def test_the_default_times_nothing(kernel, device, monkeypatch):
    ops = _ops_or_skip(kernel, device)
    monkeypatch.delenv("FUSED_GEGLU_LT_CANDIDATES", raising=False)
    x, w, b = _operands(80, _K + 40, _N, seed=5)
    out = torch.empty(80, _N, device="cuda", dtype=torch.bfloat16)
    s0 = _stats(ops)
    ops.linear_lt(out, x, w, b, 0, None)
    torch.cuda.synchronize()
    d = _delta(_stats(ops), s0)
    assert _stats(ops)["candidates"] == 1
    assert {k: d[k] for k in ("plans", "timed", "from_bucket", "not_first", "single")} == {
        "plans": 1, "timed": 0, "from_bucket": 0, "not_first": 0, "single": 1}, d
    _check(out, x, w, b, "linear_lt with the heuristic's first")


def test_a_bad_candidate_count_is_named(kernel, device, monkeypatch):
    ops = _ops_or_skip(kernel, device)
    monkeypatch.setenv("FUSED_GEGLU_LT_CANDIDATES", "nine")
    x, w, b = _operands(81, _K + 40, _N, seed=6)
    with pytest.raises(RuntimeError, match="FUSED_GEGLU_LT_CANDIDATES must be an integer from 1 to 8"):
        ops.linear_lt(torch.empty(81, _N, device="cuda", dtype=torch.bfloat16), x, w, b, 0, None)
