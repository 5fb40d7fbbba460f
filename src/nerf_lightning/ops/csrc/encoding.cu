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

namespace nl {

constexpr int kMaxLevels = 32;

struct LevelMeta {
  float scale[kMaxLevels];
  uint32_t res[kMaxLevels];
  uint32_t offset[kMaxLevels + 1];  // first row of each level in the table
  uint32_t dense_mask;              // bit l: level l indexes densely
  int n_levels;
  int level_major;  // thread order: 0 = levels of one point adjacent, 1 = points of one level adjacent
};

// (point, level) of thread tid; see LevelMeta::level_major.
__device__ __forceinline__ void thread_item(int64_t tid, int64_t n_points, const LevelMeta& meta, int64_t& n, int& l) {
  if (meta.level_major) {
    l = static_cast<int>(tid / n_points);
    n = tid - static_cast<int64_t>(l) * n_points;
  } else {
    n = tid / meta.n_levels;
    l = static_cast<int>(tid - n * meta.n_levels);
  }
}

template <typename T, int F>
struct alignas(sizeof(T) * F) Vec {
  T v[F];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// Corner rows and trilinear weights of point n at level l.
__device__ __forceinline__ void level_corners(const float* __restrict__ x, int64_t n, int l,
                                              const LevelMeta& meta, uint32_t rows[8], float wts[8]) {
  const float scale = meta.scale[l];
  const uint32_t res = meta.res[l];
  const uint32_t lo = meta.offset[l];
  const uint32_t size = meta.offset[l + 1] - lo;
  const bool dense = (meta.dense_mask >> l) & 1u;
  uint32_t p0[3];
  float w[3];
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
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (tid >= n_points * L) return;
  int64_t n;
  int l;
  thread_item(tid, n_points, meta, n, l);
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
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (tid >= n_points * L) return;
  int64_t n;
  int l;
  thread_item(tid, n_points, meta, n, l);
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
  // Benchmark switch (default 0); read at every launch so that a benchmark can compare both orders.
  const char* order = std::getenv("NERF_LIGHTNING_HASH_ORDER");
  m.level_major = (order != nullptr && order[0] == 'l') ? 1 : 0;
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
  NL_CHECK_INPUT(x);
  NL_CHECK_INPUT(params);
  NL_CHECK_DTYPE(x, torch::kFloat32);
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

// Returns the float32 gradient of the table [rows, F] (the caller casts it to the params dtype).
torch::Tensor hash_encode_bwd(torch::Tensor x, torch::Tensor grad_out, int64_t n_rows, int64_t n_features,
                              std::vector<double> scales, std::vector<int64_t> resolutions,
                              std::vector<int64_t> offsets) {
  NL_CHECK_INPUT(x);
  NL_CHECK_INPUT(grad_out);
  NL_CHECK_DTYPE(x, torch::kFloat32);
  NL_CHECK_DTYPE(grad_out, torch::kFloat32);
  const c10::cuda::CUDAGuard guard(x.device());
  const LevelMeta meta = make_meta(scales, resolutions, offsets);
  const int64_t N = x.size(0);
  const int Fr = static_cast<int>(n_features);
  TORCH_CHECK(grad_out.dim() == 2 && grad_out.size(0) == N && grad_out.size(1) == meta.n_levels * Fr,
              "hash encoding backward: grad_out must be [N, L*F]");
  auto grad = torch::zeros({n_rows, n_features}, x.options());
  if (N == 0) return grad;
  const int threads = 256;
  const int64_t total = N * meta.n_levels;
  NL_DISPATCH_F(Fr, hash_bwd_kernel<F><<<n_blocks(total, threads), threads, 0, stream()>>>(
                        x.data_ptr<float>(), grad_out.data_ptr<float>(), meta, N, grad.data_ptr<float>()));
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
  NL_CHECK_INPUT(dirs);
  NL_CHECK_DTYPE(dirs, torch::kFloat32);
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

}  // namespace nl
