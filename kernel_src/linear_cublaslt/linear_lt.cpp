// Bias / GELU epilogue GEMMs through cuBLASLt, and the weight gradient with the bias gradient
// reduced in the same call (BGRADB).
//
//   linear_lt:            out[M,N] = act(x[M,K] @ weight[N,K]^T + bias[N])
//                         x may also be 3-D [B,S,K] with any batch and row strides (M = B*S, out
//                         in (b, s) row order): one strided-batched call, the weight and the bias
//                         broadcast over the batch (batch offset 0), no copy of x. This is the
//                         sequence-first activation seen batch-first, x[S,B,K].transpose(0, 1),
//                         which no 2-D view covers: ATen runs bmm and then a separate bias add.
//                         bias may instead be a matrix [M,N] (an addend, e.g. a residual): it is the
//                         GEMM's C with beta 1, read once in the epilogue (ATen's addmm copies it
//                         into the output first and then runs the GEMM with beta 1 over it).
//                         activation 0: none (epilogue BIAS, or DEFAULT without bias)
//                         activation 1: tanh-GELU (GELU_BIAS / GELU, or GELU_AUX_BIAS / GELU_AUX
//                                       when preact_out[M,N] receives x @ weight^T + bias)
//   linear_lt_bwd_weight: dw[N,K] = grad_y[M,N]^T @ x[M,K];  db[N] = sum_m grad_y[m,:] (BGRADB)
//
// cuBLASLt is column-major, so every row-major [R,C] tensor with row stride ld is passed as a
// column-major C x R matrix with leading dimension ld:
//   forward: D(N x M) = op_T(W: K x N, ld w.stride(0)) * op_N(X: K x M, ld x.stride(0)); the bias
//            has one value per row of D (= per output feature), as cuBLASLt wants.
//   wgrad:   D(K x N) = op_N(X: K x M) * op_T(GY: N x M); BGRADB reduces op(B) = M x N over the
//            GEMM's k (= M) dimension, giving one value per column of D (= per output feature).
//
// Host side: descriptors, layouts and the heuristic's candidates are cached per
// (device, dtypes, shape, leading dims, pointer alignments, epilogue, tf32); the per-call pointers
// (bias, aux) are set on the cached descriptor under a mutex. Which candidate runs is settled on the
// shape's first call outside graph capture, by timing the first few (algo_pick.h). The workspace is a 32 MiB torch
// tensor per (device, stream), so it comes from the caching allocator; nothing here synchronises,
// so the ops can be captured in a CUDA graph (allocate the workspace outside capture first, i.e.
// run once eagerly on that stream, if the graph's private pool must not own it).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <ATen/ATen.h>

#include "algo_pick.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <tuple>
#include <vector>

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

#define FG_LT_CHECK(expr, what)                                                                   \
  do {                                                                                            \
    cublasStatus_t _st = (expr);                                                                  \
    TORCH_CHECK(_st == CUBLAS_STATUS_SUCCESS, "fused_geglu cuBLASLt: ", #expr, " failed with ",   \
                cublasGetStatusName(_st), " (", int(_st), ") in ", what());                        \
  } while (0)

cudaDataType_t to_cuda_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return CUDA_R_16F;
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kFloat: return CUDA_R_32F;
    default: TORCH_CHECK(false, "fused_geglu cuBLASLt: unsupported dtype ", t);
  }
  return CUDA_R_32F;
}

// Largest power of two (<= 256) dividing the address: what the heuristic may assume.
uint32_t ptr_alignment(const void *p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 1;
  while (al < 256 && (a % (al * 2)) == 0) al *= 2;
  return a == 0 ? 256 : al;
}

// The alignment every batch's matrix keeps: that of the first one's address and of the batch
// offset in bytes (a batch stride of an odd number of elements misaligns every other batch).
uint32_t batch_alignment(const void *p, int64_t batch_stride, cudaDataType_t t) {
  const int64_t elt = t == CUDA_R_32F ? 4 : 2;
  return std::min(ptr_alignment(p),
                  ptr_alignment(reinterpret_cast<const void *>(uintptr_t(batch_stride * elt))));
}

