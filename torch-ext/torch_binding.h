// Declarations of the compiled ops. One header for every backend: the .cpp/.cu sources under
// kernel_src/ implement the subset their backend has, and torch_binding.cpp registers only those.
//
// Shapes: `gate`, `up`, `out`, `grad_*` are 2-D [rows, cols] views whose last dimension is
// contiguous (stride 1); the row stride may be anything >= cols, so the two halves of a packed
// [rows, 2*cols] tensor are passed as views without a copy. `approximate`: 0 = exact erf GELU,
// 1 = tanh GELU.
#pragma once

// ATen's Tensor alone (not <torch/torch.h>, the whole C++ frontend): the binding compiles in
// seconds instead of minutes.
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <vector>

// out = gelu(gate) * up, math in fp32, stored in out's dtype.
void geglu_fwd(at::Tensor &out, at::Tensor const &gate, at::Tensor const &up,
               int64_t approximate);

// grad_gate = grad_out * up * gelu'(gate);  grad_up = grad_out * gelu(gate).
void geglu_bwd(at::Tensor &grad_gate, at::Tensor &grad_up, at::Tensor const &grad_out,
               at::Tensor const &gate, at::Tensor const &up, int64_t approximate);

// The training forward's vendor-GEMM + pointwise sequence (cuBLAS on CUDA, ATen's CPU GEMMs on CPU):
// (y, gate, up), h in its own buffer (gate/up are what the backward needs). x 2-D [M, H].
std::tuple<at::Tensor, at::Tensor, at::Tensor> geglu_mlp_gemm_train(
    at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up, at::Tensor const &w_down,
    std::optional<at::Tensor> const &b_gate, std::optional<at::Tensor> const &b_up,
    std::optional<at::Tensor> const &b_down, int64_t approximate);
// The training MLP as one differentiable op whose autograd node is C++ (kernel_src/autograd_nodes):
// y[..., H] for a contiguous x[..., H]. tile >= -1: the sm90 gate+up GEMM's launch (CUDA variant,
// as geglu_gateup_sm90); tile == -2: geglu_mlp_gemm_train. Registered for AutogradCPU or AutogradCUDA.
at::Tensor geglu_mlp_train(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                           at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                           std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                           int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster);
// The same forward for a traced graph (torch.compile), with no node: (y[..., H], gate [M, I], up [M, I]);
// the graph's backward is geglu_mlp_gemm_bwd_keep. The launch is planned when the graph is traced, so on
// CUDA an sm90 launch whose operands the CUTLASS GEMM does not take at run time (alignment, the two
// weights' distance) runs geglu_mlp_gemm_train instead: the same result, other GEMMs.
std::tuple<at::Tensor, at::Tensor, at::Tensor> geglu_mlp_train_fwd(
    at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up, at::Tensor const &w_down,
    std::optional<at::Tensor> const &b_gate, std::optional<at::Tensor> const &b_up,
    std::optional<at::Tensor> const &b_down, int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster);
// The MLP's backward leaving gate/up as they are (gradients to buffers of their own): a traced graph's
// backward, where the saved pre-activations are graph values. Returns (dx, dw_gate, dw_up, dw_down,
// db_gate, db_up, db_down), a missing bias's gradient a 0-element tensor; dy [M,H], x [M,H], gate/up
// [M,I], all 2-D. CUDA: cuBLAS around geglu_bwd_h (kernel_src/geglu_cuda/mlp_gemm.cpp); CPU: ATen's
// GEMMs around the CPU pointwise kernels (kernel_src/autograd_nodes/mlp_train.cpp).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
geglu_mlp_gemm_bwd_keep(at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate,
                        at::Tensor const &w_up, at::Tensor const &w_down, at::Tensor const &gate,
                        at::Tensor const &up, int64_t approximate, bool has_b_gate, bool has_b_up,
                        bool has_b_down);
// The operand shapes every MLP backward op checks first (kernel_src/autograd_nodes/mlp_train.cpp): dy and
// x [M, H], gate and up [M, I], all 2-D; raises naming ``op``.
void check_bwd_operands(const char *op, at::Tensor const &dy, at::Tensor const &x, at::Tensor const &gate,
                        at::Tensor const &up);
// The MLP backward's GEMMs after its pointwise step (kernel_src/autograd_nodes/mlp_train.cpp), in
// fused_geglu/mlp.py's order: dW_down from h (hid), dx, then dW_gate / db_gate and dW_up / db_up, each
// M x I buffer freed after its last reader where the caller hands over its references; db_down from dy.
// Returns (dx, dw_gate, dw_up, dw_down, db_gate, db_up, db_down), a missing bias's gradient 0 elements.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> geglu_mlp_bwd_gemms(
    at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up, at::Tensor hid,
    at::Tensor dgate, at::Tensor dup, bool has_b_gate, bool has_b_up, bool has_b_down);
