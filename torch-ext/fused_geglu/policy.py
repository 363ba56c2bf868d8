"""Measured dispatch policy for the auto backend on CUDA, kept as data (``policy_sm90.json``).

Each rule says which implementation of ``geglu_mlp`` won for a range of token counts M on a GPU
generation; the numbers behind each rule are in ``benchmarks/results/``. Without a rule for the
device the fused Triton kernel is used.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=None)
def _rules(capability: tuple[int, int]) -> tuple[dict, ...]:
    path = Path(__file__).with_name(f"policy_sm{capability[0]}{capability[1]}.json")
    if not path.is_file():
        return ()
    return tuple(json.loads(path.read_text()).get("geglu_mlp", ()))


def mlp_backend_for(m: int, h: int, i: int) -> str:
    """"triton" (fused kernels) or "cuda" (cuBLAS GEMMs + compiled pointwise) for this shape."""
    if not torch.cuda.is_available():
        return "triton"
    for rule in _rules(torch.cuda.get_device_capability()):
        if rule.get("min_m", 0) <= m <= rule.get("max_m", 1 << 62) and \
                rule.get("min_h", 0) <= h <= rule.get("max_h", 1 << 62):
            return rule["backend"]
    return "triton"
