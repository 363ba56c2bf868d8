// The whole GeGLU MLP at decode sizes (M <= 16 tokens) as ONE kernel on sm90:
//   y[M,H] = (gelu(x w_gate^T + b_gate) * (x w_up^T + b_up)) w_down^T + b_down.
//
// Why one kernel: at M = 16 the MLP is a weight read (Gemma3-1B: 47.8 MB, 11.4 us at the copy rate),
// and two kernels that only read the same bytes already take 15.3 us on the H200, above the 1.3x
// target; one read-only kernel takes 12.9 us (benchmarks/results/decode-fused-*.json, README
// "Gemma3-1B decode: one kernel or two"). A Triton one-kernel prototype lost on its fp32 partial sums:
// every program added a [16, H] partial with atomics (8 MB at 108 programs). Here the CTAs of a
// thread-block cluster share their h slices through distributed shared memory first, so each
// down-GEMM partial covers a cluster's 256 columns of I, and the I/256 partials are summed after a
// grid-wide barrier by every CTA at once, in a fixed order (no atomics on the data; deterministic).
//
// Layout of the work (kCluster = 4 CTAs per cluster, 256 threads per CTA):
//   * CTA b owns the 64 columns [64b, 64b + 64) of I. Phase 1 streams those 64 rows of w_gate and of
//     w_up, in tiles of 64 rows x 128 k (256-byte runs of each row; x's matching columns ride along),
//     through a cp.async ring, and computes gate/up [16, 64] with mma.sync m16n8k16 (the 16 rows of
//     a decode step are one MMA row block); then h = gelu(gate) * up, rounded to the weights' dtype as
//     a stored h would be.
//   * The cluster's 4 CTAs exchange h through DSMEM: each then holds h[:, the cluster's 256 columns].
//   * Phase 2: CTA rank r of the cluster computes the partial y[:, r H/4 .. (r+1) H/4) over those 256
//     columns of I, streaming its w_down rows (512 contiguous bytes each) through the same ring: the
//     phase-2 loads are in flight while phase 1 finishes, so DRAM does not wait on the phase change.
//     The partial is stored (plain 16-byte stores) to partials[cluster].
//   * Grid barrier (a 64-bit counter that only grows: each call adds the grid size and waits for the
//     next multiple, so it never needs resetting), then each CTA sums a share of the [M, H] outputs
//     over the clusters in cluster order, adds b_down and writes y. The launch is cooperative, so the
//     whole grid is resident (or the launch fails) and the barrier cannot deadlock.
//
// mma.sync operand loads use one 16-byte shared-memory load per lane: lane (group g, thread t) loads
// 8 consecutive k of one row, and the two k16 MMAs of a 32-wide k block take elements {0,1},{2,3}
// and {4,5},{6,7} of it. A and B use the same k order, so the dot products are unchanged. Rows are
// 256 or 512 bytes; the 16-byte chunk index is XORed with 4 on odd rows, so the two rows one
// quarter-warp touches fall in different banks. Shared-memory traffic is what the MMAs cost here
// (measured at Gemma3-1B: 5.5 us of 25 with every warp loading its own x and h fragments per tile),
// so in phase 1 a warp takes one 32-wide k block of 32 rows (one x fragment for four MMAs), and in
// phase 2 h's fragments are loaded into registers once.
//
// Requirements (checked by the host op): sm90, bf16 or fp16, M in 1..16, H % 128 == 0, I % 256 == 0,
// the grid (I / 64 CTAs) resident at once, every operand's last dimension contiguous with 16-byte
// aligned rows.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <type_traits>

#include "torch_binding.h"

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kSlice = 64;                       // I columns per CTA (64 w_gate + 64 w_up rows)
constexpr int kCluster = 4;                      // CTAs per cluster
constexpr int kK2 = kSlice * kCluster;           // 256: the down GEMM's K per cluster
constexpr int kTileK1 = 128;                     // phase-1 tile: 64 rows of w_gate or w_up x 128 k
constexpr int kRows2 = 32;                       // phase-2 tile: 32 w_down rows x 256 k
constexpr int kMaxM = 16;
constexpr int kWBytes = 16384;
constexpr int kXBytes = kMaxM * kTileK1 * 2;     // x's 128 columns for a phase-1 tile
constexpr int kStageBytes = kWBytes + kXBytes;
constexpr int kGuBytes = kMaxM * 2 * kSlice * 4;  // gate|up accumulators, fp32
constexpr int kHsBytes = kMaxM * kSlice * 2;       // this CTA's h (read by the cluster)
constexpr int kHcBytes = kMaxM * kK2 * 2;          // the cluster's h
constexpr int kRedBytes = 4 * 32 * 16;             // phase-2 k-half exchange

