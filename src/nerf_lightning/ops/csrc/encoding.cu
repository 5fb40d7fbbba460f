// Multiresolution hash encoding (tiny-cuda-nn layout) and spherical harmonics.
//
// One thread per (point, level); consecutive threads walk the levels of one point, so the
// [N, L*F] output and gradient rows are read/written coalesced. Float arithmetic mirrors the
// torch reference (models/encoding.py::hash_encode_torch): pos = x*scale (rounded) + 0.5
// (rounded), never fused (the extension is built with --fmad=false as well).
#include <cuda_fp16.h>

#include <cstdlib>
#include <vector>

#include "common.h"
#include "warp_scan.cuh"

namespace nl {

constexpr int kMaxLevels = 32;

struct LevelMeta {
  float scale[kMaxLevels];
  uint32_t res[kMaxLevels];
  uint32_t offset[kMaxLevels + 1];  // first row of each level in the table
  uint32_t dense_mask;              // bit l: level l indexes densely
  int n_levels;
  int level_major;  // thread order: 0 = levels of one point adjacent, 1 = points of one level adjacent
  int warp_backward;  // the table's gradient by hash_bwd_warp_kernel (a warp per level, runs summed)
};

// (point, level) of this thread of a one-thread-per-(point, level) launch, see LevelMeta::level_major;
// false for the threads past the last one.
__device__ __forceinline__ bool thread_item(int64_t n_points, const LevelMeta& meta, int64_t& n, int& l) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (tid >= n_points * meta.n_levels) return false;
  if (meta.level_major) {
    l = static_cast<int>(tid / n_points);
    n = tid - static_cast<int64_t>(l) * n_points;
  } else {
    n = tid / meta.n_levels;
    l = static_cast<int>(tid - n * meta.n_levels);
  }
  return true;
}

template <typename T, int F>
struct alignas(sizeof(T) * F) Vec {
  T v[F];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// Corner rows of point n at level l and its fractional position in the cell (w[3]).
__device__ __forceinline__ void level_cell(const float* __restrict__ x, int64_t n, int l, const LevelMeta& meta,
                                           uint32_t rows[8], float w[3]) {
  const float scale = meta.scale[l];
  const uint32_t res = meta.res[l];
  const uint32_t lo = meta.offset[l];
  const uint32_t size = meta.offset[l + 1] - lo;
  const bool dense = (meta.dense_mask >> l) & 1u;
  uint32_t p0[3];
#pragma unroll
  for (int d = 0; d < 3; ++d) {
    const float pos = __fadd_rn(__fmul_rn(x[n * 3 + d], scale), 0.5f);
    const float f = floorf(pos);
    w[d] = __fsub_rn(pos, f);
    p0[d] = static_cast<uint32_t>(static_cast<int>(f));
  }
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const uint32_t cx = p0[0] + (c & 1), cy = p0[1] + ((c >> 1) & 1), cz = p0[2] + ((c >> 2) & 1);
    uint32_t i;
    if (dense) {
      i = cx + cy * res + cz * (res * res);
    } else {
      i = cx ^ (cy * 2654435761u) ^ (cz * 805459861u);
    }
    rows[c] = lo + i % size;
  }
}

// Corner rows and trilinear weights of point n at level l.
__device__ __forceinline__ void level_corners(const float* __restrict__ x, int64_t n, int l,
                                              const LevelMeta& meta, uint32_t rows[8], float wts[8]) {
  float w[3];
  level_cell(x, n, l, meta, rows, w);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const float wx = (c & 1) ? w[0] : __fsub_rn(1.0f, w[0]);
    const float wy = (c & 2) ? w[1] : __fsub_rn(1.0f, w[1]);
    const float wz = (c & 4) ? w[2] : __fsub_rn(1.0f, w[2]);
    wts[c] = __fmul_rn(__fmul_rn(wx, wy), wz);
  }
}

template <typename T, int F>
__global__ void hash_fwd_kernel(const float* __restrict__ x, const T* __restrict__ params, const LevelMeta meta,
                                int64_t n_points, float* __restrict__ out) {
  const int L = meta.n_levels;
  int64_t n;
  int l;
  if (!thread_item(n_points, meta, n, l)) return;
  uint32_t rows[8];
  float wts[8];
  level_corners(x, n, l, meta, rows, wts);
  Vec<T, F> vals[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) vals[c] = reinterpret_cast<const Vec<T, F>*>(params)[rows[c]];
  float acc[F];
#pragma unroll
  for (int f = 0; f < F; ++f) acc[f] = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; ++c) {
#pragma unroll
    for (int f = 0; f < F; ++f) acc[f] += wts[c] * to_float(vals[c].v[f]);
  }
  Vec<float, F> o;
