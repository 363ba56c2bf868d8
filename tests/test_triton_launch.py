"""``triton_kernels/launch.py``: repeat Triton launches through the compiled kernel's own launcher.

The launcher keeps a compiled kernel under a key of its own and reuses it for later calls with the same
key, so that key must separate every pair of arguments Triton would compile differently (a kernel built
for 16-byte aligned pointers, run on unaligned ones, faults or misreads). The first test checks that
against Triton's own specializer on CPU; the GPU tests check that what runs is what Triton's path runs.
"""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch
import torch.nn.functional as F


def _modules(kernel):
    pytest.importorskip("triton", reason="the kernel's Triton launcher needs triton")
    return (importlib.import_module(kernel.__name__ + ".triton_kernels.launch"),
            importlib.import_module(kernel.__name__ + ".triton_kernels.geglu"))


def test_spec_key_separates_what_triton_specializes_apart(kernel):
    pytest.importorskip("triton")
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:
        pytest.skip("this Triton has no native specializer to compare with (Triton < 3.4)")
    launch, _ = _modules(kernel)
    ints = [0, 1, 2, 15, 16, 17, 32, 48, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**32 + 3,
            2**63 - 16, 2**63, 2**63 + 16, 2**64 - 1]
    storage = {dt: torch.empty(64, dtype=dt) for dt in (torch.bfloat16, torch.float16, torch.float32, torch.int32)}
    tensors = [t[off:] for t in storage.values() for off in range(0, 9)]
    args = ints + tensors + [True, False, 1.5, None]

    def triton_spec(a):
        return native_specialize_impl(BaseBackend, a, False, True, True)

    for a, b in itertools.combinations(args, 2):
        if launch.spec_key(a) == launch.spec_key(b):
            assert triton_spec(a) == triton_spec(b), (a if not isinstance(a, torch.Tensor) else (a.dtype, a.data_ptr() % 16),
                                                      b if not isinstance(b, torch.Tensor) else (b.dtype, b.data_ptr() % 16))
    # and it does tell apart what matters most: alignment, dtype, int width
    assert launch.spec_key(tensors[0]) != launch.spec_key(tensors[1])
    assert launch.spec_key(2**31 - 16) != launch.spec_key(2**31)


def test_direct_launch_only_on_a_checked_triton(kernel):
    """A Triton outside the checked versions gets Triton's own path: its specialization or launcher
    arguments may differ from what FastKernel assumes, which would run a kept kernel wrongly, silently."""
    pytest.importorskip("triton")
    launch, _ = _modules(kernel)
    lo, hi = launch.CHECKED_TRITON
    assert lo <= (3, 6) and hi >= (3, 9)  # the GPU machine's Triton and the CPU machines'
    for version in ("3.6.0", "3.9.0", "3.7.1+git1234", "3.8.0rc1"):
        assert launch.triton_checked(version), version
    for version in ("3.5.1", "3.10.0", "4.0.0", "3.1", "dev", ""):
        assert not launch.triton_checked(version), version


class _FakeCompiled:
    """What Triton's path returns: the compiled kernel, whose ``run`` is its launcher."""

    function, packed_metadata = "function-handle", "metadata"

    def __init__(self):
        self.launches, self.refusing = [], False

    def run(self, *call):
        if self.refusing:  # a launcher that parses other arguments than these
            raise TypeError("function takes exactly 12 arguments")
        self.launches.append(call)


class _FakeJit:
    """A JIT function's launch syntax, counting the launches through Triton's path."""

    def __init__(self):
        self.compiled, self.calls = _FakeCompiled(), 0

    def __getitem__(self, grid):
        def launch(*args, num_warps):
            self.calls += 1
            return self.compiled
        return launch


