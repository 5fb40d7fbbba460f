// Fused pieces of the fixed-budget training step (models/train_step.py): the masked per-ray loss,
// the adaptive ray count with the step statistics, and the sample positions. Each replaces a chain
// of small PyTorch kernels (tens per step) whose launch boundaries, not their arithmetic, cost the
// time; contracts and float details are the reference functions' in ops/reference.py.
#include <cub/block/block_reduce.cuh>

#include "common.h"

namespace nl {

namespace {

constexpr int kReduceThreads = 256;
constexpr int kMaxReduceBlocks = 128;

__device__ __forceinline__ float huber(float x, float delta) {
  const float z = fabsf(x);
  return z < delta ? 0.5f * z * z : delta * (z - 0.5f * delta);
}

__device__ __forceinline__ float huber_grad(float x, float delta) {
  return fabsf(x) < delta ? x : copysignf(delta, x);
}

// Sums three doubles over the block and over the grid; the last block to finish adds the blocks'
// partial sums in block order (deterministic) and returns true on its thread 0 with `total` set.
__device__ bool grid_sum3(double a, double b, double c, double* partials, unsigned int* done, double total[3]) {
  using Reduce = cub::BlockReduce<double, kReduceThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ bool last;
  const double sa = Reduce(tmp).Sum(a);
  __syncthreads();
  const double sb = Reduce(tmp).Sum(b);
  __syncthreads();
  const double sc = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0) {
    partials[blockIdx.x * 3 + 0] = sa;
    partials[blockIdx.x * 3 + 1] = sb;
    partials[blockIdx.x * 3 + 2] = sc;
    __threadfence();
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return false;
  __threadfence();
  total[0] = total[1] = total[2] = 0.0;
  for (unsigned int i = 0; i < gridDim.x; ++i) {
    // written by other blocks: read through L2, never a stale L1 line
    total[0] += __ldcg(partials + i * 3 + 0);
    total[1] += __ldcg(partials + i * 3 + 1);
    total[2] += __ldcg(partials + i * 3 + 2);
  }
  return true;
}

unsigned int reduce_blocks(int64_t n) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>((n + kReduceThreads - 1) / kReduceThreads,
                                                                         kMaxReduceBlocks)));
}

template <bool kHuber>
__global__ void masked_ray_loss_fwd_kernel(const float* __restrict__ pred, const float* __restrict__ target,
                                           const bool* __restrict__ valid, int64_t n, float delta,
                                           float* __restrict__ per_ray, double* partials, unsigned int* done,
                                           float* loss, double* aux) {
  double l_sum = 0.0, sq_sum = 0.0, count = 0.0;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float lr = 0.0f;
    if (valid[r]) {
      const float x0 = pred[r * 3] - target[r * 3];
      const float x1 = pred[r * 3 + 1] - target[r * 3 + 1];
      const float x2 = pred[r * 3 + 2] - target[r * 3 + 2];
      const float l = kHuber ? (huber(x0, delta) + huber(x1, delta)) + huber(x2, delta) : (x0 * x0 + x1 * x1) + x2 * x2;
      lr = l / 3.0f;
      l_sum += lr;
      sq_sum += ((x0 * x0 + x1 * x1) + x2 * x2) / 3.0f;
      count += 1.0;
    }
    per_ray[r] = lr;
  }
  double total[3];
  if (grid_sum3(l_sum, sq_sum, count, partials, done, total)) {
    *loss = static_cast<float>(total[0] / fmax(total[2], 1.0));
    aux[0] = total[2];
    aux[1] = total[1];
  }
}

template <bool kHuber>
__global__ void masked_ray_loss_bwd_kernel(const float* __restrict__ g_loss, const float* __restrict__ pred,
                                           const float* __restrict__ target, const bool* __restrict__ valid,
                                           const double* __restrict__ aux, int64_t n3, float delta,
                                           float* __restrict__ grad) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n3) return;
  const int64_t r = i / 3;
  if (!valid[r]) {
    grad[i] = 0.0f;
    return;
  }
  const float scale = *g_loss / static_cast<float>(fmax(aux[0], 1.0)) / 3.0f;
  const float x = pred[i] - target[i];
  grad[i] = (kHuber ? huber_grad(x, delta) : 2.0f * x) * scale;
}

