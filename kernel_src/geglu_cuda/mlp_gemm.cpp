// The MLP's cuBLAS + pointwise sequences, each in one op call (host code only: ATen's GEMMs, which
// are cuBLAS on CUDA tensors, around the GeGLU kernels of geglu_cuda.cu).
//
// Why in C++: at decode sizes and in small training steps the GPU waits on the host, and issuing the
// same sequence from Python costs the interpreter and the op dispatcher's argument parsing once per
// op. Each function issues exactly the kernels, in exactly the order, of the Python sequence it
// replaces in fused_geglu/mlp.py (the GPU tests compare the bits), so the choice between them is host
// time only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>

#include <tuple>

#include "torch_binding.h"

at::Tensor geglu_mlp_gemm(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                          at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                          std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                          int64_t approximate) {
  TORCH_CHECK(x.dim() == 2, "geglu_mlp_gemm: x must be 2-D [M, H], got ", x.sizes());
  at::Tensor gate = at::linear(x, w_gate, b_gate);
  const at::Tensor up = at::linear(x, w_up, b_up);
  geglu_fwd(gate, gate, up, approximate);  // h over gate: gate is dead once h exists
  return at::linear(gate, w_down, b_down);
}

// geglu_mlp_gemm_train lives in kernel_src/autograd_nodes/mlp_train.cpp: both variants build it
// (the CPU variant as its compiled training node's forward). So do check_bwd_operands and
// geglu_mlp_bwd_gemms (the backward's GEMMs after its pointwise step), which both variants' backwards share.

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
geglu_mlp_gemm_bwd_owned(at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate,
                         at::Tensor const &w_up, at::Tensor const &w_down, at::Tensor gate, at::Tensor up,
                         bool keep, int64_t approximate, bool has_b_gate, bool has_b_up, bool has_b_down) {
  check_bwd_operands(keep ? "geglu_mlp_gemm_bwd_keep" : "geglu_mlp_gemm_bwd", dy, x, gate, up);
  at::Tensor hid = at::mm(dy, w_down);  // dh [M, I]
  at::Tensor dgate, dup;
  if (keep) {
    dgate = at::empty_like(gate);
    dup = at::empty_like(up);
    geglu_bwd_h(dgate, dup, hid, gate, up, approximate);  // hid <- h
  } else {
    geglu_bwd_inplace(gate, up, hid, approximate);  // gate <- dgate, up <- dup, hid <- h
    dgate = std::move(gate);
    dup = std::move(up);
  }
  gate.reset();  // dgate/dup hold what is still needed (the same buffers in place)
  up.reset();
  return geglu_mlp_bwd_gemms(dy, x, w_gate, w_up, std::move(hid), std::move(dgate), std::move(dup), has_b_gate,
                             has_b_up, has_b_down);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
geglu_mlp_gemm_bwd(at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate,
                   at::Tensor const &w_up, at::Tensor const &w_down, at::Tensor &gate, at::Tensor &up,
                   int64_t approximate, bool has_b_gate, bool has_b_up, bool has_b_down) {
  return geglu_mlp_gemm_bwd_owned(dy, x, w_gate, w_up, w_down, gate, up, /*keep=*/false, approximate, has_b_gate,
                                  has_b_up, has_b_down);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
geglu_mlp_gemm_bwd_keep(at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate,
                        at::Tensor const &w_up, at::Tensor const &w_down, at::Tensor const &gate,
                        at::Tensor const &up, int64_t approximate, bool has_b_gate, bool has_b_up,
                        bool has_b_down) {
  return geglu_mlp_gemm_bwd_owned(dy, x, w_gate, w_up, w_down, gate, up, /*keep=*/true, approximate, has_b_gate,
                                  has_b_up, has_b_down);
}