template <int kStages>
constexpr int smem_bytes() {
  return kStages * kStageBytes + kGuBytes + kHsBytes + kHcBytes + kRedBytes;
}

template <class T>
struct Params {
  const T *x, *wg, *wu, *wd, *bg, *bu, *bd;
  T *y;
  float *partials;                  // [I / 256, 16, H] fp32, any contents
  unsigned long long *barrier;      // zero when first used; only ever grows
  int M, H, I;
  int64_t ldx, ldwg, ldwu, ldwd, ldy;
  int approximate;
  // $FUSED_GEGLU_DECODE_DIAG (timing only, read per call): 1 = no MMA (the weight stream alone),
  // 2 = no partials and no y (the barrier stays), 3 = neither, 4 = x not loaded (wrong results), 0 = the
  // real kernel.
  int diag;
};

__device__ __forceinline__ int swz(int row, int chunk) { return chunk ^ ((row & 1) << 2); }

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; zero-filled when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}

template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// One 32-wide k block: a_lo / a_hi are rows g and g + 8 of A, b is row g of B (W[n][k]), 8 k each.
template <class T>
__device__ __forceinline__ void mma_k32(float (&c)[4], uint4 a_lo, uint4 a_hi, uint4 b) {
  mma16816<T>(c, a_lo.x, a_hi.x, a_lo.y, a_hi.y, b.x, b.y);
  mma16816<T>(c, a_lo.z, a_hi.z, a_lo.w, a_hi.w, b.z, b.w);
}

template <class T>
__device__ __forceinline__ float to_f(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return __half2float(v);
}
template <class T>
__device__ __forceinline__ T from_f(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16(v);
  else return __float2half(v);
}

__device__ __forceinline__ float gelu(float g, int approximate) {
  if (approximate) return 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  return 0.5f * g * (1.f + erff(g * 0.7071067811865476f));
}