def test_direct_launch_bookkeeping(kernel, monkeypatch):
    """FastKernel's own logic, without a GPU: Triton's path for a new key, the kept launcher (with the
    current stream, no launch metadata, no hooks) for a repeat, Triton's path again for another alignment
    or while a hook is installed."""
    launch, _ = _modules(kernel)
    fk = launch.FastKernel.__new__(launch.FastKernel)
    fake = _FakeJit()
    fk.fn, fk.fast, fk.const, fk.kept = fake, True, (False, False, False, True), {}

    class _Runtime:
        launch_enter_hook, launch_exit_hook = None, None

    class _Knobs:
        runtime = _Runtime

    monkeypatch.setattr(launch, "_knobs", _Knobs, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    storage = torch.empty(64, dtype=torch.float16)
    a, b, misaligned = storage[:16], storage[16:32], storage[1:17]
    fk((2,), (a, b, 16, 4), 4)
    assert fake.calls == 1 and not fake.compiled.launches
    fk((3, 1), (b, a, 32, 4), 4)  # same key (dtype, alignment, 16 | n, the constexpr): the kept launcher
    assert fake.calls == 1
    assert fake.compiled.launches == [(3, 1, 1, 1234, "function-handle", "metadata", None, None, None, b, a, 32, 4)]
    fk((2,), (misaligned, b, 16, 4), 4)  # another alignment: Triton's path
    fk((2,), (a, b, 16, 5), 4)  # another constexpr
    fk((2,), (a, b, 16, 4), 8)  # other warps
    assert fake.calls == 4 and len(fake.compiled.launches) == 1
    _Runtime.launch_enter_hook = print
    fk((2,), (a, b, 16, 4), 4)  # a hook is installed: Triton's path, which calls it
    assert fake.calls == 5
    _Runtime.launch_enter_hook = type("Chain", (), {"calls": []})()  # Triton >= 3.5's empty chain: no hook
    fk((2,), (a, b, 16, 4), 4)
    assert fake.calls == 5 and len(fake.compiled.launches) == 2

    fake.compiled.refusing = True  # a Triton whose launcher takes other arguments: its own path, from then on
    fk((2,), (a, b, 16, 4), 4)
    assert fake.calls == 6 and not fk.fast and not fk.kept
    fk((2,), (a, b, 16, 4), 4)
    assert fake.calls == 7


class _NoTritonPath:
    """Stands in for the JIT function: any launch through Triton's own path fails the test."""

    params = ()

    def __getitem__(self, grid):
        raise AssertionError("launched through Triton's path: the kept kernel was not reused")


def _fast_or_skip(kernel):
    launch, tk = _modules(kernel)
    if not launch.ENABLED or not tk._FWD_FLAT.fast:
        pytest.skip("the direct launch is off here (TRITON_INTERPRET, FUSED_GEGLU_TRITON_FAST_LAUNCH=0, or a Triton outside launch.CHECKED_TRITON)")
    return launch, tk


def _triton_path_out(tk, g, u, act):
    """The flat forward through ``kernel[grid](...)``, into a fresh buffer, with the launcher's plan."""
    m, n = g.shape
    grid, (block, even, int64), warps = tk._plan("geglu_fwd_flat", g.device, g.dtype, m, n)
    out = torch.empty_like(g)
    tk._geglu_fwd_flat_kernel[grid](out, g, u, m * n, ACT=act, BLOCK=block, EVEN=even, INT64=int64, num_warps=warps)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_direct_launch_reuses_only_a_kernel_triton_would_pick(kernel, dtype, monkeypatch):
    launch, tk = _fast_or_skip(kernel)
    fk = tk._FWD_FLAT
    dev = torch.device("cuda")
    n_even, n_odd = 3 * 4096, 3 * 4096 + 5  # a whole number of blocks (the maskless branch), and not
    for numel, off in [(n_even, 0), (n_even, 1), (n_even, 8), (n_odd, 0), (n_odd, 3)]:
        gs, us = (torch.randn(numel + 16, device=dev, dtype=dtype) for _ in range(2))
        g, u = gs[off:off + numel].view(1, numel), us[off:off + numel].view(1, numel)
        outs = torch.empty(numel + 16, device=dev, dtype=dtype)
        out = outs[off:off + numel].view(1, numel)  # unaligned together with the inputs where off is odd
        tk.geglu_fwd(out, g, u, "tanh")  # the first call with this key: Triton's path, which compiles
        first = out.clone()
        out.zero_()
        with monkeypatch.context() as mp:
            mp.setattr(fk, "fn", _NoTritonPath())
            tk.geglu_fwd(out, g, u, "tanh")  # the same key: must be the kept kernel
        torch.testing.assert_close(out, first, rtol=0, atol=0)
        torch.testing.assert_close(out, _triton_path_out(tk, g, u, 2), rtol=0, atol=0)
        ref = (F.gelu(g.double(), approximate="tanh") * u.double()).to(dtype)
        torch.testing.assert_close(out, ref, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-2 if dtype != torch.float32 else 1e-5)


def _kept(tk, shape, dtype, approximate):
    """(gate, up, out) on the GPU, after one forward that compiled and kept the flat kernel for them."""
    g, u = (torch.randn(*shape, device="cuda", dtype=dtype) for _ in range(2))
    out = torch.empty_like(g)
    tk.geglu_fwd(out, g, u, approximate)
    return g, u, out


@pytest.mark.gpu
def test_direct_launch_goes_to_the_current_stream_and_into_a_cuda_graph(kernel):
    _, tk = _fast_or_skip(kernel)
    g, u, out = _kept(tk, (64, 1000), torch.bfloat16, "none")
    ref = _triton_path_out(tk, g, u, 1)
    # The kept launcher must launch on the current stream: under capture a launch on another stream (the
    # legacy default one) would be an error, or run outside the graph.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tk.geglu_fwd(out, g, u, "none")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        tk.geglu_fwd(out, g, u, "none")
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.gpu
def test_a_launch_hook_gets_tritons_own_path(kernel):
    _, tk = _fast_or_skip(kernel)
    from triton import knobs

    g, u, out = _kept(tk, (8, 512), torch.float16, "tanh")
    seen = []
    chain = knobs.runtime.launch_enter_hook
    for install in ("add", "assign"):  # Triton >= 3.5 chains hooks (add/remove); a plain function replaces the slot
        if install == "add" and not hasattr(chain, "add"):
            continue
        seen.clear()
        if install == "add":
            chain.add(seen.append)
        else:
            knobs.runtime.launch_enter_hook = seen.append
        try:
            tk.geglu_fwd(out, g, u, "tanh")  # a profiler's hook must see the launch
        finally:
            if install == "add":
                chain.remove(seen.append)
            else:
                knobs.runtime.launch_enter_hook = chain
        torch.cuda.synchronize()
        assert len(seen) == 1, install
