"""The transformers classes fused-geglu can stand in for, and when it must not.

Each :class:`Family` names one class by module and class name (looked up in the installed
transformers, never imported here eagerly), the kernel layer that replaces its ``forward``, and
what its instances must look like for the fused kernel to compute exactly what the class does.
:func:`refusal` turns that into a reason string (or ``None``), which is the ``condition`` given to
``kernels.replace_kernel_forward_from_hub`` and also what the kernelize report prints.

The checks mirror the kernel's own per-call guard (``layers.py`` of the kernel): a GELU flavour
it recognises by class name, plain dense ``nn.Linear`` weights on one dtype and device. The
layer would fall back to the host's math for anything else; refusing up front keeps the report
honest. Gemma3n's activation sparsity is refused here too, and dropout active in training in the middle of a
Gemma-style MLP whose class is not one the layer knows the order of (:data:`DROPOUT_BEFORE_DOWN`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from . import fsdp

# Kernel-mapping names. Unique on purpose: transformers' default mapping already uses
# "GeGLUMLP" (-> Liger) and "Linear" (-> LigerLinear in training).
GEGLU_MLP = "FusedGeGLUMLP"
T5_GEGLU_DENSE = "FusedT5GeGLUDense"
PACKED_GEGLU_MLP = "FusedPackedGeGLUMLP"
LINEAR_BIAS = "FusedLinearBias"

# Mapping name -> class name inside the kernel's ``layers``.
KERNEL_LAYERS: dict[str, str] = {
    GEGLU_MLP: "GeGLUMLP",
    T5_GEGLU_DENSE: "T5GeGLUDense",
    PACKED_GEGLU_MLP: "PackedGeGLUMLP",
    LINEAR_BIAS: "LinearBias",
}

Kind = Literal["gate_up_down", "t5", "packed"]

# Same classification as the kernel's ``layers.gelu_approximation`` (by class name, because the
# kernel cannot import transformers). All tanh-form GELUs are one function,
# 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))). AccurateGELUActivation is left out because the
# kernel does not recognise it (it would run the host math); QuickGELU / ClippedGELU are not GELU.
_TANH_GELU_CLASSES = frozenset({"GELUTanh", "PytorchGELUTanh", "GELUPytorchTanh", "NewGELUActivation",
                                "FastGELUActivation"})
_EXACT_GELU_CLASSES = frozenset({"GELUActivation"})
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Gemma-style classes whose dropout sits between the GeGLU and down_proj: the kernel's GeGLUMLP runs it there
# (the host's projections, the fused GeGLU, the host's dropout and down_proj) when it is active in training.
# The same set as the kernel's ``layers._DROPOUT_BEFORE_DOWN`` (a test compares them).
DROPOUT_BEFORE_DOWN = frozenset({"T5GemmaMLP", "T5Gemma2MLP", "GteMLP"})


@dataclass(frozen=True)
class Family:
    """One transformers class whose ``forward`` a fused-geglu layer can replace."""

    key: str  # short family name, e.g. "gemma2"
    module: str  # modeling module, e.g. "transformers.models.gemma2.modeling_gemma2"
    class_name: str  # e.g. "Gemma2MLP"
    kind: Kind  # attribute layout: gate_proj/up_proj/down_proj + act_fn, wi_0/wi_1/wo + act, or Wi/Wo + act
    where: str  # where instances sit in the model (documentation only)
    notes: str = ""
    # T5-style only: whether the class casts the GeGLU product to wo's dtype (T5 keeps wo in fp32).
    casts_to_wo_dtype: bool = True

    @property
    def layer(self) -> str:
        """Kernel-mapping name this family is marked with."""
        return {"gate_up_down": GEGLU_MLP, "t5": T5_GEGLU_DENSE, "packed": PACKED_GEGLU_MLP}[self.kind]

    @property
    def attrs(self) -> tuple[str, ...]:
        return {"gate_up_down": ("gate_proj", "up_proj", "down_proj", "act_fn"),
                "t5": ("wi_0", "wi_1", "wo", "act", "dropout"),
                "packed": ("Wi", "Wo", "act", "drop")}[self.kind]


def _gud(key: str, pkg: str, cls: str, where: str = "model.layers[i].mlp", notes: str = "") -> Family:
    return Family(key, f"transformers.models.{pkg}.modeling_{pkg}", cls, "gate_up_down", where, notes)


def _t5(key: str, pkg: str, cls: str, where: str = "…layer[-1].DenseReluDense", notes: str = "",
        casts: bool = True) -> Family:
    return Family(key, f"transformers.models.{pkg}.modeling_{pkg}", cls, "t5", where, notes, casts)


FAMILIES: tuple[Family, ...] = (
    _gud("gemma", "gemma", "GemmaMLP", notes="tanh GELU; exact GELU for old `hidden_act='gelu'` configs"),
    _gud("gemma2", "gemma2", "Gemma2MLP"),
    _gud("gemma3", "gemma3", "Gemma3MLP", notes="text model, also the LM of Gemma3ForConditionalGeneration"),
    _gud("gemma3n", "gemma3n", "Gemma3nTextMLP", notes="refused where activation_sparsity > 0"),
    _gud("gemma4", "gemma4", "Gemma4TextMLP", notes="doubled intermediate on KV-shared layers (width read per instance)"),
    _gud("gemma4_unified", "gemma4_unified", "Gemma4UnifiedTextMLP"),
    _gud("vaultgemma", "vaultgemma", "VaultGemmaMLP"),
    _gud("embedding_gemma2", "embedding_gemma2", "EmbeddingGemma2MLP"),
    _gud("diffusion_gemma", "diffusion_gemma", "DiffusionGemmaText4MLP"),
    _gud("t5gemma", "t5gemma", "T5GemmaMLP", "encoder/decoder.layers[i].mlp",
         notes="dropout between GeGLU and down_proj, run by the layer in training"),
    _gud("t5gemma2", "t5gemma2", "T5Gemma2MLP", "encoder/decoder.layers[i].mlp",
         notes="dropout between GeGLU and down_proj, run by the layer in training"),
    _gud("recurrent_gemma", "recurrent_gemma", "RecurrentGemmaMlp", "model.layers[i].mlp_block",
         notes="biases on all three projections; width intermediate_size // 2"),
    _gud("pixtral", "pixtral", "PixtralMLP", "transformer.layers[i].feed_forward", notes="exact GELU"),
    _gud("dinov3_vit", "dinov3_vit", "DINOv3ViTGatedMLP", "layer[i].mlp",
         notes="exact GELU, optional biases (config.use_gated_mlp)"),
    _gud("eomt_dinov3", "eomt_dinov3", "EomtDinov3GatedMLP", "layers[i].mlp", notes="exact GELU, optional biases"),
    _gud("gte", "gte", "GteMLP", "layers[i].mlp",
         notes="exact GELU; biased down_proj; dropout between GeGLU and down_proj, run by the layer in training"),
    _gud("zamba", "zamba", "ZambaMLP", "model.layers[i].shared_transf.feed_forward", notes="exact GELU"),
    _gud("pi05", "pi05", "PI05MLP", "model.dit.layers[i].mlp",
         notes="the π0.5 policy's Gemma action expert (transformers 5.25+); its PaliGemma LM is the gemma family"),
    _t5("t5", "t5", "T5DenseGatedActDense", notes="feed_forward_proj='gated-gelu'; wo kept in fp32"),
    _t5("mt5", "mt5", "MT5DenseGatedActDense", notes="wo kept in fp32"),
    _t5("umt5", "umt5", "UMT5DenseGatedActDense", notes="wo kept in fp32"),
    _t5("longt5", "longt5", "LongT5DenseGatedActDense",
        notes="does not cast to wo's dtype: refused when wo's dtype differs", casts=False),
    _t5("udop", "udop", "UdopDenseGatedActDense", notes="wo kept in fp32"),
    _t5("pop2piano", "pop2piano", "Pop2PianoDenseGatedActDense", notes="wo kept in fp32"),
    _t5("pix2struct_text", "pix2struct", "Pix2StructTextDenseGatedActDense", "decoder.layer[i].mlp.DenseReluDense"),
    _t5("pix2struct_vision", "pix2struct", "Pix2StructVisionMlp", "encoder.layer[i].mlp"),
    _t5("kosmos2_5_vision", "kosmos2_5", "Kosmos2_5VisionMlp", "vision_model.encoder.layer[i].mlp",
        notes="Kosmos-2.5's vision encoder (Pix2Struct's): tanh GELU ('gelu_new'), wo kept in fp32"),
    Family("modernbert", "transformers.models.modernbert.modeling_modernbert", "ModernBertMLP", "packed",
           "model.layers[i].mlp", "one packed Wi (GELU on its first half); exact GELU; optional biases"),
    Family("modernbert_decoder", "transformers.models.modernbert_decoder.modeling_modernbert_decoder",
           "ModernBertDecoderMLP", "packed", "model.layers[i].mlp", "as ModernBERT"),
)

FAMILIES_BY_CLASS: dict[tuple[str, str], Family] = {(f.module, f.class_name): f for f in FAMILIES}


def family_of(cls: type) -> Family | None:
    """The family of exactly this class (subclasses are not families of their parents)."""
    return FAMILIES_BY_CLASS.get((cls.__module__, cls.__name__))


def gelu_approximate(act: object) -> Literal["none", "tanh"] | None:
    """``"none"`` (erf) / ``"tanh"`` if ``act`` is exactly a GELU of that flavour, else ``None``."""
    if isinstance(act, nn.GELU):
        return act.approximate if act.approximate in ("none", "tanh") else None
    name = type(act).__name__
    if name in _TANH_GELU_CLASSES:
        return "tanh"
    if name in _EXACT_GELU_CLASSES:
        return "none"
    return None


# --- reasons ------------------------------------------------------------------------------------

def _hooked(module: nn.Module) -> bool:
    """Hooks the kernel would bypass: it reads weights directly instead of calling the module."""
    return bool(module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook"))


def _in_forward(lin: nn.Module, name: str) -> tuple[type, torch.dtype]:
    """The type and dtype the module's forward will see for ``lin``'s parameter ``name``: an FSDP2 shard
    is all-gathered into a plain Parameter (of the mixed-precision ``param_dtype`` if one is set)."""
    t = getattr(lin, name)
    g = fsdp.gathered(lin, name)
    return (type(t), t.dtype) if g is None or g.dtensor else (nn.Parameter, g.dtype)


def _dense_reason(name: str, lin: object) -> str | None:
    if type(lin) is not nn.Linear:
        return f"{name} is {type(lin).__name__}, not a plain nn.Linear (quantised, sharded or adapter-wrapped)"
    w = lin.weight
    wtype, wdtype = _in_forward(lin, "weight")
    if wtype not in (torch.Tensor, nn.Parameter):
        if fsdp.managed(lin):
            return (f"{name}.weight is an FSDP2 shard of a tensor-parallel DTensor (fully_shard on a 2-D mesh) "
                    "outside the gate/up/down layout the kernel layer runs" if fsdp.gathered(lin, "weight") is not None else
                    f"{name}.weight is an FSDP2 shard this torch does not describe; kernelize before fully_shard")
        return f"{name}.weight is a {wtype.__name__} tensor subclass"
    if wdtype not in _FLOAT_DTYPES:
        return f"{name}.weight is {wdtype}; the kernel takes float32, float16 or bfloat16"
    if w.device.type == "meta":
        return f"{name}.weight is on the meta device (offloaded or not materialised)"
    if lin.bias is not None and _in_forward(lin, "bias")[1] != wdtype:
        return f"{name}.bias is {_in_forward(lin, 'bias')[1]} but its weight is {wdtype}"
    if _hooked(lin):
        return f"{name} has forward hooks, which the fused kernel would skip"
    return None


def _same_dtype_device(names: tuple[str, ...], lins: tuple[nn.Linear, ...]) -> str | None:
    ref = lins[0].weight
    ref_dtype = _in_forward(lins[0], "weight")[1]
    for name, lin in zip(names[1:], lins[1:]):
        dtype = _in_forward(lin, "weight")[1]
        if dtype != ref_dtype or lin.weight.device != ref.device:
            return (f"{name} is {dtype} on {lin.weight.device} but {names[0]} is "
                    f"{ref_dtype} on {ref.device}")
    return None


def _linears_reason(module: nn.Module, names: tuple[str, ...]) -> str | None:
    lins = []
    for name in names:
        lin = getattr(module, name, None)
        reason = _dense_reason(name, lin)
        if reason:
            return reason
        lins.append(lin)
    return _same_dtype_device(names, tuple(lins))


def _activation_reason(module: nn.Module, attr: str) -> str | None:
    act = getattr(module, attr, None)
    if gelu_approximate(act) is None:
        return f"activation {attr}={type(act).__name__} is not a GELU the kernel recognises"
    if _hooked(act):
        return f"activation {attr} has forward hooks, which the fused kernel would skip"
    return None


def _dropout_hooks_reason(module: nn.Module, attr: str = "dropout") -> str | None:
    """A hooked dropout between GeGLU and the down projection: the fused op never calls it (any mode)."""
    dropout = getattr(module, attr, None)
    if isinstance(dropout, nn.Module) and _hooked(dropout):
        return f"{attr} has forward hooks, which the fused kernel would skip"
    return None


def _dropout_p(module: nn.Module) -> float:
    dropout = getattr(module, "dropout", None)
    p = getattr(dropout, "p", 0.0)
    return float(p) if isinstance(p, (int, float)) else 0.0


def _tensor_parallel_layout(module: nn.Module) -> str | None:
    """None when gate/up/down are DTensors sharded column/column/row-wise on one 1-D mesh (the
    layout the kernel's GeGLUMLP runs on local shards, with one all-reduce); else a reason, or
    "" when the weights are not DTensors at all."""
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:
        return ""
    lins = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(lin) is nn.Linear for lin in lins):
        return ""
    weights = [lin.weight for lin in lins]
    if not any(isinstance(w, DTensor) for w in weights):
        return ""
    # (mesh, placements) of each weight and bias as forward sees it: an FSDP2 shard is gathered over the
    # data-parallel dims first (into a plain Parameter, or a DTensor that keeps its tensor-parallel spec).
    def layout(lin, name):
        t = getattr(lin, name)
        g = fsdp.gathered(lin, name)
        if g is None:
            return (t.device_mesh, t.placements) if isinstance(t, DTensor) else None
        return (g.mesh, g.placements) if g.dtensor else None

    if all(fsdp.managed(lin) for lin in lins):
        gathered = [fsdp.gathered(lin, "weight") for lin in lins]
        if not all(g is not None and g.dtensor and g.placements is not None for g in gathered):
            # Gathered into plain Parameters (checked as dense weights), or of a form this torch does not
            # describe, which _dense_reason refuses by name.
            return ""
    forms = [layout(lin, "weight") for lin in lins]
    if not all(f is not None for f in forms):
        return "some projections are DTensors and some are not"
    mesh = forms[0][0]
    if mesh is None or mesh.ndim != 1 or any(f[0] != mesh for f in forms):
        return "tensor-parallel weights on a mesh other than one 1-D mesh"
    if tuple(f[1] for f in forms) != ((Shard(0),), (Shard(0),), (Shard(1),)):
        return (f"tensor-parallel placements {[f[1] for f in forms]}; the kernel runs "
                "column/column/row-wise sharding")
    want = ((Shard(0),), (Shard(0),), (Replicate(),))
    for lin, placement in zip(lins, want):
        if lin.bias is not None and (layout(lin, "bias") is None or layout(lin, "bias")[1] != placement):
            return "tensor-parallel biases are not sharded like their weights"
    if any(_hooked(lin) for lin in lins):
        return "tensor-parallel projections with forward hooks, which the fused kernel would skip"
    return None


def _gate_up_down_reason(module: nn.Module) -> str | None:
    reason = _activation_reason(module, "act_fn") or _dropout_hooks_reason(module)
    if reason:
        return reason
    sparsity = getattr(module, "activation_sparsity", 0.0)
    if isinstance(sparsity, (int, float)) and sparsity > 0.0:
        return f"activation_sparsity={sparsity:g} (Gemma3n top-k gate) is not a plain GeGLU"
    if module.training and _dropout_p(module) > 0.0 and type(module).__name__ not in DROPOUT_BEFORE_DOWN:
        return (f"dropout p={_dropout_p(module):g} is active in training, at a place in {type(module).__name__}'s "
                "forward the kernel layer does not know")
    tp = _tensor_parallel_layout(module)
    if tp is None:
        return None  # tensor-parallel shards in the layout the kernel layer handles
    if tp:
        return tp
    return _linears_reason(module, ("gate_proj", "up_proj", "down_proj"))


def _t5_reason(module: nn.Module, family: Family) -> str | None:
    reason = _activation_reason(module, "act") or _dropout_hooks_reason(module)
    if reason:
        return reason
    if not isinstance(getattr(module, "dropout", None), nn.Module):
        return "has no dropout module"
    reason = _linears_reason(module, ("wi_0", "wi_1")) or _dense_reason("wo", getattr(module, "wo", None))
    if reason:
        return reason
    wo_dtype, wi_dtype = _in_forward(module.wo, "weight")[1], _in_forward(module.wi_0, "weight")[1]
    if not family.casts_to_wo_dtype and wo_dtype != wi_dtype:
        return (f"wo is {wo_dtype} but wi_0 is {wi_dtype}, and "
                f"{family.class_name} does not cast between them (the kernel layer would)")
    return None


def _packed_reason(module: nn.Module) -> str | None:
    """ModernBERT's MLP: ``Wo(drop(act(a) * b))`` with ``a, b = Wi(x).chunk(2, dim=-1)``. Dropout active in
    training is not refused: the layer then runs the host's Wi, drop and Wo around the fused GeGLU."""
    reason = _activation_reason(module, "act") or _dropout_hooks_reason(module, "drop")
    if reason:
        return reason
    reason = _linears_reason(module, ("Wi", "Wo"))
    if reason:
        return reason
    width, inner = module.Wi.out_features, module.Wo.in_features
    if width != 2 * inner:
        return f"Wi has {width} outputs, not twice Wo's {inner} inputs (a packed GeGLU's two halves)"
    return None


def _linear_bias_reason(module: nn.Module) -> str | None:
    if type(module) is not nn.Linear:
        # nn.Linear's marks are inherited by every subclass (bitsandbytes, peft, ...).
        return f"{type(module).__name__} is a subclass of nn.Linear"
    if module.bias is None:
        return "has no bias (only biased linears are replaced)"
    return _dense_reason("linear", module)


def refusal(module: nn.Module, family: Family | None = None) -> str | None:
    """Why the kernel would compute ``module`` differently from its class (``None``: it would not).

    ``family`` is the class's family; ``None`` means a plain ``nn.Linear`` (bias-epilogue layer).
    """
    if hasattr(module, "_hf_hook"):
        return "has an accelerate hook (device_map offloading), which wraps its forward"
    if family is None:
        return _linear_bias_reason(module)
    if family.kind == "gate_up_down":
        return _gate_up_down_reason(module)
    if family.kind == "packed":
        return _packed_reason(module)
    return _t5_reason(module, family)