#pragma unroll
  for (int f = 0; f < F; ++f) o.v[f] = acc[f];
  reinterpret_cast<Vec<float, F>*>(out)[n * L + l] = o;  // out row n, level l
}

template <int F>
__device__ __forceinline__ void atomic_add_vec(float* addr, const float* v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (F == 2) {
    atomicAdd(reinterpret_cast<float2*>(addr), make_float2(v[0], v[1]));
    return;
  } else if constexpr (F == 4) {
    atomicAdd(reinterpret_cast<float4*>(addr), make_float4(v[0], v[1], v[2], v[3]));
    return;
  }
#endif
#pragma unroll
  for (int f = 0; f < F; ++f) atomicAdd(addr + f, v[f]);
}

template <int F>
__global__ void hash_bwd_kernel(const float* __restrict__ x, const float* __restrict__ grad_out,
                                const LevelMeta meta, int64_t n_points, float* __restrict__ grad_params) {
  const int L = meta.n_levels;
  int64_t n;
  int l;
  if (!thread_item(n_points, meta, n, l)) return;
  const Vec<float, F> g = reinterpret_cast<const Vec<float, F>*>(grad_out)[n * L + l];
  bool any = false;
#pragma unroll
  for (int f = 0; f < F; ++f) any |= g.v[f] != 0.0f;
  if (!any) return;  // zero upstream gradient: nothing to scatter (common for masked samples)
  uint32_t rows[8];
  float wts[8];
  level_corners(x, n, l, meta, rows, wts);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    float v[F];
#pragma unroll
    for (int f = 0; f < F; ++f) v[f] = wts[c] * g.v[f];
    atomic_add_vec<F>(grad_params + static_cast<int64_t>(rows[c]) * F, v);
  }
}

// The table's gradient, a warp per level over 32 consecutive points (a block: 32 points, L warps). Consecutive
// samples of a ray share the coarse levels' cells, so lanes often add into the same row: each run of equal
// rows is summed in registers (warp_run_sum) and written by one atomic, not one per lane into a contended
// row. Sums in another order than hash_bwd_kernel (float rounding only).
constexpr uint32_t kNoRow = 0xffffffffu;  // lanes past the points or with a zero gradient

template <int F>
__global__ void hash_bwd_warp_kernel(const float* __restrict__ x, const float* __restrict__ grad_out,
                                     const LevelMeta meta, int64_t n_points, float* __restrict__ grad_params) {
  const int L = meta.n_levels;
  const int lane = threadIdx.x & 31;
  const int l = threadIdx.x >> 5;
  const int64_t n = blockIdx.x * 32LL + lane;
  Vec<float, F> g{};
  bool any = false;
  if (n < n_points) {
    g = reinterpret_cast<const Vec<float, F>*>(grad_out)[n * L + l];
#pragma unroll
    for (int f = 0; f < F; ++f) any |= g.v[f] != 0.0f;
  }
  if (!__any_sync(kFull, any)) return;  // the whole warp: nothing to scatter
  uint32_t rows[8] = {};
  float wts[8] = {};
  if (any) level_corners(x, n, l, meta, rows, wts);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const uint32_t row = any ? rows[c] : kNoRow;
    float v[F];
#pragma unroll
    for (int f = 0; f < F; ++f) v[f] = any ? wts[c] * g.v[f] : 0.0f;
    if (warp_run_sum<F>(row, v, lane) && row != kNoRow) atomic_add_vec<F>(grad_params + int64_t{row} * F, v);
  }
}

