"""Programmatic dependent launch (PDL) for the decode chain: gate+up -> down GEMM -> split-K reduction.

At decode sizes (M <= 64 tokens) each kernel streams its weight in a few microseconds, so the gap between
two kernels (the next grid's launch, then the first DRAM round trip of its loads) is a large share of the
step. On sm90 a kernel launched with the PDL attribute may start while the kernel before it still runs:
its programs take free SM slots once every program of the earlier kernel has executed
`griddepcontrol.launch_dependents` (issued first thing by the kernels here), prefetch their slice of the
weight into L2, and then block in `griddepcontrol.wait` until the earlier kernel has finished and its
writes are visible. Only what the earlier kernel produces (h, the fp32 partial sums) is read after the
wait.

Why an L2 prefetch and not loads into registers before the wait: a weight loaded into registers before
`griddepcontrol.wait` could be stale if the kernel before wrote it (an optimizer step, a weight copy),
since that kernel may not have finished. A prefetch only moves lines into L2, where every write lands, so
whatever is read after the wait is current. Both instructions are hints the hardware may drop: with the
attribute off, `wait` returns at once and the prefetch is a plain L2 fill.

`FUSED_GEGLU_PDL=0` turns it off (for measuring); it is off on CPU tensors (the interpreter has neither
instruction) and before sm90.
"""

import functools
import os

import torch
import triton
import triton.language as tl

# Largest M (tokens) that launches with PDL: the decode sizes the policy sends to these kernels.
PDL_MAX_M = 64
# Where a kernel with a PDL successor lets it start: first thing (True), or after its main loop, before
# the epilogue (False), so that the successor's prefetch lands in L2 shortly before it is read.
TRIGGER_AT_START = True
# At most this many bytes of a down weight are prefetched into L2 per PDL launch, in total over all
# programs (0: no prefetch; the launch latency is still hidden).
PREFETCH_BYTES = 16 << 20
# The gate+up kernel marks its weight lines first to leave L2 under PDL (each is read once at M <= its
# BLOCK_M), so that they do not push out the down weight's prefetched lines.
EVICT_FIRST = True


def pdl_enabled(device: torch.device, m: int) -> bool:
    """Whether kernels for an M-row problem on `device` use programmatic dependent launch."""
    if device.type != "cuda" or m > PDL_MAX_M:
        return False
    if os.environ.get("FUSED_GEGLU_PDL", "1").strip().lower() in ("0", "no", "off", "false"):
        return False
    return _cuda_major(device.index if device.index is not None else torch.cuda.current_device()) >= 9


@functools.lru_cache(maxsize=None)
def _cuda_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def launch_kwargs(pdl: bool) -> dict:
    """Extra launch options of a kernel that waits on the one before it (`PDL=True` inside)."""
    return {"launch_pdl": True} if pdl else {}


def prefetch_cols(weight: torch.Tensor, rows: int, cols: int) -> int:
    """Columns per weight row that a PDL launch prefetches into L2 (at most `cols`), keeping the total
    over `rows` rows under PREFETCH_BYTES."""
    return max(0, min(cols, PREFETCH_BYTES // (rows * weight.element_size())))


@triton.jit
def let_dependents_start(PDL: tl.constexpr, HERE: tl.constexpr = True):
    """Called by a kernel whose successor waits with PDL (at its start and after its main loop, HERE
    true at one of them): the successor's programs may take free SM slots from here on (they still wait
    for this kernel's results before reading them)."""
    if PDL and HERE:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_for_previous(PDL: tl.constexpr):
    """Block until the kernel launched before this one has finished and its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def prefetch_rows_l2(ptr, rows, stride, k_lo, count, K, PDL: tl.constexpr):
    """Prefetch elements [k_lo, min(k_lo + count, K)) of the given rows (int64 offsets, all valid) of a
    row-major matrix into L2: one `prefetch.global.L2` per 128-byte line, 8 lines per row per step."""
    if PDL:
        LINE: tl.constexpr = 1024 // ptr.dtype.element_ty.primitive_bitwidth  # elements per 128 B
        k_hi = tl.minimum(k_lo + count, K)
        lines = tl.arange(0, 8) * LINE
        for k0 in range(k_lo, k_hi, 8 * LINE):
            k = tl.minimum(k0 + lines, k_hi - 1)
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                [ptr + rows[:, None] * stride + k[None, :]],
                dtype=tl.int32, is_pure=False, pack=1,
            )
