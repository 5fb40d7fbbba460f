// Python bindings of the nerf_lightning CUDA extension (one pybind11 module).
#include <torch/extension.h>

#include <vector>

namespace nl {
torch::Tensor hash_encode_fwd(torch::Tensor x, torch::Tensor params, std::vector<double> scales,
                              std::vector<int64_t> resolutions, std::vector<int64_t> offsets);
torch::Tensor hash_encode_bwd(torch::Tensor x, torch::Tensor grad_out, int64_t n_rows, int64_t n_features,
                              std::vector<double> scales, std::vector<int64_t> resolutions,
                              std::vector<int64_t> offsets);
torch::Tensor hash_encode_bwd_input(torch::Tensor x, torch::Tensor params, torch::Tensor grad_out,
                                    std::vector<double> scales, std::vector<int64_t> resolutions,
                                    std::vector<int64_t> offsets);
torch::Tensor sh_encode_fwd(torch::Tensor dirs, int64_t degree);
torch::Tensor sh_encode_bwd(torch::Tensor dirs, torch::Tensor grad_out, int64_t degree);
std::vector<torch::Tensor> ray_aabb_intersect(torch::Tensor rays_o, torch::Tensor rays_d, torch::Tensor aabb);
torch::Tensor grid_cell_positions(torch::Tensor cell_indices, torch::Tensor jitter, int64_t g);
torch::Tensor grid_ema_update(torch::Tensor grid, torch::Tensor cell_indices, torch::Tensor densities, double decay);
torch::Tensor pack_bitfield(torch::Tensor binaries);
torch::Tensor unpack_bitfield(torch::Tensor bits, int64_t c, int64_t g);
std::vector<torch::Tensor> march_rays(torch::Tensor rays_o, torch::Tensor rays_d, torch::Tensor t_near,
                                      torch::Tensor t_far, torch::Tensor binaries, c10::optional<torch::Tensor> t_jitter,
                                      double step_size, double cone_angle, double max_step, int64_t max_samples,
                                      double near_plane);
std::vector<torch::Tensor> march_rays_fixed(torch::Tensor rays_o, torch::Tensor rays_d, torch::Tensor t_near,
                                            torch::Tensor t_far, torch::Tensor binaries,
                                            c10::optional<torch::Tensor> t_jitter,
                                            c10::optional<torch::Tensor> n_active, double step_size,
                                            double cone_angle, double max_step, int64_t max_samples,
                                            double near_plane, int64_t capacity);
std::vector<torch::Tensor> repack(torch::Tensor t_starts, torch::Tensor t_ends, torch::Tensor packed_info,
                                  torch::Tensor keep, int64_t capacity, c10::optional<torch::Tensor> ray_valid);
std::vector<torch::Tensor> render_weights_fwd(torch::Tensor sigmas, torch::Tensor t_starts, torch::Tensor t_ends,
                                              torch::Tensor packed_info, double eps);
torch::Tensor render_weights_bwd(torch::Tensor grad_w, c10::optional<torch::Tensor> grad_trans, torch::Tensor sigmas,
                                 torch::Tensor t_starts, torch::Tensor t_ends, torch::Tensor packed_info,
                                 torch::Tensor w, torch::Tensor trans, double eps);
std::vector<torch::Tensor> volume_render_fwd(torch::Tensor sigmas, torch::Tensor rgbs, torch::Tensor t_starts,
                                             torch::Tensor t_ends, torch::Tensor packed_info, double eps,
                                             c10::optional<torch::Tensor> background);
std::vector<torch::Tensor> volume_render_bwd(torch::Tensor g_rgb, c10::optional<torch::Tensor> g_op,
                                             c10::optional<torch::Tensor> g_depth, c10::optional<torch::Tensor> g_w,
                                             torch::Tensor sigmas, torch::Tensor rgbs, torch::Tensor t_starts,
                                             torch::Tensor t_ends, torch::Tensor packed_info, torch::Tensor w,
                                             double eps, c10::optional<torch::Tensor> background);
torch::Tensor distortion_loss_fwd(torch::Tensor weights, torch::Tensor t_starts, torch::Tensor t_ends,
                                  torch::Tensor packed_info);
torch::Tensor distortion_loss_bwd(torch::Tensor g_loss, torch::Tensor weights, torch::Tensor t_starts,
                                  torch::Tensor t_ends, torch::Tensor packed_info);
std::vector<torch::Tensor> masked_ray_loss_fwd(torch::Tensor pred, torch::Tensor target, torch::Tensor valid,
                                               bool huber_loss, double delta);
torch::Tensor masked_ray_loss_bwd(torch::Tensor g_loss, torch::Tensor pred, torch::Tensor target,
                                  torch::Tensor valid, torch::Tensor aux, bool huber_loss, double delta);
torch::Tensor adapt_ray_count(torch::Tensor aux, torch::Tensor valid, torch::Tensor marched, torch::Tensor rendered,
                              torch::Tensor n_active, torch::Tensor n_active_f, torch::Tensor target_fraction,
                              double sample_budget, double march_budget, double min_rays, double n_slots,
                              double momentum);
std::vector<torch::Tensor> sample_points(torch::Tensor rays_o, torch::Tensor rays_d, torch::Tensor ray_idx,
                                         torch::Tensor t_starts, torch::Tensor t_ends);
std::vector<torch::Tensor> sample_pixels(torch::Tensor u, torch::Tensor cdf, torch::Tensor widths,
                                         torch::Tensor heights, int64_t res);
std::vector<torch::Tensor> training_rays(torch::Tensor poses, torch::Tensor intrinsics, torch::Tensor pixels,
                                         torch::Tensor offsets, torch::Tensor widths, torch::Tensor view_ids,
                                         torch::Tensor ix, torch::Tensor iy, torch::Tensor ux, torch::Tensor uy,
                                         torch::Tensor background, c10::optional<torch::Tensor> table,
                                         c10::optional<torch::Tensor> camera_of_view);
torch::Tensor density_activation_fwd(torch::Tensor h, torch::Tensor inside, double bias);
torch::Tensor density_activation_bwd(torch::Tensor g, torch::Tensor h, torch::Tensor inside, double bias);
torch::Tensor fused_mlp_fwd(torch::Tensor in0, c10::optional<torch::Tensor> in1, std::vector<torch::Tensor> weights,
                            std::vector<torch::Tensor> biases, bool bf16);
std::vector<torch::Tensor> fused_mlp_bwd(torch::Tensor grad_out, torch::Tensor in0, c10::optional<torch::Tensor> in1,
                                         std::vector<torch::Tensor> weights, std::vector<torch::Tensor> biases,
                                         bool bf16, bool need_grad_in0, bool need_grad_in1);
std::vector<torch::Tensor> normalize_to_box(torch::Tensor positions, torch::Tensor box_min, torch::Tensor box_size);
}  // namespace nl

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "nerf_lightning CUDA kernels (see nerf_lightning/ops/cuda.py for the Python API)";
  m.def("hash_encode_fwd", &nl::hash_encode_fwd);
  m.def("hash_encode_bwd", &nl::hash_encode_bwd);
  m.def("hash_encode_bwd_input", &nl::hash_encode_bwd_input);
  m.def("sh_encode_fwd", &nl::sh_encode_fwd);
  m.def("sh_encode_bwd", &nl::sh_encode_bwd);
  m.def("ray_aabb_intersect", &nl::ray_aabb_intersect);
  m.def("grid_cell_positions", &nl::grid_cell_positions);
  m.def("grid_ema_update", &nl::grid_ema_update);
  m.def("pack_bitfield", &nl::pack_bitfield);
  m.def("unpack_bitfield", &nl::unpack_bitfield);
  m.def("march_rays", &nl::march_rays);
  m.def("march_rays_fixed", &nl::march_rays_fixed);
  m.def("repack", &nl::repack);
  m.def("render_weights_fwd", &nl::render_weights_fwd);
  m.def("render_weights_bwd", &nl::render_weights_bwd);
  m.def("volume_render_fwd", &nl::volume_render_fwd);
  m.def("volume_render_bwd", &nl::volume_render_bwd);
  m.def("distortion_loss_fwd", &nl::distortion_loss_fwd);
  m.def("distortion_loss_bwd", &nl::distortion_loss_bwd);
  m.def("masked_ray_loss_fwd", &nl::masked_ray_loss_fwd);
  m.def("masked_ray_loss_bwd", &nl::masked_ray_loss_bwd);
  m.def("adapt_ray_count", &nl::adapt_ray_count);
  m.def("sample_points", &nl::sample_points);
  m.def("normalize_to_box", &nl::normalize_to_box);
  m.def("density_activation_fwd", &nl::density_activation_fwd);
  m.def("training_rays", &nl::training_rays);
  m.def("sample_pixels", &nl::sample_pixels);
  m.def("density_activation_bwd", &nl::density_activation_bwd);
  m.def("fused_mlp_fwd", &nl::fused_mlp_fwd);
  // need_grad_in1 defaults to false: callers of the three-result form are unchanged
  m.def("fused_mlp_bwd", &nl::fused_mlp_bwd, pybind11::arg("grad_out"), pybind11::arg("in0"), pybind11::arg("in1"),
        pybind11::arg("weights"), pybind11::arg("biases"), pybind11::arg("bf16"), pybind11::arg("need_grad_in0"),
        pybind11::arg("need_grad_in1") = false);
  m.attr("ABI_VERSION") = 6;
}
