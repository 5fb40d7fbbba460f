// Occupancy-grid ops of ops/reference/grid.py: cell positions, the density EMA, occupancy bits.
//
// Every kernel reproduces the float32 operation sequence of the reference (the oracle); the
// extension is built with --fmad=false and IEEE division/sqrt so that a*b+c is rounded twice, as
// PyTorch's elementwise kernels do. Comments name the reference expression each line mirrors.
#include <cmath>

#include "common.h"

namespace nl {

__global__ void grid_cell_positions_kernel(const int64_t* __restrict__ idx, const float* __restrict__ jitter,
                                           int64_t n, int g, float* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t g3 = static_cast<int64_t>(g) * g * g;
  const int64_t id = idx[i];
  // python-style floor division / modulo, as torch's // and % on int64
  int64_t c = id / g3;
  int64_t local = id - c * g3;
  if (local < 0) { local += g3; c -= 1; }
  const int64_t ijk[3] = {local / (static_cast<int64_t>(g) * g), (local / g) % g, local % g};
  const float scale = ldexpf(1.0f, static_cast<int>(c));
  const float gf = static_cast<float>(g);
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    // ((ijk + jitter) / g - 0.5) * scale + 0.5
    const float v = __fdiv_rn(static_cast<float>(ijk[a]) + jitter[i * 3 + a], gf);
    out[i * 3 + a] = (v - 0.5f) * scale + 0.5f;
  }
}

torch::Tensor grid_cell_positions(torch::Tensor cell_indices, torch::Tensor jitter, int64_t g) {
  NL_CHECK_INPUTS(cell_indices, jitter);
  NL_CHECK_DTYPES(torch::kInt64, cell_indices);
  NL_CHECK_DTYPES(torch::kFloat32, jitter);
  const c10::cuda::CUDAGuard guard(jitter.device());
  const int64_t n = cell_indices.size(0);
  auto out = torch::empty({n, 3}, jitter.options());
  if (n > 0) {
    grid_cell_positions_kernel<<<n_blocks(n, 256), 256, 0, stream()>>>(
        cell_indices.data_ptr<int64_t>(), jitter.data_ptr<float>(), n, static_cast<int>(g), out.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

// Max-splat of non-negative densities: float order == int order for x >= 0, and the splat starts
// at +0 (the reference's scatter_reduce(amax, include_self) over zeros), so negatives never win.
__global__ void grid_splat_kernel(const int64_t* __restrict__ idx, const float* __restrict__ dens, int64_t n,
                                  int* __restrict__ splat) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float v = dens[i];
  if (v > 0.0f) atomicMax(splat + idx[i], __float_as_int(v));
}

__global__ void grid_ema_kernel(const float* __restrict__ old, const int* __restrict__ splat, int64_t n, float decay,
                                float* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float o = old[i];
  const float s = __int_as_float(splat[i]);
  out[i] = o < 0.0f ? o : fmaxf(o * decay, s);
}

torch::Tensor grid_ema_update(torch::Tensor grid, torch::Tensor cell_indices, torch::Tensor densities, double decay) {
  NL_CHECK_INPUTS(grid, cell_indices, densities);
  NL_CHECK_DTYPES(torch::kFloat32, grid);
  NL_CHECK_DTYPES(torch::kInt64, cell_indices);
  NL_CHECK_DTYPES(torch::kFloat32, densities);
  const c10::cuda::CUDAGuard guard(grid.device());
  const int64_t n_cells = grid.numel();
  const int64_t n = cell_indices.size(0);
  auto splat = torch::zeros({n_cells}, grid.options().dtype(torch::kInt32));
  auto out = torch::empty_like(grid);
  if (n > 0) {
    grid_splat_kernel<<<n_blocks(n, 256), 256, 0, stream()>>>(cell_indices.data_ptr<int64_t>(),
                                                              densities.data_ptr<float>(), n, splat.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (n_cells > 0) {
    grid_ema_kernel<<<n_blocks(n_cells, 256), 256, 0, stream()>>>(grid.data_ptr<float>(), splat.data_ptr<int>(),
                                                                  n_cells, static_cast<float>(decay),
                                                                  out.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

__global__ void pack_bits_kernel(const uint8_t* __restrict__ bins, int64_t n_bytes, uint8_t* __restrict__ bits) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_bytes) return;
  const uint64_t v = reinterpret_cast<const uint64_t*>(bins)[i];  // 8 bools, little endian
  uint8_t b = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) b |= static_cast<uint8_t>(((v >> (8 * k)) & 0xffu) != 0) << k;
  bits[i] = b;
}

__global__ void unpack_bits_kernel(const uint8_t* __restrict__ bits, int64_t n_bytes, uint8_t* __restrict__ bins) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_bytes) return;
  const uint8_t b = bits[i];
  uint64_t v = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) v |= static_cast<uint64_t>((b >> k) & 1u) << (8 * k);
  reinterpret_cast<uint64_t*>(bins)[i] = v;
}

torch::Tensor pack_bitfield(torch::Tensor binaries) {
  NL_CHECK_TENSORS(torch::kBool, binaries);
  TORCH_CHECK(binaries.numel() % 8 == 0, "pack_bitfield: number of cells is not a multiple of 8");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(binaries.data_ptr()) % 8 == 0, "pack_bitfield: input not 8-byte aligned");
  const c10::cuda::CUDAGuard guard(binaries.device());
  const int64_t n_bytes = binaries.numel() / 8;
  auto bits = torch::empty({n_bytes}, binaries.options().dtype(torch::kUInt8));
  if (n_bytes > 0) {
    pack_bits_kernel<<<n_blocks(n_bytes, 256), 256, 0, stream()>>>(
        reinterpret_cast<const uint8_t*>(binaries.data_ptr<bool>()), n_bytes, bits.data_ptr<uint8_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return bits;
}

torch::Tensor unpack_bitfield(torch::Tensor bits, int64_t c, int64_t g) {
  NL_CHECK_TENSORS(torch::kUInt8, bits);
  TORCH_CHECK(bits.numel() == c * g * g * g / 8, "unpack_bitfield: expected C*G^3/8 bytes");
  const c10::cuda::CUDAGuard guard(bits.device());
  const int64_t n_bytes = bits.numel();
  auto bins = torch::empty({c, g, g, g}, bits.options().dtype(torch::kBool));
  if (n_bytes > 0) {
    unpack_bits_kernel<<<n_blocks(n_bytes, 256), 256, 0, stream()>>>(
        bits.data_ptr<uint8_t>(), n_bytes, reinterpret_cast<uint8_t*>(bins.data_ptr<bool>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return bins;
}

}  // namespace nl
