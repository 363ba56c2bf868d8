"""FSDP2 (``torch.distributed.fsdp.fully_shard``): what a module and its parameters look like in forward.

Between steps fully_shard keeps every parameter as a DTensor shard (``Shard(0)`` on the data-parallel
mesh) and the module it was applied to as an instance of a generated subclass, ``FSDP<Class>``. In that
module's pre-forward hook it all-gathers the shards into plain ``nn.Parameter``s (cast to the mixed-precision
``param_dtype`` if one is set) and puts those on the submodules, where the class's forward, and the kernel
layer that replaces it, read them. The kernel layer checks the weights it is handed on every call, so it
sees the gathered form and runs the fused MLP. The up-front refusal (``families.refusal``) runs between
steps and must judge that gathered form too: a shard looks like tensor parallelism with every weight
``Shard(0)``, which the kernel does not run, and refusing it left FSDP2 models kernelized after
``fully_shard`` on eager's path (found 2026-12-05).

Which parameters fully_shard manages, and as what, is kept only in its private state
(``FSDPParam``, reached through ``torch.distributed._composable_state``). This module reads it
defensively: on a torch that keeps it elsewhere every lookup answers "not managed", and the refusal
then treats the shard as it did before (refused, with a reason naming FSDP2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Gathered:
    """A parameter as fully_shard hands it to forward."""

    dtype: torch.dtype
    # True: gathered over the data-parallel dims into a DTensor that stays sharded for tensor
    # parallelism (fully_shard over DTensor parameters, a 2-D mesh); False: a plain Parameter.
    dtensor: bool
    # That DTensor's mesh and placements (the tensor-parallel ones), where this torch tells them.
    mesh: object = None
    placements: tuple | None = None


def original_class(cls: type) -> type:
    """The class fully_shard derived ``cls`` from (``FSDPGemmaMLP`` -> ``GemmaMLP``), else ``cls``.

    fully_shard makes ``type(f"FSDP{name}", (FSDPModule, cls), ...)`` and swaps the instance's class;
    the generated class defines no ``forward`` of its own."""
    bases = cls.__bases__
    if (len(bases) == 2 and bases[0].__name__ == "FSDPModule" and cls.__name__ == f"FSDP{bases[1].__name__}"
            and bases[0].__module__.startswith("torch.distributed")):
        return bases[1]
    return cls


def _fsdp_params():
    """``(FSDPParam, its group)`` for every parameter of every live fully_shard state (none if this
    torch keeps them elsewhere)."""
    try:
        from torch.distributed import _composable_state
    except ImportError:
        return
    for ref in list(getattr(_composable_state, "_module_state_mapping", {}).values()):
        state = ref()
        groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.13: one list per state
        if groups is None:
            try:
                group = getattr(state, "_fsdp_param_group", None)  # earlier: at most one group
            except Exception:  # noqa: BLE001 - a property that may refuse; then nothing is known
                continue
            groups = [] if group is None else [group]
        for group in groups:
            for fp in getattr(group, "fsdp_params", ()):
                yield fp, group


def gathered(module: nn.Module, name: str) -> Gathered | None:
    """How fully_shard presents ``module``'s parameter ``name`` (a shard between steps) to forward; None
    when fully_shard does not manage it (or this torch hides how)."""
    param = getattr(module, name, None)
    if param is None or not _is_dtensor(param):
        return None
    for fp, group in _fsdp_params():
        if _owns(fp, module, name, param):
            # The MixedPrecisionPolicy, not FSDPParam.param_dtype: fully_shard sets that one in its lazy
            # init at the first forward, so a kernelize between fully_shard and the first step saw the
            # stored dtype instead (found 2026-12-05). torch 2.15 keeps the policy on each FSDPParam,
            # resolved for that parameter (its param_dtype_override_fn applied), and none on the group;
            # earlier releases keep it on the group. FSDP2 casts floating parameters only.
            policy = getattr(fp, "mp_policy", None) or getattr(group, "mp_policy", None)
            policy_dtype = getattr(policy, "param_dtype", None) or getattr(fp, "param_dtype", None)
            dtype = policy_dtype if policy_dtype is not None and param.dtype.is_floating_point else param.dtype
            if not getattr(fp, "is_dtensor", True):
                return Gathered(dtype=dtype, dtensor=False)
            # The tensor-parallel spec the gathered DTensor gets (torch 2.13: _unsharded_dtensor_spec;
            # earlier releases: _tp_spec).
            spec = getattr(fp, "_unsharded_dtensor_spec", None) or getattr(fp, "_tp_spec", None)
            return Gathered(dtype=dtype, dtensor=True, mesh=getattr(spec, "mesh", None),
                            placements=getattr(spec, "placements", None))
    return None


def _owns(fp, module: nn.Module, name: str, param) -> bool:
    """Whether FSDPParam ``fp`` manages ``module.name``: its sharded parameter is that object, or it was
    made for that module and name (transformers' native FSDP + tensor-parallel loading,
    ``DistributedConfig(fsdp_size=, tp_size=)``, leaves on the module a DTensor that is not the
    FSDPParam's object)."""
    if getattr(fp, "sharded_param", None) is param:
        return True
    info = getattr(fp, "_module_info", None)
    return getattr(info, "module", None) is module and getattr(info, "param_name", None) == name


def _is_dtensor(t: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(t, DTensor)


def managed(module: nn.Module) -> bool:
    """Whether fully_shard manages ``module``'s parameters (it marks every such module for Dynamo)."""
    return bool(getattr(module, "_is_fsdp_managed_module", False))
