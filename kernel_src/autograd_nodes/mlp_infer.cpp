// `geglu_mlp_infer`: the MLP's forward for an eager call that records no graph (inference, no_grad),
// from one op call that also makes the checks the Python path makes per call. Beside geglu_infer.cpp
// (the pointwise forms' no-graph calls) and mlp_train.cpp (the training node).
//
// Why: without CUDA graphs a decode step waits on the host, and inside a transformers model the Python
// of `geglu_mlp` (argument checks, the policy's pick, the sm90 operand checks, row views, the launch
// lookup) cost 65 µs per MLP call on the H200's host against 78 µs for the compiled op it then called
// (benchmarks/results/e2e-gemma2b-b1s16-host-h200-9b0ed3c.json). The Python caller now keeps only what
// C++ cannot see (tensor subclasses, tracing, environment overrides) and a per-size plan: which of
// the sequences below `fused_geglu/mlp.py` would run for this call under the auto policy.
//
// The op never raises for an operand it does not expect: it returns an undefined tensor (None in
// Python) and the caller takes its general path, which runs the named argument checks and whatever
// sequence fits (a copy of a non-contiguous x, a fresh gradient-recording node, ...). It declines when
//   - grad mode is on and an input requires grad (the caller records a graph instead);
//   - an operand's dtype, device, rank, shape or last-dim stride is not what geglu_mlp expects, x is
//     not contiguous, or there are no rows, features or intermediate columns;
//   - CUDA, sm90 launch: the operands are not ones the CUTLASS gate+up GEMM takes (its host op would
//     raise; sm90_weights.usable in Python lists the same conditions).
// The kernels are the ones the Python path issues for the same plan, in the same order (the tests
// compare the bits):
//   tile >= 0             - geglu_mlp_sm90 (CUDA: CUTLASS gate+up, then cuBLAS down);
//   tile == kGemmPointwise - vendor GEMMs around geglu_fwd: geglu_mlp_gemm on CUDA (h over gate), and
//                           on CPU the same with h in its own buffer (the CPU loop declares its
//                           operands restrict).
//
// Registered for the Autograd key of the variant's device (like the training nodes), so a call does
// not go through the dispatcher's boxed autograd fallback, for its backend key (inference_mode leaves
// the Autograd keys out of dispatch), and for CompositeImplicitAutograd as a plain decline, so tensors of any other device (or a mix that this variant has no kernel for) reach
// the caller's general path and its named errors instead of a dispatcher error.
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/linear.h>
#include <c10/core/DeviceGuard.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "torch_binding.h"

