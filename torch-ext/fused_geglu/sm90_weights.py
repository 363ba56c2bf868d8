"""Host-side glue of the sm90 CUTLASS GEMMs (``kernel_src/gemm_sm90``): when the gate+up kernel
can take a call, launch specs from the policy, and when the dh kernel (backward) can take one.

The gate+up kernel reads the host module's own ``w_gate``/``w_up`` where they are, as one TMA view
over both tensors (``kernel_src/gemm_sm90/geglu_gateup_sm90.h``): nothing is copied or cached
here, so an optimizer's in-place update is seen by the next call as it is by cuBLAS.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

from .policy import device_capability


def usable(x2: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> bool:
    """Whether ``geglu_gateup_sm90`` accepts these operands (its host op checks the same and
    raises): sm_90, bf16/fp16, 16-byte TMA rows, and w_gate/w_up two distinct tensors with one row
    stride, 16-byte aligned and less than 2^40 bytes apart (one TMA view spans both)."""
    return (shapes_usable(x2, w_gate, w_up) and x2.data_ptr() % 16 == 0
            and w_gate.data_ptr() % 16 == 0 and w_up.data_ptr() % 16 == 0
            and 0 < abs(w_up.data_ptr() - w_gate.data_ptr()) < (1 << 40))


def shapes_usable(x2: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> bool:
    """``usable`` without the pointers: what a graph being traced knows. The op that runs a traced
    plan checks the pointers when it runs (``geglu_mlp_train_fwd``, kernel_src/autograd_nodes/mlp_train.cpp)."""
    i, h = w_gate.shape
    return (x2.dtype in (torch.bfloat16, torch.float16) and i % 8 == 0 and h % 8 == 0
            and x2.stride(0) % 8 == 0
            and w_gate.stride(1) == 1 and w_up.stride(1) == 1 and w_gate.stride(0) == w_up.stride(0)
            and w_gate.stride(0) % 8 == 0 and device_capability(x2.device) == (9, 0))


# The op's tile indices (TileCfg in kernel_src/gemm_sm90/geglu_gateup_sm90.h, same order).
TILES = ("128x128", "128x256", "128x128pp", "256x128", "128x192pp", "64x128pp", "64x256pp", "64x128k128pp")
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
    if (b_gate is None) != (b_up is None):  # the kernel takes both biases or neither
        b_gate = b_gate if b_gate is not None else torch.zeros_like(b_up)
        b_up = b_up if b_up is not None else torch.zeros_like(b_gate)
    ops.geglu_gateup_sm90(h_out, x2, w_gate, w_up, b_gate, b_up, 0 if approximate == "none" else 1, gate, up,
                          *parse_launch(launch))
    return h_out, gate, up


def mlp_sm90(ops, x2, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate: str,
             launch: str | None = None) -> torch.Tensor:
    """The inference forward ``y`` from one compiled call: the gate+up GEMM, then cuBLAS down
    (``geglu_mlp_sm90``; it zero-fills a missing one of b_gate/b_up itself)."""
    return ops.geglu_mlp_sm90(x2, w_gate, w_up, w_down, b_gate, b_up, b_down, 0 if approximate == "none" else 1,
                              *parse_launch(launch))


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
