"""Repeat launches of a compiled Triton kernel without Triton's Python launcher.

``kernel[grid](*args)`` spends most of its host time before the launch: binding the arguments,
computing their specialization, building the cache key, reading the device, the stream and the
option knobs, and (Triton >= 3.5) building launch metadata for an empty hook chain. On an H100 host
(Triton 3.6) that path took 12.7 µs per launch of the flat GeGLU kernel where the compiled kernel's
own launcher took 5.1 (``benchmarks/results/triton-launch-h100-1baf024.json``); on a faster host
9.8 against 4.2, and this class's launch 6.3 (``triton-launch-h100-f9bebc9.json``). In the noarch
``torch-cuda`` build, which has no compiled entries, an eager call waits on exactly that.

:class:`FastKernel` launches through Triton's normal path the first time it sees a specialization,
keeps the compiled kernel Triton returns, and calls that kernel's launcher directly afterwards. The
key it files the kernel under is at least as fine as Triton's own specialization
(:func:`spec_key`; ``tests/test_triton_launch.py`` checks that against Triton's specializer), so a
kept kernel is only ever reused for arguments Triton would have given the same kernel. Triton's path
runs instead while a launch hook is installed (``knobs.runtime.launch_enter_hook``: profilers), under
``TRITON_INTERPRET=1``, with ``$FUSED_GEGLU_TRITON_FAST_LAUNCH=0`` (read at import), and on a Triton outside
the versions whose specialization and launcher arguments were checked (``CHECKED_TRITON``): a newer Triton
that specialized on something more, or took its launcher's arguments in another order, would otherwise
get a kept kernel run with arguments it was not compiled for, with no error. Options changed
through Triton's knobs after a kernel's first launch (debug, instrumentation) do not reach the kernels
already kept.
"""

from __future__ import annotations

import os

import torch
from triton.runtime.jit import JITFunction

_I32_MIN, _I32_END, _U64_MIN = -(1 << 31), 1 << 31, 1 << 63
# (major, minor) of the Tritons whose specializer spec_key was compared with (tests/test_triton_launch.py:
# 3.9 on CPU; 3.6 on the GPU machine, whose GPU tests also check the kept kernel's results) and whose
# launcher takes (grid x3, stream, function, packed metadata, launch metadata, enter hook, exit hook,
# *args): 3.6 on the GPU, 3.9 read in its source (backends/nvidia/driver.py). 3.7 and 3.8 lie between
# two checked ends of an unchanged interface.
CHECKED_TRITON = ((3, 6), (3, 9))


def spec_key(a) -> tuple:
    """What a launch of a non-constexpr argument ``a`` is filed under. Triton (3.6-3.9) specializes a
    tensor on its dtype and on whether its address is a multiple of 16, and an int on whether it is 1,
    whether it is a multiple of 16, and its width (i32, i64, u64); anything else is keyed by type and
    value, which is finer than Triton's."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if type(a) is int:
        return (a == 1, a % 16 == 0, _I32_MIN <= a < _I32_END, a >= _U64_MIN)
    return (type(a), a)


def triton_checked(version: str) -> bool:
    """Whether a Triton of this ``__version__`` is within ``CHECKED_TRITON`` (either end included)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return CHECKED_TRITON[0] <= (major, minor) <= CHECKED_TRITON[1]


def _usable() -> bool:
    if os.environ.get("FUSED_GEGLU_TRITON_FAST_LAUNCH", "1").strip().lower() in ("0", "no", "off", "false"):
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    import triton

    if not triton_checked(triton.__version__):
        return False
    try:
        from triton import knobs  # Triton >= 3.4: where the launch hooks live
    except ImportError:
        return False
    return hasattr(knobs, "runtime") and hasattr(torch._C, "_cuda_getCurrentRawStream")


ENABLED = _usable()
if ENABLED:
    from triton import knobs as _knobs


def _hooked() -> bool:
    """Whether a launch hook is installed. Triton 3.5+ keeps each hook slot as a ``HookChain`` (empty,
    not None, when nothing is installed: its own path then builds launch metadata for every launch and
    calls the empty chain); a user may also assign a plain function to the slot."""
    for hook in (_knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


class FastKernel:
    """``FastKernel(jit_fn)(grid, args, num_warps)``: ``jit_fn[grid](*args, num_warps=num_warps)`` with
    ``args`` every parameter in signature order (constexprs included, as values). ``grid`` is a tuple
    of 1-3 ints. CUDA tensors only: the caller passes CPU tensors (the interpreter) to ``jit_fn``."""

    __slots__ = ("fn", "fast", "const", "kept")

    def __init__(self, fn):
        self.fn = fn
        # An interpreted kernel (TRITON_INTERPRET=1 when it was defined) has no compiled launcher.
        self.fast = ENABLED and isinstance(fn, JITFunction)
        self.const = tuple(p.is_constexpr for p in fn.params) if self.fast else ()
        self.kept: dict[tuple, tuple] = {}

    def __call__(self, grid: tuple, args: tuple, num_warps: int) -> None:
        if not self.fast or _hooked():
            self.fn[grid](*args, num_warps=num_warps)
            return
        device = torch.cuda.current_device()  # Triton's own choice of device: the current one
        key = (device, num_warps, *[a if c else spec_key(a) for a, c in zip(args, self.const)])
        kept = self.kept.get(key)
        if kept is None:
            compiled = self.fn[grid](*args, num_warps=num_warps)
            if compiled is not None and hasattr(compiled, "packed_metadata"):
                if len(self.kept) > 256:  # keys vary with alignment and sizes: keep the table bounded
                    self.kept.clear()
                # The compiled kernel itself rides along: it owns the loaded module the handle points into.
                self.kept[key] = (compiled.run, compiled.function, compiled.packed_metadata, compiled)
            return
        run, function, metadata, _ = kept
        n = len(grid)
        try:
            run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, torch._C._cuda_getCurrentRawStream(device),
                function, metadata, None, None, None, *args)
        except TypeError:
            # A Triton whose launcher takes other arguments (its argument parsing refuses them before
            # anything is launched): Triton's own path from now on, for this kernel.
            self.fast = False
            self.kept.clear()
            self.fn[grid](*args, num_warps=num_warps)