struct AdaptArgs {
  float sample_budget, march_budget, min_rays, n_slots, momentum, one_minus_momentum;
};

__global__ void adapt_ray_count_kernel(const double* __restrict__ aux, const bool* __restrict__ valid,
                                       const int64_t* __restrict__ marched, const int64_t* __restrict__ rendered,
                                       int64_t n, const float* __restrict__ target_fraction, AdaptArgs a,
                                       double* partials, unsigned int* done, int64_t* n_active, float* n_active_f,
                                       double* stats) {
  // Sample counts are integers far below 2^53: double sums are exact.
  double m_sum = 0.0, r_sum = 0.0;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (valid[r]) m_sum += static_cast<double>(marched[r]);
    r_sum += static_cast<double>(rendered[r]);
  }
  double total[3];
  if (!grid_sum3(m_sum, r_sum, 0.0, partials, done, total)) return;
  // The float32 operation sequence of ops/reference.py::adapt_ray_count.
  const double n_valid = aux[0];
  const float rays = fmaxf(static_cast<float>(n_valid), 1.0f);
  const float per_ray_rendered = fmaxf(static_cast<float>(total[1]) / rays, 0.25f);
  const float per_ray_marched = fmaxf(static_cast<float>(total[0]) / rays, 0.25f);
  const float fill = 0.98f * *target_fraction;
  const float want = fminf(fill * a.sample_budget / per_ray_rendered, fill * a.march_budget / per_ray_marched);
  const float next = a.momentum * *n_active_f + a.one_minus_momentum * want;
  const float clamped = fminf(fmaxf(next, a.min_rays), a.n_slots);
  *n_active_f = clamped;
  *n_active = static_cast<int64_t>(rintf(clamped));
  stats[0] = n_valid;
  stats[1] = total[0];
  stats[2] = total[1];
  stats[3] = aux[1];
}

__global__ void sample_points_kernel(const float* __restrict__ o, const float* __restrict__ d,
                                     const int64_t* __restrict__ ray_idx, const float* __restrict__ t_starts,
                                     const float* __restrict__ t_ends, int64_t n, float* __restrict__ positions,
                                     float* __restrict__ dirs) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t r = ray_idx[i];
  const float mid = (t_starts[i] + t_ends[i]) * 0.5f;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const float dc = d[r * 3 + c];
    dirs[i * 3 + c] = dc;
    positions[i * 3 + c] = o[r * 3 + c] + dc * mid;
  }
}

__global__ void normalize_to_box_kernel(const float* __restrict__ p, const float* __restrict__ box_min,
                                        const float* __restrict__ box_size, int64_t n, float* __restrict__ x,
                                        bool* __restrict__ inside) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  bool in = true;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const float u = (p[i * 3 + c] - box_min[c]) / box_size[c];
    in = in && u >= 0.0f && u <= 1.0f;
    x[i * 3 + c] = fminf(fmaxf(u, 0.0f), 1.0f);
  }
  inside[i] = in;
}

template <typename T>
__global__ void density_activation_fwd_kernel(const T* __restrict__ h, int64_t stride, const bool* __restrict__ inside,
                                              int64_t n, float bias, float* __restrict__ sigma) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  // float32: x + bias, then exp, then * inside (0 or 1), the reference's sequence
  const float x = static_cast<float>(h[i * stride]) + bias;
  sigma[i] = expf(x) * (inside[i] ? 1.0f : 0.0f);
}

// grad_h [S, W]: column 0 from the activation, the other columns 0 (one pass over all of it).
template <typename T>
__global__ void density_activation_bwd_kernel(const float* __restrict__ g, const T* __restrict__ h, int64_t width,
                                              const bool* __restrict__ inside, int64_t n, float bias,
                                              T* __restrict__ grad_h) {
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= n * width) return;
  const int64_t i = k / width;
  float v = 0.0f;
  if (k == i * width) {
    const float x = static_cast<float>(h[k]) + bias;
    v = (g[i] * (inside[i] ? 1.0f : 0.0f)) * expf(fminf(x, 15.0f));
  }
  grad_h[k] = static_cast<T>(v);
}