void check_rowmajor_2d(const at::Tensor &t, const char *name) {
  TORCH_CHECK(t.dim() == 2, "fused_geglu cuBLASLt: ", name, " must be 2-D, got ", t.sizes());
  TORCH_CHECK(t.is_cuda(), "fused_geglu cuBLASLt: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.stride(1) == 1 || t.size(1) == 1, "fused_geglu cuBLASLt: ", name,
              " needs a contiguous last dimension, got strides ", t.strides());
  TORCH_CHECK(t.stride(0) >= std::max<int64_t>(1, t.size(1)), "fused_geglu cuBLASLt: ", name,
              " row stride ", t.stride(0), " must be >= its row length ", t.size(1));
}

// Per-(device, stream) workspace from the caching allocator.
void *workspace_for(int device, cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, at::Tensor> ws;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(device, stream);
  auto it = ws.find(key);
  if (it == ws.end()) {
    auto t = at::empty({int64_t(kWorkspaceBytes)},
                       at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
    it = ws.emplace(key, std::move(t)).first;
  }
  return it->second.data_ptr();
}

// The call's description for error messages, built only when one is raised. (Building it on every
// call, with std::ostringstream, was what crashed the first H200 runs: SIGSEGV inside the stream
// insertion of the shapes, 2026-12-02, backtrace in benchmarks/results/h200-tests-2026-12-02.md.)
using Describe = std::function<std::string()>;

struct PlanKey {
  int device;
  int a_type, d_type, bias_type;
  int64_t m, n, k, lda, ldb, ldc, ldd, ldaux;  // ldc 0: no C operand (beta 0, C is D)
  int64_t batch, batch_stride_b, batch_stride_d;  // batch 1: a plain GEMM (A is never batched)
  int transa, transb;
  int epilogue;
  int tf32;
  uint32_t al_a, al_b, al_c, al_d, al_bias, al_aux;
  auto tie() const {
    return std::make_tuple(device, a_type, d_type, bias_type, m, n, k, lda, ldb, ldc, ldd, ldaux,
                           std::make_tuple(batch, batch_stride_b, batch_stride_d),
                           transa, transb, epilogue, tf32,
                           std::make_tuple(al_a, al_b, al_c, al_d, al_bias, al_aux));
  }
  bool operator<(const PlanKey &o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> cands;  // the heuristic's, best first
  cublasLtMatmulAlgo_t algo;                           // the one that runs: cands[0] until settled
  bool settled = false;                                // timed, taken from the bucket, or nothing to pick
  ~Plan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

std::mutex g_plan_mu;  // guards the caches, the counters and the per-call pointer attributes of a cached desc
std::map<PlanKey, std::unique_ptr<Plan>> g_plans;
// A timed winner per size bucket (bucket_of). Later sizes in the bucket run it when their heuristic
// offers it; where the heuristic's first won, they run their own heuristic's first.
struct Winner {
  bool first;
  cublasLtMatmulAlgo_t algo;
};
std::map<PlanKey, Winner> g_winners;
// plans built, shapes timed, plans settled from a bucket's winner, plans running another than cands[0],
// plans whose heuristic offered one candidate (nothing to pick)
std::array<int64_t, 5> g_counts{};

int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// The key with the token dimension rounded up to a power of two (the rows: n in the forward, where
// A is the weight, transposed; k in the weight gradient), the batch count too, and the leading
// dimensions and batch strides, which follow the rows, reduced to whether there is a C / aux.
PlanKey bucket_of(const PlanKey &key) {
  PlanKey b = key;
  if (key.transa == CUBLAS_OP_T) b.n = pow2_at_least(key.n);
  else b.k = pow2_at_least(key.k);
  b.batch = pow2_at_least(key.batch);
  b.lda = b.ldb = b.ldd = 0;
  b.ldc = key.ldc > 0;
  b.ldaux = key.ldaux > 0;
  b.batch_stride_b = b.batch_stride_d = 0;
  return b;
}

// Builds (or finds) the plan. Called with g_plan_mu held.
Plan &get_plan(const PlanKey &key, cublasLtHandle_t handle, const Describe &what) {
  auto it = g_plans.find(key);
  if (it != g_plans.end()) return *it->second;
  if (g_plans.size() > 4096) g_plans.clear();  // bound the cache; plans are cheap to rebuild
  if (g_winners.size() > 4096) g_winners.clear();

  auto plan = std::make_unique<Plan>();
  const auto a_type = cudaDataType_t(key.a_type), d_type = cudaDataType_t(key.d_type);
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (a_type == CUDA_R_32F && key.tf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  FG_LT_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F), what);
  cublasOperation_t ta = cublasOperation_t(key.transa), tb = cublasOperation_t(key.transb);
  FG_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                             sizeof(ta)), what);
  FG_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                             sizeof(tb)), what);
  cublasLtEpilogue_t epi = cublasLtEpilogue_t(key.epilogue);
  FG_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                             sizeof(epi)), what);
  if (key.bias_type >= 0) {
    cudaDataType_t bt = cudaDataType_t(key.bias_type);
    FG_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                               &bt, sizeof(bt)), what);
  }
  if (key.ldaux > 0) {
    int64_t ldaux = key.ldaux;
    FG_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                               &ldaux, sizeof(ldaux)), what);
    cudaDataType_t aux_t = d_type;
    FG_LT_CHECK(cublasLtMatmulDescSetAttribute(
                    plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_t, sizeof(aux_t)),
                what);
  }
  // Layout dims are those of the stored matrix (before op()).
  const uint64_t a_rows = key.transa == CUBLAS_OP_N ? key.m : key.k;
  const uint64_t a_cols = key.transa == CUBLAS_OP_N ? key.k : key.m;
  const uint64_t b_rows = key.transb == CUBLAS_OP_N ? key.k : key.n;
  const uint64_t b_cols = key.transb == CUBLAS_OP_N ? key.n : key.k;
  FG_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->la, a_type, a_rows, a_cols, key.lda), what);
  FG_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->lb, a_type, b_rows, b_cols, key.ldb), what);
  FG_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->ld, d_type, key.m, key.n, key.ldd), what);
  if (key.ldc > 0) {
    FG_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->lc, d_type, key.m, key.n, key.ldc), what);
  }
  if (key.batch > 1) {
    // A (the weight) is shared by every batch: batch offset 0. The bias batch stride keeps its
    // default, 0, so the one bias vector is added to every batch.
    const int32_t count = int32_t(key.batch);
    const int64_t offsets[3] = {0, key.batch_stride_b, key.batch_stride_d};
    cublasLtMatrixLayout_t layouts[3] = {plan->la, plan->lb, plan->ld};
    for (int i = 0; i < 3; ++i) {
      FG_LT_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                   &count, sizeof(count)), what);
      FG_LT_CHECK(cublasLtMatrixLayoutSetAttribute(
                      layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offsets[i],
                      sizeof(offsets[i])), what);
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  FG_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), what);
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_guard(pref, &cublasLtMatmulPreferenceDestroy);
  uint64_t ws = kWorkspaceBytes;
  FG_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof(ws)), what);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.al_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.al_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.ldc > 0 ? key.al_c : key.al_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.al_d}};
  for (auto &[attr, v] : aligns) {
    FG_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)), what);
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(fused_geglu_lt::candidate_count());
  std::memset(results.data(), 0, results.size() * sizeof(results[0]));
  int found = 0;
  FG_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->la, plan->lb,
                                             plan->lc ? plan->lc : plan->ld, plan->ld, pref,
                                             int(results.size()), results.data(), &found), what);
  TORCH_CHECK(found > 0, "fused_geglu cuBLASLt: no algorithm found for ", what());
  results.resize(found);
  plan->cands = std::move(results);
  plan->algo = plan->cands[0].algo;
  plan->settled = plan->cands.size() < 2;
  ++g_counts[0];
  if (plan->settled) ++g_counts[4];
  return *g_plans.emplace(key, std::move(plan)).first->second;
}

