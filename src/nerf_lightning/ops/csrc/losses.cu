// Loss ops of ops/reference/losses.py: the distortion loss, forward and backward (the batch's
// photometric loss is a fused step kernel: step_ops.cu).
//
// Every kernel reproduces the float32 operation sequence of the reference (the oracle); the
// extension is built with --fmad=false and IEEE division/sqrt so that a*b+c is rounded twice, as
// PyTorch's elementwise kernels do. Comments name the reference expression each line mirrors.
#include "common.h"
#include "warp_scan.cuh"

namespace nl {

// mip-NeRF 360's distortion loss per ray (ops/reference/losses.py::distortion_loss). Per ray r: samples
// [start, start + count) of packed_info, one warp per ray, 32 samples per step. Within-ray exclusive
// prefix sums W_i = sum_{j<i} w_j and M_i = sum_{j<i} w_j m_j by float64 warp scans (the reference
// subtracts global float64 cumsums); per sample 2 w (m W - M) + w^2 (t_end - t_start) / 3 in float64,
// summed over the ray and rounded to float32 once. Samples outside every ray's range (fixed-layout
// padding) are never read: no loss, gradient 0. ray_indices are not needed (the ranges say it all).
//
// Gradient (closed form of the reference's autograd; m need not be sorted):
//   dL_r/dw_k = 2 (m_k (2 W_k - W_r) + (M_r - 2 M_k)) + 2 w_k (t_end_k - t_start_k) / 3,
// W_r = sum_i w_i, M_r = sum_i w_i m_i over the ray.

// Sample range of ray r, clamped to [0, n] so that a malformed packed_info never reads out of bounds.
__device__ __forceinline__ void ray_range(const int64_t* __restrict__ info, int64_t r, int64_t n, int64_t* s0,
                                          int64_t* end) {
  const int64_t first = info[2 * r];
  const int64_t last = first + info[2 * r + 1];
  *s0 = first < 0 ? 0 : (first > n ? n : first);
  *end = last < *s0 ? *s0 : (last > n ? n : last);
}

__global__ void distortion_loss_fwd_warp(const float* __restrict__ w, const float* __restrict__ ts,
                                         const float* __restrict__ te, const int64_t* __restrict__ info,
                                         int64_t n_rays, int64_t n_samples, float* __restrict__ loss) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n_rays) return;
  int64_t s0, end;
  ray_range(info, r, n_samples, &s0, &end);
  double carry_w = 0.0, carry_wm = 0.0, acc = 0.0;
  for (int64_t base = s0; base < end; base += 32) {
    const int64_t i = base + lane;
    double wi = 0.0, mi = 0.0, di = 0.0;
    if (i < end) {
      const float a = ts[i], b = te[i];
      wi = static_cast<double>(w[i]);
      mi = static_cast<double>((a + b) * 0.5f);  // mid = ((t_starts + t_ends) * 0.5).double()
      di = static_cast<double>(b - a);           // (t_ends - t_starts).double()
    }
    const double wm = wi * mi;
    const double incl_w = warp_incl_scan(wi, lane);
    const double incl_wm = warp_incl_scan(wm, lane);
    const double before_w = carry_w + (incl_w - wi);
    const double before_wm = carry_wm + (incl_wm - wm);
    // 2 w (mid before_w - before_wm) + w w delta / 3 (0 for lanes past the ray's end: w = 0)
    acc += 2.0 * wi * (mi * before_w - before_wm) + wi * wi * di / 3.0;
    carry_w += __shfl_sync(kFull, incl_w, 31);
    carry_wm += __shfl_sync(kFull, incl_wm, 31);
  }
  const double total = warp_sum(acc);
  if (lane == 0) loss[r] = static_cast<float>(total);
}

