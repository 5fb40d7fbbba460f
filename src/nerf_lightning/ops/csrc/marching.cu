// Marching ops of ops/reference/marching.py: marching rays into packed samples (compact and fixed
// layout), repacking kept samples into a fixed buffer.
//
// Every kernel reproduces the float32 operation sequence of the reference (the oracle); the
// extension is built with --fmad=false and IEEE division/sqrt so that a*b+c is rounded twice, as
// PyTorch's elementwise kernels do. Comments name the reference expression each line mirrors.
#include <cmath>

#include "common.h"

namespace nl {

// ------------------------------------------------------------------------------------ marching
struct MarchArgs {
  float step, cone, max_step, near_plane;
  float step_over_cone;      // float32(step / cone), computed in double like the Python scalar
  float max_step_over_cone;  // float32(max_step / cone)
  float log1p_cone;          // float32(log1p(cone))
  float growth;              // float32(1 + cone)
  float half_outer;          // 2^(C-1) / 2
  int n_cascades, g, max_samples;
  bool cone_on, has_jitter;
};

struct RayLaw {
  float t0, tf, ka, nb, ta, tb;
};

// _StepLaw.t_of_k
__device__ __forceinline__ float t_of_k(float k, const RayLaw& w, const MarchArgs& a) {
  const float lin = w.t0 + k * a.step;
  if (!a.cone_on || k <= w.ka) return lin;
  if (k <= w.ka + w.nb) return w.ta * powf(a.growth, k - w.ka);
  return w.tb + ((k - w.ka) - w.nb) * a.max_step;
}

// march_rays preamble: t0, validity and the per-ray phase constants of _StepLaw.
__device__ __forceinline__ bool ray_law(int64_t r, const float* __restrict__ t_near, const float* __restrict__ t_far,
                                        const float* __restrict__ jitter, const MarchArgs& a, RayLaw& w) {
  const float tn = t_near[r], tfar = t_far[r];
  const bool hit = tfar > tn;
  float t0 = fmaxf(tn, a.near_plane);
  if (a.has_jitter) {
    const float dt = a.cone_on ? fminf(fmaxf(t0 * a.cone, a.step), a.max_step) : a.step;
    t0 = t0 + jitter[r] * dt;
  }
  if (!(hit && t0 < tfar)) return false;
  w.t0 = t0;
  w.tf = tfar;
  if (a.cone_on) {
    w.ka = fmaxf(ceilf(__fdiv_rn(a.step_over_cone - t0, a.step)), 0.0f);
    w.ta = t0 + w.ka * a.step;
    w.nb = fmaxf(ceilf(__fdiv_rn(logf(__fdiv_rn(a.max_step_over_cone, w.ta)), a.log1p_cone)), 0.0f);
    w.tb = w.ta * powf(a.growth, w.nb);
  } else {
    w.ka = w.nb = w.ta = w.tb = 0.0f;
  }
  return true;
}

// grid_cell_indices + occupancy + outer-box test for the midpoint p.
__device__ __forceinline__ bool occupied(const float p[3], const uint8_t* __restrict__ bins, const MarchArgs& a) {
  const float ax = fabsf(p[0] - 0.5f), ay = fabsf(p[1] - 0.5f), az = fabsf(p[2] - 0.5f);
  const float amax = fmaxf(fmaxf(ax, ay), az);
  if (!(amax <= a.half_outer)) return false;
  int e;
  const float mant = frexpf(2.0f * amax, &e);
  int c = e - (mant == 0.5f ? 1 : 0);
  c = max(0, min(c, a.n_cascades - 1));
  const float g = static_cast<float>(a.g);
  int ijk[3];
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const float u = ldexpf(p[k] - 0.5f, -c) + 0.5f;  // (p - 0.5) / 2^c + 0.5 (exact scaling)
    ijk[k] = min(max(static_cast<int>(floorf(u * g)), 0), a.g - 1);
  }
  const int64_t flat = ((static_cast<int64_t>(c) * a.g + ijk[0]) * a.g + ijk[1]) * a.g + ijk[2];
  return bins[flat] != 0;
}