template <class T, int kStages>
// 4 stages fit two CTAs per SM (100 KB of shared memory each), 8 stages one (180 KB).
__global__ void __launch_bounds__(kThreads, kStages == 4 ? 2 : 1) geglu_mlp_decode_kernel(const Params<T> p) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char *ring = smem;
  float *gu = reinterpret_cast<float *>(smem + kStages * kStageBytes);     // [16][128]
  T *hs = reinterpret_cast<T *>(smem + kStages * kStageBytes + kGuBytes);  // [16][64]
  unsigned char *hc = smem + kStages * kStageBytes + kGuBytes + kHsBytes;  // [16][256], swizzled
  float4 *red = reinterpret_cast<float4 *>(hc + kHcBytes);                 // [4][32]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int cl = blockIdx.x / kCluster, n_clusters = gridDim.x / kCluster;
  const int i0 = blockIdx.x * kSlice;  // this CTA's columns of I
  const int k20 = cl * kK2;            // the cluster's columns of I (the down GEMM's K)
  // Phase-1 tiles alternate w_gate and w_up rows of one 128-wide k block (t & 1, t >> 1).
  const int H = p.H, T1 = 2 * (H / kTileK1), nq = H / kCluster, T2 = nq / kRows2, n_tiles = T1 + T2;
  const int n20 = rank * nq;           // this CTA's output columns

  auto load_tile = [&](int t, int stage) {
    const uint32_t s = smem_u32(ring + stage * kStageBytes);
    if (t < T1) {
      const T *w = (t & 1) ? p.wu : p.wg;
      const int64_t ldw = (t & 1) ? p.ldwu : p.ldwg;
      const int k0 = (t >> 1) * kTileK1;
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // 64 rows x 16 chunks: 256-byte runs of each row
        const int q = tid + i * kThreads, row = q >> 4, c = q & 15;
        cp_async16(s + row * 256 + (swz(row, c) << 4), w + int64_t(i0 + row) * ldw + k0 + c * 8, true);
      }
      if (!(p.diag & 4)) {  // x's 16 rows x 16 chunks, zeros past M
        const int row = tid >> 4, c = tid & 15;
        const bool valid = row < p.M;
        const T *src = p.x + int64_t(valid ? row : 0) * p.ldx + k0 + c * 8;
        cp_async16(s + kWBytes + row * 256 + (swz(row, c) << 4), src, valid);
      }
    } else {
      const int tt = t - T1;
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // 32 rows x 32 chunks: 512-byte runs
        const int q = tid + i * kThreads, row = q >> 5, c = q & 31;
        const T *src = p.wd + int64_t(n20 + tt * kRows2 + row) * p.ldwd + k20 + c * 8;
        cp_async16(s + row * 512 + (swz(row, c) << 4), src, true);
      }
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    cp_commit();
  }

  float acc1[2][4][4] = {};                 // [gate|up][8-row group][fragment]
  const int kq = warp & 3, rh = warp >> 2;  // phase 1: k32 block of the tile, 32-row half
  const int g2 = warp & 3, kh = warp >> 2;  // phase 2: 8-row group of the tile, half of the 256 k
  uint4 h_lo[4], h_hi[4];                   // phase 2: this warp's h fragments (rows gid, gid + 8)
  for (int t = 0; t < n_tiles; ++t) {
    cp_wait<kStages - 2>();
    __syncthreads();
    if (t + kStages - 1 < n_tiles) load_tile(t + kStages - 1, (t + kStages - 1) % kStages);
    cp_commit();
    const unsigned char *s = ring + (t % kStages) * kStageBytes;
    if (t < T1) {
      // Warp w: k32 block kq = w & 3 of the tile, rows 32 (w >> 2) .. + 32 (four 8-row groups), so
      // each x fragment loaded from shared memory serves four MMAs (one per group).
      const unsigned char *xs = s + kWBytes;
      const int ch = kq * 4 + tig;
      const uint4 a_lo = *reinterpret_cast<const uint4 *>(xs + gid * 256 + (swz(gid, ch) << 4));
      const uint4 a_hi = *reinterpret_cast<const uint4 *>(xs + (gid + 8) * 256 + (swz(gid + 8, ch) << 4));
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const int row = rh * 32 + g * 8 + gid;
        const uint4 b = *reinterpret_cast<const uint4 *>(s + row * 256 + (swz(row, ch) << 4));
        if (!(p.diag & 1)) {
          if (t & 1) mma_k32<T>(acc1[1][g], a_lo, a_hi, b);
          else mma_k32<T>(acc1[0][g], a_lo, a_hi, b);
        }
      }
      if (t == T1 - 1) {
        // gate and up accumulators meet in shared memory: the four k blocks' partials are added in
        // k order, one k block per step (deterministic)
        for (int step = 0; step < 4; ++step) {
          if (kq == step) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {  // j = 0: gate columns 0..63, j = 1: up columns 64..127
#pragma unroll
              for (int g = 0; g < 4; ++g) {
                const int col = j * kSlice + rh * 32 + g * 8 + tig * 2;
                float2 *lo = reinterpret_cast<float2 *>(gu + gid * 128 + col);
                float2 *hi = reinterpret_cast<float2 *>(gu + (gid + 8) * 128 + col);
                float2 vlo = make_float2(acc1[j][g][0], acc1[j][g][1]);
                float2 vhi = make_float2(acc1[j][g][2], acc1[j][g][3]);
                if (step > 0) {
                  vlo.x += lo->x, vlo.y += lo->y, vhi.x += hi->x, vhi.y += hi->y;
                }
                *lo = vlo;
                *hi = vhi;
              }
            }
          }
          __syncthreads();
        }
        __syncthreads();
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int idx = tid * 4 + e, m = idx >> 6, c = idx & 63;
          float g = gu[m * 128 + c], u = gu[m * 128 + kSlice + c];
          if (p.bg != nullptr) g += to_f(p.bg[i0 + c]);
          if (p.bu != nullptr) u += to_f(p.bu[i0 + c]);
          hs[m * kSlice + c] = from_f<T>(gelu(g, p.approximate) * u);
        }
        cluster.sync();  // every CTA's h is written
        // the cluster's h: peer q's 64 columns at q * 64, 16 rows of 512 bytes
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int q = tid + i * kThreads, peer = q >> 7, r = (q >> 3) & 15, c = q & 7;
          const T *remote = cluster.map_shared_rank(hs, peer);
          const uint4 v = *reinterpret_cast<const uint4 *>(remote + r * kSlice + c * 8);
          *reinterpret_cast<uint4 *>(hc + r * 512 + (swz(r, peer * 8 + c) << 4)) = v;
        }
        // Peers may still be reading this CTA's h: arrive now, wait before exiting.
        asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory");
        __syncthreads();
        // Phase 2 multiplies every w_down tile by the same h: its fragments stay in registers.
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const int c2 = (kh * 4 + kk) * 4 + tig;
          h_lo[kk] = *reinterpret_cast<const uint4 *>(hc + gid * 512 + (swz(gid, c2) << 4));
          h_hi[kk] = *reinterpret_cast<const uint4 *>(hc + (gid + 8) * 512 + (swz(gid + 8, c2) << 4));
        }
      }
    } else {
      const int tt = t - T1;
      float acc2[4][4] = {};
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int ch = (kh * 4 + kk) * 4 + tig;
        const int row = g2 * 8 + gid;
        const uint4 b = *reinterpret_cast<const uint4 *>(s + row * 512 + (swz(row, ch) << 4));
        if (!(p.diag & 1)) mma_k32<T>(acc2[kk], h_lo[kk], h_hi[kk], b);
      }
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = acc2[0][e] + acc2[1][e] + acc2[2][e] + acc2[3][e];
      if (kh == 1) red[g2 * 32 + lane] = make_float4(v[0], v[1], v[2], v[3]);
      __syncthreads();
      if (kh == 0 && !(p.diag & 2)) {
        const float4 o = red[g2 * 32 + lane];
        v[0] += o.x, v[1] += o.y, v[2] += o.z, v[3] += o.w;
        // Lanes tig and tig ^ 1 hold columns 2tig..2tig+1 of rows gid and gid + 8: the even lane
        // stores four columns of row gid, the odd one four of row gid + 8 (16 bytes each).
        const float p0 = __shfl_xor_sync(0xffffffffu, v[0], 1), p1 = __shfl_xor_sync(0xffffffffu, v[1], 1);
        const float p2 = __shfl_xor_sync(0xffffffffu, v[2], 1), p3 = __shfl_xor_sync(0xffffffffu, v[3], 1);
        const bool odd = tig & 1;
        const int m = odd ? gid + 8 : gid;
        const int col = n20 + tt * kRows2 + g2 * 8 + (tig & 2) * 2;
        if (m < p.M)
          __stcg(reinterpret_cast<float4 *>(p.partials + (int64_t(cl) * kMaxM + m) * H + col),
                 odd ? make_float4(p2, p3, v[2], v[3]) : make_float4(v[0], v[1], p0, p1));
      }
    }
  }
  cp_wait<0>();

  // Grid barrier: every cluster's partial is stored. The counter grows by the grid size per call.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned long long g = gridDim.x;
    const unsigned long long target = (atomicAdd(p.barrier, 1ULL) / g + 1) * g;
    while (ld_acquire(p.barrier) < target) __nanosleep(32);
  }
  __syncthreads();

  if (!(p.diag & 2)) {
    // y[m, 4q..4q+3] = sum over clusters + b_down, float4 groups spread over every warp of the grid:
    // tpg lanes per group each add every tpg-th cluster's partial (up to 8 loads in flight), then a
    // butterfly adds the lanes. The order depends only on the sizes, so the result is deterministic.
    const int per_row = H / 4, n4 = p.M * per_row, n_warps = gridDim.x * (kThreads / 32);
    int tpg = 32;
    while (tpg > 1 && n4 * tpg > n_warps * 32) tpg >>= 1;
    const int gpw = 32 / tpg, sub = lane % tpg;
    for (int base = (warp * gridDim.x + blockIdx.x) * gpw; base < n4; base += n_warps * gpw) {
      const int q = base + lane / tpg;
      const bool valid = q < n4;
      const int m = valid ? q / per_row : 0, c = valid ? (q % per_row) * 4 : 0;
      const float *src = p.partials + int64_t(m) * H + c;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int k0 = sub; k0 < n_clusters; k0 += 8 * tpg) {
        float4 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int k = k0 + j * tpg;
          v[j] = valid && k < n_clusters ? __ldcg(reinterpret_cast<const float4 *>(src + int64_t(k) * kMaxM * H))
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) acc.x += v[j].x, acc.y += v[j].y, acc.z += v[j].z, acc.w += v[j].w;
      }
      for (int off = tpg / 2; off >= 1; off >>= 1) {
        acc.x += __shfl_xor_sync(0xffffffffu, acc.x, off);
        acc.y += __shfl_xor_sync(0xffffffffu, acc.y, off);
        acc.z += __shfl_xor_sync(0xffffffffu, acc.z, off);
        acc.w += __shfl_xor_sync(0xffffffffu, acc.w, off);
      }
      if (valid && sub == 0) {
        float o[4] = {acc.x, acc.y, acc.z, acc.w};
        if (p.bd != nullptr) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[e] += to_f(p.bd[c + e]);
        }
        T *dst = p.y + int64_t(m) * p.ldy + c;
