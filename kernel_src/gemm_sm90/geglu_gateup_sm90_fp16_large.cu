// fp16 instantiations of the sm90 gate+up GeGLU GEMM's large tiles (256x128, 128x192 ping-pong),
// in their own TU so they compile in parallel with geglu_gateup_sm90_fp16.cu.
#ifndef NDEBUG
#define NDEBUG  // see geglu_gateup_sm90_fp16.cu
#endif
#include "geglu_gateup_sm90_kernel.cuh"

namespace fused_geglu_sm90 {
FUSED_GEGLU_SM90_INSTANTIATE(cutlass::half_t, TileCfg::k256x128)
FUSED_GEGLU_SM90_INSTANTIATE(cutlass::half_t, TileCfg::k128x192pp)
}  // namespace fused_geglu_sm90
