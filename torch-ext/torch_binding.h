// Declarations of the compiled ops. One header for every backend: the .cpp/.cu sources under
// kernel_src/ implement the subset their backend has, and torch_binding.cpp registers only those.
//
// Shapes: `gate`, `up`, `out`, `grad_*` are 2-D [rows, cols] views whose last dimension is
// contiguous (stride 1); the row stride may be anything >= cols, so the two halves of a packed
// [rows, 2*cols] tensor are passed as views without a copy. `approximate`: 0 = exact erf GELU,
// 1 = tanh GELU.
#pragma once

#include <torch/torch.h>

// out = gelu(gate) * up, math in fp32, stored in out's dtype.
void geglu_fwd(torch::Tensor &out, torch::Tensor const &gate, torch::Tensor const &up,
               int64_t approximate);

// grad_gate = grad_out * up * gelu'(gate);  grad_up = grad_out * gelu(gate).
void geglu_bwd(torch::Tensor &grad_gate, torch::Tensor &grad_up, torch::Tensor const &grad_out,
               torch::Tensor const &gate, torch::Tensor const &up, int64_t approximate);

#if defined(CUDA_KERNEL)
// ---- CUDA-only ops (kernel_src/linear_cublaslt, kernel_src/gemm_sm90) ----
// cuBLASLt: out[M,N] = act(x[M,K] @ weight[N,K]^T + bias[N]); activation 0 = none, 1 = tanh GELU
// (preact_out[M,N], optional, receives the pre-activation: GELU_AUX_BIAS). x and weight need only
// a contiguous last dimension; out, bias and preact_out are contiguous. bf16 / fp16 / fp32.
void linear_lt(torch::Tensor &out, torch::Tensor const &x, torch::Tensor const &weight,
               std::optional<torch::Tensor> const &bias, int64_t activation,
               std::optional<torch::Tensor> const &preact_out);
// cuBLASLt: dw[N,K] = grad_y[M,N]^T @ x[M,K], db[N] = sum_m grad_y (BGRADB, same call).
// dw (and db) in x's dtype or float32.
void linear_lt_bwd_weight(torch::Tensor &dw, std::optional<torch::Tensor> const &db,
                          torch::Tensor const &grad_y, torch::Tensor const &x);
// sm90a CUTLASS GEMM with a GeGLU epilogue: h_out[M,I] = gelu(gate) * up from one GEMM over the
// 8-row-interleaved w_gateup[2I,H] (layout in kernel_src/gemm_sm90/geglu_gateup_sm90.h);
// approximate 0 = erf, 1 = tanh; b_gateup[2I] and preact_out[M,2I] interleaved the same way.
void geglu_gateup_sm90(torch::Tensor &h_out, torch::Tensor const &x, torch::Tensor const &w_gateup,
                       std::optional<torch::Tensor> const &b_gateup, int64_t approximate,
                       std::optional<torch::Tensor> const &preact_out);
#endif