// GeGLU pointwise with C++ autograd nodes (kernel_src/autograd_nodes/geglu_train.cpp), over geglu_fwd /
// geglu_bwd: separate contiguous gate/up of one shape, or a contiguous packed x[..., 2d] (gate first).
at::Tensor geglu_train(at::Tensor const &gate, at::Tensor const &up, int64_t approximate);
at::Tensor geglu_packed_train(at::Tensor const &x, int64_t approximate);
// The same forms for calls that record no graph (kernel_src/autograd_nodes/geglu_infer.cpp): one op call
// allocates the output (or, for geglu_packed_into, fills a contiguous out[..., d]) and runs geglu_fwd.
at::Tensor geglu_infer(at::Tensor const &gate, at::Tensor const &up, int64_t approximate);
at::Tensor geglu_packed_infer(at::Tensor const &x, int64_t approximate);
void geglu_packed_into(at::Tensor &out, at::Tensor const &x, int64_t approximate);
// The MLP's forward for a call that records no graph (kernel_src/autograd_nodes/mlp_infer.cpp): y[..., H]
// for a contiguous x[..., H] with geglu_mlp_train's launch arguments, or an undefined tensor where the
// call is not one it takes (grad needed, unexpected operands); the _decline form is every other key's.
at::Tensor geglu_mlp_infer(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                           at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                           std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                           int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster);
// geglu_mlp_infer as a traced inference graph's node: never undefined (falls back from an sm90 launch
// the operands do not fit to the vendor-GEMM sequence, else raises).
at::Tensor geglu_mlp_fwd_planned(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                                 at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                                 std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                                 int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster);
at::Tensor geglu_mlp_infer_decline(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                                   at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                                   std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                                   int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster);

#if defined(CUDA_KERNEL)
// In place: gate <- grad_out * up * gelu'(gate), up <- grad_out * gelu(gate),
// grad_out <- gelu(gate) * up (the h the down projection's weight gradient needs).
void geglu_bwd_inplace(at::Tensor &gate, at::Tensor &up, at::Tensor &grad_out, int64_t approximate);
// The same into separate gradient buffers (gate/up unchanged): grad_gate, grad_up <- the gradients,
// grad_out <- h.
void geglu_bwd_h(at::Tensor &grad_gate, at::Tensor &grad_up, at::Tensor &grad_out, at::Tensor const &gate,
                 at::Tensor const &up, int64_t approximate);
// Whether geglu_gateup_sm90 takes these operands (x contiguous [M, H], weights [I, H] with stride-1 rows):
// bf16/fp16, 16-byte TMA rows and bases, one row stride for both weights, and two distinct weights less than
// 2^40 bytes apart (one TMA view); any [I] biases. Its host op raises where this is false.
bool sm90_gateup_takes(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up);
// The MLP's inference forward with cuBLAS GEMMs (ATen linear) around geglu_fwd, h written over
// gate: y[M,H] = (gelu(x w_gate^T + b_gate) * (x w_up^T + b_up)) w_down^T + b_down.
at::Tensor geglu_mlp_gemm(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                          at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                          std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                          int64_t approximate);
// The MLP's backward with cuBLAS GEMMs around geglu_bwd_inplace: dh = dy w_down, then gate <- dgate,
// up <- dup and dh <- h in place; returns (dx, dw_gate, dw_up, dw_down, db_gate, db_up, db_down), a
// missing bias's gradient a 0-element tensor. dy [M,H], x [M,H], gate/up [M,I], all 2-D.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
geglu_mlp_gemm_bwd(at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate,
                   at::Tensor const &w_up, at::Tensor const &w_down, at::Tensor &gate, at::Tensor &up,
                   int64_t approximate, bool has_b_gate, bool has_b_up, bool has_b_down);
// (geglu_mlp_gemm_bwd_keep, declared above, is the same with the gradients in buffers of their own.)
// The sequence behind both, for a caller that hands over its references to gate/up (the C++
// training node): each M x I buffer is freed after its last reader, so the peak is the Python
// sequence's (three M x I buffers) at any size. `keep`: gradients to buffers of their own.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
geglu_mlp_gemm_bwd_owned(at::Tensor const &dy, at::Tensor const &x, at::Tensor const &w_gate,
                         at::Tensor const &w_up, at::Tensor const &w_down, at::Tensor gate, at::Tensor up,
                         bool keep, int64_t approximate, bool has_b_gate, bool has_b_up, bool has_b_down);

