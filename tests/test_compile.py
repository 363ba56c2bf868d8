"""torch.compile sees the ops as single nodes: no graph break, no recompile on a new token count."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from _numerics import randn
from conftest import REPO_ID, VERSION


class _CountingBackend:
    """A torch.compile backend that counts compilations (graphs handed to it)."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _mlp_fn(kernel):
    def fn(x, wg, wu, wd, b):
        y = kernel.geglu_mlp(x, wg, wu, wd, approximate="tanh")
        z = kernel.linear(y, wd.t().contiguous(), None, activation="gelu_tanh")
        out = torch.empty(*z.shape[:-1], z.shape[-1] // 2, dtype=z.dtype, device=z.device)
        kernel.gelu_tanh_and_mul(out, z)
        return kernel.geglu(out, out, approximate="none").sum() + b.sum()

    return fn


def test_fullgraph_dynamic_no_recompile(kernel, device):
    torch._dynamo.reset()
    counter = _CountingBackend()
    fn = torch.compile(_mlp_fn(kernel), backend=counter, fullgraph=True, dynamic=True)
    h, i = 16, 32
    wg, wu = randn(i, h, device=device), randn(i, h, device=device)
    wd, b = randn(h, i, device=device), randn(3, device=device)
    eager = _mlp_fn(kernel)
    for m in (5, 9, 17):
        x = randn(m, h, device=device)
        torch.testing.assert_close(fn(x, wg, wu, wd, b), eager(x, wg, wu, wd, b), rtol=1e-5, atol=1e-5)
    assert counter.graphs == 1, f"recompiled: {counter.graphs} graphs for 3 token counts"


# The kernel's memo tables, filled by eager calls as they pick (name: module). A compiled graph must not
# guard on them: an eager call between two compiled ones (an eager eval, then compiled training) would
# otherwise recompile. Until 2026-12-05 the tanh-GELU short path of ``linear`` read ``_LT_GELU_TANH``
# before asking whether dynamo traced it; only CUDA eager calls fill that set, so the test above, which
# interleaves eager calls, failed on the GPU alone (H100, 222b46f) and never on the CPU.
_MEMOS = {"_picks": ("geglu", "linear"), "_ATEN_PLAIN": ("linear",), "_LT_GELU_TANH": ("linear",),
          "_infer_plans": ("mlp",), "_auto_routes": ("mlp",), "_plans": ("triton_kernels.geglu",),
          "_decisions": ("policy",), "_last": ("_dispatch",)}


def test_memo_tables_filled_by_eager_calls_do_not_recompile(kernel, device):
    """Every memo table gains an entry between two compiled calls (as an eager call on another device
    would add one): still one graph, for every public op of the test above, plain and tanh-GELU ``linear``."""
    torch._dynamo.reset()
    counter = _CountingBackend()
    mlp = _mlp_fn(kernel)

    def fn(x, wg, wu, wd, b):
        return mlp(x, wg, wu, wd, b) + kernel.linear(x, wg, None).sum() + kernel.linear(x, wu, None, "gelu_tanh").sum()

    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    h, i = 16, 32
    wg, wu = randn(i, h, device=device), randn(i, h, device=device)
    wd, b = randn(h, i, device=device), randn(3, device=device)
    compiled(randn(5, h, device=device), wg, wu, wd, b)
    sentinel, added = torch.device("cuda", 97), []
    try:
        import triton  # noqa: F401
        skipped = ()
    except ImportError:  # a torch without triton: the kernel runs without its Triton modules
        skipped = tuple(m for modules in _MEMOS.values() for m in modules if m.startswith("triton_kernels."))
    for name, modules in _MEMOS.items():
        for mod in modules:
            if mod in skipped:
                continue
            table = getattr(importlib.import_module(f"{kernel.__name__}.{mod}"), name)
            if isinstance(table, set):
                table.add(sentinel)
            else:
                table[sentinel] = "torch"
            added.append(table)
    try:
        for m in (9, 17):
            x = randn(m, h, device=device)
            torch.testing.assert_close(compiled(x, wg, wu, wd, b), fn(x, wg, wu, wd, b), rtol=1e-5, atol=1e-5)
    finally:
        for table in added:
            table.discard(sentinel) if isinstance(table, set) else table.pop(sentinel, None)
    assert len(added) == 9 - len(skipped)
    assert counter.graphs == 1, f"recompiled: {counter.graphs} graphs after the memo tables changed"


def test_setting_an_environment_variable_does_not_recompile(kernel, device, monkeypatch):
    """A variable set between two compiled calls (a launcher's, a logging library's) leaves the graph alone.
    Until 2026-12-05 dynamo guarded on the length and keys of os.environ's store, which the dispatch reads
    directly in eager calls: every graph holding a kernel op recompiled, up to dynamo's recompile limit."""
    torch._dynamo.reset()
    counter = _CountingBackend()
    h, i = 16, 32
    wg, wu, wd = randn(i, h, device=device), randn(i, h, device=device), randn(h, i, device=device)

    def fn(x):
        y = kernel.geglu_mlp(x, wg, wu, wd)
        return kernel.linear(y, wg, None).sum() + kernel.linear(y, wu, None, "gelu_tanh").sum() + kernel.geglu(x, x).sum()

    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    compiled(randn(5, h, device=device))
    for n, m in enumerate((9, 17)):
        monkeypatch.setenv(f"FUSED_GEGLU_TEST_UNRELATED_{n}", "1")
        x = randn(m, h, device=device)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-5)
    assert counter.graphs == 1, f"recompiled: {counter.graphs} graphs after setting environment variables"


