// Compositing ops of ops/reference/compositing.py: volume-rendering weights and per-ray sums,
// forward and backward.
//
// Every kernel reproduces the float32 operation sequence of the reference (the oracle); the
// extension is built with --fmad=false and IEEE division/sqrt so that a*b+c is rounded twice, as
// PyTorch's elementwise kernels do. Comments name the reference expression each line mirrors.
#include <cmath>

#include "common.h"
#include "warp_scan.cuh"

#include <utility>

namespace nl {

// Per ray r: samples [start, start + count) of packed_info. One warp per ray, 32 samples per step:
// warp scans (float64) of the optical depth and of the gradient terms, the exclusive optical depth
// accumulated in double (the reference subtracts a global float64 cumsum), T = float(exp(-depth)).
// Same formulas as ops/reference/compositing.py; only the float64 summation order differs.

__global__ void render_weights_fwd_warp(const float* __restrict__ sig, const float* __restrict__ ts,
                                        const float* __restrict__ te, const int64_t* __restrict__ info,
                                        int64_t n_rays, float eps, float* __restrict__ w,
                                        float* __restrict__ trans) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n_rays) return;
  const int64_t s0 = info[2 * r], end = s0 + info[2 * r + 1];
  double carry = 0.0;
  for (int64_t base = s0; base < end; base += 32) {
    const int64_t i = base + lane;
    const bool valid = i < end;
    const float tau = valid ? sig[i] * (te[i] - ts[i]) : 0.0f;
    const double incl = warp_incl_scan(static_cast<double>(tau), lane);
    if (valid) {
      const float T = static_cast<float>(exp(-(carry + (incl - static_cast<double>(tau)))));
      trans[i] = T;
      w[i] = T < eps ? 0.0f : T * (1.0f - expf(-tau));
    }
    carry += __shfl_sync(kFull, incl, 31);
  }
}

__global__ void render_weights_bwd_warp(const float* __restrict__ gw, const float* __restrict__ gt,
                                        const float* __restrict__ sig, const float* __restrict__ ts,
                                        const float* __restrict__ te, const int64_t* __restrict__ info,
                                        const float* __restrict__ w, const float* __restrict__ trans,
                                        int64_t n_rays, float eps, float* __restrict__ gsig) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n_rays) return;
  const int64_t s0 = info[2 * r], end = s0 + info[2 * r + 1];
  double part = 0.0;
  for (int64_t i = s0 + lane; i < end; i += 32) {
    part += static_cast<double>(gw[i]) * w[i];
    if (gt != nullptr) part += static_cast<double>(gt[i]) * trans[i];
  }
  const double total = warp_sum(part);
  double carry = 0.0;
  for (int64_t base = s0; base < end; base += 32) {
    const int64_t i = base + lane;
    const bool valid = i < end;
    double term = 0.0;
    float T = 0.0f, g = 0.0f;
    if (valid) {
      T = trans[i];
      g = gw[i];
      term = static_cast<double>(g) * w[i];
      if (gt != nullptr) term += static_cast<double>(gt[i]) * T;
    }
    const double prefix = carry + warp_incl_scan(term, lane);
    if (valid) {
      const float delta = te[i] - ts[i];
      const float tau = sig[i] * delta;
      const double direct = T < eps ? 0.0 : static_cast<double>(g) * T * expf(-tau);
      gsig[i] = static_cast<float>(delta * (direct - (total - prefix)));
    }
    carry = __shfl_sync(kFull, prefix, 31);
  }
}

