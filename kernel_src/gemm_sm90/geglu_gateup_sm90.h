// Hopper (sm_90a) gate+up GEMM with a GeGLU epilogue: one CUTLASS 3.x kernel, TMA + wgmma
// warp-specialised cooperative mainloop (collective builder), and a custom register epilogue that
// pairs each gate accumulator with its up accumulator held by the same thread and writes the
// half-width h = gelu(gate) * up (plus, optionally, gate and up themselves) through a shared-memory
// staging tile as 16-byte row vectors.
//
// ---------------------------------------------------------------------------------------------
// Weights: w_gate [I, H] and w_up [I, H] are read where they are (the host module's own tensors,
// no repacked copy), as one TMA tensor (K, I, 2) with strides (1, ldw, delta), delta being the
// distance from the lower-addressed weight to the other (split_weight_mainloop.cuh). Output tile j
// (BN accumulator columns) is rows [j*BN/2, (j+1)*BN/2) of the lower weight followed by the same
// rows of the other; the epilogue pairs accumulator column n with n + BN/2, which the wgmma layout
// keeps in the same thread (each thread holds column pairs (8k + 2t, 8k + 2t + 1) of every 8-column
// chunk k, t = lane % 4), so no data moves between threads.
//   b_gate / b_up [I] (both or neither). gate_out / up_out [M, I] (optional) receive the two
//   pre-activations.
// Why not one [2I, H] weight row-interleaved in blocks of 8 (the first version): that copy is
// 2*I*H values per layer kept beside the model (205 MB for one Gemma2-9B layer) and remade after
// every optimizer step; the two-weight view measured the same or faster at every tile
// (benchmarks/results/kernel-probe-split-h200-*.json).
// ---------------------------------------------------------------------------------------------
//
// Requirements (checked by the host op): sm_90 device, bf16 or fp16, H % 8 == 0 and every row
// stride a multiple of 8 elements (16 bytes, TMA), I % 8 == 0, last-dim stride 1 everywhere,
// w_gate and w_up distinct, with one row stride, 16-byte aligned and less than 2^40 bytes apart.
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
  const void *w_gate;    // [I, H], row stride ldw
  const void *w_up;      // [I, H], row stride ldw (a separate tensor)
  const void *b_gate;    // [I] or nullptr
  const void *b_up;      // [I] or nullptr (both or neither)
  void *h;               // [M, I], row stride ldh
  void *gate;            // [M, I] gate pre-activation, row stride ldg, or nullptr
  void *up;              // [M, I] up pre-activation, row stride ldu, or nullptr (both or neither)
  int64_t M, N2, K;      // N2 = 2I: the GEMM's N (gate and up columns together)
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
};

// Tile configurations (few on purpose: each is a separate heavy instantiation). Tile M x N x K:
//   k128x128    cooperative (two consumer warp groups split one 128x128 tile), cluster 1x1
//   k128x256    cooperative, cluster 2x1 (multicast x tiles): the wide tile for large M
//   k128x128pp  ping-pong (each consumer warp group owns a whole 128x128 tile; one group's
//               GeGLU epilogue overlaps the other's mainloop), cluster 2x1
//   k256x128    cooperative, each consumer group a 128x128 half, cluster 1x2 (multicast w tiles)
//   k128x192pp  ping-pong with a 192-wide tile (192 accumulators per thread), cluster 1x2
// Decode sizes (M <= 64): a 128-row tile at M = 16 spends 8x the tensor-core work the rows need,
// and the cooperative 128x128 tile read the weights at only 2.5-2.6 TB/s there. 64 rows is the
// smallest wgmma tile (one warp group); ping-pong is the schedule that allows it. Cluster 1x1 (one
// M tile: there is nothing to multicast).
//   k64x128pp      64x128x64
//   k64x256pp      64x256x64 (half as many tiles, twice the bytes per stage)
//   k64x128k128pp  64x128x128 (256-byte runs of each weight row per stage instead of 128)
enum class TileCfg : int {
  k128x128 = 0, k128x256 = 1, k128x128pp = 2, k256x128 = 3, k128x192pp = 4,
  k64x128pp = 5, k64x256pp = 6, k64x128k128pp = 7
};

// Defined in the per-dtype TUs. Return a message on failure, nullptr on success.
template <class Element, TileCfg Cfg>
const char *launch_geglu_gateup(GateUpArgs const &args);
template <class Element, TileCfg Cfg>
size_t geglu_gateup_workspace_bytes(GateUpArgs const &args);

}  // namespace fused_geglu_sm90
