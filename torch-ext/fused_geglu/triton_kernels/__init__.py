"""Triton kernels of fused-geglu. Launchers take validated tensors and fill the given outputs.

geglu.geglu_fwd / geglu_bwd          pointwise GeGLU (erf or tanh GELU)
linear.linear_fwd / linear_bwd_*     GEMM with bias / GELU epilogue, dgrad with fused gelu', wgrad with fused bias grad
mlp.gateup_fwd / dh_bwd              gate+up GEMM with GeGLU epilogue; dh GEMM with dGeGLU epilogue
configs                              launch configs as data (configs_sm90.json), tune.py writes them
"""

from .configs import KernelConfig, get_config
from .geglu import geglu_bwd, geglu_fwd
from .linear import linear_bwd_input, linear_bwd_weight, linear_fwd
from .mlp import dh_bwd, gateup_fwd

__all__ = [
    "KernelConfig",
    "get_config",
    "geglu_fwd",
    "geglu_bwd",
    "linear_fwd",
    "linear_bwd_input",
    "linear_bwd_weight",
    "gateup_fwd",
    "dh_bwd",
]