#pragma unroll
        for (int e = 0; e < 4; ++e) dst[e] = from_f<T>(o[e]);
      }
    }
  }
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

template <class T, int kStages>
void launch(const Params<T> &p, int device, cudaStream_t stream) {
  auto *kernel = geglu_mlp_decode_kernel<T, kStages>;
  constexpr int smem = smem_bytes<kStages>();
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.I / kSlice);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeCooperative;  // the grid barrier needs every CTA resident
  attr[1].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  // The shared-memory opt-in is per kernel and device: set once, not per call (a driver call each).
  // The number of clusters the device can hold at once is read at the same time.
  static std::once_flag once[64];
  static int max_clusters[64];
  std::call_once(once[device & 63], [&] {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaLaunchConfig_t occ = cfg;
    occ.numAttrs = 1;  // the cluster shape only
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&max_clusters[device & 63], kernel, &occ));
  });
  TORCH_CHECK(int(cfg.gridDim.x) / kCluster <= max_clusters[device & 63], "geglu_mlp_decode_sm90: I = ", p.I,
              " needs ", cfg.gridDim.x / kCluster, " clusters of ", kCluster, " resident at once with ", kStages,
              " stages; this GPU holds ", max_clusters[device & 63]);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
}

void check_2d(at::Tensor const &t, const char *name, at::Tensor const &x, int64_t rows, int64_t cols) {
  TORCH_CHECK(t.device() == x.device() && t.scalar_type() == x.scalar_type(), "geglu_mlp_decode_sm90: ", name,
              " must be ", x.scalar_type(), " on ", x.device(), ", got ", t.scalar_type(), " on ", t.device());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, "geglu_mlp_decode_sm90: ", name,
              " must be [", rows, ", ", cols, "], got ", t.sizes());
  TORCH_CHECK(t.stride(1) == 1 && t.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
              "geglu_mlp_decode_sm90: ", name, " needs a contiguous last dimension, a row stride that is a "
              "multiple of 8 elements and a 16-byte aligned start, got strides ", t.strides());
}

