"""Counting the casts an op makes of given tensors: what autocast's weight cache saves is casts."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CastCounter(TorchDispatchMode):
    """Counts the casts (``aten._to_copy``) whose source is one of ``sources`` (by identity; a DTensor
    parameter is seen as itself, since a dispatch mode runs before the subclass's dispatch)."""

    def __init__(self, sources):
        super().__init__()
        self.sources, self.casts = list(sources), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and any(args[0] is s for s in self.sources):
            self.casts += 1
        return func(*args, **(kwargs or {}))