// Pass 1 (counts only, offsets == nullptr) and pass 2 (writes the samples at offsets[r]; rays with
// offsets[r] < 0 are skipped). Rays r >= *n_active (when n_active is given) get no samples.
// One warp per ray: lane j evaluates candidate k = base + j of each 32-candidate chunk, the warp
// ballots occupancy and compacts the kept samples in candidate order. Same semantics as a serial
// loop: candidates stop at the first one ending past t_far (t_k is non-decreasing in k), and only
// the first max_samples kept ones are written.
__global__ void march_kernel(const float* __restrict__ o, const float* __restrict__ d,
                             const float* __restrict__ t_near, const float* __restrict__ t_far,
                             const float* __restrict__ jitter, const uint8_t* __restrict__ bins, const MarchArgs a,
                             int64_t n_rays, const int64_t* __restrict__ n_active, int32_t* __restrict__ counts,
                             const int64_t* __restrict__ offsets, int64_t* __restrict__ ray_idx,
                             float* __restrict__ t_starts, float* __restrict__ t_ends) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n_rays) return;  // warp-uniform
  const bool fill = offsets != nullptr;
  if (fill && offsets[r] < 0) return;  // fixed layout: the ray did not fit (or is inactive)
  RayLaw w;
  const bool active = n_active == nullptr || r < *n_active;
  if (!active || a.max_samples <= 0 || !ray_law(r, t_near, t_far, jitter, a, w)) {
    if (!fill && lane == 0) counts[r] = 0;
    return;
  }
  const float ox = o[r * 3], oy = o[r * 3 + 1], oz = o[r * 3 + 2];
  const float dx = d[r * 3], dy = d[r * 3 + 1], dz = d[r * 3 + 2];
  const int64_t out0 = fill ? offsets[r] : 0;
  const unsigned lower = (1u << lane) - 1u;
  int n = 0;  // kept so far (warp-uniform)
  for (int base = 0; base < (1 << 24); base += 32) {
    const int k = base + lane;
    const float ts = t_of_k(static_cast<float>(k), w, a);
    const float te = t_of_k(static_cast<float>(k + 1), w, a);
    const unsigned out_mask = __ballot_sync(0xffffffffu, !(te <= w.tf));
    const int first_out = out_mask ? __ffs(out_mask) - 1 : 32;
    bool keep = false;
    if (lane < first_out) {
      const float mid = (ts + te) * 0.5f;
      const float p[3] = {ox + dx * mid, oy + dy * mid, oz + dz * mid};
      keep = occupied(p, bins, a);
    }
    const unsigned keep_mask = __ballot_sync(0xffffffffu, keep);
    const int slot = n + __popc(keep_mask & lower);
    if (fill && keep && slot < a.max_samples) {
      ray_idx[out0 + slot] = r;
      t_starts[out0 + slot] = ts;
      t_ends[out0 + slot] = te;
    }
    n += __popc(keep_mask);
    if (n >= a.max_samples) {
      n = a.max_samples;
      break;
    }
    if (first_out < 32) break;
  }
  if (!fill && lane == 0) counts[r] = n;
}

// Checks shared by both marching entry points; returns the kernel's constants.
static MarchArgs march_args(const torch::Tensor& rays_o, const torch::Tensor& rays_d, const torch::Tensor& t_near,
                            const torch::Tensor& t_far, const torch::Tensor& binaries, const float* jit,
                            double step_size, double cone_angle, double max_step, int64_t max_samples,
                            double near_plane) {
  NL_CHECK_INPUTS(rays_o, rays_d, t_near, t_far, binaries);
  NL_CHECK_DTYPES(torch::kFloat32, rays_o, rays_d, t_near, t_far);
  NL_CHECK_DTYPES(torch::kBool, binaries);
  TORCH_CHECK(binaries.dim() == 4, "march_rays: binaries must be [C, G, G, G]");
  MarchArgs a{};
  a.step = static_cast<float>(step_size);
  a.cone = static_cast<float>(cone_angle);
  a.max_step = static_cast<float>(max_step);
  a.near_plane = static_cast<float>(near_plane);
  a.cone_on = cone_angle > 0;
  if (a.cone_on) {
    a.step_over_cone = static_cast<float>(step_size / cone_angle);
    a.max_step_over_cone = static_cast<float>(max_step / cone_angle);
    a.log1p_cone = static_cast<float>(std::log1p(cone_angle));
    a.growth = static_cast<float>(1.0 + cone_angle);
  }
  a.n_cascades = static_cast<int>(binaries.size(0));
  a.g = static_cast<int>(binaries.size(1));
  a.half_outer = static_cast<float>(std::ldexp(1.0, a.n_cascades - 1) / 2.0);
  a.max_samples = static_cast<int>(std::min<int64_t>(max_samples, 1 << 30));
  a.has_jitter = jit != nullptr;
  return a;
}