// ---- CUDA-only ops (kernel_src/linear_cublaslt, kernel_src/gemm_sm90) ----
// cuBLASLt: out[M,N] = act(x[M,K] @ weight[N,K]^T + bias[N]); activation 0 = none, 1 = tanh GELU
// (preact_out[M,N], optional, receives the pre-activation: GELU_AUX_BIAS). x and weight need only
// a contiguous last dimension; out, bias and preact_out are contiguous. bf16 / fp16 / fp32.
void linear_lt(at::Tensor &out, at::Tensor const &x, at::Tensor const &weight,
               std::optional<at::Tensor> const &bias, int64_t activation,
               std::optional<at::Tensor> const &preact_out);
// cuBLASLt: dw[N,K] = grad_y[M,N]^T @ x[M,K], db[N] = sum_m grad_y (BGRADB, same call).
// dw (and db) in x's dtype or float32.
void linear_lt_bwd_weight(at::Tensor &dw, std::optional<at::Tensor> const &db,
                          at::Tensor const &grad_y, at::Tensor const &x);
// What the cuBLASLt plans did so far (algo_pick.h): [plans built, shapes timed, plans settled from a
// size bucket's winner, plans running another candidate than the heuristic's first, plans offered one
// candidate, candidates asked for].
std::vector<int64_t> linear_lt_plan_stats();
// linear_lt with a C++ autograd node (kernel_src/autograd_nodes/linear_lt_train.cpp): y[..., N] for a
// contiguous x[..., K]; activation 0 (BIAS epilogue) or 1 (tanh GELU_AUX_BIAS, pre-activation saved).
at::Tensor linear_lt_train(at::Tensor const &x, at::Tensor const &weight, std::optional<at::Tensor> const &bias,
                           int64_t activation);
// Its form for calls that record no graph (kernel_src/autograd_nodes/linear_lt_infer.cpp): one op call
// that allocates y[..., N] for a non-empty contiguous x[..., K], a [N] bias or none; activation 0 or 1.
at::Tensor linear_lt_infer(at::Tensor const &x, at::Tensor const &weight, std::optional<at::Tensor> const &bias,
                           int64_t activation);
// sm90a CUTLASS GEMM with a GeGLU epilogue: h_out[M,I] = gelu(x w_gate^T + b_gate) * (x w_up^T + b_up)
// from one GEMM that reads w_gate[I,H] and w_up[I,H] where they are (kernel_src/gemm_sm90/
// geglu_gateup_sm90.h); approximate 0 = erf, 1 = tanh; b_gate / b_up [I], both or neither;
// gate_out / up_out [M,I] (optional, for training) receive the two pre-activations.
// tile: a TileCfg index (-1: the op's own size heuristic); swizzle 1/2/4/8 and raster 0/1/2 (heuristic,
// along M, along N) order the persistent tile scheduler. The caller's measured policy picks them.
void geglu_gateup_sm90(at::Tensor &h_out, at::Tensor const &x, at::Tensor const &w_gate,
                       at::Tensor const &w_up, std::optional<at::Tensor> const &b_gate,
                       std::optional<at::Tensor> const &b_up, int64_t approximate,
                       std::optional<at::Tensor> const &gate_out,
                       std::optional<at::Tensor> const &up_out, int64_t tile, int64_t swizzle,
                       int64_t raster);
// The MLP's inference forward on sm90 in one call: h = geglu_gateup_sm90(x, w_gate, w_up, b_gate,
// b_up) (a missing one of the two biases is zeros), then y[M,H] = h @ w_down[H,I]^T + b_down through
// ATen's linear (cuBLAS). Same tile arguments as geglu_gateup_sm90.
at::Tensor geglu_mlp_sm90(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                          at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                          std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                          int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster);
// sm90a CUTLASS GEMM dh = dy @ w_down with the GeGLU-backward epilogue (kernel_src/gemm_sm90/
// geglu_dh_sm90.h): gate <- dgate, up <- dup in place, h_out = gelu(gate) * up.
void geglu_dh_sm90(at::Tensor &gate, at::Tensor &up, at::Tensor &h_out, at::Tensor const &dy,
                   at::Tensor const &w_down, int64_t approximate, int64_t swizzle, int64_t raster);
#endif

// The operands of a call under torch.autocast cast to `dtype` through autocast's weight cache
// (kernel_src/autograd_nodes/autocast_cast.cpp); None stays None. Every backend, CompositeImplicitAutograd.
std::vector<std::optional<at::Tensor>> autocast_cast(std::vector<std::optional<at::Tensor>> const &tensors,
                                                     at::ScalarType dtype);
