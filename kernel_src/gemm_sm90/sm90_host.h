// Host-side helper both sm90 ops (geglu_gateup_sm90.cu, geglu_dh_sm90.cu) call before CUTLASS
// builds its TMA descriptors.
#pragma once

#include <cuda_runtime.h>

namespace fused_geglu_sm90 {

// Autograd runs the backward on its own thread, where no CUDA context need be current yet; the TMA
// descriptors CUTLASS encodes on the host go through the driver API, which then fails (error 201,
// invalid context: seen on the H200 at cdb9034) and the kernel runs with a garbage descriptor.
// cudaSetDevice makes the device's primary context current on this thread. It is skipped while the
// stream is being captured into a CUDA graph: the capturing thread has a current context already,
// and the call is kept out of capture.
inline cudaError_t bind_primary_context(int device, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err != cudaSuccess) return err;
  return status == cudaStreamCaptureStatusNone ? cudaSetDevice(device) : cudaSuccess;
}

}  // namespace fused_geglu_sm90
