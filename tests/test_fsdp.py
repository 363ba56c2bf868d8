"""FSDP2 (``fully_shard``) training of a kernelized Gemma: CPU processes over gloo.

fully_shard keeps parameters as ``Shard(0)`` DTensors between steps and all-gathers them into plain
Parameters for forward, where the kernel layer reads them. Until 2026-12-05 kernelize after fully_shard
refused every MLP (the shards looked like tensor parallelism) and did not see MLPs that were themselves
fully_shard units (their class is ``FSDP<Class>``): the model trained on eager's path. Here, in both
orders of kernelize and fully_shard, per decoder layer and per MLP, with HSDP's 2-D mesh, with bf16
mixed precision, with a float64 model computed in float32 and with each sharded decoder layer compiled,
the fused MLP runs in every step (its autograd node is in the graph; compiled, its ops are in the
profile) and the losses and the gradients of two SGD steps are within twice the error of the same
sharded model without the kernel, against the unsharded model in float64.

fully_shard over tensor-parallel weights: transformers' native loading (``DistributedConfig(fsdp_size=2,
tp_size=2)``, four ranks) runs the fused tensor-parallel MLP on each rank's gathered shards; torch's
``parallelize_module`` (forward hooks on the projections) is refused and trains on the host's path.

ModernBERT (one packed ``Wi``, the ``PackedGeGLUMLP`` layer on views of the gathered parameter), fully_shard per
layer then kernelize: fused in every step, the losses and the Wi / Wo gradients within twice the error of the
sharded model without the kernel.

DistributedDataParallel, kernelized before or after wrapping, in the same two-rank processes: fused in every
step, within twice the error of DDP without the kernel (first run 2026-12-05; nothing needed changing).

The cases of one world size share one set of processes (process start-up is most of the cost on two cores).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from test_tensor_parallel import _exit_now, _free_port

HERE = Path(__file__).resolve().parent
pytest.importorskip("transformers")
if not hasattr(torch.distributed, "is_available") or not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available in this build", allow_module_level=True)

# name -> (kernelize before fully_shard, fully_shard each MLP too, mesh, mixed precision, torch.compile
#          each decoder layer after sharding). Mixed precision: None; "bf16" (float32 model, bf16 params in
#          forward); "f64-as-f32" (a float64 model computed in float32: the dtype the kernels take only
#          after FSDP's cast, which a kernelize before the first step must read from the policy).
CASES = {
    "layers-after": (False, False, "fsdp", None, False),
    "layers-before": (True, False, "fsdp", None, False),
    "mlp-units-after": (False, True, "fsdp", None, False),
    "mlp-units-before": (True, True, "fsdp", None, False),
    "hsdp-after": (False, False, "hsdp", None, False),
    "bf16-after": (False, False, "fsdp", "bf16", False),
    "f64-as-f32-after": (False, False, "fsdp", "f64-as-f32", False),
    "compiled-layers-after": (False, False, "fsdp", None, True),
}
STEPS = 2


def _fused_nodes(loss: torch.Tensor) -> int:
    """Autograd nodes of the fused MLP (C++ node or Python Function) in ``loss``'s graph (a compiled
    graph is one node of its own: see _fused_op_calls)."""
    seen, stack, count = set(), [loss.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += "geglu" in node.name().lower()
        stack.extend(fn for fn, _ in node.next_functions)
    return count


def _gemma(seed: int, precision=None):
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(seed)
    cfg = GemmaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                      initializer_range=0.5)
    model = GemmaForCausalLM(cfg).train()
    return model.double() if precision == "f64-as-f32" else model


def _modernbert(seed: int):
    """ModernBERT (one packed Wi per MLP, the PackedGeGLUMLP layer) as a masked LM of the same size."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    torch.manual_seed(seed)
    cfg = ModernBertConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, cls_token_id=1, sep_token_id=2, initializer_range=0.5)
    return ModernBertForMaskedLM(cfg).train()


def _mlp_weights(mlp):
    """The MLP's projection weights: gate/up/down, or ModernBERT's packed Wi and Wo."""
    names = ("Wi", "Wo") if hasattr(mlp, "Wi") else ("gate_proj", "up_proj", "down_proj")
    return [getattr(mlp, n).weight for n in names]


def _shard(model, mesh, per_mlp: bool, precision, compiled: bool = False):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = {None: MixedPrecisionPolicy(),
              "bf16": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
              "f64-as-f32": MixedPrecisionPolicy(param_dtype=torch.float32)}[precision]
    for layer in model.model.layers:
        if per_mlp:
            fully_shard(layer.mlp, mesh=mesh, mp_policy=policy)
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return _compile_layers(model) if compiled else model


