"""Launch configurations as data.

A `KernelConfig` (frozen dataclass) per launch, looked up by (kernel, device capability, M bucket, N, K):

1. exact tuned entry for (kernel, M bucket, N, K) in ``configs_sm{major}{minor}.json``;
2. the tuned entry of that (kernel, N, K) with the nearest M bucket (log space);
3. the JSON's per-kernel defaults, the first whose ``m_max`` >= M;
4. built-in defaults (generic GPU, or the tiny interpreter ones for CPU tensors).

Whatever is picked is then fitted to the device (`fit_config`): shared memory of the pipelined operand
tiles, and the minimum `tl.dot` tile of 16. The JSON files are read once per capability. No tuning ever
runs on a user's call; `tune.py` is the offline tool that writes these files.

JSON layout (``configs_sm90.json``)::

    {"defaults": {"<kernel>": [{"m_max": 64, "config": {...}}, {"m_max": null, "config": {...}}]},
     "tuned":    {"<kernel>": {"M=4096,N=3072,K=768": {...}}}}

For the pointwise kernels (`geglu_fwd`, `geglu_bwd` and their `_flat` forms) only BLOCK_M, BLOCK_N and
num_warps matter; N and K of the key are the column count and 0. The flat kernels move BLOCK_M * BLOCK_N
elements per program as one 1-D block.
"""

import dataclasses
import functools
import json
import math
import os
from typing import Dict, Optional, Tuple

import torch