static const float* jitter_ptr(const c10::optional<torch::Tensor>& t_jitter) {
  if (!t_jitter.has_value()) return nullptr;
  NL_CHECK_TENSORS(torch::kFloat32, (*t_jitter));
  return t_jitter->data_ptr<float>();
}

constexpr int kMarchThreads = 128;  // 4 rays (warps) per block

static void launch_march(const torch::Tensor& rays_o, const torch::Tensor& rays_d, const torch::Tensor& t_near,
                         const torch::Tensor& t_far, const float* jit, const torch::Tensor& binaries,
                         const MarchArgs& a, const int64_t* n_active, int32_t* counts, const int64_t* offsets,
                         int64_t* ray_idx, float* t_s, float* t_e) {
  const int64_t n_rays = rays_o.size(0);
  march_kernel<<<n_blocks(n_rays * 32, kMarchThreads), kMarchThreads, 0, stream()>>>(
      rays_o.data_ptr<float>(), rays_d.data_ptr<float>(), t_near.data_ptr<float>(), t_far.data_ptr<float>(), jit,
      reinterpret_cast<const uint8_t*>(binaries.data_ptr<bool>()), a, n_rays, n_active, counts, offsets, ray_idx,
      t_s, t_e);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::vector<torch::Tensor> march_rays(torch::Tensor rays_o, torch::Tensor rays_d, torch::Tensor t_near,
                                      torch::Tensor t_far, torch::Tensor binaries, c10::optional<torch::Tensor> t_jitter,
                                      double step_size, double cone_angle, double max_step, int64_t max_samples,
                                      double near_plane) {
  const float* jit = jitter_ptr(t_jitter);
  const MarchArgs a = march_args(rays_o, rays_d, t_near, t_far, binaries, jit, step_size, cone_angle, max_step,
                                 max_samples, near_plane);
  const c10::cuda::CUDAGuard guard(rays_o.device());
  const int64_t n_rays = rays_o.size(0);
  auto counts = torch::zeros({n_rays}, rays_o.options().dtype(torch::kInt32));
  auto lopt = rays_o.options().dtype(torch::kInt64);
  if (n_rays == 0) {
    return {torch::empty({0}, lopt), torch::empty({0}, rays_o.options()), torch::empty({0}, rays_o.options()),
            torch::zeros({0, 2}, lopt)};
  }
  launch_march(rays_o, rays_d, t_near, t_far, jit, binaries, a, nullptr, counts.data_ptr<int32_t>(), nullptr,
               nullptr, nullptr, nullptr);
  auto count64 = counts.to(torch::kInt64);
  auto incl = torch::cumsum(count64, 0);
  auto starts = incl - count64;
  const int64_t total = incl[n_rays - 1].item<int64_t>();  // the one host sync: S sizes the outputs
  auto ray_idx = torch::empty({total}, lopt);
  auto t_s = torch::empty({total}, rays_o.options());
  auto t_e = torch::empty({total}, rays_o.options());
  if (total > 0) {
    launch_march(rays_o, rays_d, t_near, t_far, jit, binaries, a, nullptr, nullptr, starts.data_ptr<int64_t>(),
                 ray_idx.data_ptr<int64_t>(), t_s.data_ptr<float>(), t_e.data_ptr<float>());
  }
  auto packed_info = torch::stack({starts, count64}, -1);
  return {ray_idx, t_s, t_e, packed_info};
}

// ------------------------------------------------------------------------------- fixed layout
// Rays keep their samples in index order while the inclusive sum of their counts fits `capacity`
// (ops/reference/marching.py::repack). Given that inclusive sum, one thread per ray decides: valid rays get
// (start, count); the others (count, start) = (0, n_used), where n_used, the samples in use, is the
// largest inclusive sum <= capacity (rays that are not candidates have count 0, so the sums are
// non-decreasing and a binary search finds it). `offsets` (optional): start, or -1 if invalid.
__global__ void fixed_layout_kernel(const int64_t* __restrict__ counts, const int64_t* __restrict__ incl,
                                    const bool* __restrict__ candidate, const int64_t* __restrict__ n_active,
                                    int64_t n_rays, int64_t capacity, int64_t* __restrict__ info,
                                    bool* __restrict__ valid, int64_t* __restrict__ offsets) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= n_rays) return;
  const bool ok = incl[r] <= capacity && (candidate == nullptr || candidate[r]) && (n_active == nullptr || r < *n_active);
  int64_t start;
  if (ok) {
    start = incl[r] - counts[r];
  } else {
    int64_t lo = 0, hi = n_rays;  // first index whose inclusive sum exceeds capacity
    while (lo < hi) {
      const int64_t mid = (lo + hi) >> 1;
      if (incl[mid] <= capacity) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    start = lo == 0 ? 0 : incl[lo - 1];
  }
  info[r * 2] = start;
  info[r * 2 + 1] = ok ? counts[r] : 0;
  valid[r] = ok;
  if (offsets != nullptr) offsets[r] = ok ? start : -1;
}