// Chooses the candidate a plan runs (algo_pick.h). Called with g_plan_mu held.
void settle(Plan &plan, const PlanKey &key, fused_geglu_lt::LtCall &call) {
  if (at::globalContext().deterministicAlgorithms()) {  // the heuristic's first, always
    plan.settled = true;
    return;
  }
  const PlanKey bucket = bucket_of(key);
  auto won = g_winners.find(bucket);
  if (won != g_winners.end()) {
    for (size_t i = 0; i < plan.cands.size() && !won->second.first; ++i) {
      if (fused_geglu_lt::same_config(plan.cands[i].algo, won->second.algo)) {
        plan.algo = plan.cands[i].algo;
        if (i != 0) ++g_counts[3];
        break;
      }
    }
    plan.settled = true;
    ++g_counts[2];
    return;
  }
  // Timing re-runs the call: D must not be one of its inputs (an in-place addend would be added twice).
  if ((key.ldc > 0 && call.C == call.D) || call.A == call.D || call.B == call.D) return;
  if (!fused_geglu_lt::may_time(call.stream, int(plan.cands.size()))) return;  // in capture: cands[0] for now
  const int64_t ea = key.a_type == CUDA_R_32F ? 4 : 2, ed = key.d_type == CUDA_R_32F ? 4 : 2;
  call.operand_bytes = size_t(ea * (key.m * key.k + key.k * key.n * key.batch) +
                              ed * key.m * key.n * key.batch * (key.ldc > 0 ? 2 : 1));
  std::vector<float> us;
  const int best = fused_geglu_lt::time_candidates(call, plan.cands, us);
  plan.algo = plan.cands[best].algo;
  plan.settled = true;
  g_winners[bucket] = Winner{best == 0, plan.algo};
  ++g_counts[1];
  if (best != 0) ++g_counts[3];
  if (fused_geglu_lt::log_enabled()) {
    std::string times;
    char one[32];
    for (float t : us) {
      std::snprintf(one, sizeof(one), "%s%.2f", times.empty() ? "" : " ", double(t));
      times += one;
    }
    std::fprintf(stderr, "fused_geglu cuBLASLt pick: m=%lld n=%lld k=%lld batch=%lld epilogue=%d "
                 "trans=%d%d dtype=%d: us [%s] -> %d\n", (long long)key.m, (long long)key.n,
                 (long long)key.k, (long long)key.batch, key.epilogue, key.transa, key.transb,
                 key.a_type, times.c_str(), best);
  }
}