KERNELS = (
    "geglu_fwd",
    "geglu_bwd",
    "geglu_fwd_flat",  # contiguous operands: 1-D blocks of BLOCK_M * BLOCK_N elements (BLOCK_M = 1)
    "geglu_bwd_flat",
    "linear_fwd",  # activation "none" (bias epilogue only)
    "linear_fwd_act",  # GELU epilogue (+ pre-activation store): more epilogue registers, own tiles
    "linear_bwd_input",
    "linear_bwd_weight",
    "gateup_fwd",
    "dh_bwd",
)
POINTWISE_KERNELS = ("geglu_fwd", "geglu_bwd", "geglu_fwd_flat", "geglu_bwd_flat")
# Kernels whose launcher can split K (the epilogue then runs in the reduction kernel).
SPLIT_K_KERNELS = ("linear_fwd", "linear_fwd_act")
MAX_SPLIT_K = 16
# How many B-operand tiles each GEMM kernel streams per K step (gateup_fwd has two weights).
_NUM_B_OPERANDS = {"gateup_fwd": 2}


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int = 32
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 3
    # K splits of a skinny GEMM (linear_fwd*: one program per (N tile, K slice), the slices summed by a
    # second small kernel). 1 = no split; 0 = as many as it takes to give every SM two programs (at
    # most MAX_SPLIT_K), because at decode sizes there are too few output tiles to stream the weight
    # at full bandwidth.
    SPLIT_K: int = 1

    @classmethod
    def from_dict(cls, d: dict) -> "KernelConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"unknown KernelConfig fields {sorted(unknown)} in {d}")
        return cls(**d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def config_supports(kernel: str, cfg: KernelConfig, elem_size: int = 2, smem_bytes: Optional[int] = None) -> bool:
    """Single validity predicate (used by the lookup, `fit_config` and `tune.py`)."""
    if kernel not in KERNELS:
        return False
    if not (_pow2(cfg.BLOCK_M) and _pow2(cfg.BLOCK_N) and _pow2(cfg.num_warps)):
        return False
    if kernel in POINTWISE_KERNELS:
        return cfg.BLOCK_M * cfg.BLOCK_N <= 65536
    if not _pow2(cfg.BLOCK_K) or min(cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K) < 16:
        return False
    if cfg.GROUP_M < 1 or cfg.num_stages < 1 or not 0 <= cfg.SPLIT_K <= MAX_SPLIT_K:
        return False
    if cfg.SPLIT_K != 1 and kernel not in SPLIT_K_KERNELS:
        return False
    if kernel == "dh_bwd" and cfg.BLOCK_N < 32:  # split into two BLOCK_N/2 accumulators, each >= 16
        return False
    if smem_bytes is not None and _smem_estimate(kernel, cfg, elem_size) > smem_bytes:
        return False
    return True


def _smem_estimate(kernel: str, cfg: KernelConfig, elem_size: int) -> int:
    nb = _NUM_B_OPERANDS.get(kernel, 1)
    per_stage = (cfg.BLOCK_M * cfg.BLOCK_K + nb * cfg.BLOCK_N * cfg.BLOCK_K) * elem_size
    pipeline = per_stage * max(cfg.num_stages, 1)  # the software pipeline keeps num_stages tiles resident
    if elem_size == 4:
        # fp32 operands: Triton also stages a layout conversion of one operand tile, rows padded by 8
        # (H200, triton 3.6: linear_bwd_weight 128x128x64 with GELU' asked for 233472 bytes, a 196608-byte
        # pipeline + 128 x 72 x 4, past the 232448 an SM has).
        pipeline += max(cfg.BLOCK_M, cfg.BLOCK_N) * (cfg.BLOCK_K + 8) * elem_size
    elif kernel in ("linear_bwd_input", "linear_bwd_weight"):
        # 16-bit operands with the GELU' variant (g = grad_y * gelu'(preact) formed on load): Triton stages
        # that tile's conversion too, BLOCK_M x BLOCK_N elements (= 2 x BLOCK_M x BLOCK_K in every config
        # compiled), and linear_bwd_weight's bias-gradient sum 4 KB more. Compiled for sm90 without a GPU
        # (benchmarks/diag/triton_smem.py, triton 3.6 and 3.9): 128x128x64 at 4 stages asked for 163840 /
        # 167936 bytes where this estimate said 131072. Kept an upper bound of every compiled launch
        # (tests/test_triton_configs_fit.py).
        pipeline += max(cfg.BLOCK_M * cfg.BLOCK_N, 2 * cfg.BLOCK_M * cfg.BLOCK_K) * elem_size
        pipeline += 4096 if kernel == "linear_bwd_weight" else 0
    return pipeline


def fit_config(kernel: str, cfg: KernelConfig, elem_size: int, smem_bytes: Optional[int]) -> KernelConfig:
    """Shrink a config until it fits the device: first fewer stages (down to 2), then half BLOCK_K.
    fp32 operands double the bytes of a bf16-tuned config, which is why this exists."""
    if kernel in POINTWISE_KERNELS or smem_bytes is None:
        return cfg
    while not config_supports(kernel, cfg, elem_size, smem_bytes):
        if cfg.num_stages > 2:
            cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.BLOCK_K > 16:
            cfg = dataclasses.replace(cfg, BLOCK_K=cfg.BLOCK_K // 2)
        elif cfg.BLOCK_N > 16:
            cfg = dataclasses.replace(cfg, BLOCK_N=cfg.BLOCK_N // 2)
        else:
            break
    return cfg


# ----------------------------------------------------------------------------------------------
# Built-in defaults.
# Interpreter: tiny tiles so CPU tests are fast; 16 is the smallest tile tl.dot takes on GPUs.
_INTERPRETER = {
    "geglu_fwd": KernelConfig(BLOCK_M=4, BLOCK_N=32, num_warps=1),
    "geglu_bwd": KernelConfig(BLOCK_M=4, BLOCK_N=32, num_warps=1),
    "geglu_fwd_flat": KernelConfig(BLOCK_M=1, BLOCK_N=64, num_warps=1),
    "geglu_bwd_flat": KernelConfig(BLOCK_M=1, BLOCK_N=64, num_warps=1),
}
_INTERPRETER["dh_bwd"] = KernelConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, num_warps=1, num_stages=1)
_INTERPRETER_GEMM = KernelConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=1, num_stages=1)
# Skinny M under the interpreter takes the split-K path, so the CPU tests cover both launchers.
_INTERPRETER_SPLIT_K = dataclasses.replace(_INTERPRETER_GEMM, SPLIT_K=0)

# Generic CUDA GPU (any arch without a JSON): conservative, fits sm80-class shared memory.
_GENERIC_GPU = {
    "geglu_fwd": KernelConfig(BLOCK_M=8, BLOCK_N=1024, num_warps=8),
    "geglu_bwd": KernelConfig(BLOCK_M=4, BLOCK_N=1024, num_warps=8),
    "geglu_fwd_flat": KernelConfig(BLOCK_M=1, BLOCK_N=1024, num_warps=4),
    "geglu_bwd_flat": KernelConfig(BLOCK_M=1, BLOCK_N=1024, num_warps=4),
    "linear_fwd": KernelConfig(128, 128, 32, 8, 8, 3),
    "linear_fwd_act": KernelConfig(128, 128, 32, 8, 8, 3),
    "linear_bwd_input": KernelConfig(128, 128, 32, 8, 8, 3),
    "linear_bwd_weight": KernelConfig(128, 128, 32, 8, 8, 3),
    "gateup_fwd": KernelConfig(128, 64, 32, 8, 8, 3),
    "dh_bwd": KernelConfig(128, 128, 32, 8, 8, 3),
}
_SMALL_M_GPU = KernelConfig(16, 64, 64, 1, 4, 4)  # skinny M (decode): weight-bandwidth bound
_SMALL_M_MAX = 16
SKINNY_M_MAX = 64  # M buckets up to this are decode sizes (tune.py times them as CUDA-graph replays)

_HERE = os.path.dirname(os.path.abspath(__file__))


def m_bucket(m: int) -> int:
    """Power-of-two bucket of M, clamped to [16, 65536]."""
    return min(max(16, 1 << max(m - 1, 0).bit_length()), 65536)


def shape_key(m: int, n: int, k: int) -> str:
    return f"M={m_bucket(m)},N={n},K={k}"


@functools.lru_cache(maxsize=None)
def _load_json(capability: Tuple[int, int]) -> dict:
    path = os.path.join(_HERE, f"configs_sm{capability[0]}{capability[1]}.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        data = json.load(f)
    parsed: dict = {"defaults": {}, "tuned": {}}
    for kernel, rules in data.get("defaults", {}).items():
        parsed["defaults"][kernel] = [
            (r.get("m_max"), KernelConfig.from_dict(r["config"])) for r in rules
        ]
    for kernel, table in data.get("tuned", {}).items():
        parsed["tuned"][kernel] = {key: KernelConfig.from_dict(c) for key, c in table.items()}
    return parsed


def _parse_key(key: str) -> Dict[str, int]:
    return {p.split("=")[0]: int(p.split("=")[1]) for p in key.split(",")}


@functools.lru_cache(maxsize=None)
def _device_smem(device_index: int) -> Optional[int]:
    props = torch.cuda.get_device_properties(device_index)
    for attr in ("shared_memory_per_block_optin", "max_shared_memory_per_block_optin"):
        v = getattr(props, attr, None)
        if v:
            return int(v)
    return None


def _lookup(kernel: str, capability: Tuple[int, int], m: int, n: int, k: int) -> KernelConfig:
    data = _load_json(capability)
    tuned = data.get("tuned", {}).get(kernel, {})
    if tuned:
        key = shape_key(m, n, k)
        if key in tuned:
            return tuned[key]
        want = math.log2(m_bucket(m))
        skinny = m_bucket(m) <= SKINNY_M_MAX
        best = None
        for tkey, cfg in tuned.items():
            p = _parse_key(tkey)
            # A decode-size entry (narrow tiles, K splits) never stands in for a large M, nor the reverse.
            if p.get("N") == n and p.get("K") == k and (p["M"] <= SKINNY_M_MAX) == skinny:
                d = abs(math.log2(p["M"]) - want)
                if best is None or d < best[0]:
                    best = (d, cfg)
        if best is not None:
            return best[1]
    for m_max, cfg in data.get("defaults", {}).get(kernel, []):
        if m_max is None or m <= m_max:
            return cfg
    if kernel not in POINTWISE_KERNELS and m <= _SMALL_M_MAX:
        return _SMALL_M_GPU
    return _GENERIC_GPU[kernel]


def get_config(kernel: str, device: torch.device, dtype: torch.dtype, m: int, n: int, k: int = 0) -> KernelConfig:
    """Launch config for `kernel` on `device` for an (M, N, K) problem with operands of `dtype`."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")
    if device.type != "cuda":  # CPU tensors = TRITON_INTERPRET=1
        if kernel in SPLIT_K_KERNELS and m <= _SMALL_M_MAX:
            return _INTERPRETER_SPLIT_K
        return _INTERPRETER.get(kernel, _INTERPRETER_GEMM)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _gpu_config(kernel, index, dtype, m, n, k)


@functools.lru_cache(maxsize=4096)
def _gpu_config(kernel: str, index: int, dtype: torch.dtype, m: int, n: int, k: int) -> KernelConfig:
    """Cached per problem: the lookup walks the tuned table, which costs more than a decode-size
    launch is worth when repeated on every call."""
    capability = tuple(torch.cuda.get_device_capability(index))
    cfg = _lookup(kernel, capability, m, n, k)
    elem = torch.empty((), dtype=dtype).element_size()
    return fit_config(kernel, cfg, elem, _device_smem(index))
