// Argument checks shared by the CPU and CUDA GeGLU pointwise ops (kernel_src/geglu_cpu,
// kernel_src/geglu_cuda). The Python layer checks first and names the user's argument; these are the
// backstop for direct calls of the registered ops, so a bad operand is an error, never a wrong read.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <utility>

namespace geglu_checks {

// t: one operand of op (gate, up, out, grad_*), checked against gate: same device, 2-D [rows, cols],
// gate's dtype and shape, unit stride along cols, and rows that do not overlap (row stride >= cols),
// so a packed [rows, 2*cols] tensor's halves pass as views.
inline void operand(const char *op, const char *name, const at::Tensor &t, const at::Tensor &gate) {
  TORCH_CHECK(t.device() == gate.device(), op, ": ", name, " must be on gate's device ",
              gate.device(), ", got ", t.device());
  TORCH_CHECK(t.dim() == 2, op, ": ", name, " must be 2-D [rows, cols], got ", t.dim(),
              "-D with shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == gate.scalar_type(), op, ": ", name,
              " must have gate's dtype ", gate.scalar_type(), ", got ", t.scalar_type());
  TORCH_CHECK(t.sizes() == gate.sizes(), op, ": ", name, " must have gate's shape ", gate.sizes(),
              ", got ", t.sizes());
  TORCH_CHECK(t.size(1) <= 1 || t.stride(1) == 1, op, ": ", name,
              " must have last-dim stride 1, got strides ", t.strides());
  TORCH_CHECK(t.size(0) <= 1 || t.stride(0) >= t.size(1), op, ": ", name,
              " must have row stride >= cols, got strides ", t.strides(), " for shape ", t.sizes());
}

// What holds for the whole call: the GELU flavour and a supported dtype.
inline void common(const char *op, const at::Tensor &gate, int64_t approximate) {
  TORCH_CHECK(approximate == 0 || approximate == 1, op,
              ": approximate must be 0 (erf) or 1 (tanh), got ", approximate);
  const auto dtype = gate.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, op,
              ": dtype must be float32, float16 or bfloat16, got ", dtype);
}

// One op's checks: gate on a `device` tensor (the backend's own; a wrong one means the dispatcher chose
// this kernel for another operand's device), the call's rules, then each named operand against gate.
inline void all(const char *op, c10::DeviceType device, int64_t approximate, const at::Tensor &gate,
                std::initializer_list<std::pair<const char *, const at::Tensor *>> operands) {
  TORCH_CHECK(gate.device().type() == device, op, ": gate must be a ", c10::DeviceTypeName(device),
              " tensor, got device ", gate.device());
  common(op, gate, approximate);
  for (const auto &[name, t] : operands) operand(op, name, *t, gate);
}

}  // namespace geglu_checks
