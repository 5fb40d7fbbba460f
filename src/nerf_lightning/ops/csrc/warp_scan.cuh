// Warp-level float64/float32 scans and sums shared by the one-warp-per-ray kernels
// (compositing.cu, losses.cu).
#pragma once

namespace nl {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ double warp_incl_scan(double v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const double y = __shfl_up_sync(kFull, v, off);
    if (lane >= off) v += y;
  }
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

__device__ __forceinline__ float warp_sumf(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

}  // namespace nl