// Gradient w.r.t. the positions (learned camera poses move the samples): per point, over the levels,
// sum_c <dL/dout_l, feature_c> * d w_c / d x, with d w_c / d x_d = scale_l * (+-1) * (the other two
// factors of w_c). One thread per point (no atomics); points with a zero upstream gradient skip
// their gathers.
template <typename T, int F>
__global__ void hash_bwd_input_kernel(const float* __restrict__ x, const T* __restrict__ params,
                                      const float* __restrict__ grad_out, const LevelMeta meta, int64_t n_points,
                                      float* __restrict__ grad_x) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= n_points) return;
  const int L = meta.n_levels;
  float gx[3] = {0.0f, 0.0f, 0.0f};
  for (int l = 0; l < L; ++l) {
    const Vec<float, F> g = reinterpret_cast<const Vec<float, F>*>(grad_out)[n * L + l];
    bool any = false;
#pragma unroll
    for (int f = 0; f < F; ++f) any |= g.v[f] != 0.0f;
    if (!any) continue;
    uint32_t rows[8];
    float w[3];
    level_cell(x, n, l, meta, rows, w);
    const float scale = meta.scale[l];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const Vec<T, F> val = reinterpret_cast<const Vec<T, F>*>(params)[rows[c]];
      float dot = 0.0f;
#pragma unroll
      for (int f = 0; f < F; ++f) dot += g.v[f] * to_float(val.v[f]);
      const float wx = (c & 1) ? w[0] : 1.0f - w[0];
      const float wy = (c & 2) ? w[1] : 1.0f - w[1];
      const float wz = (c & 4) ? w[2] : 1.0f - w[2];
      const float k = dot * scale;
      gx[0] += ((c & 1) ? k : -k) * wy * wz;
      gx[1] += ((c & 2) ? k : -k) * wx * wz;
      gx[2] += ((c & 4) ? k : -k) * wx * wy;
    }
  }
#pragma unroll
  for (int d = 0; d < 3; ++d) grad_x[n * 3 + d] = gx[d];
}

static LevelMeta make_meta(const std::vector<double>& scales, const std::vector<int64_t>& resolutions,
                           const std::vector<int64_t>& offsets) {
  const int L = static_cast<int>(scales.size());
  TORCH_CHECK(L >= 1 && L <= kMaxLevels, "hash encoding: 1..", kMaxLevels, " levels supported, got ", L);
  TORCH_CHECK(static_cast<int>(resolutions.size()) == L && static_cast<int>(offsets.size()) == L + 1,
              "hash encoding: need L resolutions and L+1 offsets");
  TORCH_CHECK(offsets[L] < (1LL << 32), "hash encoding: table too large for uint32 rows");
  LevelMeta m{};
  m.n_levels = L;
  for (int l = 0; l < L; ++l) {
    m.scale[l] = static_cast<float>(scales[l]);
    m.res[l] = static_cast<uint32_t>(resolutions[l]);
    m.offset[l] = static_cast<uint32_t>(offsets[l]);
    const int64_t size = offsets[l + 1] - offsets[l];
    TORCH_CHECK(size > 0, "hash encoding: empty level ", l);
    const double r = static_cast<double>(resolutions[l]);
    if (r * r * r <= static_cast<double>(size)) m.dense_mask |= (1u << l);
  }
  m.offset[L] = static_cast<uint32_t>(offsets[L]);
  // Benchmark switch (default 0); read at every launch so that a benchmark can compare the orders.
  const char* order = std::getenv("NERF_LIGHTNING_HASH_ORDER");
  m.level_major = (order != nullptr && order[0] == 'l') ? 1 : 0;
  m.warp_backward = (order != nullptr && order[0] == 'w') ? 1 : 0;
  return m;
}

#define NL_DISPATCH_F(F_RT, ...)                                                  \
  switch (F_RT) {                                                                 \
    case 1: { constexpr int F = 1; __VA_ARGS__; break; }                          \
    case 2: { constexpr int F = 2; __VA_ARGS__; break; }                          \
    case 4: { constexpr int F = 4; __VA_ARGS__; break; }                          \
    case 8: { constexpr int F = 8; __VA_ARGS__; break; }                          \
    default: TORCH_CHECK(false, "hash encoding: n_features_per_level must be 1, 2, 4 or 8, got ", F_RT); \
  }

