// Shared helpers of the nerf_lightning CUDA extension.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>

#define NL_CHECK_CUDA(x) TORCH_CHECK((x).is_cuda(), #x " must be a CUDA tensor")
#define NL_CHECK_CONTIG(x) TORCH_CHECK((x).is_contiguous(), #x " must be contiguous")
#define NL_CHECK_INPUT(x) \
  NL_CHECK_CUDA(x);       \
  NL_CHECK_CONTIG(x)
#define NL_CHECK_DTYPE(x, t) TORCH_CHECK((x).scalar_type() == (t), #x " must have dtype " #t)

namespace nl {

inline unsigned int n_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(b, 0x7fffffffLL)));
}

inline cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream(); }

}  // namespace nl