const void *bias_ptr(std::optional<at::Tensor> const &b, const char *name, at::Tensor const &x, int64_t n) {
  if (!b.has_value() || !b->defined()) return nullptr;
  TORCH_CHECK(b->dim() == 1 && b->size(0) == n && b->is_contiguous() && b->device() == x.device() &&
                  b->scalar_type() == x.scalar_type(),
              "geglu_mlp_decode_sm90: ", name, " must be a contiguous [", n, "] ", x.scalar_type(), " tensor on ",
              x.device(), ", got ", b->sizes(), " ", b->scalar_type());
  return b->data_ptr();
}

template <class T>
void run(at::Tensor &y, at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
         at::Tensor const &w_down, const void *bg, const void *bu, const void *bd, int64_t approximate,
         at::Tensor &partials, at::Tensor &barrier, int64_t stages) {
  Params<T> p{};
  p.x = static_cast<const T *>(x.data_ptr());
  p.wg = static_cast<const T *>(w_gate.data_ptr());
  p.wu = static_cast<const T *>(w_up.data_ptr());
  p.wd = static_cast<const T *>(w_down.data_ptr());
  p.bg = static_cast<const T *>(bg);
  p.bu = static_cast<const T *>(bu);
  p.bd = static_cast<const T *>(bd);
  p.y = static_cast<T *>(y.data_ptr());
  p.partials = partials.data_ptr<float>();
  p.barrier = reinterpret_cast<unsigned long long *>(barrier.data_ptr<int64_t>());
  p.M = int(x.size(0));
  p.H = int(x.size(1));
  p.I = int(w_gate.size(0));
  p.ldx = x.stride(0);
  p.ldwg = w_gate.stride(0);
  p.ldwu = w_up.stride(0);
  p.ldwd = w_down.stride(0);
  p.ldy = y.stride(0);
  p.approximate = int(approximate);
  const char *diag = std::getenv("FUSED_GEGLU_DECODE_DIAG");
  p.diag = diag != nullptr ? std::atoi(diag) : 0;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (stages == 4) launch<T, 4>(p, x.get_device(), stream);
  else launch<T, 8>(p, x.get_device(), stream);
}

}  // namespace

