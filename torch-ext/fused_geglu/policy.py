"""Measured dispatch policy for the auto backend on CUDA, kept as data (``policy_sm90.json``).

Each rule says which implementation won for a range of sizes on a GPU generation; the run behind
each rule is named in the JSON (``benchmarks/results/``). The first matching rule wins; without one,
the fallback given by the caller is used.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

from ._dispatch import env


@lru_cache(maxsize=None)
def _rules(capability: tuple[int, int]) -> dict:
    path = Path(__file__).with_name(f"policy_sm{capability[0]}{capability[1]}.json")
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


@lru_cache(maxsize=None)
def capability(index: int) -> tuple[int, int]:
    """The compute capability of CUDA device ``index``, cached: ``get_device_capability`` reads
    the device properties on every call, and this is asked on every decode-size call."""
    return torch.cuda.get_device_capability(index)


def device_capability(device: torch.device) -> tuple[int, int]:
    return capability(device.index if device.index is not None else torch.cuda.current_device())


def first_match(rules, fallback: str, sizes: dict[str, int]) -> str:
    """The backend of the first rule whose ``min_<size>`` / ``max_<size>`` bounds all hold (a bound
    a rule does not name is open; a rule that bounds a size the caller did not pass does not match,
    so a caller that forgets a size never gets a launch measured only under that condition), else
    ``fallback``."""
    for rule in rules:
        if all(rule.get(f"min_{k}", 0) <= v <= rule.get(f"max_{k}", 1 << 62) for k, v in sizes.items()) \
                and all(key.partition("_")[2] in sizes for key in rule if key.startswith(("min_", "max_"))):
            return rule["backend"]
    return fallback


_decisions: dict[tuple, str] = {}


def backend_for(op: str, device: torch.device, fallback: str, **sizes: int) -> str:
    """The measured winner for ``op`` at ``sizes`` (e.g. ``m=``, ``h=``, ``numel=``) on ``device``.

    Decisions are remembered per (op, GPU generation, sizes), so the rules are walked once per
    size rather than on every call (host time is what a decode-size call waits on).
    """
    if device.type != "cuda":
        return fallback
    key = (op, device_capability(device), fallback, *sizes.items())
    choice = _decisions.get(key)
    if choice is None:
        choice = first_match(_rules(key[1]).get(op, ()), fallback, sizes)
        if len(_decisions) > 65536:  # sizes vary with the token count: keep the table bounded
            _decisions.clear()
        _decisions[key] = choice
    return choice


def size_free(op: str, device: torch.device) -> bool:
    """Whether ``backend_for(op, device, ...)`` gives one answer at every size: off CUDA (the
    fallback), or no rule of ``op`` for this GPU bounds a size."""
    if device.type != "cuda":
        return True
    rules = _rules(device_capability(device)).get(op, ())
    return not any(key.startswith(("min_", "max_")) for rule in rules for key in rule)


def capturing(device: torch.device) -> int:
    """1 while the current CUDA stream is being captured into a graph, else 0. A caller that asks
    several rules during one call asks this once and passes it on (it is a driver query)."""
    return int(device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def mlp_backend_for(m: int, h: int, i: int, device: torch.device | None = None,
                    capturing_now: int | None = None) -> str:
    """"triton" (the fused Triton kernels) or "cuda" (sm90 CUTLASS, or vendor GEMMs around this
    project's pointwise kernel; ``mlp._pick`` turns it into ATen's GEMMs where the build has no
    compiled CUDA library). Where no rule decides (a GPU without a policy file) it is "cuda": eager's
    own GEMMs with one fused pointwise pass cannot lose much to eager, where the Triton MLP, measured
    only on sm90, lost 5-20 % to it there at M = 8192 (until 2026-12-05 it was the default)."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    if capturing_now is None:
        capturing_now = capturing(device)
    return backend_for("geglu_mlp", device, "cuda", m=m, h=h, capturing=capturing_now)


def sm90_mlp_launch(m: int, h: int, device: torch.device, training: bool = False,
                    capturing_now: int | None = None) -> str | None:
    """The CUTLASS gate+up GEMM's launch (``"<tile>/s<swizzle>[m|n]"``, e.g. ``"128x128pp/s1"``)
    where it beat cuBLAS + the pointwise kernel at this size on this GPU, else None: the inference
    forward (``geglu_mlp_sm90``), or the training step (``geglu_mlp_sm90_train``: the epilogue
    also writes gate and up). Rules may name ``capturing`` (1 inside CUDA-graph capture): without
    graphs a small-width call is bound by host time, where the path with fewer launches wins even
    at a GPU-time tie. Rules may name ``m_align``, the largest power of two dividing M: a tile of R
    rows does full work for the last partial row block, and a tile order that groups G row blocks
    (swizzle G) leaves a ragged last group, so some launches win only when M is a multiple of R or of
    R * G (``min_m_align``). ``$FUSED_GEGLU_SM90_MLP`` overrides both for measuring: a launch, or ``no``."""
    choice = env("FUSED_GEGLU_SM90_MLP") or backend_for(
        "geglu_mlp_sm90_train" if training else "geglu_mlp_sm90", device, "no", m=m, h=h,
        capturing=capturing(device) if capturing_now is None else capturing_now, m_align=m & -m)
    return None if choice == "no" else choice


def sm90_forced_launch(m: int, h: int, device: torch.device) -> str | None:
    """The gate+up launch for ``backend="cuda"`` forced where ``sm90_mlp_launch`` names none (cuBLAS +
    pointwise measured faster there): per width and 128-row interval, the launch that lost least in
    those places, else None (the op's own size heuristic, where nothing was measured).
    ``$FUSED_GEGLU_SM90_MLP``, when set, keeps the heuristic (it is the override)."""
    if env("FUSED_GEGLU_SM90_MLP"):
        return None
    choice = backend_for("geglu_mlp_sm90_forced", device, "heuristic", m=m, h=h)
    return None if choice == "heuristic" else choice


def sm90_dh_launch(m: int, h: int, device: torch.device) -> str | None:
    """The dh GEMM with the GeGLU-backward epilogue's tile order (``"s<swizzle>[m|n]"``) where it
    beat cuBLAS dh + the in-place pointwise kernel at this size, else None."""
    choice = backend_for("geglu_mlp_dh_sm90", device, "no", m=m, h=h)
    return None if choice == "no" else choice