__global__ void distortion_loss_bwd_warp(const float* __restrict__ g_loss, const float* __restrict__ w,
                                         const float* __restrict__ ts, const float* __restrict__ te,
                                         const int64_t* __restrict__ info, int64_t n_rays, int64_t n_samples,
                                         float* __restrict__ g_w) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n_rays) return;
  int64_t s0, end;
  ray_range(info, r, n_samples, &s0, &end);
  if (s0 == end) return;
  const double g = static_cast<double>(g_loss[r]);
  // the ray's totals W_r, M_r
  double part_w = 0.0, part_wm = 0.0;
  for (int64_t i = s0 + lane; i < end; i += 32) {
    const double wi = static_cast<double>(w[i]);
    part_w += wi;
    part_wm += wi * static_cast<double>((ts[i] + te[i]) * 0.5f);
  }
  const double tot_w = warp_sum(part_w), tot_wm = warp_sum(part_wm);
  double carry_w = 0.0, carry_wm = 0.0;
  for (int64_t base = s0; base < end; base += 32) {
    const int64_t i = base + lane;
    const bool valid = i < end;
    double wi = 0.0, mi = 0.0, di = 0.0;
    if (valid) {
      const float a = ts[i], b = te[i];
      wi = static_cast<double>(w[i]);
      mi = static_cast<double>((a + b) * 0.5f);
      di = static_cast<double>(b - a);
    }
    const double wm = wi * mi;
    const double incl_w = warp_incl_scan(wi, lane);
    const double incl_wm = warp_incl_scan(wm, lane);
    if (valid) {
      const double before_w = carry_w + (incl_w - wi);
      const double before_wm = carry_wm + (incl_wm - wm);
      const double dl = 2.0 * (mi * (2.0 * before_w - tot_w) + (tot_wm - 2.0 * before_wm)) + 2.0 * wi * di / 3.0;
      g_w[i] = static_cast<float>(g * dl);
    }
    carry_w += __shfl_sync(kFull, incl_w, 31);
    carry_wm += __shfl_sync(kFull, incl_wm, 31);
  }
}

static void check_distortion_args(const torch::Tensor& weights, const torch::Tensor& t_starts,
                                  const torch::Tensor& t_ends, const torch::Tensor& packed_info) {
  NL_CHECK_INPUTS(weights, t_starts, t_ends, packed_info);
  NL_CHECK_DTYPES(torch::kFloat32, weights, t_starts, t_ends);
  NL_CHECK_DTYPES(torch::kInt64, packed_info);
  const int64_t n = weights.numel();
  TORCH_CHECK(weights.dim() == 1 && t_starts.dim() == 1 && t_ends.dim() == 1 && t_starts.size(0) == n &&
                  t_ends.size(0) == n,
              "distortion_loss: weights, t_starts and t_ends must all be [S]");
  TORCH_CHECK(packed_info.dim() == 2 && packed_info.size(1) == 2, "distortion_loss: packed_info must be [R, 2]");
}

torch::Tensor distortion_loss_fwd(torch::Tensor weights, torch::Tensor t_starts, torch::Tensor t_ends,
                                  torch::Tensor packed_info) {
  check_distortion_args(weights, t_starts, t_ends, packed_info);
  const c10::cuda::CUDAGuard guard(weights.device());
  const int64_t n_rays = packed_info.size(0);
  auto loss = torch::empty({n_rays}, weights.options());  // every ray's warp writes its entry
  if (n_rays > 0) {
    distortion_loss_fwd_warp<<<n_blocks(n_rays * 32, 128), 128, 0, stream()>>>(
        weights.data_ptr<float>(), t_starts.data_ptr<float>(), t_ends.data_ptr<float>(),
        packed_info.data_ptr<int64_t>(), n_rays, weights.numel(), loss.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return loss;
}

torch::Tensor distortion_loss_bwd(torch::Tensor g_loss, torch::Tensor weights, torch::Tensor t_starts,
                                  torch::Tensor t_ends, torch::Tensor packed_info) {
  check_distortion_args(weights, t_starts, t_ends, packed_info);
  NL_CHECK_TENSORS(torch::kFloat32, g_loss);
  const int64_t n_rays = packed_info.size(0);
  TORCH_CHECK(g_loss.dim() == 1 && g_loss.size(0) == n_rays, "distortion_loss: the gradient must be [R]");
  const c10::cuda::CUDAGuard guard(weights.device());
  auto g_w = torch::zeros_like(weights);  // samples outside every ray's range (padding) keep 0
  if (n_rays > 0 && weights.numel() > 0) {
    distortion_loss_bwd_warp<<<n_blocks(n_rays * 32, 128), 128, 0, stream()>>>(
        g_loss.data_ptr<float>(), weights.data_ptr<float>(), t_starts.data_ptr<float>(), t_ends.data_ptr<float>(),
        packed_info.data_ptr<int64_t>(), n_rays, weights.numel(), g_w.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return g_w;
}

}  // namespace nl
