"""2-D row views of N-D tensors, without copies where the strides allow it."""

from __future__ import annotations

import math

import torch


def rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as [prod(leading dims), last dim] with last-dim stride 1.

    Views when the leading dims collapse (contiguous tensors, and the halves of a packed
    [..., 2d] tensor); otherwise (e.g. ``x[::2]`` of a 3-D tensor, or a transposed last dim)
    one copy is made, and so it is where the rows would overlap (a broadcast, row stride 0).
    """
    n = t.shape[-1]
    if t.dim() == 2 and (t.stride(1) == 1 or n <= 1):
        if t.stride(0) >= n or t.shape[0] <= 1:
            return t  # already rows (the common 2-D case, kept cheap: it runs on every call)
        return t.contiguous()  # rows that overlap (a broadcast x.expand(M, n), stride 0): the kernels need their own
    if t.stride(-1) != 1 and n > 1:
        t = t.contiguous()
    # reshape is a view where the leading dims collapse and a contiguous copy where they do not. (A
    # view attempt caught on failure cost 15 µs per call on the development CPU, most of it building
    # the exception, about 45 µs on the H200's host: what a sequence-first x paid twice per step.)
    r = t.reshape(t.numel() // n if n else math.prod(t.shape[:-1]), n)
    if r.stride(0) < n and r.shape[0] > 1:
        return r.contiguous()  # rows that overlap, as above (an N-D broadcast over the leading dims)
    return r


def rows_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rows(a), rows(b)
