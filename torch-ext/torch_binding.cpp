// Registers the compiled ops in the kernel's unique namespace (TORCH_EXTENSION_NAME, which the
// builder sets to the ops id `_fused_geglu_<backend>_<uid>`). The Python package wraps these in
// its public custom ops (fused_geglu/ops/*.py); users never call them directly.
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("geglu_fwd(Tensor! out, Tensor gate, Tensor up, int approximate) -> ()");
  ops.def(
      "geglu_bwd(Tensor! grad_gate, Tensor! grad_up, Tensor grad_out, Tensor gate, Tensor up, "
      "int approximate) -> ()");
  // The training MLP whose autograd node is C++ (kernel_src/autograd_nodes). Only this variant's
  // Autograd key has a kernel: the Python wrapper calls it only when autograd records a graph.
  ops.def(
      "geglu_mlp_train(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor? b_gate, Tensor? b_up, "
      "Tensor? b_down, int approximate, int tile, int swizzle, int raster) -> Tensor");
  // A traced training step's forward and backward (kernel_src/autograd_nodes/mlp_train.cpp, and
  // kernel_src/geglu_cuda/mlp_gemm.cpp for the CUDA backward) and a traced inference forward
  // (kernel_src/autograd_nodes/mlp_infer.cpp): plain ops at the backend key, which a compiled graph
  // calls directly; fused_geglu/mlp.py gives them their fake kernels and the training forward's autograd.
  ops.def(
      "geglu_mlp_train_fwd(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor? b_gate, Tensor? b_up, "
      "Tensor? b_down, int approximate, int tile, int swizzle, int raster) -> (Tensor, Tensor, Tensor)");
  ops.def(
      "geglu_mlp_fwd_planned(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor? b_gate, Tensor? b_up, "
      "Tensor? b_down, int approximate, int tile, int swizzle, int raster) -> Tensor");
  ops.def(
      "geglu_mlp_gemm_bwd_keep(Tensor dy, Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor gate, "
      "Tensor up, int approximate, bool has_b_gate, bool has_b_up, bool has_b_down) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // The GeGLU pointwise forms with C++ autograd nodes (kernel_src/autograd_nodes/geglu_train.cpp), same rule.
  ops.def("geglu_train(Tensor gate, Tensor up, int approximate) -> Tensor");
  ops.def("geglu_packed_train(Tensor x, int approximate) -> Tensor");
  // Their forms for calls that record no graph (kernel_src/autograd_nodes/geglu_infer.cpp): the CPU /
  // CUDA key only; the Python wrapper calls them when no input needs a gradient.
  ops.def("geglu_infer(Tensor gate, Tensor up, int approximate) -> Tensor");
  ops.def("geglu_packed_infer(Tensor x, int approximate) -> Tensor");
  ops.def("geglu_packed_into(Tensor(a!) out, Tensor x, int approximate) -> ()");
  // The MLP's no-graph forward (kernel_src/autograd_nodes/mlp_infer.cpp): y, or None where the call is
  // not one it takes (the Python wrapper then takes its general path). Same launch arguments as
  // geglu_mlp_train. Registered at the variant's Autograd key (no boxed autograd fallback per call)
  // and at its backend key (reached under inference_mode); every other key declines.
  ops.def(
      "geglu_mlp_infer(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor? b_gate, Tensor? b_up, "
      "Tensor? b_down, int approximate, int tile, int swizzle, int raster) -> Tensor");
  ops.impl("geglu_mlp_infer", torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd,
                                              TORCH_FN(geglu_mlp_infer_decline)));
  // The casts of `linear` / `geglu_mlp` under torch.autocast, through autocast's weight cache
  // (kernel_src/autograd_nodes/autocast_cast.cpp): one implementation for every backend and key.
  ops.def("autocast_cast(Tensor?[] tensors, ScalarType dtype) -> Tensor?[]");
  ops.impl("autocast_cast", torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(autocast_cast)));