// counts (int64 [R], zero for non-candidates) -> packed_info [R, 2], valid [R], offsets [R] (optional).
static std::vector<torch::Tensor> fixed_layout(const torch::Tensor& counts, const bool* candidate,
                                               const int64_t* n_active, int64_t capacity, bool with_offsets) {
  const int64_t n_rays = counts.size(0);
  auto lopt = counts.options();
  auto incl = torch::cumsum(counts, 0);
  auto info = torch::empty({n_rays, 2}, lopt);
  auto valid = torch::empty({n_rays}, lopt.dtype(torch::kBool));
  auto offsets = with_offsets ? torch::empty({n_rays}, lopt) : torch::Tensor();
  const int threads = 256;
  fixed_layout_kernel<<<n_blocks(n_rays, threads), threads, 0, stream()>>>(
      counts.data_ptr<int64_t>(), incl.data_ptr<int64_t>(), candidate, n_active, n_rays, capacity,
      info.data_ptr<int64_t>(), valid.data_ptr<bool>(), with_offsets ? offsets.data_ptr<int64_t>() : nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {info, valid, offsets};
}

// The fixed layout of ops/reference/marching.py (march_rays_fixed): `capacity` sample slots, rays kept in
// index order while they fit, padding = (ray 0, t 0, t 0). No host sync (graph capturable).
std::vector<torch::Tensor> march_rays_fixed(torch::Tensor rays_o, torch::Tensor rays_d, torch::Tensor t_near,
                                            torch::Tensor t_far, torch::Tensor binaries,
                                            c10::optional<torch::Tensor> t_jitter,
                                            c10::optional<torch::Tensor> n_active, double step_size,
                                            double cone_angle, double max_step, int64_t max_samples,
                                            double near_plane, int64_t capacity) {
  const float* jit = jitter_ptr(t_jitter);
  const MarchArgs a = march_args(rays_o, rays_d, t_near, t_far, binaries, jit, step_size, cone_angle, max_step,
                                 max_samples, near_plane);
  TORCH_CHECK(capacity >= 0, "march_rays_fixed: capacity must be >= 0");
  const int64_t* active = nullptr;
  if (n_active.has_value()) {
    NL_CHECK_TENSORS(torch::kInt64, (*n_active));
    TORCH_CHECK(n_active->numel() == 1, "march_rays_fixed: n_active must be a scalar tensor");
    active = n_active->data_ptr<int64_t>();
  }
  const c10::cuda::CUDAGuard guard(rays_o.device());
  const int64_t n_rays = rays_o.size(0);
  auto lopt = rays_o.options().dtype(torch::kInt64);
  auto ray_idx = torch::zeros({capacity}, lopt);
  auto t_s = torch::zeros({capacity}, rays_o.options());
  auto t_e = torch::zeros({capacity}, rays_o.options());
  if (n_rays == 0) {
    return {ray_idx, t_s, t_e, torch::zeros({0, 2}, lopt), torch::zeros({0}, rays_o.options().dtype(torch::kBool))};
  }
  auto counts = torch::empty({n_rays}, rays_o.options().dtype(torch::kInt32));  // the count pass writes every ray
  launch_march(rays_o, rays_d, t_near, t_far, jit, binaries, a, active, counts.data_ptr<int32_t>(), nullptr, nullptr,
               nullptr, nullptr);
  // inactive rays count 0, so the layout's inclusive sums stay non-decreasing
  auto layout = fixed_layout(counts.to(torch::kInt64), nullptr, active, capacity, true);
  if (capacity > 0) {
    launch_march(rays_o, rays_d, t_near, t_far, jit, binaries, a, active, nullptr, layout[2].data_ptr<int64_t>(),
                 ray_idx.data_ptr<int64_t>(), t_s.data_ptr<float>(), t_e.data_ptr<float>());
  }
  return {ray_idx, t_s, t_e, layout[0], layout[1]};
}

// repack, one thread per ray: kept samples of candidate rays counted, then copied in order.
__global__ void repack_count_kernel(const int64_t* __restrict__ info, const bool* __restrict__ keep,
                                    const bool* __restrict__ ray_valid, int64_t n_rays, int64_t n_samples,
                                    int64_t* __restrict__ counts) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= n_rays) return;
  int64_t n = 0;
  if (ray_valid == nullptr || ray_valid[r]) {
    const int64_t first = info[r * 2], end = min(first + info[r * 2 + 1], n_samples);
    for (int64_t s = max(first, int64_t{0}); s < end; ++s) n += keep[s] ? 1 : 0;
  }
  counts[r] = n;
}

