// The GeGLU pointwise forms for eager calls that record no autograd graph (inference, no_grad), each
// as one op call that allocates its output and launches geglu_fwd: `geglu_infer` (separate gate, up),
// `geglu_packed_infer` (x = [..., 2d], gate first) and `geglu_packed_into` (the same into a given out,
// for kernels-community's `gelu_and_mul(out, x)`). Registered for the CPU / CUDA key only, beside the
// training nodes of geglu_train.cpp.
//
// Why: at the sizes a decode step uses, a pointwise call is a few µs of GPU time and the Python around
// it (an output allocation, three row views, the kernel op) cost more than the eager expression it
// replaces (H200 harness, fd3f75b: 33.8 against eager's 25.5 µs at M = 16). Here those steps are C++.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>

#include "torch_binding.h"

namespace {

at::Tensor rows(at::Tensor const &t) { return t.view({-1, t.size(-1)}); }

}  // namespace

at::Tensor geglu_infer(at::Tensor const &gate, at::Tensor const &up, int64_t approximate) {
  TORCH_CHECK(gate.dim() >= 1 && gate.is_contiguous() && up.is_contiguous() && gate.sizes() == up.sizes(),
              "geglu_infer: gate and up must be contiguous and of one shape, got ", gate.sizes(), " and ",
              up.sizes());
  const c10::OptionalDeviceGuard guard(gate.device());
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  if (out.numel() > 0) {
    at::Tensor out2 = rows(out);
    geglu_fwd(out2, rows(gate), rows(up), approximate);
  }
  return out;
}

void geglu_packed_into(at::Tensor &out, at::Tensor const &x, int64_t approximate) {
  const int64_t d = x.size(-1) / 2;
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && x.size(-1) == 2 * d && out.is_contiguous() &&
                  out.numel() * 2 == x.numel() && out.size(-1) == d,
              "geglu_packed_into: x must be contiguous with an even last dimension and out contiguous with "
              "half of it, got x ", x.sizes(), " and out ", out.sizes());
  if (out.numel() == 0) return;
  // Both are dense here, so ATen's test is exact: an out inside x (its first half, say) would be
  // written while the kernel still reads it. (geglu_fwd's own test sees x's halves, which are not
  // dense, and cannot tell.)
  at::assert_no_overlap(out, x);
  const c10::OptionalDeviceGuard guard(x.device());
  const at::Tensor x2 = rows(x);
  at::Tensor out2 = rows(out);
  geglu_fwd(out2, x2.narrow(1, 0, d), x2.narrow(1, d, d), approximate);
}

at::Tensor geglu_packed_infer(at::Tensor const &x, int64_t approximate) {
  TORCH_CHECK(x.dim() >= 1, "geglu_packed_infer: x must have at least one dimension");
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() /= 2;
  at::Tensor out = at::empty(shape, x.options());
  geglu_packed_into(out, x, approximate);
  return out;
}