#if defined(CPU_KERNEL)
  ops.impl("geglu_fwd", c10::kCPU, &geglu_fwd);
  ops.impl("geglu_bwd", c10::kCPU, &geglu_bwd);
  ops.impl("geglu_mlp_train", torch::dispatch(c10::DispatchKey::AutogradCPU, TORCH_FN(geglu_mlp_train)));
  ops.impl("geglu_mlp_train_fwd", c10::kCPU, &geglu_mlp_train_fwd);
  ops.impl("geglu_mlp_gemm_bwd_keep", c10::kCPU, &geglu_mlp_gemm_bwd_keep);
  ops.impl("geglu_mlp_fwd_planned", c10::kCPU, &geglu_mlp_fwd_planned);
  ops.impl("geglu_train", torch::dispatch(c10::DispatchKey::AutogradCPU, TORCH_FN(geglu_train)));
  ops.impl("geglu_packed_train", torch::dispatch(c10::DispatchKey::AutogradCPU, TORCH_FN(geglu_packed_train)));
  ops.impl("geglu_infer", c10::kCPU, &geglu_infer);
  ops.impl("geglu_packed_infer", c10::kCPU, &geglu_packed_infer);
  ops.impl("geglu_packed_into", c10::kCPU, &geglu_packed_into);
  ops.impl("geglu_mlp_infer", torch::dispatch(c10::DispatchKey::AutogradCPU, TORCH_FN(geglu_mlp_infer)));
  ops.impl("geglu_mlp_infer", c10::kCPU, &geglu_mlp_infer);  // inference_mode skips the Autograd keys
