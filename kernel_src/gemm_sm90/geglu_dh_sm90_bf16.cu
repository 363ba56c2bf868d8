// bf16 instantiation of the sm90 dh GEMM with the GeGLU-backward epilogue (own TU: builds in parallel).
#ifndef NDEBUG
#define NDEBUG  // see geglu_gateup_sm90_bf16.cu
#endif
#include "geglu_dh_sm90_kernel.cuh"

namespace fused_geglu_sm90 {
FUSED_GEGLU_SM90_DH_INSTANTIATE(cutlass::bfloat16_t)
}  // namespace fused_geglu_sm90