def _compile_layers(model):
    for layer in model.model.layers:
        layer.compile()
    return model


def _fused_op_calls(prof) -> int:
    """MLPs a compiled step ran fused: calls of the kernel's MLP forward ops in a profile (the CPU
    variant's graph calls ``geglu_mlp_train_fwd`` once per MLP, then ``geglu_mlp_gemm_bwd_keep``)."""
    return sum(1 for e in prof.events() if "fused_geglu" in e.name and "::geglu_mlp" in e.name and "fwd" in e.name)


def _train(model, ids, steps: int = STEPS, compiled: bool = False):
    """Losses, fused-node counts (compiled: calls of the MLP ops) and the layer-0 MLP gradients of
    ``steps`` SGD steps."""
    from torch.distributed.tensor import DTensor
    from torch.profiler import ProfilerActivity, profile

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, nodes, grads = [], [], []
    for _ in range(steps):
        if compiled:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            nodes.append(_fused_op_calls(prof))
        else:
            loss = model(input_ids=ids, labels=ids).loss
            nodes.append(_fused_nodes(loss))
            loss.backward()
        losses.append(loss.detach())  # float32 (also under the bf16 policy: logits are upcast), the reference float64
        mlp = getattr(model, "module", model).model.layers[0].mlp  # DistributedDataParallel wraps the model
        grads.append([(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                      for p in _mlp_weights(mlp)])
        opt.step()
        opt.zero_grad()
    return torch.stack(losses), nodes, grads


def _worker(rank: int, world: int, port: int, result_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="")
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "src"))
    import torch.distributed as dist
    from kernels import Mode
    from torch.distributed.device_mesh import init_device_mesh

    import _numerics
    from fused_geglu_tools.transformers import kernelize

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
        # The reference: the unsharded eager model in float64. Each case is held to the project's rule
        # against it: at most twice the error of the eager model under the same fully_shard and policy.
        ref_losses, _, ref_grads = _train(_gemma(0).double(), ids)
        for name, (before, per_mlp, mesh_kind, precision, compiled) in CASES.items():
            mesh = init_device_mesh("cpu", (world,)) if mesh_kind == "fsdp" else \
                init_device_mesh("cpu", (1, world), mesh_dim_names=("replicate", "shard"))
            model = _gemma(0, precision)
            mode = Mode.TRAINING | Mode.TORCH_COMPILE if compiled else Mode.TRAINING
            report = kernelize(model, mode=mode, device="cpu", source="hub") if before else None
            _shard(model, mesh, per_mlp, precision, compiled=False)
            if not before:
                report = kernelize(model, mode=mode, device="cpu", source="hub")
            assert report.replaced_count == 2 and not report.refused, f"{name}: {report}"
            if compiled:
                _compile_layers(model)
            losses, nodes, grads = _train(model, ids, compiled=compiled)
            if compiled:  # the first step also traces the graph, which calls the ops on fake tensors
                nodes[0] = min(nodes[0], 2)
            assert nodes == [2] * STEPS, f"{name}: fused MLP nodes per step {nodes} (2 layers)"
            eager_losses, eager_nodes, eager_grads = _train(_shard(_gemma(0, precision), mesh, per_mlp, precision, compiled), ids,
                                                            compiled=compiled)
            assert eager_nodes == [0] * STEPS
            # A float64 model computed in float32 has float64 gradients of float32 values: judged as float32.
            as32 = (lambda t: t.float()) if precision == "f64-as-f32" else (lambda t: t)
            _numerics.assert_close(as32(losses), ref_losses, as32(eager_losses), what=f"{name} losses", model=True)
            # Under the bf16 policy the first SGD step (lr 0.5) already moves eager's second-step
            # gradients 100 % away from float64's: only the first step's are a measure there.
            for step in range(1 if precision == "bf16" else STEPS):
                for proj, got, want, eager in zip(("gate", "up", "down"), grads[step], ref_grads[step],
                                                  eager_grads[step]):
                    _numerics.assert_close(as32(got), want, as32(eager), what=f"{name} step {step} {proj}_proj gradient",
                                           model=True)

        # ModernBERT's packed Wi, fully_shard per layer then kernelize: the layer splits the gathered Wi into views,
        # and their gradients reach the one sharded parameter.
        mesh = init_device_mesh("cpu", (world,))
        model = _shard(_modernbert(0), mesh, False, None)
        report = kernelize(model, mode=Mode.TRAINING, device="cpu", source="hub")
        assert report.count("ModernBertMLP") == 2 and not report.refused, f"modernbert: {report}"
        losses, nodes, grads = _train(model, ids)
        assert nodes == [2] * STEPS, f"modernbert: fused MLP nodes per step {nodes} (2 layers)"
        eager_losses, eager_nodes, eager_grads = _train(_shard(_modernbert(0), mesh, False, None), ids)
        assert eager_nodes == [0] * STEPS
        mb_losses, _, mb_grads = _train(_modernbert(0).double(), ids)
        _numerics.assert_close(losses, mb_losses, eager_losses, what="modernbert losses", model=True)
        for step in range(STEPS):
            for proj, got, want, eager in zip(("Wi", "Wo"), grads[step], mb_grads[step], eager_grads[step]):
                _numerics.assert_close(got, want, eager, what=f"modernbert step {step} {proj} gradient", model=True)

        # DistributedDataParallel (its gradient all-reduce runs in autograd hooks on the parameters, which the
        # kernel's nodes feed like any other): kernelized before or after wrapping, it trains fused and within
        # twice the error of DDP without the kernel.
        from torch.nn.parallel import DistributedDataParallel

        for before in (True, False):
            name = f"ddp, kernelize {'before' if before else 'after'} wrapping"
            model = _gemma(0)
            report = kernelize(model, mode=Mode.TRAINING, device="cpu", source="hub") if before else None
            model = DistributedDataParallel(model)
            if not before:
                report = kernelize(model, mode=Mode.TRAINING, device="cpu", source="hub")
            assert report.replaced_count == 2 and not report.refused, f"{name}: {report}"
            losses, nodes, grads = _train(model, ids)
            assert nodes == [2] * STEPS, f"{name}: fused MLP nodes per step {nodes} (2 layers)"
            eager_losses, eager_nodes, eager_grads = _train(DistributedDataParallel(_gemma(0)), ids)
            assert eager_nodes == [0] * STEPS
            _numerics.assert_close(losses, ref_losses, eager_losses, what=f"{name} losses", model=True)
            for step in range(STEPS):
                for proj, got, want, eager in zip(("gate", "up", "down"), grads[step], ref_grads[step], eager_grads[step]):
                    _numerics.assert_close(got, want, eager, what=f"{name} step {step} {proj}_proj gradient", model=True)

        # fully_shard over weights torch's parallelize_module made tensor-parallel: its forward hooks on the
        # projections (which the layer would skip) refuse the MLP; the host's path trains as eager.
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh2 = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
        model = _gemma(0)
        for layer in model.model.layers:
            parallelize_module(layer.mlp, mesh2["tp"], {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(),
                                                         "down_proj": RowwiseParallel()})
        _shard(model, mesh2["dp"], False, None)
        report = kernelize(model, mode=Mode.TRAINING, device="cpu", source="hub")
        assert report.replaced_count == 0 and "forward hooks" in str(report), str(report)
        losses, nodes, _ = _train(model, ids)
        assert nodes == [0] * STEPS
        torch.testing.assert_close(losses, ref_losses.float(), rtol=1e-5, atol=1e-6)
        Path(result_dir, f"rank{rank}").write_text("ok")
    finally:
        dist.destroy_process_group()
    _exit_now()


