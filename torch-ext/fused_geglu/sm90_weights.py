"""Host-side glue of the sm90 CUTLASS GEMMs (``kernel_src/gemm_sm90``): the interleaved gate/up
weight the gate+up kernel reads (cached outside the module), launch specs from the policy, and
when the dh kernel (backward) can take a call.

The kernel's epilogue pairs gate and up values held by one thread, which needs the two weights
row-interleaved in blocks of 8 (``kernel_src/gemm_sm90/geglu_gateup_sm90.h`` has the layout). The
host module keeps its own ``gate_proj``/``up_proj`` tensors untouched; the interleaved copy
(``2·I·H`` values) lives here, keyed by the weights' identity and version counters, so an
in-place update of a weight is picked up and a freed weight's entry is dropped.
"""

from __future__ import annotations

import os
import weakref
from functools import lru_cache

import torch

from .policy import device_capability

GROUP = 8
_cache: dict[tuple[int, int], tuple] = {}


def _interleave(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    i, h = w_gate.shape
    return torch.stack([w_gate.reshape(i // GROUP, GROUP, h), w_up.reshape(i // GROUP, GROUP, h)], 1).reshape(2 * i, h)


def _interleave_bias(b_gate, b_up):
    """The [2I] bias in the weight's interleaved order; a missing half is zeros."""
    if b_gate is None and b_up is None:
        return None
    b_gate = b_gate if b_gate is not None else torch.zeros_like(b_up)
    b_up = b_up if b_up is not None else torch.zeros_like(b_gate)
    i = b_gate.shape[0]
    return torch.stack([b_gate.reshape(i // GROUP, GROUP), b_up.reshape(i // GROUP, GROUP)], 1).reshape(2 * i)


def gateup_weight(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    key = (id(w_gate), id(w_up))
    entry = _cache.get(key)
    if entry is not None:
        ref_g, ref_u, versions, packed = entry
        if ref_g() is w_gate and ref_u() is w_up and versions == (w_gate._version, w_up._version):
            return packed
        # Stale (a weight was updated in place, e.g. by an optimizer step): drop it before making
        # the new copy, so that two copies never coexist.
        del _cache[key], entry, packed
    with torch.no_grad():
        packed = _interleave(w_gate.detach(), w_up.detach())
    _cache[key] = (weakref.ref(w_gate, lambda _: _cache.pop(key, None)), weakref.ref(w_up),
                   (w_gate._version, w_up._version), packed)
    return packed


def usable(x2: torch.Tensor, w_gate: torch.Tensor) -> bool:
    i, h = w_gate.shape
    return (x2.dtype in (torch.bfloat16, torch.float16) and i % GROUP == 0 and h % 8 == 0
            and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0
            and device_capability(x2.device) == (9, 0))


# The op's tile indices (TileCfg in kernel_src/gemm_sm90/geglu_gateup_sm90.h, same order).
TILES = ("128x128", "128x256", "128x128pp", "256x128", "128x192pp")
_RASTER = {"": 0, "m": 1, "n": 2}


@lru_cache(maxsize=64)  # a handful of policy strings, parsed on every call otherwise
def parse_launch(spec: str | None) -> tuple[int, int, int]:
    """``"<tile>/s<swizzle>[m|n]"`` (a policy value) -> the op's (tile, swizzle, raster) arguments;
    None -> the op's own size heuristic."""
    if spec is None:
        return -1, 1, 0
    tile, _, order = spec.partition("/")
    swizzle, raster = order[1:].rstrip("mn"), order[1:].lstrip("0123456789")
    if tile not in TILES or not order.startswith("s") or swizzle not in ("1", "2", "4", "8") or raster not in _RASTER:
        raise ValueError(f"sm90 launch {spec!r}: expected '<tile>/s<1|2|4|8>[m|n]' with a tile in {TILES} "
                         "(the dh kernel's launches and $FUSED_GEGLU_SM90_DH: 's<1|2|4|8>[m|n]' or '0')")
    return TILES.index(tile), int(swizzle), _RASTER[raster]


def gateup_sm90(ops, x2, w_gate, w_up, b_gate, b_up, approximate: str, launch: str | None = None,
                save_preact: bool = False):
    """``(h, gate, up)`` from one CUTLASS GEMM; gate/up (the pre-activations, for the backward)
    only when ``save_preact``, else None."""
    m, i = x2.shape[0], w_gate.shape[0]
    h_out = torch.empty((m, i), dtype=x2.dtype, device=x2.device)
    gate = torch.empty_like(h_out) if save_preact else None
    up = torch.empty_like(h_out) if save_preact else None
    approx = 0 if approximate == "none" else 1
    if _split_weights(ops, w_gate, w_up):
        # EXPERIMENTAL ($FUSED_GEGLU_SM90_SPLIT=1): the weights where they are, no interleaved copy.
        if b_gate is None and b_up is not None:
            b_gate = torch.zeros_like(b_up)
        if b_up is None and b_gate is not None:
            b_up = torch.zeros_like(b_gate)
        ops.geglu_gateup_split_sm90(h_out, x2, w_gate, w_up, b_gate, b_up, approx, gate, up, *parse_launch(launch))
    else:
        ops.geglu_gateup_sm90(h_out, x2, gateup_weight(w_gate, w_up), _interleave_bias(b_gate, b_up), approx,
                              gate, up, *parse_launch(launch))
    return h_out, gate, up


def _split_weights(ops, w_gate: torch.Tensor, w_up: torch.Tensor) -> bool:
    """Whether to run the copy-free gate+up GEMM (``geglu_gateup_split_sm90``): opt-in with
    ``$FUSED_GEGLU_SM90_SPLIT=1`` while it is unmeasured, and only where its one TMA view of both
    weights exists (same row stride, 16-byte aligned, distinct and at most 2^40 bytes apart)."""
    if os.environ.get("FUSED_GEGLU_SM90_SPLIT", "0") != "1" or not hasattr(ops, "geglu_gateup_split_sm90"):
        return False
    return (w_gate.stride(1) == 1 and w_up.stride(1) == 1 and w_gate.stride(0) == w_up.stride(0)
            and w_gate.stride(0) % 8 == 0 and w_gate.data_ptr() % 16 == 0 and w_up.data_ptr() % 16 == 0
            and 0 < abs(w_up.data_ptr() - w_gate.data_ptr()) < (1 << 40))


def dh_usable(dy: torch.Tensor, w_down: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> bool:
    """Whether ``geglu_dh_sm90`` accepts these operands (its host op checks the same and raises)."""
    i = w_down.shape[1]
    return (dy.dtype in (torch.bfloat16, torch.float16) and i % 8 == 0 and dy.shape[1] % 8 == 0
            and dy.stride(1) == 1 and dy.stride(0) % 8 == 0 and dy.data_ptr() % 16 == 0
            and w_down.stride(1) == 1 and w_down.stride(0) % 8 == 0 and w_down.data_ptr() % 16 == 0
            and gate.is_contiguous() and up.is_contiguous()
            and device_capability(dy.device) == (9, 0))


def dh_launch(policy_choice: str | None) -> tuple[int, int] | None:
    """(swizzle, raster) for ``geglu_dh_sm90``, or None for cuBLAS dh + the pointwise kernel.

    ``policy_choice`` is the policy's ``"s<swizzle>[m|n]"`` or None ("no"). The kernel measured
    slower than cuBLAS + pointwise (``policy_sm90.json``), so no rule names it and a forced ``cuda``
    backend does not run it either: ``$FUSED_GEGLU_SM90_DH`` opts in for measuring and testing
    (a launch such as ``s8``; ``0`` = off).
    """
    override = os.environ.get("FUSED_GEGLU_SM90_DH")
    if override is not None:
        policy_choice = None if override == "0" else override
    if policy_choice is None:
        return None
    _, swizzle, raster = parse_launch(f"{TILES[0]}/{policy_choice}")
    return swizzle, raster