// One training ray per thread: camera ray through (ix + ux, iy + uy) and its target colour, with the
// operation sequence of data/cameras.py (pixel_rays for pinhole views, UndistortionTable.rays for
// tabulated lens models) and _ViewSet.batch (colours / 255, RGBA composited over the background).
__global__ void training_rays_kernel(const float* __restrict__ poses, const float* __restrict__ intr,
                                     const uint8_t* __restrict__ pixels, int channels,
                                     const int64_t* __restrict__ offsets, const int64_t* __restrict__ widths,
                                     const int64_t* __restrict__ view_ids, const int64_t* __restrict__ ix,
                                     const int64_t* __restrict__ iy, const float* __restrict__ ux,
                                     const float* __restrict__ uy, const float* __restrict__ bg,
                                     const float* __restrict__ table, const int64_t* __restrict__ camera_of_view,
                                     int64_t table_h, int64_t table_w, int64_t n, float* __restrict__ rays_o,
                                     float* __restrict__ rays_d, float* __restrict__ rgb) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  const int64_t v = view_ids[r];
  const float px = static_cast<float>(ix[r]) + ux[r];
  const float py = static_cast<float>(iy[r]) + uy[r];
  float d0, d1, d2;
  if (table != nullptr) {
    const float x0 = floorf(px), y0 = floorf(py);
    const float fx = px - x0, fy = py - y0;
    const int64_t w1 = table_w - 1;
    const int64_t cx = min(max(static_cast<int64_t>(x0), int64_t{0}), w1 - 1);
    const int64_t cy = min(max(static_cast<int64_t>(y0), int64_t{0}), table_h - 2);
    const int64_t base = ((camera_of_view[v] * table_h + cy) * (w1 + 1) + cx) * 3;
    const float* t00 = table + base;
    const float* t01 = t00 + 3;
    const float* t10 = table + base + (w1 + 1) * 3;
    const float* t11 = t10 + 3;
    float d[3];
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      d[c] = (t00[c] * (1.0f - fx) + t01[c] * fx) * (1.0f - fy) + (t10[c] * (1.0f - fx) + t11[c] * fx) * fy;
    }
    d0 = d[0];
    d1 = d[1];
    d2 = d[2];
  } else {
    const float* k = intr + v * 10;
    d0 = (px - k[2]) / k[0];
    d1 = (py - k[3]) / k[1];
    d2 = 1.0f;
  }
  const float* m = poses + v * 12;  // [3, 4] row-major: rotation | translation
  float dir[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) dir[i] = (m[i * 4] * d0 + m[i * 4 + 1] * d1) + m[i * 4 + 2] * d2;
  const float norm = fmaxf(sqrtf((dir[0] * dir[0] + dir[1] * dir[1]) + dir[2] * dir[2]), 1e-12f);
  const int64_t flat = offsets[v] + iy[r] * widths[v] + ix[r];
  const uint8_t* px_c = pixels + flat * channels;
  const float alpha = channels == 4 ? static_cast<float>(px_c[3]) / 255.0f : 1.0f;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    rays_o[r * 3 + c] = m[c * 4 + 3];
    rays_d[r * 3 + c] = dir[c] / norm;
    const float col = static_cast<float>(px_c[c]) / 255.0f;
    rgb[r * 3 + c] = channels == 4 ? col * alpha + bg[r * 3 + c] * (1.0f - alpha) : col;
  }
}