__global__ void volume_render_fwd_warp(const float* __restrict__ sig, const float* __restrict__ rgb,
                                       const float* __restrict__ ts, const float* __restrict__ te,
                                       const int64_t* __restrict__ info, int64_t n_rays, float eps,
                                       const float* __restrict__ bg, int64_t bg_stride,
                                       float* __restrict__ out_rgb, float* __restrict__ out_op,
                                       float* __restrict__ out_depth, float* __restrict__ w) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n_rays) return;
  const int64_t s0 = info[2 * r], end = s0 + info[2 * r + 1];
  double carry = 0.0;
  float cr = 0.f, cg = 0.f, cb = 0.f, op = 0.f, dep = 0.f;
  int64_t base = s0;
  for (; base < end; base += 32) {
    const int64_t i = base + lane;
    const bool valid = i < end;
    float a = 0.f, b = 0.f, tau = 0.f;
    if (valid) {
      a = ts[i];
      b = te[i];
      tau = sig[i] * (b - a);
    }
    const double incl = warp_incl_scan(static_cast<double>(tau), lane);
    bool stop = false;
    if (valid) {
      const float T = static_cast<float>(exp(-(carry + (incl - static_cast<double>(tau)))));
      stop = T < eps;
      const float wi = stop ? 0.0f : T * (1.0f - expf(-tau));
      w[i] = wi;
      if (!stop) {
        cr += wi * rgb[3 * i];
        cg += wi * rgb[3 * i + 1];
        cb += wi * rgb[3 * i + 2];
        op += wi;
        dep += wi * ((a + b) * 0.5f);
      }
    }
    carry += __shfl_sync(kFull, incl, 31);
    if (__ballot_sync(kFull, stop)) {  // early termination: the rest of the ray has weight 0
      for (int64_t j = base + 32 + lane; j < end; j += 32) w[j] = 0.0f;
      break;
    }
  }
  cr = warp_sumf(cr);
  cg = warp_sumf(cg);
  cb = warp_sumf(cb);
  op = warp_sumf(op);
  dep = warp_sumf(dep);
  if (lane == 0) {
    if (bg != nullptr) {  // composited over the background: c + (1 - opacity) * bg, as the reference
      const float clear = 1.0f - op;
      cr = cr + clear * bg[bg_stride * r];
      cg = cg + clear * bg[bg_stride * r + 1];
      cb = cb + clear * bg[bg_stride * r + 2];
    }
    out_rgb[3 * r] = cr;
    out_rgb[3 * r + 1] = cg;
    out_rgb[3 * r + 2] = cb;
    out_op[r] = op;
    out_depth[r] = dep;
  }
}

__global__ void volume_render_bwd_warp(const float* __restrict__ g_rgb, const float* __restrict__ g_op,
                                       const float* __restrict__ g_depth, const float* __restrict__ g_w,
                                       const float* __restrict__ sig, const float* __restrict__ rgb,
                                       const float* __restrict__ ts, const float* __restrict__ te,
                                       const int64_t* __restrict__ info, const float* __restrict__ w,
                                       int64_t n_rays, float eps, const float* __restrict__ bg,
                                       int64_t bg_stride, float* __restrict__ g_sig, float* __restrict__ g_rgbs) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n_rays) return;
  const int64_t s0 = info[2 * r], end = s0 + info[2 * r + 1];
  const float gr = g_rgb[3 * r], gg = g_rgb[3 * r + 1], gb = g_rgb[3 * r + 2];
  float go = g_op != nullptr ? g_op[r] : 0.0f;
  const float gd = g_depth != nullptr ? g_depth[r] : 0.0f;
  // the background term (1 - opacity) * bg sends -<g_rgb, bg> to the opacity
  if (bg != nullptr) go -= gr * bg[bg_stride * r] + gg * bg[bg_stride * r + 1] + gb * bg[bg_stride * r + 2];
  double part = 0.0;
  for (int64_t i = s0 + lane; i < end; i += 32) {
    float gwi = gr * rgb[3 * i] + gg * rgb[3 * i + 1] + gb * rgb[3 * i + 2] + go + gd * ((ts[i] + te[i]) * 0.5f);
    if (g_w != nullptr) gwi += g_w[i];
    part += static_cast<double>(gwi) * w[i];
  }
  const double total = warp_sum(part);
  double carry_tau = 0.0, carry_term = 0.0;
  for (int64_t base = s0; base < end; base += 32) {
    const int64_t i = base + lane;
    const bool valid = i < end;
    float a = 0.f, b = 0.f, tau = 0.f, gwi = 0.f, wi = 0.f;
    if (valid) {
      a = ts[i];
      b = te[i];
      tau = sig[i] * (b - a);
      wi = w[i];
      gwi = gr * rgb[3 * i] + gg * rgb[3 * i + 1] + gb * rgb[3 * i + 2] + go + gd * ((a + b) * 0.5f);
      if (g_w != nullptr) gwi += g_w[i];
    }
    const double incl_tau = warp_incl_scan(static_cast<double>(tau), lane);
    const double prefix = carry_term + warp_incl_scan(static_cast<double>(gwi) * wi, lane);
    if (valid) {
      const float T = static_cast<float>(exp(-(carry_tau + (incl_tau - static_cast<double>(tau)))));
      if (T < eps) {  // terminated: weight 0 and no later weight depends on it
        g_sig[i] = 0.0f;
        g_rgbs[3 * i] = g_rgbs[3 * i + 1] = g_rgbs[3 * i + 2] = 0.0f;
      } else {
        const float delta = b - a;
        const double direct = static_cast<double>(gwi) * T * expf(-tau);
        g_sig[i] = static_cast<float>(delta * (direct - (total - prefix)));
        g_rgbs[3 * i] = wi * gr;
        g_rgbs[3 * i + 1] = wi * gg;
        g_rgbs[3 * i + 2] = wi * gb;
      }
    }
    carry_tau += __shfl_sync(kFull, incl_tau, 31);
    carry_term = __shfl_sync(kFull, prefix, 31);
  }
}

