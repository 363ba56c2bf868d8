// bf16 instantiations of the sm90 gate+up GeGLU GEMM's 64-row decode tiles, in their own TU so they
// compile in parallel with the other tiles' TUs.
#ifndef NDEBUG
#define NDEBUG  // see geglu_gateup_sm90_bf16.cu
#endif
#include "geglu_gateup_sm90_kernel.cuh"

namespace fused_geglu_sm90 {
FUSED_GEGLU_SM90_INSTANTIATE(cutlass::bfloat16_t, TileCfg::k64x128pp)
FUSED_GEGLU_SM90_INSTANTIATE(cutlass::bfloat16_t, TileCfg::k64x256pp)
FUSED_GEGLU_SM90_INSTANTIATE(cutlass::bfloat16_t, TileCfg::k64x128k128pp)
}  // namespace fused_geglu_sm90
