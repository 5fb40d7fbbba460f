// Ray ops of ops/reference/rays.py: ray/box (AABB) intersection (sample positions and box
// coordinates are fused step kernels: step_ops.cu).
//
// Every kernel reproduces the float32 operation sequence of the reference (the oracle); the
// extension is built with --fmad=false and IEEE division/sqrt so that a*b+c is rounded twice, as
// PyTorch's elementwise kernels do. Comments name the reference expression each line mirrors.
#include <cmath>

#include "common.h"

namespace nl {

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

}  // namespace nl