// One training pixel per thread from uniforms u [3, n] (float64): the (view, cell) pair whose CDF
// interval holds u0 (torch.searchsorted(cdf, u0, right=True), clamped), then a pixel uniform inside
// the cell; the integer sequence of data/sampler.py::RaySampler.sample.
__global__ void sample_pixels_kernel(const double* __restrict__ u, const double* __restrict__ cdf, int64_t n_cdf,
                                     const int64_t* __restrict__ widths, const int64_t* __restrict__ heights,
                                     int64_t res, int64_t n, int64_t* __restrict__ view_ids,
                                     int64_t* __restrict__ px, int64_t* __restrict__ py) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const double u0 = u[i], u1 = u[n + i], u2 = u[2 * n + i];
  int64_t lo = 0, hi = n_cdf;  // first entry > u0
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (cdf[mid] <= u0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int64_t idx = min(lo, n_cdf - 1);
  const int64_t cells = res * res;
  const int64_t v = idx / cells, cell = idx - v * cells;
  const int64_t cy = cell / res, cx = cell % res;
  const int64_t w = widths[v], h = heights[v];
  const int64_t x0 = (cx * w + res - 1) / res, x1 = ((cx + 1) * w + res - 1) / res;
  const int64_t y0 = (cy * h + res - 1) / res, y1 = ((cy + 1) * h + res - 1) / res;
  view_ids[i] = v;
  px[i] = min(x0 + static_cast<int64_t>(u1 * static_cast<double>(x1 - x0)), x1 - 1);
  py[i] = min(y0 + static_cast<int64_t>(u2 * static_cast<double>(y1 - y0)), y1 - 1);
}

void check_rows3(const torch::Tensor& t, int64_t n, const char* name) {
  NL_CHECK_TENSORS(torch::kFloat32, t);
  TORCH_CHECK(t.dim() == 2 && t.size(0) == n && t.size(1) == 3, name, " must be [", n, ", 3]");
}

void check_mask(const torch::Tensor& t, int64_t n, const char* name) {
  NL_CHECK_TENSORS(torch::kBool, t);
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n, name, " must be bool [", n, "]");
}

}  // namespace