def test_fsdp2_kernelized_gemma_trains_fused_and_matches_eager(kernel, tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    assert all((tmp_path / f"rank{r}").read_text() == "ok" for r in range(2))


def test_fsdp_class_unwrapping_and_lookups_are_narrow():
    """Only fully_shard's generated ``FSDP<Class>`` (bases ``(FSDPModule, Class)``) maps back to its class;
    a user's class that merely starts with "FSDP", or derives from a family class, stays itself; a
    tensor fully_shard does not manage has no gathered form."""
    from torch import nn
    from torch.distributed.fsdp import FSDPModule

    from fused_geglu_tools.hf import fsdp

    class GemmaLikeMLP(nn.Module):
        pass

    generated = type("FSDPGemmaLikeMLP", (FSDPModule, GemmaLikeMLP), {})
    assert fsdp.original_class(generated) is GemmaLikeMLP
    assert fsdp.original_class(type("FSDPGemmaLikeMLP", (GemmaLikeMLP,), {})) is not GemmaLikeMLP
    assert fsdp.original_class(type("Other", (FSDPModule, GemmaLikeMLP), {})).__name__ == "Other"
    assert fsdp.original_class(nn.Linear) is nn.Linear
    assert fsdp.gathered(nn.Linear(2, 2), "weight") is None and fsdp.gathered(nn.Linear(2, 2, bias=False), "bias") is None
    assert not fsdp.managed(nn.Linear(2, 2))


def test_gathered_dtype_reads_the_mixed_precision_policy_where_each_torch_keeps_it(monkeypatch):
    """The dtype a shard is gathered in comes from the MixedPrecisionPolicy: on the param group up to torch
    2.14, on each FSDPParam (resolved per parameter) from 2.15, whose groups have none. Reading only the
    group's refused a float64 model computed in float32 on torch 2.15 (the "f64-as-f32-after" case above
    failed there). Fakes of both layouts, so that CI's torch checks the one it does not run."""
    from types import SimpleNamespace

    from torch import nn

    from fused_geglu_tools.hf import fsdp

    lin = nn.Linear(2, 2).double()
    f32 = SimpleNamespace(param_dtype=torch.float32)
    layouts = {
        "group policy (torch <= 2.14)": (SimpleNamespace(param_dtype=None, is_dtensor=False), SimpleNamespace(mp_policy=f32)),
        "param policy (torch 2.15)": (SimpleNamespace(param_dtype=None, is_dtensor=False, mp_policy=f32), SimpleNamespace()),
        "lazy-init param_dtype": (SimpleNamespace(param_dtype=torch.float32, is_dtensor=False), SimpleNamespace()),
        "no cast": (SimpleNamespace(param_dtype=None, is_dtensor=False, mp_policy=SimpleNamespace(param_dtype=None)),
                    SimpleNamespace()),
    }
    monkeypatch.setattr(fsdp, "_is_dtensor", lambda t: True)
    for what, (fp, group) in layouts.items():
        fp.sharded_param = lin.weight
        monkeypatch.setattr(fsdp, "_fsdp_params", lambda fp=fp, group=group: iter([(fp, group)]))
        want = torch.float64 if what == "no cast" else torch.float32
        assert fsdp.gathered(lin, "weight") == fsdp.Gathered(dtype=want, dtensor=False), what
        assert fsdp.gathered(lin, "bias") is None, what  # not that FSDPParam's parameter


def _fsdp_tp_worker(rank: int, world: int, port: int, model_dir: str, result_dir: str) -> None:
    """transformers' native FSDP2 + tensor parallelism (fsdp 2 x tp 2), then kernelize."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), CUDA_VISIBLE_DEVICES="")
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "src"))
    import torch.distributed as dist
    from kernels import Mode
    from transformers import GemmaForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig

    import _numerics
    from fused_geglu_tools.transformers import kernelize

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
        ref_losses, _, ref_grads = _train(GemmaForCausalLM.from_pretrained(model_dir).double().train(), ids)
        config = DistributedConfig(fsdp_size=2, tp_size=2)
        model = GemmaForCausalLM.from_pretrained(model_dir, distributed_config=config).train()
        report = kernelize(model, mode=Mode.TRAINING, device="cpu", source="hub")
        assert report.replaced_count == 2 and not report.refused, str(report)
        losses, nodes, grads = _train(model, ids)
        assert nodes == [2] * STEPS, f"fused MLP nodes per step {nodes}"
        eager = GemmaForCausalLM.from_pretrained(model_dir, distributed_config=config).train()
        eager_losses, eager_nodes, eager_grads = _train(eager, ids)
        assert eager_nodes == [0] * STEPS
        _numerics.assert_close(losses, ref_losses, eager_losses, what="fsdp+tp losses", model=True)
        for step in range(STEPS):
            for proj, got, want, e in zip(("gate", "up", "down"), grads[step], ref_grads[step], eager_grads[step]):
                _numerics.assert_close(got, want, e, what=f"fsdp+tp step {step} {proj}_proj gradient", model=True)
        Path(result_dir, f"rank{rank}").write_text("ok")
    finally:
        dist.destroy_process_group()
    _exit_now()


def test_transformers_fsdp_tp_kernelized_gemma_trains_fused(kernel, tmp_path):
    """Four CPU ranks: a 2 x 2 (fsdp x tp) mesh, as transformers' own ``DistributedConfig`` loads it. Between
    steps each weight is a DTensor on the 2-D mesh; in forward, fully_shard hands the layer the tensor-parallel
    shard (column/column/row-wise on the tp mesh), which it runs fused with one all-reduce. kernelize judges
    that gathered form (before 2026-12-05 it refused the MLPs)."""
    pytest.importorskip("transformers.distributed.configuration_utils")
    _gemma(0).save_pretrained(tmp_path / "model")
    mp.spawn(_fsdp_tp_worker, args=(4, _free_port(), str(tmp_path / "model"), str(tmp_path)), nprocs=4, join=True)
    assert all((tmp_path / f"rank{r}").read_text() == "ok" for r in range(4))
