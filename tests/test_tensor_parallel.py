"""Tensor-parallel GeGLU MLP: two CPU processes over gloo, weights sharded as torch's
ColwiseParallel (gate_proj, up_proj) / RowwiseParallel (down_proj) lay them out, the kernel layer
running the fused MLP on the local shards with one all-reduce, against the unsharded module."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, bias: bool, result_dir: str) -> None:
    sys.path.insert(0, str(HERE))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import kernels
    from test_layers import _HostMLP

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        k = kernels.get_kernel("org/fused-geglu", version=1, trust_remote_code=True)
        torch.manual_seed(0)  # same weights and inputs on every rank
        h, i = 24, 40
        ref = _HostMLP(h, i, nn.GELU(approximate="tanh"), bias=bias)
        x = torch.randn(3, 7, h)
        dy = torch.randn(3, 7, h)
        x_ref = x.clone().requires_grad_()
        y_ref = ref(x_ref)
        y_ref.backward(dy)

        tp = _HostMLP(h, i, nn.GELU(approximate="tanh"), bias=bias)
        tp.load_state_dict(ref.state_dict())
        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(tp, mesh, {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(),
                                      "down_proj": RowwiseParallel()})
        assert isinstance(tp.gate_proj.weight, DTensor)
        assert tp.gate_proj.weight.to_local().shape == (i // world, h), "weights must stay sharded"
        from types import MethodType

        tp.forward = MethodType(k.layers.GeGLUMLP.forward, tp)  # what kernelize does
        x_tp = x.clone().requires_grad_()
        y = tp(x_tp)
        ran = k.last_backend("geglu_mlp")
        y.backward(dy)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x_tp.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
        lo, hi = rank * (i // world), (rank + 1) * (i // world)
        torch.testing.assert_close(tp.gate_proj.weight.grad.to_local(), ref.gate_proj.weight.grad[lo:hi], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tp.up_proj.weight.grad.to_local(), ref.up_proj.weight.grad[lo:hi], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tp.down_proj.weight.grad.to_local(), ref.down_proj.weight.grad[:, lo:hi], rtol=1e-5, atol=1e-5)
        if bias:
            torch.testing.assert_close(tp.gate_proj.bias.grad.to_local(), ref.gate_proj.bias.grad[lo:hi], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(tp.down_proj.bias.grad.to_local(), ref.down_proj.bias.grad, rtol=1e-5, atol=1e-5)
        Path(result_dir, f"rank{rank}").write_text(f"ok {ran}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_two_rank_tensor_parallel_mlp_matches_unsharded(kernel, tmp_path, bias):
    world = 2
    mp.spawn(_worker, args=(world, _free_port(), bias, str(tmp_path)), nprocs=world, join=True)
    for rank in range(world):
        status = (tmp_path / f"rank{rank}").read_text()
        # the fused path ran (a backend was recorded), not the host's unfused fallback
        assert status.startswith("ok ") and status != "ok None", status
