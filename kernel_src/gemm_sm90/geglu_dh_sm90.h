// Hopper (sm_90a) dh GEMM with the GeGLU-backward epilogue: the backward half of the MLP's
// pointwise, fused into the GEMM that produces its input.
//
//   dh[M, I]  = dy[M, H] @ w_down[H, I]          (fp32 accumulators, never stored)
//   gate     <- dh * up * gelu'(gate)             (in place: gate held the pre-activation)
//   up       <- dh * gelu(gate)                   (in place: up held the pre-activation)
//   h_out     = gelu(gate) * up                   (the forward's h, for dW_down = dy^T @ h)
//
// Each thread reads the gate/up pairs of the accumulator columns it holds and writes their
// gradients back to the same addresses, so the in-place update needs no synchronisation.
// Requirements (checked by the host op): sm_90 device, bf16 or fp16, H % 8 == 0 and I % 8 == 0
// (16-byte TMA rows of dy and w_down), w_down and dy row-major with a contiguous last dimension,
// gate/up/h_out [M, I] with a contiguous last dimension and even row strides. Any M.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cutlass/numeric_types.h"

namespace fused_geglu_sm90 {

struct DhArgs {
  const void *dy;   // [M, H], row stride lddy
  const void *w;    // w_down [H, I], row stride ldw
  void *gate;       // [M, I], row stride ldg (in: pre-activation, out: gradient)
  void *up;         // [M, I], row stride ldu (in: pre-activation, out: gradient)
  void *h;          // [M, I], row stride ldh (out)
  int64_t M, N, K;  // N = I, K = H
  int64_t lddy, ldw, ldg, ldu, ldh;
  int approximate;  // 0 = erf, 1 = tanh
  int device, sm_count;
  int swizzle = 1;  // persistent tile scheduler order, as in GateUpArgs
  int raster = 0;
  cudaStream_t stream;
  void *workspace;
};

// One tile (128x128 per consumer warp group, ping-pong: one group's epilogue, which here moves
// five M x I streams, overlaps the other group's mainloop). Defined in the per-dtype TUs.
template <class Element>
const char *launch_geglu_dh(DhArgs const &args);
template <class Element>
size_t geglu_dh_workspace_bytes(DhArgs const &args);

}  // namespace fused_geglu_sm90
