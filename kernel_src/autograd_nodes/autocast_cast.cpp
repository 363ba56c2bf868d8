// The casts `linear` and `geglu_mlp` make under torch.autocast (fused_geglu/_autocast.py), through
// autocast's own weight cache.
//
// Why: autocast's `linear` casts a float32 parameter to the autocast dtype once per autocast region
// and reuses that copy for the rest of the region (at::autocast::cached_cast: float32 leaf tensors that
// need a gradient, while the cache is enabled). A `generate()` or an evaluation loop inside one
// `with torch.autocast(...)` therefore reads each weight once in float32 and then only its
// half-precision copy. A plain `.to(dtype)` per call re-reads the float32 weight and writes a new copy
// every step: 2.7x eager's time for a decode-sized MLP on the development CPU (2026-12-05). Going
// through the same cache also shares one copy with any eager `F.linear` of the region (a tied weight).
//
// Registered at CompositeImplicitAutograd: autograd records the `.to()` inside, so a float32
// parameter gets a float32 gradient as from autocast's own cast. Tensors autocast would not cast
// (float64, another device type, undefined) come back as they are; the Python side checks before.
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

#include "torch_binding.h"

std::vector<std::optional<at::Tensor>> autocast_cast(std::vector<std::optional<at::Tensor>> const &tensors,
                                                     at::ScalarType dtype) {
  std::vector<std::optional<at::Tensor>> out;
  out.reserve(tensors.size());
  for (auto const &t : tensors) {
    if (t.has_value() && t->defined()) {
      out.emplace_back(at::autocast::cached_cast(dtype, *t, t->device().type()));
    } else {
      out.emplace_back(std::nullopt);
    }
  }
  return out;
}