// One cuBLASLt matmul D = op(A) op(B) (+ C when key.ldc > 0) (+ epilogue). Pointers of bias / aux
// may be null; C is read only when key.ldc > 0.
void lt_matmul(PlanKey key, const void *A, const void *B, const void *C, void *D, const void *bias,
               void *aux, const Describe &what) {
  key.al_a = ptr_alignment(A);
  key.al_b = key.batch > 1 ? batch_alignment(B, key.batch_stride_b, cudaDataType_t(key.a_type)) : ptr_alignment(B);
  key.al_d = key.batch > 1 ? batch_alignment(D, key.batch_stride_d, cudaDataType_t(key.d_type)) : ptr_alignment(D);
  key.al_c = key.ldc > 0 ? ptr_alignment(C) : 0;
  key.al_bias = bias ? ptr_alignment(bias) : 0;
  key.al_aux = aux ? ptr_alignment(aux) : 0;
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  void *ws = workspace_for(key.device, stream);
  const float alpha = 1.0f, beta = key.ldc > 0 ? 1.0f : 0.0f;

  std::lock_guard<std::mutex> lock(g_plan_mu);
  Plan &plan = get_plan(key, handle, what);
  if (bias) {
    FG_LT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                               &bias, sizeof(bias)), what);
  }
  if (aux) {
    FG_LT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                               &aux, sizeof(aux)), what);
  }
  if (!plan.settled) {
    fused_geglu_lt::LtCall call{handle, plan.desc, plan.la, plan.lb, plan.lc, plan.ld, A, B,
                                key.ldc > 0 ? C : D, D, beta, ws, kWorkspaceBytes, stream,
                                key.device, 0};
    settle(plan, key, call);
  }
  FG_LT_CHECK(cublasLtMatmul(handle, plan.desc, &alpha, A, plan.la, B, plan.lb, &beta,
                             key.ldc > 0 ? C : D, plan.lc ? plan.lc : plan.ld, D, plan.ld,
                             &plan.algo, ws, kWorkspaceBytes, stream), what);
}