std::vector<torch::Tensor> render_weights_fwd(torch::Tensor sigmas, torch::Tensor t_starts, torch::Tensor t_ends,
                                              torch::Tensor packed_info, double eps) {
  NL_CHECK_INPUTS(sigmas, t_starts, t_ends, packed_info);
  NL_CHECK_DTYPES(torch::kFloat32, sigmas);
  NL_CHECK_DTYPES(torch::kInt64, packed_info);
  const c10::cuda::CUDAGuard guard(sigmas.device());
  const int64_t n_rays = packed_info.size(0);
  // zeros: samples outside every ray's range (fixed-layout padding) are never written by a warp
  auto w = torch::zeros_like(sigmas);
  auto trans = torch::zeros_like(sigmas);
  if (n_rays > 0 && sigmas.numel() > 0) {
    render_weights_fwd_warp<<<n_blocks(n_rays * 32, 128), 128, 0, stream()>>>(
        sigmas.data_ptr<float>(), t_starts.data_ptr<float>(), t_ends.data_ptr<float>(),
        packed_info.data_ptr<int64_t>(), n_rays, static_cast<float>(eps), w.data_ptr<float>(), trans.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {w, trans};
}

torch::Tensor render_weights_bwd(torch::Tensor grad_w, c10::optional<torch::Tensor> grad_trans, torch::Tensor sigmas,
                                 torch::Tensor t_starts, torch::Tensor t_ends, torch::Tensor packed_info,
                                 torch::Tensor w, torch::Tensor trans, double eps) {
  NL_CHECK_INPUT(grad_w);
  const c10::cuda::CUDAGuard guard(sigmas.device());
  const int64_t n_rays = packed_info.size(0);
  auto gsig = torch::zeros_like(sigmas);
  const float* gt = nullptr;
  if (grad_trans.has_value()) {
    NL_CHECK_INPUT((*grad_trans));
    gt = grad_trans->data_ptr<float>();
  }
  if (n_rays > 0 && sigmas.numel() > 0) {
    render_weights_bwd_warp<<<n_blocks(n_rays * 32, 128), 128, 0, stream()>>>(
        grad_w.data_ptr<float>(), gt, sigmas.data_ptr<float>(), t_starts.data_ptr<float>(), t_ends.data_ptr<float>(),
        packed_info.data_ptr<int64_t>(), w.data_ptr<float>(), trans.data_ptr<float>(), n_rays,
        static_cast<float>(eps), gsig.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return gsig;
}

// (background [R, 3] or [3]) -> its pointer and row stride; nullptr: no compositing.
static std::pair<const float*, int64_t> background_ptr(const c10::optional<torch::Tensor>& background, int64_t n_rays) {
  if (!background.has_value()) return {nullptr, 0};
  const torch::Tensor& b = *background;
  NL_CHECK_TENSORS(torch::kFloat32, b);
  const bool shared = b.dim() == 1 && b.size(0) == 3;
  TORCH_CHECK(shared || (b.dim() == 2 && b.size(0) == n_rays && b.size(1) == 3),
              "volume_render: background must be [3] or [", n_rays, ", 3]");
  return {b.data_ptr<float>(), shared ? 0 : 3};
}

std::vector<torch::Tensor> volume_render_fwd(torch::Tensor sigmas, torch::Tensor rgbs, torch::Tensor t_starts,
                                             torch::Tensor t_ends, torch::Tensor packed_info, double eps,
                                             c10::optional<torch::Tensor> background) {
  NL_CHECK_INPUTS(sigmas, rgbs, t_starts, t_ends, packed_info);
  NL_CHECK_DTYPES(torch::kFloat32, sigmas, rgbs);
  NL_CHECK_DTYPES(torch::kInt64, packed_info);
  const c10::cuda::CUDAGuard guard(sigmas.device());
  const int64_t n_rays = packed_info.size(0);
  auto opt = sigmas.options();
  auto out_rgb = torch::empty({n_rays, 3}, opt);
  auto out_op = torch::empty({n_rays, 1}, opt);
  auto out_depth = torch::empty({n_rays, 1}, opt);
  auto w = torch::zeros_like(sigmas);  // padding samples of the fixed layout stay 0
  const auto bg = background_ptr(background, n_rays);
  if (n_rays > 0) {
    volume_render_fwd_warp<<<n_blocks(n_rays * 32, 128), 128, 0, stream()>>>(
        sigmas.data_ptr<float>(), rgbs.data_ptr<float>(), t_starts.data_ptr<float>(), t_ends.data_ptr<float>(),
        packed_info.data_ptr<int64_t>(), n_rays, static_cast<float>(eps), bg.first, bg.second, out_rgb.data_ptr<float>(),
        out_op.data_ptr<float>(), out_depth.data_ptr<float>(), w.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {out_rgb, out_op, out_depth, w};
}

std::vector<torch::Tensor> volume_render_bwd(torch::Tensor g_rgb, c10::optional<torch::Tensor> g_op,
                                             c10::optional<torch::Tensor> g_depth, c10::optional<torch::Tensor> g_w,
                                             torch::Tensor sigmas, torch::Tensor rgbs, torch::Tensor t_starts,
                                             torch::Tensor t_ends, torch::Tensor packed_info, torch::Tensor w,
                                             double eps, c10::optional<torch::Tensor> background) {
  NL_CHECK_INPUT(g_rgb);
  const float* go = nullptr;
  const float* gd = nullptr;
  if (g_op.has_value()) {
    NL_CHECK_INPUT((*g_op));
    go = g_op->data_ptr<float>();
  }
  if (g_depth.has_value()) {
    NL_CHECK_INPUT((*g_depth));
    gd = g_depth->data_ptr<float>();
  }
  const c10::cuda::CUDAGuard guard(sigmas.device());
  const int64_t n_rays = packed_info.size(0);
  auto g_sig = torch::zeros_like(sigmas);
  auto g_rgbs = torch::zeros_like(rgbs);
  const float* gw = nullptr;
  if (g_w.has_value()) {
    NL_CHECK_INPUT((*g_w));
    gw = g_w->data_ptr<float>();
  }
  const auto bg = background_ptr(background, n_rays);
  if (n_rays > 0 && sigmas.numel() > 0) {
    volume_render_bwd_warp<<<n_blocks(n_rays * 32, 128), 128, 0, stream()>>>(
        g_rgb.data_ptr<float>(), go, gd, gw, sigmas.data_ptr<float>(), rgbs.data_ptr<float>(),
        t_starts.data_ptr<float>(), t_ends.data_ptr<float>(), packed_info.data_ptr<int64_t>(), w.data_ptr<float>(),
        n_rays, static_cast<float>(eps), bg.first, bg.second, g_sig.data_ptr<float>(), g_rgbs.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {g_sig, g_rgbs};
}

}  // namespace nl