torch::Tensor density_activation_fwd(torch::Tensor h, torch::Tensor inside, double bias) {
  NL_CHECK_CUDA(h);
  TORCH_CHECK(h.dim() == 2 && h.stride(1) == 1, "density_activation: h must be [S, W] with contiguous rows");
  const int64_t n = h.size(0);
  check_mask(inside, n, "inside");
  const c10::cuda::CUDAGuard guard(h.device());
  auto sigma = torch::empty({n}, h.options().dtype(torch::kFloat32));
  if (n == 0) return sigma;
  const int threads = 256;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "density_activation_fwd", [&] {
    density_activation_fwd_kernel<scalar_t><<<n_blocks(n, threads), threads, 0, stream()>>>(
        h.data_ptr<scalar_t>(), h.stride(0), inside.data_ptr<bool>(), n, static_cast<float>(bias),
        sigma.data_ptr<float>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return sigma;
}

torch::Tensor density_activation_bwd(torch::Tensor g, torch::Tensor h, torch::Tensor inside, double bias) {
  NL_CHECK_INPUT(h);
  TORCH_CHECK(h.dim() == 2, "density_activation: h must be [S, W]");
  const int64_t n = h.size(0), width = h.size(1);
  NL_CHECK_TENSORS(torch::kFloat32, g);
  TORCH_CHECK(g.numel() == n, "density_activation: the gradient must be [S]");
  check_mask(inside, n, "inside");
  const c10::cuda::CUDAGuard guard(h.device());
  auto grad_h = torch::empty_like(h);
  if (n == 0 || width == 0) return grad_h;
  const int threads = 256;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "density_activation_bwd", [&] {
    density_activation_bwd_kernel<scalar_t><<<n_blocks(n * width, threads), threads, 0, stream()>>>(
        g.data_ptr<float>(), h.data_ptr<scalar_t>(), width, inside.data_ptr<bool>(), n, static_cast<float>(bias),
        grad_h.data_ptr<scalar_t>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad_h;
}

std::vector<torch::Tensor> sample_pixels(torch::Tensor u, torch::Tensor cdf, torch::Tensor widths,
                                         torch::Tensor heights, int64_t res) {
  NL_CHECK_TENSORS(torch::kFloat64, u);
  TORCH_CHECK(u.dim() == 2 && u.size(0) == 3, "sample_pixels: u must be [3, n]");
  NL_CHECK_TENSORS(torch::kFloat64, cdf);
  TORCH_CHECK(cdf.dim() == 1 && cdf.numel() >= 1, "sample_pixels: cdf must be [V * C]");
  NL_CHECK_INPUTS(widths, heights);
  NL_CHECK_DTYPES(torch::kInt64, widths, heights);
  TORCH_CHECK(res >= 1 && cdf.numel() == widths.numel() * res * res, "sample_pixels: cdf must be [V * res^2]");
  const int64_t n = u.size(1);
  const c10::cuda::CUDAGuard guard(u.device());
  auto lopt = widths.options();
  auto view_ids = torch::empty({n}, lopt);
  auto px = torch::empty({n}, lopt);
  auto py = torch::empty({n}, lopt);
  if (n == 0) return {view_ids, px, py};
  const int threads = 256;
  sample_pixels_kernel<<<n_blocks(n, threads), threads, 0, stream()>>>(
      u.data_ptr<double>(), cdf.data_ptr<double>(), cdf.numel(), widths.data_ptr<int64_t>(),
      heights.data_ptr<int64_t>(), res, n, view_ids.data_ptr<int64_t>(), px.data_ptr<int64_t>(),
      py.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {view_ids, px, py};
}

std::vector<torch::Tensor> training_rays(torch::Tensor poses, torch::Tensor intrinsics, torch::Tensor pixels,
                                         torch::Tensor offsets, torch::Tensor widths, torch::Tensor view_ids,
                                         torch::Tensor ix, torch::Tensor iy, torch::Tensor ux, torch::Tensor uy,
                                         torch::Tensor background, c10::optional<torch::Tensor> table,
                                         c10::optional<torch::Tensor> camera_of_view) {
  const int64_t n = view_ids.size(0);
  const int64_t n_views = poses.size(0);
  NL_CHECK_TENSORS(torch::kFloat32, poses);
  TORCH_CHECK(poses.dim() == 3 && poses.size(1) == 3 && poses.size(2) == 4, "training_rays: poses must be [V, 3, 4]");
  NL_CHECK_TENSORS(torch::kFloat32, intrinsics);
  TORCH_CHECK(intrinsics.dim() == 2 && intrinsics.size(0) == n_views && intrinsics.size(1) == 10,
              "training_rays: intrinsics must be [V, 10]");
  NL_CHECK_TENSORS(torch::kUInt8, pixels);
  TORCH_CHECK(pixels.dim() == 2 && (pixels.size(1) == 3 || pixels.size(1) == 4), "training_rays: pixels must be [P, 3|4]");
  for (const auto* t : {&offsets, &widths}) {
    NL_CHECK_TENSORS(torch::kInt64, (*t));
    TORCH_CHECK(t->numel() == n_views, "training_rays: offsets and widths must be [V]");
  }
  for (const auto* t : {&view_ids, &ix, &iy}) {
    NL_CHECK_TENSORS(torch::kInt64, (*t));
    TORCH_CHECK(t->numel() == n, "training_rays: view_ids, ix, iy must be [R]");
  }
  for (const auto* t : {&ux, &uy}) {
    NL_CHECK_TENSORS(torch::kFloat32, (*t));
    TORCH_CHECK(t->numel() == n, "training_rays: ux, uy must be [R]");
  }
  check_rows3(background, n, "background");
  const float* tab = nullptr;
  const int64_t* cam = nullptr;
  int64_t th = 0, tw = 0;
  if (table.has_value()) {
    TORCH_CHECK(camera_of_view.has_value(), "training_rays: a table needs camera_of_view");
    NL_CHECK_TENSORS(torch::kFloat32, (*table));
    TORCH_CHECK(table->dim() == 4 && table->size(3) == 3 && table->size(1) >= 2 && table->size(2) >= 2,
                "training_rays: the table must be [U, H + 1, W + 1, 3]");
    NL_CHECK_TENSORS(torch::kInt64, (*camera_of_view));
    tab = table->data_ptr<float>();
    cam = camera_of_view->data_ptr<int64_t>();
    th = table->size(1);
    tw = table->size(2);
  }
  const c10::cuda::CUDAGuard guard(view_ids.device());
  auto fopt = background.options();
  auto rays_o = torch::empty({n, 3}, fopt);
  auto rays_d = torch::empty({n, 3}, fopt);
  auto rgb = torch::empty({n, 3}, fopt);
  if (n == 0) return {rays_o, rays_d, rgb};
  const int threads = 256;
  training_rays_kernel<<<n_blocks(n, threads), threads, 0, stream()>>>(
      poses.data_ptr<float>(), intrinsics.data_ptr<float>(), pixels.data_ptr<uint8_t>(),
      static_cast<int>(pixels.size(1)), offsets.data_ptr<int64_t>(), widths.data_ptr<int64_t>(),
      view_ids.data_ptr<int64_t>(), ix.data_ptr<int64_t>(), iy.data_ptr<int64_t>(), ux.data_ptr<float>(),
      uy.data_ptr<float>(), background.data_ptr<float>(), tab, cam, th, tw, n, rays_o.data_ptr<float>(),
      rays_d.data_ptr<float>(), rgb.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {rays_o, rays_d, rgb};
}

std::vector<torch::Tensor> masked_ray_loss_fwd(torch::Tensor pred, torch::Tensor target, torch::Tensor valid,
                                               bool huber_loss, double delta) {
  const int64_t n = pred.size(0);
  check_rows3(pred, n, "pred");
  check_rows3(target, n, "target");
  check_mask(valid, n, "valid");
  const c10::cuda::CUDAGuard guard(pred.device());
  auto fopt = pred.options();
  auto per_ray = torch::empty({n}, fopt);
  auto loss = torch::empty({}, fopt);
  auto aux = torch::empty({2}, fopt.dtype(torch::kFloat64));
  const unsigned int blocks = reduce_blocks(n);
  auto partials = torch::empty({blocks * 3}, fopt.dtype(torch::kFloat64));
  auto done = torch::zeros({1}, fopt.dtype(torch::kInt32));
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kReduceThreads, 0, stream()>>>(
        pred.data_ptr<float>(), target.data_ptr<float>(), valid.data_ptr<bool>(), n, static_cast<float>(delta),
        per_ray.data_ptr<float>(), partials.data_ptr<double>(), reinterpret_cast<unsigned int*>(done.data_ptr<int32_t>()),
        loss.data_ptr<float>(), aux.data_ptr<double>());
  };
  if (huber_loss) {
    launch(masked_ray_loss_fwd_kernel<true>);
  } else {
    launch(masked_ray_loss_fwd_kernel<false>);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {loss, per_ray, aux};
}

torch::Tensor masked_ray_loss_bwd(torch::Tensor g_loss, torch::Tensor pred, torch::Tensor target,
                                  torch::Tensor valid, torch::Tensor aux, bool huber_loss, double delta) {
  const int64_t n = pred.size(0);
  check_rows3(pred, n, "pred");
  check_rows3(target, n, "target");
  check_mask(valid, n, "valid");
  NL_CHECK_TENSORS(torch::kFloat32, g_loss);
  TORCH_CHECK(g_loss.numel() == 1, "g_loss must be a scalar");
  NL_CHECK_TENSORS(torch::kFloat64, aux);
  const c10::cuda::CUDAGuard guard(pred.device());
  auto grad = torch::empty_like(pred);
  if (n == 0) return grad;
  const int threads = 256;
  auto launch = [&](auto kernel) {
    kernel<<<n_blocks(n * 3, threads), threads, 0, stream()>>>(
        g_loss.data_ptr<float>(), pred.data_ptr<float>(), target.data_ptr<float>(), valid.data_ptr<bool>(),
        aux.data_ptr<double>(), n * 3, static_cast<float>(delta), grad.data_ptr<float>());
  };
  if (huber_loss) {
    launch(masked_ray_loss_bwd_kernel<true>);
  } else {
    launch(masked_ray_loss_bwd_kernel<false>);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad;
}

torch::Tensor adapt_ray_count(torch::Tensor aux, torch::Tensor valid, torch::Tensor marched, torch::Tensor rendered,
                              torch::Tensor n_active, torch::Tensor n_active_f, torch::Tensor target_fraction,
                              double sample_budget, double march_budget, double min_rays, double n_slots,
                              double momentum) {
  const int64_t n = valid.size(0);
  check_mask(valid, n, "ray_valid");
  for (const auto* t : {&marched, &rendered}) {
    NL_CHECK_TENSORS(torch::kInt64, (*t));
    TORCH_CHECK(t->dim() == 1 && t->size(0) == n, "sample counts must be int64 [", n, "]");
  }
  NL_CHECK_TENSORS(torch::kFloat64, aux);
  NL_CHECK_TENSORS(torch::kInt64, n_active);
  NL_CHECK_TENSORS(torch::kFloat32, n_active_f, target_fraction);
  const c10::cuda::CUDAGuard guard(valid.device());
  auto dopt = aux.options();
  auto stats = torch::empty({4}, dopt);
  const unsigned int blocks = reduce_blocks(n);
  auto partials = torch::empty({blocks * 3}, dopt);
  auto done = torch::zeros({1}, dopt.dtype(torch::kInt32));
  const AdaptArgs a{static_cast<float>(sample_budget), static_cast<float>(march_budget), static_cast<float>(min_rays),
                    static_cast<float>(n_slots), static_cast<float>(momentum),
                    static_cast<float>(1.0 - momentum)};  // rounded once from double, as torch's scalar
  adapt_ray_count_kernel<<<blocks, kReduceThreads, 0, stream()>>>(
      aux.data_ptr<double>(), valid.data_ptr<bool>(), marched.data_ptr<int64_t>(), rendered.data_ptr<int64_t>(), n,
      target_fraction.data_ptr<float>(), a, partials.data_ptr<double>(),
      reinterpret_cast<unsigned int*>(done.data_ptr<int32_t>()), n_active.data_ptr<int64_t>(),
      n_active_f.data_ptr<float>(), stats.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return stats;
}

std::vector<torch::Tensor> sample_points(torch::Tensor rays_o, torch::Tensor rays_d, torch::Tensor ray_idx,
                                         torch::Tensor t_starts, torch::Tensor t_ends) {
  const int64_t n_rays = rays_o.size(0);
  check_rows3(rays_o, n_rays, "rays_o");
  check_rows3(rays_d, n_rays, "rays_d");
  NL_CHECK_TENSORS(torch::kInt64, ray_idx);
  NL_CHECK_TENSORS(torch::kFloat32, t_starts, t_ends);
  const int64_t n = ray_idx.size(0);
  TORCH_CHECK(t_starts.numel() == n && t_ends.numel() == n, "sample_points: t_starts/t_ends must be [", n, "]");
  const c10::cuda::CUDAGuard guard(rays_o.device());
  auto positions = torch::empty({n, 3}, rays_o.options());
  auto dirs = torch::empty({n, 3}, rays_o.options());
  if (n == 0) return {positions, dirs};
  const int threads = 256;
  sample_points_kernel<<<n_blocks(n, threads), threads, 0, stream()>>>(
      rays_o.data_ptr<float>(), rays_d.data_ptr<float>(), ray_idx.data_ptr<int64_t>(), t_starts.data_ptr<float>(),
      t_ends.data_ptr<float>(), n, positions.data_ptr<float>(), dirs.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {positions, dirs};
}

std::vector<torch::Tensor> normalize_to_box(torch::Tensor positions, torch::Tensor box_min, torch::Tensor box_size) {
  const int64_t n = positions.size(0);
  check_rows3(positions, n, "positions");
  for (const auto* t : {&box_min, &box_size}) {
    NL_CHECK_TENSORS(torch::kFloat32, (*t));
    TORCH_CHECK(t->numel() == 3, "normalize_to_box: the box corner and size must be [3]");
  }
  const c10::cuda::CUDAGuard guard(positions.device());
  auto x = torch::empty_like(positions);
  auto inside = torch::empty({n}, positions.options().dtype(torch::kBool));
  if (n == 0) return {x, inside};
  const int threads = 256;
  normalize_to_box_kernel<<<n_blocks(n, threads), threads, 0, stream()>>>(
      positions.data_ptr<float>(), box_min.data_ptr<float>(), box_size.data_ptr<float>(), n, x.data_ptr<float>(),
      inside.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {x, inside};
}

}  // namespace nl