namespace {

constexpr int64_t kGemmPointwise = -2;  // as in mlp_train.cpp and fused_geglu/mlp.py

#if defined(CUDA_KERNEL)
constexpr c10::DeviceType kDeviceType = c10::DeviceType::CUDA;
#else
constexpr c10::DeviceType kDeviceType = c10::DeviceType::CPU;
#endif

bool present(std::optional<at::Tensor> const &b) { return b.has_value() && b->defined(); }

bool records_grad(at::Tensor const &t) { return t.requires_grad(); }
bool records_grad(std::optional<at::Tensor> const &b) { return present(b) && b->requires_grad(); }

// A [I, H]-shaped weight on x's dtype and device with a contiguous last dimension.
bool weight_ok(at::Tensor const &w, int64_t rows, int64_t cols, at::Tensor const &x) {
  return w.dim() == 2 && w.size(0) == rows && w.size(1) == cols && w.stride(1) == 1 &&
         w.scalar_type() == x.scalar_type() && w.device() == x.device();
}

// None, or an [n] bias on x's dtype and device, of any stride (ATen's linear takes any, and the sm90
// gate+up op copies one its epilogue cannot read).
bool bias_ok(std::optional<at::Tensor> const &b, int64_t n, at::Tensor const &x) {
  return !present(b) || (b->dim() == 1 && b->size(0) == n && b->scalar_type() == x.scalar_type() &&
                         b->device() == x.device());
}

bool aligned(void const *p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

#if defined(CUDA_KERNEL)
// What geglu_gateup_sm90's host op requires of operands that already passed checks like the ones above
// (x contiguous [M, H], weights [I, H] with stride-1 rows); mlp_train.cpp's traced forward asks it too:
// bf16/fp16, 16-byte TMA rows and bases, one row stride for both weights, and two distinct weights less
// than 2^40 bytes apart (one TMA view). Any [I] bias will do: the op copies one its epilogue cannot read.
bool sm90_gateup_takes(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up) {
  const auto dtype = x.scalar_type();
  const int64_t I = w_gate.size(0), H = w_gate.size(1);
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || I % 8 != 0 || H % 8 != 0) return false;
  if (w_gate.stride(0) != w_up.stride(0) || w_gate.stride(0) % 8 != 0) return false;
  if (!aligned(x.data_ptr(), 16) || !aligned(w_gate.data_ptr(), 16) || !aligned(w_up.data_ptr(), 16)) return false;
  const int64_t delta = std::llabs(static_cast<const char *>(w_up.data_ptr()) -
                                   static_cast<const char *>(w_gate.data_ptr()));
  return delta != 0 && delta < (int64_t(1) << 40);
}
#endif

at::Tensor geglu_mlp_infer(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                           at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                           std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                           int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster) {
  if (at::GradMode::is_enabled() &&
      (records_grad(x) || records_grad(w_gate) || records_grad(w_up) || records_grad(w_down) ||
       records_grad(b_gate) || records_grad(b_up) || records_grad(b_down))) {
    return {};
  }
  const auto dtype = x.scalar_type();
  if ((approximate != 0 && approximate != 1) || x.device().type() != kDeviceType ||
      (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) || x.dim() < 1 ||
      w_gate.dim() != 2 || !x.is_contiguous()) {
    return {};
  }
  const int64_t I = w_gate.size(0), H = w_gate.size(1);
  if (I == 0 || H == 0 || x.size(-1) != H || x.numel() == 0 || !weight_ok(w_gate, I, H, x) ||
      !weight_ok(w_up, I, H, x) || !weight_ok(w_down, H, I, x) || !bias_ok(b_gate, I, x) ||
      !bias_ok(b_up, I, x) || !bias_ok(b_down, H, x)) {
    return {};
  }
  const c10::OptionalDeviceGuard guard(x.device());
  const at::Tensor x2 = x.view({-1, H});
  at::Tensor y;
#if defined(CUDA_KERNEL)
  if (tile != kGemmPointwise) {
    if (tile < 0 || !sm90_gateup_takes(x2, w_gate, w_up)) return {};
    y = geglu_mlp_sm90(x2, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, tile, swizzle, raster);
  } else {
    y = geglu_mlp_gemm(x2, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate);
  }
#else
  if (tile != kGemmPointwise) return {};
  (void)swizzle;
  (void)raster;
  at::Tensor gate = at::linear(x2, w_gate, b_gate);
  at::Tensor up = at::linear(x2, w_up, b_up);
  at::Tensor h = at::empty_like(gate);
  geglu_fwd(h, gate, up, approximate);
  gate.reset();  // freed before the down GEMM allocates y, as the Python sequence does
  up.reset();
  y = at::linear(h, w_down, b_down);
#endif
  if (x.dim() == 2) return y;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = H;
  return y.view(shape);
}

// Any call the kernel above is not registered for (another device type, or a device mix): decline.
at::Tensor geglu_mlp_infer_decline(at::Tensor const &, at::Tensor const &, at::Tensor const &,
                                   at::Tensor const &, std::optional<at::Tensor> const &,
                                   std::optional<at::Tensor> const &, std::optional<at::Tensor> const &,
                                   int64_t, int64_t, int64_t, int64_t) {
  return {};
}

// The same forward as a traced graph's node (torch.compile with static sizes, inference): the plan was
// made when the graph was traced (fused_geglu/mlp_traced.py, inference), so where the planned sm90
// launch's operands are not ones the CUTLASS GEMM takes (pointers, known only now) it runs the
// vendor-GEMM sequence; a call neither sequence takes is an error, not a None a graph cannot use.
at::Tensor geglu_mlp_fwd_planned(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                                 at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                                 std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                                 int64_t approximate, int64_t tile, int64_t swizzle, int64_t raster) {
  at::Tensor y = geglu_mlp_infer(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, tile, swizzle, raster);
  if (!y.defined() && tile != kGemmPointwise) {
    y = geglu_mlp_infer(x, w_gate, w_up, w_down, b_gate, b_up, b_down, approximate, kGemmPointwise, 1, 0);
  }
  TORCH_CHECK(y.defined(), "geglu_mlp_fwd_planned: the traced plan does not take these operands (x ", x.sizes(),
              " with strides ", x.strides(), ", ", x.scalar_type(), " on ", x.device(), "; w_gate ", w_gate.sizes(),
              "), or an input needs a gradient where the graph was traced for inference");
  return y;
}