torch::Tensor hash_encode_fwd(torch::Tensor x, torch::Tensor params, std::vector<double> scales,
                              std::vector<int64_t> resolutions, std::vector<int64_t> offsets) {
  NL_CHECK_INPUTS(x, params);
  NL_CHECK_DTYPES(torch::kFloat32, x);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == 3, "hash encoding: x must be [N, 3]");
  TORCH_CHECK(params.dim() == 2, "hash encoding: params must be [rows, F]");
  const c10::cuda::CUDAGuard guard(x.device());
  const LevelMeta meta = make_meta(scales, resolutions, offsets);
  TORCH_CHECK(params.size(0) == offsets.back(), "hash encoding: params has ", params.size(0), " rows, expected ",
              offsets.back());
  const int64_t N = x.size(0);
  const int Fr = static_cast<int>(params.size(1));
  auto out = torch::empty({N, meta.n_levels * Fr}, x.options());
  if (N == 0) return out;
  const int threads = 256;
  const int64_t total = N * meta.n_levels;
  if (params.scalar_type() == torch::kFloat32) {
    NL_DISPATCH_F(Fr, hash_fwd_kernel<float, F><<<n_blocks(total, threads), threads, 0, stream()>>>(
                          x.data_ptr<float>(), params.data_ptr<float>(), meta, N, out.data_ptr<float>()));
  } else if (params.scalar_type() == torch::kFloat16) {
    const __half* p = reinterpret_cast<const __half*>(params.data_ptr<at::Half>());
    NL_DISPATCH_F(Fr, hash_fwd_kernel<__half, F><<<n_blocks(total, threads), threads, 0, stream()>>>(
                          x.data_ptr<float>(), p, meta, N, out.data_ptr<float>()));
  } else {
    TORCH_CHECK(false, "hash encoding: params must be float32 or float16");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// What both backward passes require of the positions [N, 3] and the output gradient [N, L*F].
static void check_backward_inputs(const torch::Tensor& x, const torch::Tensor& grad_out, const LevelMeta& meta,
                                  int features) {
  NL_CHECK_INPUTS(x, grad_out);
  NL_CHECK_DTYPES(torch::kFloat32, x, grad_out);
  TORCH_CHECK(grad_out.dim() == 2 && grad_out.size(0) == x.size(0) && grad_out.size(1) == meta.n_levels * features,
              "hash encoding backward: grad_out must be [N, L*F]");
}

// Returns the float32 gradient of the table [rows, F] (the caller casts it to the params dtype).
torch::Tensor hash_encode_bwd(torch::Tensor x, torch::Tensor grad_out, int64_t n_rows, int64_t n_features,
                              std::vector<double> scales, std::vector<int64_t> resolutions,
                              std::vector<int64_t> offsets) {
  const LevelMeta meta = make_meta(scales, resolutions, offsets);
  const int Fr = static_cast<int>(n_features);
  check_backward_inputs(x, grad_out, meta, Fr);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t N = x.size(0);
  auto grad = torch::zeros({n_rows, n_features}, x.options());
  if (N == 0) return grad;
  if (meta.warp_backward) {  // a block: 32 points, one warp per level (L <= 32: at most 1024 threads)
    NL_DISPATCH_F(Fr, hash_bwd_warp_kernel<F><<<n_blocks(N, 32), 32 * meta.n_levels, 0, stream()>>>(
                          x.data_ptr<float>(), grad_out.data_ptr<float>(), meta, N, grad.data_ptr<float>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return grad;
  }
  const int threads = 256;
  const int64_t total = N * meta.n_levels;
  NL_DISPATCH_F(Fr, hash_bwd_kernel<F><<<n_blocks(total, threads), threads, 0, stream()>>>(
                        x.data_ptr<float>(), grad_out.data_ptr<float>(), meta, N, grad.data_ptr<float>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad;
}

// The float32 gradient of the positions [N, 3] (only computed when the positions require it).
torch::Tensor hash_encode_bwd_input(torch::Tensor x, torch::Tensor params, torch::Tensor grad_out,
                                    std::vector<double> scales, std::vector<int64_t> resolutions,
                                    std::vector<int64_t> offsets) {
  NL_CHECK_INPUT(params);
  const LevelMeta meta = make_meta(scales, resolutions, offsets);
  const int Fr = static_cast<int>(params.size(1));
  check_backward_inputs(x, grad_out, meta, Fr);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t N = x.size(0);
  TORCH_CHECK(params.size(0) == offsets.back(), "hash encoding: params has ", params.size(0), " rows, expected ",
              offsets.back());
  auto grad = torch::empty({N, 3}, x.options());
  if (N == 0) return grad;
  const int threads = 128;
  if (params.scalar_type() == torch::kFloat32) {
    NL_DISPATCH_F(Fr, hash_bwd_input_kernel<float, F><<<n_blocks(N, threads), threads, 0, stream()>>>(
                          x.data_ptr<float>(), params.data_ptr<float>(), grad_out.data_ptr<float>(), meta, N,
                          grad.data_ptr<float>()));
  } else if (params.scalar_type() == torch::kFloat16) {
    const __half* p = reinterpret_cast<const __half*>(params.data_ptr<at::Half>());
    NL_DISPATCH_F(Fr, hash_bwd_input_kernel<__half, F><<<n_blocks(N, threads), threads, 0, stream()>>>(
                          x.data_ptr<float>(), p, grad_out.data_ptr<float>(), meta, N, grad.data_ptr<float>()));
  } else {
    TORCH_CHECK(false, "hash encoding: params must be float32 or float16");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad;
}

// ------------------------------------------------------------------------ spherical harmonics
__global__ void sh_fwd_kernel(const float* __restrict__ d, int64_t n, int degree, float* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = d[i * 3], y = d[i * 3 + 1], z = d[i * 3 + 2];
  float* o = out + i * degree * degree;
  o[0] = 0.28209479177387814f;
  if (degree <= 1) return;
  o[1] = -0.48860251190291987f * y;
  o[2] = 0.48860251190291987f * z;
  o[3] = -0.48860251190291987f * x;
  if (degree <= 2) return;
  const float xx = x * x, yy = y * y, zz = z * z, xy = x * y, yz = y * z, xz = x * z;
  o[4] = 1.0925484305920792f * xy;
  o[5] = -1.0925484305920792f * yz;
  o[6] = 0.94617469575755997f * zz - 0.31539156525251999f;
  o[7] = -1.0925484305920792f * xz;
  o[8] = 0.54627421529603959f * xx - 0.54627421529603959f * yy;
  if (degree <= 3) return;
  o[9] = 0.59004358992664352f * y * (-3.0f * xx + yy);
  o[10] = 2.8906114426405538f * xy * z;
  o[11] = 0.45704579946446572f * y * (1.0f - 5.0f * zz);
  o[12] = 0.3731763325901154f * z * (5.0f * zz - 3.0f);
  o[13] = 0.45704579946446572f * x * (1.0f - 5.0f * zz);
  o[14] = 1.4453057213202769f * z * (xx - yy);
  o[15] = 0.59004358992664352f * x * (-xx + 3.0f * yy);
}

// Degree 4 (the default view encoding): the 16 coefficients of a direction are one 64-byte row,
// written as four 16-byte stores instead of sixteen 4-byte ones (same values as sh_fwd_kernel).
__global__ void sh4_fwd_kernel(const float* __restrict__ d, int64_t n, float4* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = d[i * 3], y = d[i * 3 + 1], z = d[i * 3 + 2];
  const float xx = x * x, yy = y * y, zz = z * z, xy = x * y, yz = y * z, xz = x * z;
  float4* o = out + i * 4;
  o[0] = make_float4(0.28209479177387814f, -0.48860251190291987f * y, 0.48860251190291987f * z,
                     -0.48860251190291987f * x);
  o[1] = make_float4(1.0925484305920792f * xy, -1.0925484305920792f * yz,
                     0.94617469575755997f * zz - 0.31539156525251999f, -1.0925484305920792f * xz);
  o[2] = make_float4(0.54627421529603959f * xx - 0.54627421529603959f * yy,
                     0.59004358992664352f * y * (-3.0f * xx + yy), 2.8906114426405538f * xy * z,
                     0.45704579946446572f * y * (1.0f - 5.0f * zz));
  o[3] = make_float4(0.3731763325901154f * z * (5.0f * zz - 3.0f), 0.45704579946446572f * x * (1.0f - 5.0f * zz),
                     1.4453057213202769f * z * (xx - yy), 0.59004358992664352f * x * (-xx + 3.0f * yy));
}

torch::Tensor sh_encode_fwd(torch::Tensor dirs, int64_t degree) {
  NL_CHECK_TENSORS(torch::kFloat32, dirs);
  TORCH_CHECK(dirs.dim() == 2 && dirs.size(1) == 3, "sh encoding: dirs must be [N, 3]");
  TORCH_CHECK(degree >= 1 && degree <= 4, "sh encoding: degree must be in 1..4");
  const c10::cuda::CUDAGuard guard(dirs.device());
  const int64_t n = dirs.size(0);
  auto out = torch::empty({n, degree * degree}, dirs.options());
  if (n == 0) return out;
  if (degree == 4) {  // a fresh contiguous [n, 16] float tensor: every row is 16-byte aligned
    sh4_fwd_kernel<<<n_blocks(n, 256), 256, 0, stream()>>>(dirs.data_ptr<float>(), n,
                                                           reinterpret_cast<float4*>(out.data_ptr<float>()));
  } else {
    sh_fwd_kernel<<<n_blocks(n, 256), 256, 0, stream()>>>(dirs.data_ptr<float>(), n, static_cast<int>(degree),
                                                          out.data_ptr<float>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// d/d(x, y, z) of the SH coefficients above, contracted with the coefficients' gradient g [n, degree^2]:
// the directions' gradient [n, 3] (learned camera poses turn the view directions).
__global__ void sh_bwd_kernel(const float* __restrict__ d, const float* __restrict__ g, int64_t n, int degree,
                              float* __restrict__ grad) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = d[i * 3], y = d[i * 3 + 1], z = d[i * 3 + 2];
  const float* o = g + i * degree * degree;
  float gx = 0.0f, gy = 0.0f, gz = 0.0f;
  if (degree > 1) {
    const float c1 = 0.48860251190291987f;
    gy -= c1 * o[1];
    gz += c1 * o[2];
    gx -= c1 * o[3];
  }
  if (degree > 2) {
    const float c20 = 1.0925484305920792f, c21 = 0.94617469575755997f, c23 = 0.54627421529603959f;
    gx += c20 * y * o[4];
    gy += c20 * x * o[4];
    gy -= c20 * z * o[5];
    gz -= c20 * y * o[5];
    gz += 2.0f * c21 * z * o[6];
    gx -= c20 * z * o[7];
    gz -= c20 * x * o[7];
    gx += 2.0f * c23 * x * o[8];
    gy -= 2.0f * c23 * y * o[8];
  }
  if (degree > 3) {
    const float c30 = 0.59004358992664352f, c31 = 2.8906114426405538f, c32 = 0.45704579946446572f;
    const float c33 = 0.3731763325901154f, c34 = 1.4453057213202769f;
    const float xx = x * x, yy = y * y, zz = z * z;
    gx += -6.0f * c30 * x * y * o[9];  // c30 y (-3 xx + yy)
    gy += 3.0f * c30 * (yy - xx) * o[9];
    gx += c31 * y * z * o[10];  // c31 x y z
    gy += c31 * x * z * o[10];
    gz += c31 * x * y * o[10];
    gy += c32 * (1.0f - 5.0f * zz) * o[11];  // c32 y (1 - 5 zz)
    gz += -10.0f * c32 * y * z * o[11];
    gz += c33 * (15.0f * zz - 3.0f) * o[12];  // c33 z (5 zz - 3)
    gx += c32 * (1.0f - 5.0f * zz) * o[13];  // c32 x (1 - 5 zz)
    gz += -10.0f * c32 * x * z * o[13];
    gx += 2.0f * c34 * x * z * o[14];  // c34 z (xx - yy)
    gy += -2.0f * c34 * y * z * o[14];
    gz += c34 * (xx - yy) * o[14];
    gx += 3.0f * c30 * (yy - xx) * o[15];  // c30 x (-xx + 3 yy)
    gy += 6.0f * c30 * x * y * o[15];
  }
  grad[i * 3] = gx;
  grad[i * 3 + 1] = gy;
  grad[i * 3 + 2] = gz;
}

torch::Tensor sh_encode_bwd(torch::Tensor dirs, torch::Tensor grad_out, int64_t degree) {
  NL_CHECK_INPUTS(dirs, grad_out);
  NL_CHECK_DTYPES(torch::kFloat32, dirs, grad_out);
  TORCH_CHECK(degree >= 1 && degree <= 4, "sh encoding: degree must be in 1..4");
  const int64_t n = dirs.size(0);
  TORCH_CHECK(dirs.dim() == 2 && dirs.size(1) == 3, "sh encoding: dirs must be [N, 3]");
  TORCH_CHECK(grad_out.dim() == 2 && grad_out.size(0) == n && grad_out.size(1) == degree * degree,
              "sh encoding backward: grad_out must be [N, degree^2]");
  const c10::cuda::CUDAGuard guard(dirs.device());
  auto grad = torch::empty({n, 3}, dirs.options());
  if (n == 0) return grad;
  sh_bwd_kernel<<<n_blocks(n, 256), 256, 0, stream()>>>(dirs.data_ptr<float>(), grad_out.data_ptr<float>(), n,
                                                        static_cast<int>(degree), grad.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad;
}

}  // namespace nl