at::Tensor geglu_mlp_decode_sm90(at::Tensor const &x, at::Tensor const &w_gate, at::Tensor const &w_up,
                                 at::Tensor const &w_down, std::optional<at::Tensor> const &b_gate,
                                 std::optional<at::Tensor> const &b_up, std::optional<at::Tensor> const &b_down,
                                 int64_t approximate, at::Tensor &partials, at::Tensor &barrier, int64_t stages) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2, "geglu_mlp_decode_sm90: x must be a 2-D CUDA tensor, got ",
              x.sizes(), " on ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              "geglu_mlp_decode_sm90: x must be bfloat16 or float16, got ", x.scalar_type());
  const int64_t M = x.size(0), H = x.size(1), I = w_gate.dim() == 2 ? w_gate.size(0) : -1;
  TORCH_CHECK(M >= 1 && M <= kMaxM, "geglu_mlp_decode_sm90: x must have 1 to ", kMaxM, " rows, got ", M);
  TORCH_CHECK(H % 128 == 0 && H > 0 && H <= 16384, "geglu_mlp_decode_sm90: H must be a positive multiple of "
              "128 up to 16384, got ", H);
  TORCH_CHECK(I % kK2 == 0 && I > 0 && I <= 65536, "geglu_mlp_decode_sm90: I must be a positive multiple of ",
              kK2, " up to 65536, got ", I);
  TORCH_CHECK(approximate == 0 || approximate == 1, "geglu_mlp_decode_sm90: approximate must be 0 (erf) or "
              "1 (tanh), got ", approximate);
  TORCH_CHECK(stages == 0 || stages == 4 || stages == 8, "geglu_mlp_decode_sm90: stages must be 0 (by size), 4 "
              "or 8, got ", stages);
  check_2d(x, "x", x, M, H);
  check_2d(w_gate, "w_gate", x, I, H);
  check_2d(w_up, "w_up", x, I, H);
  check_2d(w_down, "w_down", x, H, I);
  const int64_t n_partials = I / kK2 * kMaxM * H;
  TORCH_CHECK(partials.device() == x.device() && partials.scalar_type() == at::kFloat &&
                  partials.is_contiguous() && partials.numel() >= n_partials,
              "geglu_mlp_decode_sm90: partials must be a contiguous float32 tensor of at least I / 256 * 16 * H = ",
              n_partials, " elements on ", x.device());
  TORCH_CHECK(barrier.device() == x.device() && barrier.scalar_type() == at::kLong && barrier.is_contiguous() &&
                  barrier.numel() >= 1,
              "geglu_mlp_decode_sm90: barrier must be a contiguous int64 tensor (zero when first used) on ",
              x.device());
  const void *bg = bias_ptr(b_gate, "b_gate", x, I), *bu = bias_ptr(b_up, "b_up", x, I),
             *bd = bias_ptr(b_down, "b_down", x, H);
  const c10::cuda::CUDAGuard guard(x.device());
  if (stages == 0) {  // one CTA per SM while the grid fits that way (8 stages), else two (4 stages)
    int sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.get_device()));
    stages = I / kSlice <= sms ? 8 : 4;
  }
  at::Tensor y = at::empty({M, H}, x.options());
  if (x.scalar_type() == at::kBFloat16)
    run<__nv_bfloat16>(y, x, w_gate, w_up, w_down, bg, bu, bd, approximate, partials, barrier, stages);
  else
    run<__half>(y, x, w_gate, w_up, w_down, bg, bu, bd, approximate, partials, barrier, stages);
  return y;
}