def test_backward_inside_a_compiled_step_with_checkpointing(kernel, device):
    """``loss.backward()`` inside a compiled step (it graph-breaks there, so the engine runs the backward
    while dynamo's frame callback is set), the ops under non-reentrant activation checkpointing: gradients
    as the eager step's, and as many graphs as the same step of ATen ops. Until 2026-12-05 dynamo compiled
    the kernel's Python backwards as frames of their own and, building a guard on ``ctx.saved_tensors``,
    unpacked them twice: CheckpointError (transformers' Gemma with gradient checkpointing, inductor)."""
    from torch.utils.checkpoint import checkpoint

    h, i = 16, 32
    leaves = [randn(*s, device=device, scale=0.3, requires_grad=True) for s in ((i, h), (i, h), (h, i), (h, h))]

    def ours(x, wg, wu, wd, w):
        y = kernel.geglu_mlp(x, wg, wu, wd, approximate="tanh")
        return kernel.geglu(kernel.linear(y, w, None, "gelu_tanh"), y)

    def aten(x, wg, wu, wd, w):
        y = F.linear(F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd)
        return F.gelu(F.gelu(F.linear(y, w), approximate="tanh")) * y

    def step_of(body):
        def step(x):
            y = checkpoint(body, x, *leaves, use_reentrant=False)
            y.square().sum().backward()
            return y.detach()
        return step

    xs = [randn(m, h, device=device) for m in (5, 5, 9)]
    graphs, grads = {}, {}
    for name, body in (("ours", ours), ("aten", aten), ("eager", ours)):
        torch._dynamo.reset()
        counter = _CountingBackend()
        step = step_of(body) if name == "eager" else torch.compile(step_of(body), backend=counter)
        for p in leaves:
            p.grad = None
        for x in xs:
            step(x.clone().requires_grad_(True))
        graphs[name], grads[name] = counter.graphs, [p.grad.clone() for p in leaves]
    for got, want in zip(grads["ours"], grads["eager"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert graphs["ours"] == graphs["aten"], graphs


def test_linear_sequence_first_and_addend_compile_without_breaks(kernel, device):
    """``linear`` on a sequence-first x (a [S, B, K] tensor seen as [B, S, K]) and with an addend of the
    output's shape: one graph for three sequence lengths, the eager function's values and gradients."""
    torch._dynamo.reset()
    counter = _CountingBackend()
    k, n, n2, bsz = 24, 40, 16, 3
    w = randn(n, k, device=device, scale=k**-0.5, requires_grad=True)
    b = randn(n, device=device, requires_grad=True)
    w2 = randn(n2, n, device=device, scale=n**-0.5, requires_grad=True)

    def fn(xs, r):
        y = kernel.linear(xs.transpose(0, 1), w, b)
        return kernel.linear(y, w2, r, activation="gelu_tanh")

    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    for s in (5, 9, 17):
        xs = randn(s, bsz, k, device=device)
        r = randn(bsz, s, n2, device=device, requires_grad=True)
        got = compiled(xs, r)
        want = fn(xs, r)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        g = randn(*got.shape, device=device)
        for a, e in zip(torch.autograd.grad(got, (w, b, w2, r), g), torch.autograd.grad(want, (w, b, w2, r), g)):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    assert counter.graphs == 1, f"recompiled: {counter.graphs} graphs for 3 sequence lengths"


def test_no_recompile_when_a_compiled_function_is_the_first_caller(hub_cache, device):
    """In a fresh process whose first call into the kernel is a compiled function, three token counts
    still give one graph. (The environment reads of the dispatch are traced by dynamo; until c8a298a
    they filled a cache on first use, which failed the first trace's guards: one recompile that the
    in-suite test above never saw, because earlier tests had filled the cache.)"""
    code = textwrap.dedent(f"""
        import torch, kernels
        k = kernels.get_kernel({REPO_ID!r}, version={VERSION}, trust_remote_code=True)
        graphs = []
        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        def fn(x, w, wg, wu, wd):
            return k.linear(k.geglu_mlp(x, wg, wu, wd), w, None, activation="gelu_tanh")
        c = torch.compile(fn, backend=backend, fullgraph=True, dynamic=True)
        h, i = 16, 32
        d = "{device}"
        w, wg, wu, wd = torch.randn(h, h, device=d), torch.randn(i, h, device=d), torch.randn(i, h, device=d), torch.randn(h, i, device=d)
        for m in (5, 9, 17):
            c(torch.randn(m, h, device=d), w, wg, wu, wd)
        print("graphs", len(graphs))
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}
    env.pop("FUSED_GEGLU_BACKEND", None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-2:] == ["graphs", "1"], run.stdout[-500:] + run.stderr[-2000:]


def test_training_step_compiles_with_inductor(kernel, device):
    torch._dynamo.reset()
    h, i = 16, 24
    wg = randn(i, h, device=device, scale=0.3, requires_grad=True)
    wu = randn(i, h, device=device, scale=0.3, requires_grad=True)
    wd = randn(h, i, device=device, scale=0.3, requires_grad=True)

    def step(x):
        return kernel.geglu_mlp(x, wg, wu, wd, approximate="tanh").square().sum()

    compiled = torch.compile(step, fullgraph=True)
    x = randn(7, h, device=device)
    loss = compiled(x)
    loss.backward()
    grads = [p.grad.clone() for p in (wg, wu, wd)]
    for p in (wg, wu, wd):
        p.grad = None
    step(x).backward()
    for g, p in zip(grads, (wg, wu, wd)):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["geglu_fwd_op", "geglu_packed_fwd_op", "linear_fwd_op", "geglu_mlp_fwd_op"])
def test_opcheck(kernel, device, name):
    """torch.library.opcheck: schema, fake tensors, autograd registration and AOT dispatch."""
    op = getattr(torch.ops, kernel.OPS_ID)
    x = randn(5, 12, device=device, requires_grad=True)
    w = randn(6, 12, device=device, requires_grad=True)
    args = {
        "geglu_fwd_op": (x, randn(5, 12, device=device, requires_grad=True), "tanh", "auto"),
        "geglu_packed_fwd_op": (x, "none", "auto"),
        "linear_fwd_op": (x, w, randn(6, device=device, requires_grad=True), "gelu_tanh", True, "auto"),
        "geglu_mlp_fwd_op": (x, w, randn(6, 12, device=device, requires_grad=True),
                             randn(12, 6, device=device, requires_grad=True), None, None, None, "tanh", True, "auto"),
    }[name]
    torch.library.opcheck(getattr(op, name), args)


@pytest.mark.parametrize("name", ["geglu_mlp_train_fwd", "geglu_mlp_gemm_bwd_keep", "geglu_mlp_fwd_planned"])
def test_opcheck_traced_training_ops(kernel, device, compiled, name):
    """The two compiled ops a traced training step calls directly (``mlp_traced.training``): schema,
    the fake kernels and the forward's autograd registered in fused_geglu/mlp_traced.py, AOT dispatch."""
    op = getattr(torch.ops, kernel.OPS_ID)
    m, h, i = 5, 12, 8
    x, dy = randn(m, h, device=device, requires_grad=True), randn(m, h, device=device)
    wg, wu, wd = (randn(*s, device=device, requires_grad=True) for s in ((i, h), (i, h), (h, i)))
    bg = randn(i, device=device, requires_grad=True)
    if name == "geglu_mlp_train_fwd":
        args = (x, wg, wu, wd, bg, None, None, 1, -2, 1, 0)  # -2: the vendor-GEMM launch
    elif name == "geglu_mlp_fwd_planned":  # inference: no input needs a gradient
        args = (x.detach(), wg.detach(), wu.detach(), wd.detach(), bg.detach(), None, None, 0, -2, 1, 0)
    else:
        gate, up = randn(m, i, device=device), randn(m, i, device=device)
        args = (dy, x.detach(), wg.detach(), wu.detach(), wd.detach(), gate, up, 0, True, False, True)
        with pytest.raises(RuntimeError, match=r"geglu_mlp_gemm_bwd_keep: gate \[.*must be \[M, I\]"):
            getattr(op, name)(*args[:5], gate[1:], up[1:], *args[7:])  # one row short of x's
    torch.library.opcheck(getattr(op, name), args)


# (lead, H, I, dtype) of the traced-plan tests; on the H200 the bf16 ones are the cuBLAS + pointwise and
# the CUTLASS gate+up launches, on CPU all three the CPU sequence.
_PLANNED_SHAPES = [((3, 37), 48, 200, torch.float32), ((2, 160), 264, 392, torch.bfloat16),
                   ((1024,), 1152, 1024, torch.bfloat16)]


@pytest.fixture
def traced_ops_on(kernel, device, compiled, monkeypatch):
    """The traced route switched on for the test's device (``mlp_traced.TRACED_OPS_DEVICES``; CUDA's default
    is off until a GPU run verifies it: these tests are that run)."""
    traced = importlib.import_module(kernel.__name__ + ".mlp_traced")
    monkeypatch.setattr(traced, "TRACED_OPS_DEVICES", traced.TRACED_OPS_DEVICES | {device})
    return traced


def _traced_ops(kernel, fn, leaves, dy, dynamic):
    """(the kernel's ops in the compiled forward and backward graphs, y, gradients) of ``fn`` compiled
    with AOTAutograd running the traced graphs as they are (aot_eager, with the graphs kept)."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    seen = []

    def keep(gm, _):
        seen.append({str(n.target).split(".")[-2] for n in gm.graph.nodes if kernel.OPS_ID in str(n.target)})
        return make_boxed_func(gm)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True,
                             dynamic=dynamic)
    y = compiled(*leaves)
    grads = torch.autograd.grad(y, leaves, dy)
    torch._dynamo.reset()
    return seen, y.detach(), grads


@pytest.mark.parametrize("shape", _PLANNED_SHAPES, ids=str)
def test_traced_training_step_calls_the_compiled_ops(kernel, device, shape, traced_ops_on):
    """A training step traced with static sizes calls ``geglu_mlp_train_fwd`` and, in its backward,
    ``geglu_mlp_gemm_bwd_keep`` (the launch planned at trace time), where the auto policy's eager step
    runs the C++ training node; it gives that node's bits (the same kernels: on the H200 the second
    shape is cuBLAS + pointwise, the third the CUTLASS gate+up GEMM). Symbolic sizes keep the custom
    ops, also with eager's bits."""
    lead, h, i, dtype = shape
    os.environ.pop("FUSED_GEGLU_BACKEND", None)
    x = randn(*lead, h, device=device, dtype=dtype, requires_grad=True)
    wg, wu = (randn(i, h, device=device, dtype=dtype, scale=h**-0.5, requires_grad=True) for _ in range(2))
    wd = randn(h, i, device=device, dtype=dtype, scale=i**-0.5, requires_grad=True)
    bg = randn(i, device=device, dtype=dtype, requires_grad=True)
    leaves = [x, wg, wu, wd, bg]
    dy = randn(*lead, h, device=device, dtype=dtype)
    approximate = "none" if dtype == torch.float32 else "tanh"  # both flavours reach the planned op

    def fn(x, wg, wu, wd, bg):
        return kernel.geglu_mlp(x, wg, wu, wd, bg, None, None, approximate=approximate)

    y = fn(*leaves)
    assert "GegluMlpTrain" in y.grad_fn.name(), "the eager step is the C++ node's at this size"
    want = (y.detach(), *torch.autograd.grad(y, leaves, dy))
    for dynamic, ops in ((False, ({"geglu_mlp_train_fwd"}, {"geglu_mlp_gemm_bwd_keep"})),
                         (True, ({"geglu_mlp_fwd_op"}, {"geglu_mlp_bwd_op"}))):
        seen, got_y, got = _traced_ops(kernel, fn, leaves, dy, dynamic)
        assert tuple(seen) == ops, f"dynamic={dynamic}: the graphs call {seen}, expected {ops}"
        for name, a, b in zip(["y", "dx", "dW_gate", "dW_up", "dW_down", "db_gate"], (got_y, *got), want):
            assert torch.equal(a, b), f"dynamic={dynamic}: {name} differs from the eager C++ node's"


def test_make_fx_training_step_records_the_compiled_ops(kernel, device, traced_ops_on):
    """Tracers other than dynamo (make_fx, and export on top of it) take the same plan in plain Python:
    the traced forward and backward are the two compiled ops, with eager's values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    m, h, i = 6, 16, 24
    leaves = [randn(m, h, device=device, requires_grad=True),
              *(randn(*s, device=device, scale=0.3, requires_grad=True) for s in ((i, h), (i, h), (h, i)))]
    dy = randn(m, h, device=device)

    def step(x, wg, wu, wd, dy):
        y = kernel.geglu_mlp(x, wg, wu, wd)
        return (y, *torch.autograd.grad(y, (x, wg, wu, wd), dy))

    gm = make_fx(step, tracing_mode="fake")(*leaves, dy)
    called = [str(n.target).split(".")[-2] for n in gm.graph.nodes if kernel.OPS_ID in str(n.target)]
    assert called == ["geglu_mlp_train_fwd", "geglu_mlp_gemm_bwd_keep"], called
    got, want = gm(*leaves, dy), step(*leaves, dy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_traced_ops_switch_keeps_the_custom_ops(kernel, device, compiled, monkeypatch):
    """``FUSED_GEGLU_TRACED_OPS=0`` (``mlp_traced.TRACED_OPS_DEVICES`` without the device): traced graphs call
    the custom ops again, with the same values."""
    traced = importlib.import_module(kernel.__name__ + ".mlp_traced")
    m, h, i = 6, 16, 24
    leaves = [randn(m, h, device=device, requires_grad=True),
              *(randn(*s, device=device, scale=0.3, requires_grad=True) for s in ((i, h), (i, h), (h, i)))]
    dy = randn(m, h, device=device)

    def fn(x, wg, wu, wd):
        return kernel.geglu_mlp(x, wg, wu, wd)

    seen = {}
    for on in (True, False):
        monkeypatch.setattr(traced, "TRACED_OPS_DEVICES", frozenset({device} if on else ()))
        seen[on] = _traced_ops(kernel, fn, leaves, dy, dynamic=False)
    assert seen[True][0] == [{"geglu_mlp_train_fwd"}, {"geglu_mlp_gemm_bwd_keep"}], seen[True][0]
    assert seen[False][0] == [{"geglu_mlp_fwd_op"}, {"geglu_mlp_bwd_op"}], seen[False][0]
    for a, b in zip(seen[True][1:], seen[False][1:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_traced_ops_default_devices(kernel, device, compiled):
    """$FUSED_GEGLU_TRACED_OPS: unset, the traced route is CPU's only (on CUDA it showed no end-to-end gain); '1'
    every device, '0' none; anything else is refused, naming the variable. A device outside the set
    (CUDA by default) gets the custom ops in its graphs."""
    traced = importlib.import_module(kernel.__name__ + ".mlp_traced")
    assert traced.devices_from_env(None) == traced.devices_from_env(" ") == {"cpu"}
    assert traced.devices_from_env("1") == traced.devices_from_env("ON") == {"cpu", "cuda"}
    assert traced.devices_from_env("0") == traced.devices_from_env("off") == frozenset()
    with pytest.raises(ValueError, match="FUSED_GEGLU_TRACED_OPS"):
        traced.devices_from_env("cuda-only")
    assert traced.TRACED_OPS_DEVICES == traced.devices_from_env(os.environ.get("FUSED_GEGLU_TRACED_OPS"))
    leaves = [randn(6, 16, device=device, requires_grad=True),
              *(randn(*s, device=device, scale=0.3, requires_grad=True) for s in ((24, 16), (24, 16), (16, 24)))]
    seen, _, _ = _traced_ops(kernel, lambda *a: kernel.geglu_mlp(*a), leaves, randn(6, 16, device=device), False)
    want = ([{"geglu_mlp_train_fwd"}, {"geglu_mlp_gemm_bwd_keep"}] if device in traced.TRACED_OPS_DEVICES
            else [{"geglu_mlp_fwd_op"}, {"geglu_mlp_bwd_op"}])
    assert seen == want, seen


@pytest.mark.parametrize("shape", _PLANNED_SHAPES, ids=str)
def test_traced_inference_calls_the_planned_op(kernel, device, shape, traced_ops_on):
    """An inference forward traced with static sizes calls ``geglu_mlp_fwd_planned`` with the plan of
    an eager no-grad call (on the H200: cuBLAS + pointwise for the second shape, the CUTLASS gate+up
    GEMM for the third) and gives that call's bits; symbolic sizes keep the custom op. At decode sizes,
    where the plan under CUDA-graph capture differs, the custom op stays (it chooses per call)."""
    lead, h, i, dtype = shape
    os.environ.pop("FUSED_GEGLU_BACKEND", None)
    x = randn(*lead, h, device=device, dtype=dtype)
    wg, wu = (randn(i, h, device=device, dtype=dtype, scale=h**-0.5) for _ in range(2))
    wd = randn(h, i, device=device, dtype=dtype, scale=i**-0.5)
    bd = randn(h, device=device, dtype=dtype)

    def fn(x, wg, wu, wd, bd):
        return kernel.geglu_mlp(x, wg, wu, wd, None, None, bd, approximate="none")

    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    want = fn(x, wg, wu, wd, bd)
    for dynamic, op in ((False, "geglu_mlp_fwd_planned"), (True, "geglu_mlp_fwd_op")):
        seen = []

        def keep(gm, _):
            seen.append({str(n.target).split(".")[-2] for n in gm.graph.nodes if kernel.OPS_ID in str(n.target)})
            return make_boxed_func(gm)

        torch._dynamo.reset()
        got = torch.compile(fn, backend=aot_autograd(fw_compiler=keep), fullgraph=True, dynamic=dynamic)(
            x, wg, wu, wd, bd)
        assert seen == [{op}], f"dynamic={dynamic}: the graph calls {seen}, expected {op}"
        assert torch.equal(got, want), f"dynamic={dynamic}: y differs from the eager no-grad call's"
    torch._dynamo.reset()
    if device == "cuda":  # M = 16: the plan under capture is the Triton decode kernel's
        seen.clear()
        x16 = randn(16, h, device=device, dtype=dtype)
        torch.compile(fn, backend=aot_autograd(fw_compiler=keep), fullgraph=True)(x16, wg, wu, wd, bd)
        assert seen == [{"geglu_mlp_fwd_op"}], seen
        torch._dynamo.reset()


@pytest.mark.parametrize("case", ["strided_biases", "offset_biases", "no_intermediate"])
@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_traced_route_takes_what_eager_takes(kernel, device, case, train, traced_ops_on):
    """Operands eager ``geglu_mlp`` computes, the traced route computes too, with eager's values:
    biases sliced out of a packed [2I] vector (``b[::2]``, ``b[1::2]``), biases at an odd element offset
    (2-byte aligned in bf16: the sm90 epilogue reads 4-byte aligned vectors and copies the others),
    and an empty intermediate (I = 0: y is b_down). Until these were planned around, a compiled
    inference forward raised in ``geglu_mlp_fwd_planned`` where the eager call worked."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    m, h, i = (64, 64, 0) if case == "no_intermediate" else (64, 64, 128)
    packed = randn(2 * i + 1, device=device, dtype=dtype)
    bg, bu = ((packed[:-1:2], packed[1::2]) if case == "strided_biases" else
              (packed[1:i + 1], packed[i + 1:]))
    leaves = [randn(m, h, device=device, dtype=dtype), randn(i, h, device=device, dtype=dtype, scale=h**-0.5),
              randn(i, h, device=device, dtype=dtype, scale=h**-0.5),
              randn(h, i, device=device, dtype=dtype, scale=max(i, 1)**-0.5), bg, bu,
              randn(h, device=device, dtype=dtype)]
    if train:
        leaves = [t.detach().requires_grad_() for t in leaves]

    def fn(*a):
        return kernel.geglu_mlp(*a, approximate="tanh")

    with torch.set_grad_enabled(train):
        want = fn(*leaves)
        torch._dynamo.reset()
        got = torch.compile(fn, backend="aot_eager", fullgraph=True)(*leaves)
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if train:
        dy = randn(m, h, device=device, dtype=dtype)
        for a, b in zip(torch.autograd.grad(got, leaves, dy), torch.autograd.grad(want, leaves, dy)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_cuda_graph_capture(kernel):
    """The ops launch on the current stream with no host syncs, so they can be captured."""
    h, i, m = 256, 512, 16
    x = randn(m, h, device="cuda", dtype=torch.bfloat16)
    wg, wu = randn(i, h, device="cuda", dtype=torch.bfloat16), randn(i, h, device="cuda", dtype=torch.bfloat16)
    wd = randn(h, i, device="cuda", dtype=torch.bfloat16)
    for backend in kernel.available_backends("cuda"):
        fn = lambda: kernel.geglu_mlp(x, wg, wu, wd, backend=backend)  # noqa: E731
        expected = fn()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        x.copy_(randn(m, h, device="cuda", dtype=torch.bfloat16))
        expected = fn()
        g.replay()
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
