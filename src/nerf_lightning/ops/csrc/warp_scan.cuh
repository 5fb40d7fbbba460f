// Warp-level float64/float32 scans and sums shared by the one-warp-per-ray kernels
// (compositing.cu, losses.cu), and the run sum of the hash grid's warp backward (encoding.cu).
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

// Sums v over the run of equal keys that ends at this lane; true on a run's last lane (which holds its sum).
template <int F>
__device__ __forceinline__ bool warp_run_sum(uint32_t key, float (&v)[F], int lane) {
  const uint32_t prev = __shfl_up_sync(kFull, key, 1);
  const unsigned heads = __ballot_sync(kFull, lane == 0 || prev != key);
  if (heads == kFull) return true;  // every lane a run of its own (the same answer on every lane)
  const int first = 31 - __clz(heads & ((2u << lane) - 1u));  // the first lane of this lane's run
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
#pragma unroll
    for (int f = 0; f < F; ++f) {
      const float o = __shfl_up_sync(kFull, v[f], off);
      if (lane - off >= first) v[f] += o;
    }
  }
  return lane == 31 || ((heads >> (lane + 1)) & 1u);
}

}  // namespace nl
