// Which of cuBLASLt's heuristic candidates a cached plan runs (kernel_src/linear_cublaslt/algo_pick.cpp).
//
// The heuristic's first answer depends on the query (workspace, alignments), and at some shapes it is
// not the fastest it offers: ATen's addmm, asking with its own preferences, got kernels 10-20 % faster
// or slower than this project's query on the same down projections (benchmarks/RESULTS.md, "The bounds
// on an H200"). So the first time a shape runs outside CUDA-graph capture, its first few candidates
// are each timed once (a few launches, L2 flushed where the operands would stay in it) and the fastest
// is kept; the heuristic's first stays unless another is at least 3 % faster, so noise does not move
// it. The winner is remembered per size bucket (rows rounded up to a power of two), and a later size
// in the bucket reuses it when the heuristic offers the same configuration there (where the heuristic's
// first won, a later size runs its own first): a server seeing a new token count per request times once
// per bucket, not once per count.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fused_geglu_lt {

// One matmul's operands, as cublasLtMatmul takes them. Re-running it must give the same D: D may not
// alias A, B or C (the caller skips timing when it does).
struct LtCall {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc, ld;
  const void *A, *B, *C;
  void *D;
  float beta;
  void *workspace;
  size_t workspace_bytes;
  cudaStream_t stream;
  int device;
  size_t operand_bytes;  // A + B + C + D bytes: whether an L2 flush is needed between launches
};

// $FUSED_GEGLU_LT_CANDIDATES: how many heuristic candidates are asked for and timed (1 = the
// heuristic's first, no timing; at most 8), read whenever a plan is built. The default is 1, the
// behaviour before this file: on an H100 (benchmarks/diag/lt_pick.py, two runs at 417c42a) the pick at 4
// ran 0.81-1.12x the first's time under graph replay, with wins and losses that both reproduced, and
// its own margin did not predict which (benchmarks/RESULTS.md, "cuBLASLt's candidates ..."). A single
// cold launch after a memset flush is not the steady state a stream of GEMMs sees.
int candidate_count();

// Whether this call may time candidates now: not while the stream is being captured, not with one
// candidate. (Deterministic mode is the caller's check: it settles on the heuristic's first for good.)
bool may_time(cudaStream_t stream, int n_candidates);

// Times each candidate (a warm-up launch, then `rounds` launches each), returns the index to keep
// (0 unless another is >= 3 % faster) and fills `us` with the median µs per candidate (a candidate
// that fails to launch gets +inf). Synchronises on the timing events: call it once per shape.
int time_candidates(const LtCall &call, const std::vector<cublasLtMatmulHeuristicResult_t> &cands,
                    std::vector<float> &us, int rounds = 5);

// Whether two algorithms are the same kernel configuration (algo id, tile, stages, split-K, reduction,
// swizzle, custom option, cluster shape): the heuristic returns them per shape, so a bucket's winner is
// looked up among another size's candidates this way.
bool same_config(const cublasLtMatmulAlgo_t &a, const cublasLtMatmulAlgo_t &b);

// $FUSED_GEGLU_LT_LOG=1: one line per timed shape on stderr (the candidates' µs and the pick).
bool log_enabled();

}  // namespace fused_geglu_lt