__global__ void repack_copy_kernel(const int64_t* __restrict__ info, const bool* __restrict__ keep,
                                   const float* __restrict__ t_starts, const float* __restrict__ t_ends,
                                   const int64_t* __restrict__ out_info, const bool* __restrict__ valid,
                                   int64_t n_rays, int64_t n_samples, int64_t* __restrict__ out_idx,
                                   float* __restrict__ out_ts, float* __restrict__ out_te) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= n_rays || !valid[r]) return;
  const int64_t first = info[r * 2], end = min(first + info[r * 2 + 1], n_samples);
  int64_t j = out_info[r * 2];
  for (int64_t s = max(first, int64_t{0}); s < end; ++s) {
    if (!keep[s]) continue;
    out_idx[j] = r;
    out_ts[j] = t_starts[s];
    out_te[j] = t_ends[s];
    ++j;
  }
}

std::vector<torch::Tensor> repack(torch::Tensor t_starts, torch::Tensor t_ends, torch::Tensor packed_info,
                                  torch::Tensor keep, int64_t capacity, c10::optional<torch::Tensor> ray_valid) {
  NL_CHECK_INPUTS(t_starts, t_ends, packed_info, keep);
  NL_CHECK_DTYPES(torch::kFloat32, t_starts, t_ends);
  NL_CHECK_DTYPES(torch::kInt64, packed_info);
  NL_CHECK_DTYPES(torch::kBool, keep);
  TORCH_CHECK(capacity >= 0, "repack: capacity must be >= 0");
  const int64_t n_samples = t_starts.numel(), n_rays = packed_info.size(0);
  TORCH_CHECK(t_ends.numel() == n_samples && keep.numel() == n_samples, "repack: samples must all be [S]");
  const bool* candidate = nullptr;
  if (ray_valid.has_value()) {
    NL_CHECK_TENSORS(torch::kBool, (*ray_valid));
    TORCH_CHECK(ray_valid->numel() == n_rays, "repack: ray_valid must be [R]");
    candidate = ray_valid->data_ptr<bool>();
  }
  const c10::cuda::CUDAGuard guard(t_starts.device());
  auto lopt = packed_info.options();
  auto out_idx = torch::zeros({capacity}, lopt);
  auto out_ts = torch::zeros({capacity}, t_starts.options());
  auto out_te = torch::zeros({capacity}, t_starts.options());
  if (n_rays == 0) return {out_idx, out_ts, out_te, torch::zeros({0, 2}, lopt), torch::zeros({0}, keep.options())};
  auto counts = torch::empty({n_rays}, lopt);
  const int threads = 256;
  repack_count_kernel<<<n_blocks(n_rays, threads), threads, 0, stream()>>>(
      packed_info.data_ptr<int64_t>(), keep.data_ptr<bool>(), candidate, n_rays, n_samples, counts.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto layout = fixed_layout(counts, candidate, nullptr, capacity, false);
  if (capacity > 0) {
    repack_copy_kernel<<<n_blocks(n_rays, threads), threads, 0, stream()>>>(
        packed_info.data_ptr<int64_t>(), keep.data_ptr<bool>(), t_starts.data_ptr<float>(), t_ends.data_ptr<float>(),
        layout[0].data_ptr<int64_t>(), layout[1].data_ptr<bool>(), n_rays, n_samples, out_idx.data_ptr<int64_t>(),
        out_ts.data_ptr<float>(), out_te.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {out_idx, out_ts, out_te, layout[0], layout[1]};
}

}  // namespace nl
