"""GeGLU pointwise ops (separate and packed forms), every backend of the loaded variant."""

from __future__ import annotations

import importlib
import os

import pytest
import torch
import torch.nn.functional as F
from _numerics import assert_close, errors, randn

BACKENDS = ["cuda", "triton", "cpu", "torch"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Contiguous operands take the Triton backend's flat kernels: (64, 1001) and (8, 2048) fill whole
# blocks under the interpreter's 64-element blocks and (8, 2048) also the GPU's 1024-4096 (the
# maskless branch); the others end in a partial block.
SHAPES = [(1, 1), (7, 33), (3, 5, 17), (64, 1001), (8, 2048)]


def _skip_unless(kernel, device, backend, dtype=None, dot=True):
    """Skip where ``backend`` cannot run here. ``dot``: the path runs a Triton ``tl.dot`` (the GEMMs),
    which Triton's CPU interpreter mis-computes in bf16; the pointwise kernels (``dot=False``) run there."""
    avail = kernel.available_backends(device)
    if backend not in avail:
        pytest.skip(f"backend {backend!r} is not in this variant for {device} (available: {avail})")
    if dot and backend == "triton" and device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's CPU interpreter mis-computes bf16 tl.dot; bf16 Triton GEMMs run on the GPU")


def _eager(gate, up, approximate):
    return F.gelu(gate, approximate=approximate) * up


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_geglu_forward_backward(kernel, device, backend, dtype, approximate, shape):
    _skip_unless(kernel, device, backend, dtype, dot=False)
    if backend == "triton" and device == "cpu" and len(shape) == 2:
        shape = (min(shape[0], 8), shape[1])  # the interpreter is slow: fewer rows, same odd width
    gate = randn(*shape, dtype=dtype, device=device, scale=2.0, requires_grad=True)
    up = randn(*shape, dtype=dtype, device=device, requires_grad=True)
    out = kernel.geglu(gate, up, approximate=approximate, backend=backend)
    assert kernel.last_backend("geglu") == backend
    ref = kernel.reference.geglu_ref(gate.detach(), up.detach(), approximate)
    eager = _eager(gate, up, approximate)
    assert out.dtype == dtype and out.shape == gate.shape
    assert_close(out, ref, eager, "geglu")

    grad = randn(*shape, dtype=dtype, device=device)
    dgate, dup = torch.autograd.grad(out, (gate, up), grad)
    g64, u64 = gate.detach().double().requires_grad_(), up.detach().double().requires_grad_()
    ref_dg, ref_du = torch.autograd.grad(kernel.reference.geglu_ref(g64, u64, approximate), (g64, u64), grad.double())
    e_dg, e_du = torch.autograd.grad(eager, (gate, up), grad)
    # d gate = grad * up * gelu'(gate), and gelu' crosses 0 at gate = -0.75, where it is a difference of
    # two terms near 0.23: its error is measured against grad * up as well (as test_linear's are against
    # the gradient without the activation). A one-element draw there failed about 1 run in 200, ours
    # and eager's errors both a few ulp of those terms (_numerics.errors).
    assert_close(dgate, ref_dg, e_dg, "d gate", scale_ref=grad.double() * u64.detach())
    assert_close(dup, ref_du, e_du, "d up")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_packed_out_form_matches_kernels_community_api(kernel, device, backend, dtype, approximate):
    """gelu_and_mul(out, x) / gelu_tanh_and_mul(out, x): x = [..., 2d], gate first, fills out."""
    _skip_unless(kernel, device, backend, dtype, dot=False)
    x = randn(4, 3, 2 * 37, dtype=dtype, device=device, scale=2.0)
    out = torch.full((4, 3, 37), float("nan"), dtype=dtype, device=device)  # sentinel: all must be written
    fn = kernel.gelu_and_mul if approximate == "none" else kernel.gelu_tanh_and_mul
    ret = fn(out, x, backend=backend)
    assert ret is out
    assert kernel.last_backend("gelu_and_mul") == backend
    ref = kernel.reference.geglu_packed_ref(x, approximate)
    assert_close(out, ref, _eager(x[..., :37], x[..., 37:], approximate), "gelu_and_mul")
    # The functional packed form records under the same name, strided x (the op path) included.
    padded = torch.cat([x, x[..., :5]], -1)[..., : 2 * 37]
    kernel.geglu_packed(padded, approximate, backend=backend)
    assert kernel.last_backend("gelu_and_mul") == backend


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_packed_backward_through_out_and_functional(kernel, device, backend, dtype):
    _skip_unless(kernel, device, backend, dtype, dot=False)
    x = randn(9, 2 * 21, dtype=dtype, device=device, scale=2.0, requires_grad=True)
    grad = randn(9, 21, dtype=dtype, device=device)
    x64 = x.detach().double().requires_grad_()
    (ref_dx,) = torch.autograd.grad(kernel.reference.geglu_packed_ref(x64, "tanh"), x64, grad.double())
    (eager_dx,) = torch.autograd.grad(_eager(x[:, :21], x[:, 21:], "tanh"), x, grad)

    (dx,) = torch.autograd.grad(kernel.geglu_packed(x, "tanh", backend=backend), x, grad)
    assert_close(dx, ref_dx, eager_dx, "geglu_packed dx")

    out = torch.empty(9, 21, dtype=dtype, device=device)
    kernel.gelu_tanh_and_mul(out, x, backend=backend)
    (dx_out,) = torch.autograd.grad(out, x, grad)
    assert_close(dx_out, ref_dx, eager_dx, "gelu_tanh_and_mul(out, x) dx")


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs(kernel, device, backend):
    _skip_unless(kernel, device, backend)
    base = randn(6, 10, 2 * 13, device=device, scale=2.0)
    cases = {
        "strided rows x[::2]": (base[::2, :, :13], base[::2, :, 13:]),
        "transposed": (base[..., :13].transpose(0, 1), base[..., 13:].transpose(0, 1)),
        "last-dim stride 2": (base[..., ::2], base[..., 1::2]),
    }
    for name, (gate, up) in cases.items():
        out = kernel.geglu(gate, up, approximate="none", backend=backend)
        ref = kernel.reference.geglu_ref(gate, up, "none")
        assert_close(out, ref, _eager(gate, up, "none"), name)


def test_empty_and_single_row(kernel, device):
    gate = randn(0, 8, device=device)
    assert kernel.geglu(gate, gate.clone()).shape == (0, 8)
    out = torch.empty(0, 4, device=device)
    kernel.gelu_and_mul(out, randn(0, 8, device=device))


def test_bad_input_errors_name_the_argument(kernel, device):
    g = randn(4, 6, device=device)
    with pytest.raises(TypeError, match="up has dtype torch.float16"):
        kernel.geglu(g, g.half())
    with pytest.raises(TypeError, match="gate must be float32, float16 or bfloat16"):
        kernel.geglu(g.int(), g.int())
    with pytest.raises(TypeError, match="up must be a torch.Tensor"):
        kernel.geglu(g, [1.0])
    with pytest.raises(ValueError, match="up is on meta"):
        kernel.geglu(g, torch.empty(4, 6, device="meta"))
    with pytest.raises(ValueError, match=r"same shape, got \(4, 6\) and \(4, 5\)"):
        kernel.geglu(g, randn(4, 5, device=device))
    with pytest.raises(ValueError, match="approximate must be"):
        kernel.geglu(g, g, approximate="erf")
    with pytest.raises(ValueError, match="even last dimension"):
        kernel.gelu_and_mul(torch.empty(4, 3, device=device), randn(4, 7, device=device))
    with pytest.raises(ValueError, match=r"out must have shape \(4, 3\)"):
        kernel.gelu_and_mul(torch.empty(4, 4, device=device), g)
    with pytest.raises(TypeError, match="out has dtype"):
        kernel.gelu_and_mul(torch.empty(4, 3, device=device, dtype=torch.float16), g)
    with pytest.raises(ValueError, match="out must be contiguous"):
        kernel.gelu_and_mul(torch.empty(3, 4, device=device).t(), g)
    with pytest.raises(ValueError, match="backend must be one of"):
        kernel.geglu(g, g, backend="tpu")
    with pytest.raises(ValueError, match=r"backend must be one of .* got \['cpu'\]"):
        kernel.geglu(g, g, backend=["cpu"])
    packed = randn(4, 12, device=device)
    for backend in kernel.available_backends(device):  # out is x's first 24 elements: partly read after written
        with pytest.raises(ValueError, match="out shares memory with x"):
            kernel.gelu_and_mul(packed.view(-1)[:24].view(4, 6), packed, backend=backend)
        with pytest.raises(ValueError, match="out shares memory with x"):  # a strided x: the op path
            kernel.gelu_and_mul(packed.view(-1)[:12].view(2, 6), packed[::2], backend=backend)
    with pytest.raises(ValueError, match="out shares memory with x"):
        kernel.gelu_and_mul(packed[:1, :6], packed[:1])  # one row: out is x's gate half
    with pytest.raises(ValueError, match="out is a leaf tensor that requires grad"):
        kernel.gelu_and_mul(torch.zeros(4, 6, device=device, requires_grad=True), packed)


def test_compiled_ops_name_a_bad_operand(kernel, device, compiled):
    """The compiled pointwise ops' own checks (torch-ext/geglu_checks.h, one rule set for the CPU and
    CUDA kernels): a direct call of the registered op that skips the Python layer gets an error naming
    the operand and what was expected, and nothing is written."""
    ops = getattr(torch.ops, kernel.OPS_ID)
    gate, up = randn(6, 40, device=device), randn(6, 40, device=device)
    out = torch.full((6, 40), float("nan"), device=device)
    wide = randn(6, 80, device=device)
    bad_up = [
        (up.half(), "geglu_fwd: up must have gate's dtype"),
        (up[:, :-1], "geglu_fwd: up must have gate's shape"),
        (up[None], "geglu_fwd: up must be 2-D"),
        (wide[:, ::2], "geglu_fwd: up must have last-dim stride 1"),
        (wide.as_strided((6, 40), (20, 1)), "geglu_fwd: up must have row stride >= cols"),
    ]
    if device == "cuda":  # the CUDA kernel is dispatched to (a CUDA tensor is among the operands)
        bad_up.append((up.cpu(), "geglu_fwd: up must be on gate's device"))
    for bad, message in bad_up:
        with pytest.raises(RuntimeError, match=message):
            ops.geglu_fwd(out, gate, bad, 0)
    with pytest.raises(RuntimeError, match=r"geglu_fwd: approximate must be 0 \(erf\) or 1 \(tanh\), got 2"):
        ops.geglu_fwd(out, gate, up, 2)
    with pytest.raises(RuntimeError, match="geglu_fwd: dtype must be float32, float16 or bfloat16"):
        ops.geglu_fwd(out.double(), gate.double(), up.double(), 0)
    assert out.isnan().all(), "a refused call wrote to out"
    grad_gate, grad_up = torch.full_like(out, float("nan")), torch.full_like(out, float("nan"))
    with pytest.raises(RuntimeError, match="geglu_bwd: grad_up must have gate's dtype"):
        ops.geglu_bwd(grad_gate, grad_up.half(), randn(6, 40, device=device), gate, up, 1)
    with pytest.raises(RuntimeError, match="geglu_bwd: grad_out must have gate's shape"):
        ops.geglu_bwd(grad_gate, grad_up, randn(6, 41, device=device), gate, up, 1)
    assert grad_gate.isnan().all() and grad_up.isnan().all(), "a refused call wrote a gradient"


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_overlap_are_computed(kernel, device, backend):
    """Operands whose rows overlap in memory (a broadcast ``g.expand(M, n)``: row stride 0, also over
    the leading dims of an N-D operand; an ``as_strided`` view with row stride below its width) are
    valid inputs: computed as eager computes them, not refused by a kernel's row-stride check."""
    _skip_unless(kernel, device, backend)
    for lead in ((5,), (2, 3)):
        one_row = randn(8, device=device).expand(*lead, 8)
        overlapping = randn(40, device=device).as_strided((*lead, 8), (4 * lead[-1], 4, 1)[-len(lead) - 1:])
        up = randn(*lead, 8, device=device)
        for name, gate in ((f"broadcast {lead}", one_row), (f"overlapping {lead}", overlapping)):
            ref = kernel.reference.geglu_ref(gate, up, "tanh")
            assert_close(kernel.geglu(gate, up, approximate="tanh", backend=backend), ref, _eager(gate, up, "tanh"),
                         name)
        packed = randn(16, device=device).expand(*lead, 16)
        ref = kernel.reference.geglu_packed_ref(packed, "none")
        eager = _eager(packed[..., :8], packed[..., 8:], "none")
        assert_close(kernel.geglu_packed(packed, backend=backend), ref, eager, f"packed broadcast {lead}")
        out = torch.empty(*lead, 8, device=device)
        assert_close(kernel.gelu_and_mul(out, packed, backend=backend), ref, eager, f"gelu_and_mul broadcast {lead}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_and_mul_with_no_features(kernel, device, backend):
    """x [..., 0] (d = 0): an empty out on every backend (a view of it as [-1, 0] raised once)."""
    _skip_unless(kernel, device, backend)
    out = torch.empty(4, 0, device=device)
    assert kernel.gelu_and_mul(out, torch.empty(4, 0, device=device), backend=backend) is out


def test_gelu_and_mul_write_is_seen_by_autograd(kernel, device):
    """gelu_and_mul writes out's memory in place, as ATen's out= ops do, and bumps out's version as
    they do: a graph that saved out before the write refuses its backward instead of computing
    gradients from the overwritten values (it used the new values once, silently)."""
    w = randn(4, 6, device=device, requires_grad=True)
    out = randn(4, 6, device=device)
    y = (w * out).sum()  # saves out for dw
    kernel.gelu_and_mul(out, randn(4, 12, device=device))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    a = randn(4, 6, device=device, requires_grad=True)
    out = a * 2  # out has a history: the write is recorded (a copy), as out.copy_ would be
    z = (out * out).sum()
    kernel.gelu_and_mul(out, randn(4, 12, device=device))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_unavailable_backend_is_refused(kernel, device):
    missing = [b for b in BACKENDS if b not in kernel.available_backends(device)]
    if not missing:
        pytest.skip("every backend is available here")
    g = randn(4, 6, device=device)
    with pytest.raises(ValueError, match=f"backend {missing[0]!r} cannot run geglu"):
        kernel.geglu(g, g, backend=missing[0])


def test_auto_on_cpu_tensors_never_picks_the_triton_interpreter(kernel):
    """On CPU tensors ``auto`` runs the compiled CPU kernels, or ATen in a variant without them (torch-cpu,
    the CUDA variants), even where TRITON_INTERPRET=1 makes Triton available there (the tests set it):
    the interpreter is a debugging aid, run only when asked for by name. Until 2026-12-05 a variant
    without compiled CPU kernels fell through to it, in geglu and in linear (garbage in bf16)."""
    want = "cpu" if "cpu" in kernel.available_backends(torch.device("cpu")) else "torch"
    g, u = randn(5, 24), randn(5, 24)
    kernel.geglu(g, u)
    assert kernel.last_backend("geglu") == want
    kernel.gelu_and_mul(torch.empty_like(g), torch.cat([g, u], -1))
    assert kernel.last_backend("gelu_and_mul") == want


def test_env_var_forces_backend(kernel, device, monkeypatch):
    g = randn(4, 6, device=device)
    monkeypatch.setenv("FUSED_GEGLU_BACKEND", "torch")
    kernel.geglu(g, g)
    assert kernel.last_backend("geglu") == "torch"


@pytest.mark.parametrize("backend", ["cuda", "triton", "torch"])
@pytest.mark.parametrize("shape", [(7, 33), (64, 1001), (8, 2048)], ids=str)
def test_forward_may_write_over_gate(kernel, device, backend, shape):
    """The inference MLP writes h over gate on these backends (mlp._H_OVER_GATE): the forward
    pointwise with out aliasing gate must give what it gives into a separate buffer, bit for bit."""
    _skip_unless(kernel, device, backend, torch.float32)
    geglu_impl = importlib.import_module(kernel.__name__ + ".geglu")
    assert backend in importlib.import_module(kernel.__name__ + ".mlp")._H_OVER_GATE
    gate, up = randn(*shape, device=device), randn(*shape, device=device)
    separate = torch.empty_like(gate)
    geglu_impl._fwd_into(separate, gate, up, "tanh", backend)
    geglu_impl._fwd_into(gate, gate, up, "tanh", backend)
    assert torch.equal(gate, separate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_torch_backend_row_blocks_match_one_pass(kernel, monkeypatch, dtype, approximate):
    """On CPU tensors the torch backend splits a large call into row blocks (geglu._by_row_blocks: its
    fp32 intermediates then stay in cache instead of being page-faulted in per call). Every form runs
    blocked (separate and packed, forward and backward, the MLP's forward and in-place backward) and
    gives what one unblocked pass gives: within 4 rounding steps of the dtype at the largest value,
    since in fp32 ATen's vector loops hand the last elements of a block to their scalar forms (a
    last-bit difference, as at ATen's own thread splits); and the pointwise results stay within
    eager's error of float64. The row counts
    leave a partial last block, and the packed halves are strided rows."""
    impl = importlib.import_module(kernel.__name__ + ".geglu")
    blocks = []
    whole_fwd, whole_bwd, whole_h = impl._torch_fwd, impl._torch_bwd, impl._torch_bwd_h_block

    def counted(fn):
        return lambda *a: (blocks.append(a[0].shape[0]), fn(*a))[1]

    # A smaller block than the shipped one keeps the operands small: 301 x 1000 elements is more than
    # twice 2^17, so the rows go in blocks of 131, 131 and 39.
    monkeypatch.setattr(impl, "_CPU_BLOCK", 1 << 17)
    m, d, h = 301, 1000, 48
    gen = torch.Generator().manual_seed(3)
    gate = randn(m, d, dtype=dtype, scale=2.0, gen=gen)
    up, grad = randn(m, d, dtype=dtype, gen=gen), randn(m, d, dtype=dtype, gen=gen)
    x = randn(m, h, dtype=dtype, gen=gen)
    params = [randn(*s, dtype=dtype, scale=n**-0.5, gen=gen) for s, n in (((d, h), h), ((d, h), h), ((h, d), d))]

    def run():
        g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
        y = kernel.geglu(g, u, approximate=approximate, backend="torch")
        y.backward(grad)
        p = torch.cat([gate, up], dim=-1).requires_grad_()
        yp = kernel.geglu_packed(p, approximate=approximate, backend="torch")
        yp.backward(grad)
        xs = x.clone().requires_grad_()
        ws = [w.clone().requires_grad_() for w in params]
        ym = kernel.geglu_mlp(xs, *ws, approximate=approximate, backend="torch")
        ym.backward(randn(m, h, dtype=dtype, gen=torch.Generator().manual_seed(4)))
        return [y, g.grad, u.grad, yp, p.grad, ym, xs.grad, *(w.grad for w in ws)]

    monkeypatch.setattr(impl, "_torch_fwd", counted(whole_fwd))
    monkeypatch.setattr(impl, "_torch_bwd", counted(whole_bwd))
    monkeypatch.setattr(impl, "_torch_bwd_h_block", counted(whole_h))
    blocked = run()
    # six calls of three blocks each: separate and packed forward and backward, the MLP's forward
    # and in-place backward
    assert blocks == [131, 131, 39] * 6, blocks
    monkeypatch.setattr(impl, "_CPU_BLOCK", 1 << 40)
    blocks.clear()
    whole = run()
    assert blocks == [m] * 6, blocks
    names = ["y", "d gate", "d up", "packed y", "packed dx", "mlp y", "mlp dx", "mlp dW_gate", "mlp dW_up",
             "mlp dW_down"]
    for name, a, b in zip(names, blocked, whole):
        diff, top = (a.detach().double() - b.detach().double()).abs().max(), b.detach().double().abs().max()
        assert diff <= 4 * torch.finfo(dtype).eps * top, f"{name}: {diff} from one pass (largest |value| {top})"
    g64, u64 = gate.double().requires_grad_(), up.double().requires_grad_()
    ref = kernel.reference.geglu_ref(g64, u64, approximate)
    ref_dg, ref_du = torch.autograd.grad(ref, (g64, u64), grad.double())
    g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
    eager = _eager(g, u, approximate)
    e_dg, e_du = torch.autograd.grad(eager, (g, u), grad)
    assert_close(blocked[0], ref, eager, "geglu, row blocks")
    assert_close(blocked[1], ref_dg, e_dg, "d gate, row blocks", scale_ref=grad.double() * up.double())
    assert_close(blocked[2], ref_du, e_du, "d up, row blocks")


@pytest.mark.parametrize("backend", ["cpu", "triton", "cuda"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_pointwise_kernels_round_once_from_fp32(kernel, device, backend, dtype, approximate):
    """The compiled pointwise kernels (C++ on CPU, Triton, CUDA) compute in fp32 and round each result
    once, to nearest even: in bf16/fp16 nearly every element (here at least 99.5 %) is the float64
    reference rounded to the dtype, and none is more than one ulp away; in fp32 the error is a few ulp.
    Rows of 8192 + 37 columns: a length no vector width or block divides, so every remainder runs. The
    tolerance tests elsewhere (2x eager's error) let a kernel pass that rounds gelu(gate) before the
    product, as eager does (1.00x eager's error), or that truncates, or has a constant off in its 6th
    digit."""
    _skip_unless(kernel, device, backend, dtype, dot=False)
    if backend == "triton" and device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter converts fp32 to bf16 by truncation; bf16 rounding runs on the GPU")
    g = torch.Generator().manual_seed(11)
    rows = 2 if backend == "triton" and device == "cpu" else 6  # the interpreter is slow
    gate, up, dy = (randn(rows, 8192 + 37, gen=g, scale=s).to(device=device, dtype=dtype) for s in (2.0, 1.0, 1.0))
    gate.requires_grad_()
    up.requires_grad_()
    out = kernel.geglu(gate, up, approximate, backend=backend)
    outs = (out, *torch.autograd.grad(out, (gate, up), dy))
    g64, u64 = (t.detach().double().requires_grad_() for t in (gate, up))
    ref = kernel.reference.geglu_ref(g64, u64, approximate)
    refs = (ref, *torch.autograd.grad(ref, (g64, u64), dy.double()))
    packed = torch.cat([gate.detach(), up.detach()], -1)
    outs += (kernel.geglu_packed(packed, approximate, backend=backend),)
    refs += (ref,)
    for name, o, r in zip(("h", "dgate", "dup", "packed h"), outs, refs):
        o, r = o.detach().cpu(), r.detach().cpu()
        if dtype == torch.float32:
            rel, mx = errors(o, r)
            assert rel <= 2e-7 and mx <= 5e-7, f"{name}: rel {rel:.3g}, max {mx:.3g} (fp32: a few ulp)"
            continue
        rounded = r.to(dtype)
        # One ulp of each element, where it is not tiny next to the largest: GELU of a very negative
        # gate is x * Phi(x) with Phi's 1 + erf cancelling in fp32 (eager's too), which is no rounding.
        # Only the CPU kernel computes Phi's tail without that cancellation, so elsewhere the share of
        # exactly rounded elements is taken over the same elements.
        big = r.abs() >= 1e-3 * r.abs().max()
        counted = big if backend != "cpu" else torch.ones_like(big)
        exact = (o == rounded)[counted].double().mean().item()
        ulp = rounded.double().abs()[big] * torch.finfo(dtype).eps
        worst = ((o.double() - rounded.double()).abs()[big] / ulp).max().item()
        assert exact >= 0.995 and worst <= 1.0, f"{name}: {exact:.4f} exact, worst {worst:.2f} ulp"


def test_cpu_exact_gelu_is_accurate_in_the_tails(kernel, device):
    """The CPU kernel's exact GELU and its derivative, fp32, over [-13, 13] against float64 (Phi from erfc,
    so the reference has no cancellation either): within 6 eps of each value (the derivative's error taken
    against |Phi(x)| + |x phi(x)|, as it is a difference near x = -0.75). Torch's own fp32 GELU computes
    0.5 * (1 + erf(x / sqrt 2)): 2e-4 relative error in [-3, -1], up to 27 % in [-5, -3], mostly 0 below -5.4; the
    kernel's tail form keeps relative accuracy down to x = -13 (gelu(-13) = -8e-38). The SSE2 baseline path
    has no FMA to recover the rounding of x^2 / 2 inside exp, so its bound grows by x^2 / 2 eps."""
    if device != "cpu" or "cpu" not in kernel.available_backends("cpu"):
        pytest.skip("the compiled CPU backend's exact GELU")
    x = torch.linspace(-13, 13, 200_001)
    gate = x.clone().requires_grad_()
    y = kernel.geglu(gate[None], torch.ones_like(x)[None], "none", backend="cpu")[0]
    (dgelu,) = torch.autograd.grad(y, gate, torch.ones_like(y))
    xd = x.double()
    cdf = 0.5 * torch.special.erfc(-xd / 2**0.5)
    x_pdf = xd * torch.exp(-0.5 * xd * xd) / (2 * torch.pi) ** 0.5
    eps = torch.finfo(torch.float32).eps
    baseline = os.environ.get("FUSED_GEGLU_CPU_ISA") == "baseline" or not {"avx2", "fma"} <= _cpu_flags()
    bound = 6.0 + (0.5 * xd * xd if baseline else 0.0)
    ref = xd * cdf
    keep = ref.abs() > 1e-36  # below, fp32 results are denormal and carry absolute, not relative, error
    err_y = ((y.double() - ref).abs() / ref.abs().clamp_min(1e-300) / eps)[keep]
    err_d = (dgelu.double() - (cdf + x_pdf)).abs() / (cdf + x_pdf.abs()) / eps
    for name, err, b, xs in (("gelu", err_y, bound[keep] if baseline else bound, x[keep]),
                             ("gelu'", err_d, bound, x)):
        worst = (err / b).argmax()
        assert (err <= b).all(), f"{name}: {err[worst].item():.1f} eps at x = {xs[worst].item():.4f}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_cpu_gelus_reach_their_limits(kernel, device, dtype, approximate):
    """For large |x| and at +-inf the CPU kernels give GELU's limits: gelu = x and gelu' = 1 above, gelu
    and gelu' ~0 below, NaN for NaN. (A clamped exp inside the tanh form once made gelu(-3e38) = -1.8
    and gelu'(1e30) = inf; the exact form gave NaN at -inf.)"""
    if device != "cpu" or "cpu" not in kernel.available_backends("cpu"):
        pytest.skip("the compiled CPU backend")
    big = torch.finfo(dtype).max
    pos = torch.tensor([20.0, 1e4, big, float("inf")]).to(dtype)
    gate = torch.cat([pos, -pos, torch.tensor([float("nan")], dtype=dtype)]).requires_grad_()
    out = kernel.geglu(gate[None], torch.ones_like(gate)[None], approximate, backend="cpu")[0]
    (grad,) = torch.autograd.grad(out, gate, torch.ones_like(out))
    n = len(pos)
    assert torch.equal(out[:n], pos) and torch.equal(grad[:n], torch.ones_like(pos)), (out, grad)
    assert out[n:2 * n].float().abs().max() <= 1e-30 and grad[n:2 * n].float().abs().max() <= 1e-30, (out, grad)
    assert out[-1].isnan() and grad[-1].isnan()


def test_cpu_kernels_run_on_torchs_threads(kernel, device):
    """The CPU kernels split their work over torch's intra-op threads. at::parallel_for compiled into a
    .so built without -fopenmp is a serial loop (its OpenMP body is a header template), so the kernels
    ran on one thread until they went through TensorIterator::for_each, which runs inside libtorch_cpu.
    Counted from /proc/self/task: during the calls, at least two threads each do a fifth of the CPU work."""
    if device != "cpu" or "cpu" not in kernel.available_backends("cpu"):
        pytest.skip("the compiled CPU backend")
    if not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2:
        pytest.skip("needs Linux's /proc and at least two CPUs")

    def cpu_ticks() -> dict[str, int]:
        ticks = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks[tid] = int(fields[11]) + int(fields[12])  # utime + stime
        return ticks

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gate, up, dy = randn(2048, 4096, requires_grad=True), randn(2048, 4096), randn(2048, 4096)

        def step(approximate):  # the forward and backward kernels and nothing else that computes
            torch.autograd.grad(kernel.geglu(gate, up, approximate, backend="cpu"), gate, dy)

        for approximate in ("none", "tanh"):
            step(approximate)  # torch's threads exist from here
            before = cpu_ticks()
            for _ in range(12):
                step(approximate)
            after = cpu_ticks()
            used = sorted((after[t] - before.get(t, 0) for t in after), reverse=True)
            assert len(used) >= 2 and used[1] >= 0.2 * sum(used), f"{approximate}: CPU ticks per thread {used}"
    finally:
        torch.set_num_threads(threads)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512", "sse4"])
def test_cpu_kernel_code_paths_round_once(kernel, device, compiled, repo_root, isa):
    """Each code path of the CPU kernels ($FUSED_GEGLU_CPU_ISA forces one; it is read once per process,
    so each runs in a process of its own): the rounding and exact-GELU tail tests above, on the SSE2
    baseline, the AVX2+FMA clone and the AVX-512 clone. A machine runs only the fastest it has otherwise.
    A value that names no path is refused by name."""
    import subprocess
    import sys

    need = {"baseline": set(), "avx2": {"avx2", "fma"}, "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
            "sse4": set()}[isa]
    if device != "cpu" or not need <= _cpu_flags():
        pytest.skip(f"{isa}: a CPU test on a CPU with {sorted(need)}")
    env = {**os.environ, "FUSED_GEGLU_CPU_ISA": isa}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           "tests/test_geglu.py", "-k",
                           "(test_pointwise_kernels_round_once_from_fp32 and cpu) or test_cpu_exact_gelu_is_accurate"],
                          cwd=repo_root, env=env, capture_output=True, text=True, timeout=600)
    if isa == "sse4":
        assert proc.returncode != 0 and "FUSED_GEGLU_CPU_ISA must be auto, baseline, avx2 or avx512" in proc.stdout
        return
    assert proc.returncode == 0 and "7 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