std::string shapes_str(const char *op, std::initializer_list<std::pair<const char *, at::Tensor>> ts) {
  std::ostringstream os;
  os << op << "(";
  bool first = true;
  for (auto &[name, t] : ts) {
    if (!first) os << ", ";
    first = false;
    os << name << "=";
    if (t.defined()) os << t.scalar_type() << t.sizes() << " strides " << t.strides();
    else os << "None";
  }
  os << ")";
  return os.str();
}

}  // namespace

void linear_lt(at::Tensor &out, at::Tensor const &x, at::Tensor const &weight,
               std::optional<at::Tensor> const &bias, int64_t activation,
               std::optional<at::Tensor> const &preact_out) {
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "linear_lt: x must be 2-D [M, K] or 3-D [B, S, K], got ",
              x.sizes());
  if (x.dim() == 3 && x.size(0) == 1) {
    return linear_lt(out, x.select(0, 0), weight, bias, activation, preact_out);
  }
  // A 3-D x [B, S, K] is checked as its first batch (a [S, K] row-major matrix) plus a batch stride.
  const bool batched = x.dim() == 3;
  check_rowmajor_2d(batched ? x.select(0, 0) : x, "x");
  check_rowmajor_2d(weight, "weight");
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous(), "linear_lt: out must be a contiguous 2-D tensor, got ",
              out.sizes(), " strides ", out.strides());
  const int64_t B = batched ? x.size(0) : 1, S = batched ? x.size(1) : x.size(0);
  const int64_t M = B * S, K = x.size(-1), N = weight.size(0);
  TORCH_CHECK(!batched || B <= INT32_MAX, "linear_lt: at most 2^31 - 1 batches, got ", B);
  TORCH_CHECK(weight.size(1) == K, "linear_lt: weight must be [N, K=", K, "], got ", weight.sizes());
  TORCH_CHECK(out.size(0) == M && out.size(1) == N, "linear_lt: out must be [", M, ", ", N,
              "], got ", out.sizes());
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() && out.scalar_type() == x.scalar_type(),
              "linear_lt: x, weight and out must share a dtype, got ", x.scalar_type(), ", ",
              weight.scalar_type(), ", ", out.scalar_type());
  TORCH_CHECK(activation == 0 || activation == 1, "linear_lt: activation must be 0 (none) or 1 "
              "(tanh GELU), got ", activation);
  TORCH_CHECK(x.device() == weight.device() && out.device() == x.device(),
              "linear_lt: tensors on different devices");
  const bool has_addend = bias.has_value() && bias->defined() && bias->dim() == 2;
  const bool has_bias = bias.has_value() && bias->defined() && !has_addend;
  const bool has_aux = preact_out.has_value() && preact_out->defined();
  if (has_bias && bias->dim() == 1 &&
      (!bias->is_contiguous() || reinterpret_cast<uintptr_t>(bias->data_ptr()) % 16 != 0)) {
    // A bias vector that is a strided view (a slice of a packed bias, say; ATen's linear takes one)
    // or starts off a 16-byte boundary is copied first, N values: the epilogue reads it at unit
    // stride, and no algorithm preference states its alignment (a bf16 bias one element into its
    // storage stopped the H200 with "misaligned address" in the GELU_BIAS epilogue, 2026-12-05).
    return linear_lt(out, x, weight, bias->clone(at::MemoryFormat::Contiguous), activation, preact_out);
  }
  if (has_bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous(),
                "linear_lt: bias must be contiguous [", N, "] or a matrix [M, N], got ", bias->sizes());
  }
  if (has_addend) {
    TORCH_CHECK(!batched && activation == 0 && !has_aux, "linear_lt: a matrix bias (addend) goes with "
                "a 2-D x and no activation (apply GELU after it: cuBLASLt's epilogue order is not relied on)");
    TORCH_CHECK(bias->size(0) == M && bias->size(1) == N, "linear_lt: a matrix bias must be [", M, ", ",
                N, "], got ", bias->sizes());
    check_rowmajor_2d(*bias, "bias");
  }
  if (has_bias || has_addend) {
    TORCH_CHECK(bias->scalar_type() == out.scalar_type(), "linear_lt: bias dtype ",
                bias->scalar_type(), " != out dtype ", out.scalar_type());
    TORCH_CHECK(bias->device() == out.device(), "linear_lt: bias is on another device");
  }
  if (has_aux) {
    TORCH_CHECK(activation == 1, "linear_lt: preact_out is only written with activation=1 (GELU)");
    TORCH_CHECK(!batched, "linear_lt: preact_out is written for 2-D x only");
    TORCH_CHECK(preact_out->sizes() == out.sizes() && preact_out->is_contiguous() &&
                    preact_out->scalar_type() == out.scalar_type(),
                "linear_lt: preact_out must be contiguous ", out.sizes(), " ", out.scalar_type(),
                ", got ", preact_out->sizes(), " ", preact_out->scalar_type());
    TORCH_CHECK(N % 8 == 0, "linear_lt: preact_out needs N % 8 == 0 (cuBLASLt aux ld), got N=", N);
    TORCH_CHECK(reinterpret_cast<uintptr_t>(preact_out->data_ptr()) % 16 == 0,
                "linear_lt: preact_out data pointer must be 16-byte aligned");
  }
  if (M == 0 || N == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  if (K == 0) {  // empty reduction: cuBLASLt rejects k = 0
    at::Tensor pre = has_bias ? bias->unsqueeze(0).expand({M, N})
                     : has_addend ? *bias : at::zeros_like(out);
    if (has_aux) preact_out->copy_(pre);
    out.copy_(activation == 1 ? at::gelu(pre, "tanh") : pre);
    return;
  }

  cublasLtEpilogue_t epi;
  if (activation == 0) epi = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  else if (has_aux) epi = has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  else epi = has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;

  PlanKey key{};
  key.device = x.get_device();
  key.a_type = to_cuda_dtype(x.scalar_type());
  key.d_type = to_cuda_dtype(out.scalar_type());
  key.bias_type = has_bias ? to_cuda_dtype(bias->scalar_type()) : -1;
  key.m = N;
  key.n = S;  // rows per batch (all M rows when x is 2-D)
  key.k = K;
  key.lda = std::max<int64_t>(weight.stride(0), K);
  key.ldb = std::max<int64_t>(x.stride(-2), K);
  key.ldc = has_addend ? std::max<int64_t>(bias->stride(0), N) : 0;
  key.ldd = N;
  key.ldaux = has_aux ? N : 0;
  key.batch = B;
  key.batch_stride_b = batched ? x.stride(0) : 0;
  key.batch_stride_d = batched ? S * N : 0;
  key.transa = CUBLAS_OP_T;
  key.transb = CUBLAS_OP_N;
  key.epilogue = epi;
  key.tf32 = x.scalar_type() == at::kFloat && at::globalContext().allowTF32CuBLAS();
  lt_matmul(key, weight.data_ptr(), x.data_ptr(), has_addend ? bias->data_ptr() : nullptr,
            out.data_ptr(), has_bias ? bias->data_ptr() : nullptr,
            has_aux ? preact_out->data_ptr() : nullptr,
            [&] {
              return shapes_str("linear_lt", {{"out", out}, {"x", x}, {"weight", weight},
                                              {"bias", has_bias ? *bias : at::Tensor()},
                                              {"preact_out", has_aux ? *preact_out : at::Tensor()}}) +
                     " epilogue " + std::to_string(int(epi));
            });
}