#elif defined(CUDA_KERNEL)
  ops.impl("geglu_fwd", c10::kCUDA, &geglu_fwd);
  ops.impl("geglu_bwd", c10::kCUDA, &geglu_bwd);
  ops.impl("geglu_mlp_train", torch::dispatch(c10::DispatchKey::AutogradCUDA, TORCH_FN(geglu_mlp_train)));
  ops.impl("geglu_mlp_train_fwd", c10::kCUDA, &geglu_mlp_train_fwd);
  ops.impl("geglu_mlp_gemm_bwd_keep", c10::kCUDA, &geglu_mlp_gemm_bwd_keep);
  ops.impl("geglu_mlp_fwd_planned", c10::kCUDA, &geglu_mlp_fwd_planned);
  ops.impl("geglu_train", torch::dispatch(c10::DispatchKey::AutogradCUDA, TORCH_FN(geglu_train)));
  ops.impl("geglu_packed_train", torch::dispatch(c10::DispatchKey::AutogradCUDA, TORCH_FN(geglu_packed_train)));
  ops.impl("geglu_infer", c10::kCUDA, &geglu_infer);
  ops.impl("geglu_packed_infer", c10::kCUDA, &geglu_packed_infer);
  ops.impl("geglu_packed_into", c10::kCUDA, &geglu_packed_into);
  ops.impl("geglu_mlp_infer", torch::dispatch(c10::DispatchKey::AutogradCUDA, TORCH_FN(geglu_mlp_infer)));
  ops.impl("geglu_mlp_infer", c10::kCUDA, &geglu_mlp_infer);  // inference_mode skips the Autograd keys
  // ---- CUDA-only ops (kernel_src/geglu_cuda) ----
  // The training MLP's fused backward pointwise: gate <- grad_gate, up <- grad_up,
  // grad_out <- h = gelu(gate) * up, element by element in place (no new M x I buffers).
  ops.def("geglu_bwd_inplace(Tensor(a!) gate, Tensor(b!) up, Tensor(c!) grad_out, int approximate) -> ()");
  ops.impl("geglu_bwd_inplace", c10::kCUDA, &geglu_bwd_inplace);
  // The same with the gradients in buffers of their own (gate/up kept): a traced backward's form.
  ops.def(
      "geglu_bwd_h(Tensor(a!) grad_gate, Tensor(b!) grad_up, Tensor(c!) grad_out, Tensor gate, Tensor up, "
      "int approximate) -> ()");
  ops.impl("geglu_bwd_h", c10::kCUDA, &geglu_bwd_h);
  // The inference MLP forward with cuBLAS GEMMs around geglu_fwd (h over gate), in one call.
  ops.def(
      "geglu_mlp_gemm(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor? b_gate, Tensor? b_up, "
      "Tensor? b_down, int approximate) -> Tensor");
  ops.impl("geglu_mlp_gemm", c10::kCUDA, &geglu_mlp_gemm);
  // The same for training: the forward also returns gate/up; the backward overwrites them with their
  // gradients (kernel_src/geglu_cuda/mlp_gemm.cpp).
  ops.def(
      "geglu_mlp_gemm_train(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor? b_gate, "
      "Tensor? b_up, Tensor? b_down, int approximate) -> (Tensor, Tensor, Tensor)");
  ops.impl("geglu_mlp_gemm_train", c10::kCUDA, &geglu_mlp_gemm_train);
  ops.def(
      "geglu_mlp_gemm_bwd(Tensor dy, Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor(a!) gate, "
      "Tensor(b!) up, int approximate, bool has_b_gate, bool has_b_up, bool has_b_down) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  ops.impl("geglu_mlp_gemm_bwd", c10::kCUDA, &geglu_mlp_gemm_bwd);
  // ---- CUDA-only ops (kernel_src/linear_cublaslt, kernel_src/gemm_sm90) ----
  // The optional outputs (preact_out, db, gate_out, up_out) are written: each has its own alias set.
  ops.def(
      "linear_lt(Tensor(a!) out, Tensor x, Tensor weight, Tensor? bias, int activation, "
      "Tensor(b!)? preact_out) -> ()");
  ops.impl("linear_lt", c10::kCUDA, &linear_lt);
  ops.def(
      "linear_lt_bwd_weight(Tensor(a!) dw, Tensor(b!)? db, Tensor grad_y, Tensor x) -> ()");
  ops.impl("linear_lt_bwd_weight", c10::kCUDA, &linear_lt_bwd_weight);
  // No tensor argument: a catch-all kernel (the tests read it; kernel_src/linear_cublaslt/algo_pick.h).
  ops.def("linear_lt_plan_stats() -> int[]", &linear_lt_plan_stats);
  // linear_lt with a C++ autograd node (kernel_src/autograd_nodes/linear_lt_train.cpp).
  ops.def("linear_lt_train(Tensor x, Tensor weight, Tensor? bias, int activation) -> Tensor");
  ops.impl("linear_lt_train", torch::dispatch(c10::DispatchKey::AutogradCUDA, TORCH_FN(linear_lt_train)));
  // Its no-graph form (kernel_src/autograd_nodes/linear_lt_infer.cpp), for the CUDA key only.
  ops.def("linear_lt_infer(Tensor x, Tensor weight, Tensor? bias, int activation) -> Tensor");
  ops.impl("linear_lt_infer", c10::kCUDA, &linear_lt_infer);
  ops.def(
      "geglu_gateup_sm90(Tensor(a!) h_out, Tensor x, Tensor w_gate, Tensor w_up, Tensor? b_gate, "
      "Tensor? b_up, int approximate, Tensor(b!)? gate_out, Tensor(c!)? up_out, int tile=-1, "
      "int swizzle=1, int raster=0) -> ()");
  ops.impl("geglu_gateup_sm90", c10::kCUDA, &geglu_gateup_sm90);
  // The inference MLP forward in one call: geglu_gateup_sm90, then y = h @ w_down^T + b_down (cuBLAS).
  ops.def(
      "geglu_mlp_sm90(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor? b_gate, Tensor? b_up, "
      "Tensor? b_down, int approximate, int tile=-1, int swizzle=1, int raster=0) -> Tensor");
  ops.impl("geglu_mlp_sm90", c10::kCUDA, &geglu_mlp_sm90);
  ops.def(
      "geglu_dh_sm90(Tensor(a!) gate, Tensor(b!) up, Tensor(c!) h_out, Tensor dy, Tensor w_down, "
      "int approximate, int swizzle=1, int raster=0) -> ()");
  ops.impl("geglu_dh_sm90", c10::kCUDA, &geglu_dh_sm90);
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
