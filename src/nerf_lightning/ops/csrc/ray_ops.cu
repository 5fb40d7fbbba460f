// Ray ops: box intersection, occupancy-grid helpers, marching into packed samples, compositing,
// the distortion loss.
//
// Every kernel reproduces the float32 operation sequence of ops/reference.py (the oracle); the
// extension is built with --fmad=false and IEEE division/sqrt so that a*b+c is rounded twice, as
// PyTorch's elementwise kernels do. Comments name the reference expression each line mirrors.
#include <cmath>

#include "common.h"

#include <utility>

namespace nl {

// ---------------------------------------------------------------------------------------- AABB
__global__ void ray_aabb_kernel(const float* __restrict__ o, const float* __restrict__ d, const float* __restrict__ box,
                                int64_t n, float* __restrict__ t_near, float* __restrict__ t_far,
                                bool* __restrict__ hit) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  float tn = -INFINITY, tf = INFINITY;
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    const float oa = o[r * 3 + a], da = d[r * 3 + a], lo = box[a], hi = box[3 + a];
    float tmin, tmax;
    if (da == 0.0f) {
      const bool inside = (oa >= lo) && (oa <= hi);
      tmin = inside ? -INFINITY : INFINITY;
      tmax = inside ? INFINITY : -INFINITY;
    } else {
      const float t1 = __fdiv_rn(lo - oa, da), t2 = __fdiv_rn(hi - oa, da);
      tmin = fminf(t1, t2);
      tmax = fmaxf(t1, t2);
    }
    tn = fmaxf(tn, tmin);
    tf = fminf(tf, tmax);
  }
  tn = fmaxf(tn, 0.0f);
  const bool h = tf > tn;
  t_near[r] = h ? tn : 1e10f;
  t_far[r] = h ? tf : 1e10f;
  hit[r] = h;
}

std::vector<torch::Tensor> ray_aabb_intersect(torch::Tensor rays_o, torch::Tensor rays_d, torch::Tensor aabb) {
  NL_CHECK_INPUTS(rays_o, rays_d, aabb);
  NL_CHECK_DTYPES(torch::kFloat32, rays_o, rays_d, aabb);
  const c10::cuda::CUDAGuard guard(rays_o.device());
  const int64_t n = rays_o.size(0);
  auto t_near = torch::empty({n}, rays_o.options());
  auto t_far = torch::empty({n}, rays_o.options());
  auto hit = torch::empty({n}, rays_o.options().dtype(torch::kBool));
  if (n > 0) {
    ray_aabb_kernel<<<n_blocks(n, 256), 256, 0, stream()>>>(rays_o.data_ptr<float>(), rays_d.data_ptr<float>(),
                                                            aabb.data_ptr<float>(), n, t_near.data_ptr<float>(),
                                                            t_far.data_ptr<float>(), hit.data_ptr<bool>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {t_near, t_far, hit};
}

// ------------------------------------------------------------------------------ grid helpers
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
// (ops/reference.py::repack). Given that inclusive sum, one thread per ray decides: valid rays get
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

// The fixed layout of ops/reference.py (march_rays_fixed): `capacity` sample slots, rays kept in
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

// ------------------------------------------------------------------------------- compositing
// Per ray r: samples [start, start + count) of packed_info. One warp per ray, 32 samples per step:
// warp scans (float64) of the optical depth and of the gradient terms, the exclusive optical depth
// accumulated in double (the reference subtracts a global float64 cumsum), T = float(exp(-depth)).
// Same formulas as ops/reference.py; only the float64 summation order differs.
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

// ------------------------------------------------------------------------------ distortion loss
// mip-NeRF 360's distortion loss per ray (ops/reference.py::distortion_loss). Per ray r: samples
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