void linear_lt_bwd_weight(at::Tensor &dw, std::optional<at::Tensor> const &db,
                          at::Tensor const &grad_y, at::Tensor const &x) {
  check_rowmajor_2d(x, "x");
  check_rowmajor_2d(grad_y, "grad_y");
  const int64_t M = x.size(0), K = x.size(1), N = grad_y.size(1);
  TORCH_CHECK(grad_y.size(0) == M, "linear_lt_bwd_weight: grad_y must be [M=", M, ", N], got ",
              grad_y.sizes());
  TORCH_CHECK(dw.dim() == 2 && dw.is_contiguous() && dw.size(0) == N && dw.size(1) == K,
              "linear_lt_bwd_weight: dw must be contiguous [", N, ", ", K, "], got ", dw.sizes(),
              " strides ", dw.strides());
  TORCH_CHECK(x.scalar_type() == grad_y.scalar_type(), "linear_lt_bwd_weight: x dtype ",
              x.scalar_type(), " != grad_y dtype ", grad_y.scalar_type());
  TORCH_CHECK(dw.scalar_type() == x.scalar_type() || dw.scalar_type() == at::kFloat,
              "linear_lt_bwd_weight: dw dtype must be x's dtype or float32, got ", dw.scalar_type());
  const bool has_db = db.has_value() && db->defined();
  if (has_db) {
    TORCH_CHECK(db->dim() == 1 && db->size(0) == N && db->is_contiguous() &&
                    db->scalar_type() == dw.scalar_type(),
                "linear_lt_bwd_weight: db must be contiguous [", N, "] of dw's dtype ",
                dw.scalar_type(), ", got ", db->sizes(), " ", db->scalar_type());
  }
  if (N == 0 || K == 0) {
    if (has_db) db->zero_();
    return;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  if (M == 0) {
    dw.zero_();
    if (has_db) db->zero_();
    return;
  }
  PlanKey key{};
  key.device = x.get_device();
  key.a_type = to_cuda_dtype(x.scalar_type());
  key.d_type = to_cuda_dtype(dw.scalar_type());
  key.bias_type = has_db ? to_cuda_dtype(db->scalar_type()) : -1;
  key.m = K;
  key.n = N;
  key.k = M;
  key.lda = std::max<int64_t>(x.stride(0), K);
  key.ldb = std::max<int64_t>(grad_y.stride(0), N);
  key.ldd = K;
  key.ldaux = 0;
  key.batch = 1;
  key.transa = CUBLAS_OP_N;
  key.transb = CUBLAS_OP_T;
  key.epilogue = has_db ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
  key.tf32 = x.scalar_type() == at::kFloat && at::globalContext().allowTF32CuBLAS();
  lt_matmul(key, x.data_ptr(), grad_y.data_ptr(), nullptr, dw.data_ptr(),
            has_db ? db->data_ptr() : nullptr, nullptr,
            [&] {
              return shapes_str("linear_lt_bwd_weight", {{"dw", dw},
                                                         {"db", has_db ? *db : at::Tensor()},
                                                         {"grad_y", grad_y}, {"x", x}});
            });
}

std::vector<int64_t> linear_lt_plan_stats() {
  std::lock_guard<std::mutex> lock(g_plan_mu);
  return {g_counts[0], g_counts[1], g_counts[2], g_counts[3], g_counts[4],
          int64_t(fused_geglu_lt::candidate_count())};
}
