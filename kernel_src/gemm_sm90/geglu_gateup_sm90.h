// Hopper (sm_90a) gate+up GEMM with a GeGLU epilogue: one CUTLASS 3.x kernel, TMA + wgmma
// warp-specialised cooperative mainloop (collective builder), and a custom register epilogue that
// pairs each gate accumulator with its up accumulator held by the same thread and writes the
// half-width h = gelu(gate) * up (plus, optionally, gate and up themselves) through a shared-memory
// staging tile as 16-byte row vectors.
//
// ---------------------------------------------------------------------------------------------
// w_gateup layout (what the caller must pass; G = 8, I % 8 == 0):
//   w_gateup is [2I, H], row-interleaved in blocks of 8 rows:
//     w_gateup[16*j + r]     = w_gate[8*j + r]     for r in 0..7
//     w_gateup[16*j + 8 + r] = w_up  [8*j + r]     for r in 0..7,   j in 0..I/8-1
//   In PyTorch:  torch.stack([w_gate.view(I//8, 8, H), w_up.view(I//8, 8, H)], 1).reshape(2*I, H)
//   b_gateup [2I] is interleaved the same way (stack of b_gate.view(I//8, 8), b_up.view(I//8, 8)).
//   gate_out / up_out [M, I] (optional) receive the pre-activations in the plain column order.
//
// Why G = 8: a wgmma 64xN accumulator gives each thread the column pairs (8k + 2t, 8k + 2t + 1)
// for every 8-column chunk k (t = lane % 4), so with 8-row blocks the gate chunk k (even) and the
// up chunk k + 1 of the same output columns sit in the same thread's registers; the epilogue
// never exchanges data between threads.
// ---------------------------------------------------------------------------------------------
//
// Requirements (checked by the host op): sm_90 device, bf16 or fp16, H % 8 == 0 and every row
// stride a multiple of 8 elements (16 bytes, TMA), I % 8 == 0, last-dim stride 1 everywhere.
// Any M (including M not a multiple of the tile) is fine.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cutlass/numeric_types.h"

namespace fused_geglu_sm90 {

// Host-side launch description, filled by the op in geglu_gateup_sm90.cu.
struct GateUpArgs {
  const void *x;         // [M, H], row stride ldx
  const void *w;         // [2I, H] interleaved, row stride ldw
  const void *bias;      // [2I] interleaved or nullptr
  void *h;               // [M, I], row stride ldh
  void *gate;            // [M, I] gate pre-activation, row stride ldg, or nullptr
  void *up;              // [M, I] up pre-activation, row stride ldu, or nullptr (both or neither)
  int64_t M, N2, K;      // N2 = 2I
  int64_t ldx, ldw, ldh, ldg, ldu;
  int approximate;       // 0 = erf, 1 = tanh
  int device, sm_count;
  cudaStream_t stream;
  void *workspace;       // at least workspace_bytes(...) bytes (0 for the persistent scheduler)
  // Persistent tile scheduler: tile-order swizzle (1, 2, 4 or 8 tiles; larger keeps a wave's x and
  // w panels inside L2 when x is bigger than L2) and raster order (0 heuristic, 1 along M, 2 along N).
  int swizzle = 1;
  int raster = 0;
  // Timing only ($FUSED_GEGLU_SM90_DIAG_NO_EPILOGUE=1): the epilogue returns at once and h is left
  // unwritten, so the mainloop's time can be told apart from the epilogue's.
  int skip_epilogue = 0;
  // Split weights (launch_geglu_gateup_split, EXPERIMENTAL): w is w_gate [I, H] and w_up its
  // partner, same row stride ldw; bias is b_gate [I] and bias_up b_up [I]. No interleaved copy.
  const void *w_up = nullptr;
  const void *bias_up = nullptr;
};

// Tile configurations (few on purpose: each is a separate heavy instantiation).
//   k128x128    cooperative (two consumer warp groups split one 128x128 tile), cluster 1x1
//   k128x256    cooperative, cluster 2x1 (multicast x tiles): the wide tile for large M
//   k128x128pp  ping-pong (each consumer warp group owns a whole 128x128 tile; one group's
//               GeGLU epilogue overlaps the other's mainloop), cluster 2x1
//   k256x128    cooperative, each consumer group a 128x128 half, cluster 1x2 (multicast w tiles)
//   k128x192pp  ping-pong with a 192-wide tile (192 accumulators per thread), cluster 1x2
enum class TileCfg : int { k128x128 = 0, k128x256 = 1, k128x128pp = 2, k256x128 = 3, k128x192pp = 4 };

// Defined in the per-dtype TUs. Return a message on failure, nullptr on success.
// launch_geglu_gateup_split reads w_gate and w_up in place (split_weight_mainloop.cuh).
template <class Element, TileCfg Cfg>
const char *launch_geglu_gateup_split(GateUpArgs const &args);
template <class Element, TileCfg Cfg>
const char *launch_geglu_gateup(GateUpArgs const &args);
template <class Element, TileCfg Cfg>
size_t geglu_gateup_workspace_bytes(GateUpArgs const &args);

}  // namespace fused_geglu_sm90
