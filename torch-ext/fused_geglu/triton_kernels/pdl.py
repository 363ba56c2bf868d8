"""Programmatic dependent launch (PDL) for the decode chain: gate+up -> down GEMM (-> split-K reduction, for
`linear()` on its own; the MLP sums the slices inside the down GEMM, `linear.py`).

At decode sizes (M <= 64 tokens) each kernel streams its weight in a few microseconds, so the gap between
two kernels (the next grid's launch and start-up) is a visible share of the step. On sm90 a kernel
launched with the PDL attribute may start while the kernel before it still runs: its programs take free SM
slots once every program of the earlier kernel has executed `griddepcontrol.launch_dependents`, and then
block in `griddepcontrol.wait` until that kernel has finished and its writes are visible. Nothing is read
before the wait, so a kernel launched this way sees exactly what a plain launch sees (the GPU tests
compare the bits).

Measured on the H200 (`benchmarks/diag/decode_pdl.py`, `decode-pdl-h200-85f3c03.json`, M = 16, graph
replay, µs per MLP for Gemma3-1B / Gemma-2B / Gemma2-9B):

- plain launches 22.5 / 59.1 / 82.2;
- trigger after the main loop (the default) 22.0 / 58.6 / 81.7 (2bed689: 22.0 / 58.7 / 81.8 against
  plain 22.4 / 59.2 / 82.5; the p20-p80 ranges are apart at Gemma3-1B, a few tenths overlapping above);
- trigger first thing 22.7 / 62.0 / 84.3: the waiting programs then sit on SM slots for the whole
  earlier kernel and slow it;
- prefetching the down weight into L2 before the wait (16 MB: 26.4 / 63.5 / 85.6 with the early trigger;
  4 MB with the late one: 22.5 / 58.4 / 81.9) loses or ties: while the gate+up kernel streams its own
  weights, the prefetched lines leave L2 before they are read, so they are fetched twice. It is not done.
- reading the down weight into registers before the wait instead (each K slice one 256-1024 wide step,
  the gate+up kernel letting the down GEMM in at its start; 7771557, `decode-sweep-h200-7771557.json`)
  tied at best at Gemma3-1B (19.5-20.1 in the pairs against 19.1 for the best plain configs, shipped
  19.6) and lost 13-21 us at Gemma-2B and Gemma2-9B, where hundreds to thousands of down programs
  admitted early hold SM slots the gate+up kernel needs. It is not done either.

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
# Where a kernel with a PDL successor lets it start: first thing (True) or after its main loop, before
# the epilogue (False, measured faster, see above). A knob for decode_pdl.py.
TRIGGER_AT_START = False


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


@triton.jit
def let_dependents_start(PDL: tl.constexpr, HERE: tl.constexpr):
    """Called by a kernel whose successor waits with PDL, at its start and after its main loop (HERE true
    at one of them): the successor's programs may take free SM slots from here on (they still wait for
    this kernel's results before reading anything)."""
    if PDL and HERE:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_for_previous(PDL: tl.constexpr):
    """Block until the kernel launched before this one has finished and its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()
