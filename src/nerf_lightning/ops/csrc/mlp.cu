// Fully fused half-precision MLP (forward and backward) on tensor cores, for the field's two small
// networks (models/field.py): width-64 ReLU hidden layers, a linear output layer, fp32 master
// weights and biases. Contract and rounding: ops/reference.py::fused_mlp.
//
// Why fused: at 2^18 samples per step the layers are 64 wide, so cuBLAS runs each layer as a
// memory-bound GEMM plus bias/activation/split-K kernels (about 20 kernels and 0.4 ms per bf16 step
// on an H200). Here one kernel runs a whole network with every activation in shared memory, as
// tiny-cuda-nn's FullyFusedMLP does (its design is the reference point; no code is taken from it).
//
// Layout: a block of 4 warps takes tiles of 64 rows (16 per warp) in a grid-stride loop, with the
// weights converted from fp32 to the half type once per block. Rounding: the input and every hidden
// activation are rounded to the half type, products accumulate in fp32, biases are added in fp32
// and the output stays fp32. The backward pass recomputes the hidden activations from the input
// (nothing is saved between the passes), propagates half-type gradients through the layers and
// accumulates the weight and bias gradients per block in fp32 shared memory, added to the global
// fp32 gradients once per block.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <vector>

#include "common.h"

namespace nl {

namespace {

using namespace nvcuda;

constexpr int kMlpMaxLayers = 8;
constexpr int kMlpWarps = 4;
constexpr int kMlpThreads = kMlpWarps * 32;
constexpr int kTileRows = 16 * kMlpWarps;
constexpr int kSkew = 8;  // halves of padding per shared row: spreads a fragment's rows over the banks

struct MlpDims {
  int n_layers;        // linear layers: hidden ones and the output layer
  int in0, in1;        // widths of the two inputs (concatenated along columns; in1 may be 0)
  int out;             // output width
  int rows_in[kMlpMaxLayers];   // real input width of each layer (weight columns)
  int rows_out[kMlpMaxLayers];  // real output width of each layer (weight rows)
  int k_pad[kMlpMaxLayers];     // padded input width (multiple of 16)
  int n_pad[kMlpMaxLayers];     // padded output width (multiple of 16)
  const float* w[kMlpMaxLayers];  // fp32 [rows_out, rows_in] row-major (nn.Linear.weight)
  const float* b[kMlpMaxLayers];  // fp32 [rows_out]
};

template <typename T>
__device__ __forceinline__ T to_half(float v);
template <>
__device__ __forceinline__ __half to_half<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 to_half<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
__device__ __forceinline__ float from_half(__half v) { return __half2float(v); }
__device__ __forceinline__ float from_half(__nv_bfloat16 v) { return __bfloat162float(v); }

// Offsets (in elements of their own type) of every shared-memory region; the same on host and device.
struct SmemLayout {
  int w_off[kMlpMaxLayers];   // half weights, [n_pad, k_pad + skew] each
  int w_ld[kMlpMaxLayers];
  int n_w;                    // halves of all weights
  int b_off[kMlpMaxLayers];   // fp32 biases [n_pad] each
  int n_b;
  int act_ld;                 // leading dimension of activation / gradient buffers (halves)
  int act_width;              // widest padded layer input or output
  size_t bytes_fwd, bytes_bwd;
  // backward only: fp32 weight- and bias-gradient accumulators
  int gw_off[kMlpMaxLayers];
  int gb_off[kMlpMaxLayers];
  int n_gw, n_gb;
};

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

inline SmemLayout make_layout(const MlpDims& d) {
  SmemLayout s{};
  int nw = 0, nb = 0, widest = 0, ngw = 0;
  for (int l = 0; l < d.n_layers; ++l) {
    s.w_ld[l] = d.k_pad[l] + kSkew;
    s.w_off[l] = nw;
    nw += d.n_pad[l] * s.w_ld[l];
    s.b_off[l] = nb;
    nb += d.n_pad[l];
    s.gw_off[l] = ngw;
    ngw += d.n_pad[l] * d.k_pad[l];
    s.gb_off[l] = l == 0 ? 0 : s.gb_off[l - 1] + d.n_pad[l - 1];
    widest = widest > d.k_pad[l] ? widest : d.k_pad[l];
    widest = widest > d.n_pad[l] ? widest : d.n_pad[l];
  }
  s.n_w = round_up(nw, 16);
  s.n_b = round_up(nb, 8);
  s.n_gw = ngw;
  s.n_gb = round_up(nb, 8);
  s.act_width = widest;
  s.act_ld = widest + kSkew;
  const size_t half = 2;
  const size_t weights = s.n_w * half + s.n_b * 4;
  const size_t scratch = kMlpWarps * 16 * 16 * 4;
  // forward: two ping-pong activation strips per warp
  s.bytes_fwd = weights + scratch + static_cast<size_t>(kMlpWarps) * 2 * 16 * s.act_ld * half;
  // backward: every layer's input for the whole tile, two gradient buffers, fp32 accumulators
  const size_t acts = static_cast<size_t>(d.n_layers) * kTileRows * s.act_ld * half;
  const size_t grads = 2 * static_cast<size_t>(kTileRows) * s.act_ld * half;
  s.bytes_bwd = weights + scratch + acts + grads + (static_cast<size_t>(s.n_gw) + s.n_gb) * 4;
  return s;
}

// Weights (fp32, global) -> half in shared memory, zero-padded; biases -> fp32 shared, zero-padded.
template <typename T>
__device__ void load_weights(const MlpDims& d, const SmemLayout& s, T* w_s, float* b_s) {
  for (int l = 0; l < d.n_layers; ++l) {
    const int n_pad = d.n_pad[l], k_pad = d.k_pad[l], ld = s.w_ld[l];
    const int rows = d.rows_out[l], cols = d.rows_in[l];
    const float* w = d.w[l];
    for (int i = threadIdx.x; i < n_pad * ld; i += blockDim.x) {
      const int r = i / ld, c = i - r * ld;
      const float v = (r < rows && c < cols && c < k_pad) ? w[r * cols + c] : 0.0f;
      w_s[s.w_off[l] + i] = to_half<T>(v);
    }
    for (int i = threadIdx.x; i < n_pad; i += blockDim.x) b_s[s.b_off[l] + i] = i < rows ? d.b[l][i] : 0.0f;
  }
}

// Input rows [row0, row0 + 16) of cat(in0, in1) -> half strip [16, k_pad0] (zeros past the end).
template <typename T>
__device__ void load_input_strip(const MlpDims& d, const float* __restrict__ in0, const float* __restrict__ in1,
                                 int64_t n, int64_t row0, T* strip, int ld, int lane) {
  const int k_pad = d.k_pad[0];
  for (int i = lane; i < 16 * k_pad; i += 32) {
    const int r = i / k_pad, c = i - r * k_pad;
    const int64_t row = row0 + r;
    float v = 0.0f;
    if (row < n) {
      if (c < d.in0) {
        v = in0[row * d.in0 + c];
      } else if (c < d.in0 + d.in1) {
        v = in1[row * d.in1 + (c - d.in0)];
      }
    }
    strip[r * ld + c] = to_half<T>(v);
  }
}

// One warp: y[16, n_pad] = x[16, k_pad] W^T (+ bias). Hidden layers write ReLU(y) as half into
// `next`; the output layer calls `emit(r, c, value)` for each element.
template <typename T, typename Emit>
__device__ __forceinline__ void warp_layer(const T* x, int x_ld, const T* w, int w_ld, const float* bias, int k_pad,
                                           int n_pad, float* scratch, int lane, bool hidden, T* next, int next_ld,
                                           Emit emit) {
  for (int nt = 0; nt < n_pad / 16; ++nt) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kt = 0; kt < k_pad / 16; ++kt) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
      wmma::load_matrix_sync(a, x + kt * 16, x_ld);
      wmma::load_matrix_sync(b, w + nt * 16 * w_ld + kt * 16, w_ld);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(scratch, acc, 16, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int i = lane * 8 + e, r = i / 16, c = i - r * 16;
      const float v = scratch[i] + bias[nt * 16 + c];
      if (hidden) {
        next[r * next_ld + nt * 16 + c] = to_half<T>(fmaxf(v, 0.0f));
      } else {
        emit(r, nt * 16 + c, v);
      }
    }
    __syncwarp();
  }
}

template <typename T>
__global__ void __launch_bounds__(kMlpThreads) mlp_fwd_kernel(const float* __restrict__ in0,
                                                              const float* __restrict__ in1, int64_t n,
                                                              const __grid_constant__ MlpDims d,
                                                              const __grid_constant__ SmemLayout s,
                                                              float* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* w_s = reinterpret_cast<T*>(smem);
  float* b_s = reinterpret_cast<float*>(w_s + s.n_w);
  float* scratch_all = b_s + s.n_b;
  T* act = reinterpret_cast<T*>(scratch_all + kMlpWarps * 256);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* scratch = scratch_all + warp * 256;
  T* buf[2] = {act + warp * 2 * 16 * s.act_ld, act + (warp * 2 + 1) * 16 * s.act_ld};
  load_weights<T>(d, s, w_s, b_s);
  __syncthreads();
  const int64_t n_tiles = (n + kTileRows - 1) / kTileRows;
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int64_t row0 = tile * kTileRows + warp * 16;
    if (row0 >= n) continue;  // warp-uniform: no block-wide barrier inside the loop
    load_input_strip<T>(d, in0, in1, n, row0, buf[0], s.act_ld, lane);
    __syncwarp();
    int cur = 0;
    for (int l = 0; l < d.n_layers; ++l) {
      const bool hidden = l + 1 < d.n_layers;
      warp_layer<T>(buf[cur], s.act_ld, w_s + s.w_off[l], s.w_ld[l], b_s + s.b_off[l], d.k_pad[l], d.n_pad[l],
                    scratch, lane, hidden, buf[cur ^ 1], s.act_ld, [&](int r, int c, float v) {
                      if (c < d.out && row0 + r < n) out[(row0 + r) * d.out + c] = v;
                    });
      cur ^= 1;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kMlpThreads) mlp_bwd_kernel(const float* __restrict__ in0,
                                                              const float* __restrict__ in1, int64_t n,
                                                              const __grid_constant__ MlpDims d,
                                                              const __grid_constant__ SmemLayout s,
                                                              const float* __restrict__ g_out,
                                                              float* __restrict__ g_in0, float* __restrict__ g_w,
                                                              float* __restrict__ g_b) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* w_s = reinterpret_cast<T*>(smem);
  float* b_s = reinterpret_cast<float*>(w_s + s.n_w);
  float* scratch_all = b_s + s.n_b;
  T* acts = reinterpret_cast<T*>(scratch_all + kMlpWarps * 256);  // [n_layers][64][act_ld]: input of layer l
  T* grads = acts + static_cast<size_t>(d.n_layers) * kTileRows * s.act_ld;  // 2 x [64][act_ld]
  float* gw_s = reinterpret_cast<float*>(grads + 2 * kTileRows * s.act_ld);
  float* gb_s = gw_s + s.n_gw;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* scratch = scratch_all + warp * 256;
  const int L = d.n_layers, ld = s.act_ld;
  const int tile_elems = kTileRows * ld;

  load_weights<T>(d, s, w_s, b_s);
  for (int i = threadIdx.x; i < s.n_gw + s.n_gb; i += blockDim.x) gw_s[i] = 0.0f;
  __syncthreads();

  const int64_t n_tiles = (n + kTileRows - 1) / kTileRows;
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int64_t row0 = tile * kTileRows + warp * 16;
    const int strip = warp * 16 * ld;
    // 1. forward recompute: the input of every layer for this warp's 16 rows (zeros past n: their
    //    output gradient is 0, so they add nothing to the weight gradients)
    load_input_strip<T>(d, in0, in1, n, row0, acts + strip, ld, lane);
    __syncwarp();
    for (int l = 0; l + 1 < L; ++l) {
      warp_layer<T>(acts + l * tile_elems + strip, ld, w_s + s.w_off[l], s.w_ld[l], b_s + s.b_off[l], d.k_pad[l],
                    d.n_pad[l], scratch, lane, true, acts + (l + 1) * tile_elems + strip, ld,
                    [](int, int, float) {});
    }
    // 2. output gradient -> half strip [16, n_pad(L-1)]
    {
      T* g = grads + strip;
      const int n_pad = d.n_pad[L - 1];
      for (int i = lane; i < 16 * n_pad; i += 32) {
        const int r = i / n_pad, c = i - r * n_pad;
        const int64_t row = row0 + r;
        const float v = (row < n && c < d.out) ? g_out[row * d.out + c] : 0.0f;
        g[r * ld + c] = to_half<T>(v);
      }
    }
    int cur = 0;
    for (int l = L - 1; l >= 0; --l) {
      const T* x_l = acts + l * tile_elems;   // layer input, all 64 rows
      const T* gy = grads + cur * tile_elems;  // gradient at the layer's output, all 64 rows
      const int n_pad = d.n_pad[l], k_pad = d.k_pad[l];
      __syncthreads();  // every warp's strip of gy and x_l is written
      // 3a. weight gradient: gW[n_pad, k_pad] += gy^T x_l over the tile's 64 rows; warps split the
      //     16x16 output fragments
      const int frags_n = n_pad / 16, frags_k = k_pad / 16;
      float* gw = gw_s + s.gw_off[l];
      for (int f = warp; f < frags_n * frags_k; f += kMlpWarps) {
        const int nt = f / frags_k, kt = f - nt * frags_k;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::load_matrix_sync(acc, gw + nt * 16 * k_pad + kt * 16, k_pad, wmma::mem_row_major);
        for (int rt = 0; rt < kTileRows / 16; ++rt) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> a;  // gy^T
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;  // x_l
          wmma::load_matrix_sync(a, gy + rt * 16 * ld + nt * 16, ld);
          wmma::load_matrix_sync(b, x_l + rt * 16 * ld + kt * 16, ld);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(gw + nt * 16 * k_pad + kt * 16, acc, k_pad, wmma::mem_row_major);
      }
      // 3b. bias gradient: column sums of gy (one thread per column)
      for (int c = threadIdx.x; c < n_pad; c += blockDim.x) {
        float sum = 0.0f;
        for (int r = 0; r < kTileRows; ++r) sum += from_half(gy[r * ld + c]);
        gb_s[s.gb_off[l] + c] += sum;
      }
      // 3c. input gradient of this warp's strip: gx[16, k_pad] = gy[16, n_pad] W[n_pad, k_pad];
      //     through the ReLU of the previous layer (its output is x_l) or, at layer 0, to g_in0
      if (l > 0 || g_in0 != nullptr) {
        T* g_next = grads + (cur ^ 1) * tile_elems + strip;
        const T* gy_strip = gy + strip;
        const T* x_strip = x_l + strip;
        const T* w = w_s + s.w_off[l];
        const int w_ld = s.w_ld[l];
        const int k_tiles = l > 0 ? k_pad / 16 : (d.in0 + 15) / 16;
        for (int kt = 0; kt < k_tiles; ++kt) {
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
          wmma::fill_fragment(acc, 0.0f);
          for (int nt = 0; nt < n_pad / 16; ++nt) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
            wmma::load_matrix_sync(a, gy_strip + nt * 16, ld);
            wmma::load_matrix_sync(b, w + nt * 16 * w_ld + kt * 16, w_ld);
            wmma::mma_sync(acc, a, b, acc);
          }
          wmma::store_matrix_sync(scratch, acc, 16, wmma::mem_row_major);
          __syncwarp();
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const int i = lane * 8 + e, r = i / 16, c = kt * 16 + (i - r * 16);
            const float v = scratch[i];
            if (l > 0) {
              const bool active = from_half(x_strip[r * ld + c]) > 0.0f;
              g_next[r * ld + c] = to_half<T>(active ? v : 0.0f);
            } else if (c < d.in0 && row0 + r < n) {
              g_in0[(row0 + r) * d.in0 + c] = v;
            }
          }
          __syncwarp();
        }
      }
      cur ^= 1;
    }
    __syncthreads();  // the next tile overwrites the buffers every warp read in 3a/3b
  }
  // 4. this block's sums -> the global fp32 gradients (real rows and columns only)
  for (int l = 0; l < L; ++l) {
    const int rows = d.rows_out[l], cols = d.rows_in[l], k_pad = d.k_pad[l];
    float* gw_global = g_w;
    for (int j = 0; j < l; ++j) gw_global += d.rows_out[j] * d.rows_in[j];
    const float* gw = gw_s + s.gw_off[l];
    for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
      const int r = i / cols, c = i - r * cols;
      atomicAdd(gw_global + i, gw[r * k_pad + c]);
    }
    float* gb_global = g_b;
    for (int j = 0; j < l; ++j) gb_global += d.rows_out[j];
    for (int i = threadIdx.x; i < rows; i += blockDim.x) atomicAdd(gb_global + i, gb_s[s.gb_off[l] + i]);
  }
}

MlpDims make_dims(const torch::Tensor& in0, const c10::optional<torch::Tensor>& in1,
                  const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases) {
  const int L = static_cast<int>(weights.size());
  TORCH_CHECK(L >= 1 && L <= kMlpMaxLayers, "fused_mlp: 1..", kMlpMaxLayers, " layers supported, got ", L);
  TORCH_CHECK(static_cast<int>(biases.size()) == L, "fused_mlp: one bias per weight");
  MlpDims d{};
  d.n_layers = L;
  d.in0 = static_cast<int>(in0.size(1));
  d.in1 = in1.has_value() ? static_cast<int>(in1->size(1)) : 0;
  int width = d.in0 + d.in1;
  for (int l = 0; l < L; ++l) {
    const auto& w = weights[l];
    const auto& b = biases[l];
    NL_CHECK_INPUT(w);
    NL_CHECK_INPUT(b);
    NL_CHECK_DTYPE(w, torch::kFloat32);
    NL_CHECK_DTYPE(b, torch::kFloat32);
    TORCH_CHECK(w.dim() == 2 && w.size(1) == width, "fused_mlp: weight ", l, " must be [out, ", width, "], got ",
                w.sizes());
    TORCH_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "fused_mlp: bias ", l, " must be [", w.size(0), "]");
    d.rows_in[l] = width;
    d.rows_out[l] = static_cast<int>(w.size(0));
    d.k_pad[l] = round_up(width, 16);
    d.n_pad[l] = round_up(d.rows_out[l], 16);
    TORCH_CHECK(d.k_pad[l] <= 128 && d.n_pad[l] <= 128, "fused_mlp: layers up to 128 wide, layer ", l, " is ",
                d.rows_out[l], "x", width);
    d.w[l] = w.data_ptr<float>();
    d.b[l] = b.data_ptr<float>();
    width = d.rows_out[l];
  }
  d.out = width;
  return d;
}

void check_inputs(const torch::Tensor& in0, const c10::optional<torch::Tensor>& in1) {
  NL_CHECK_INPUT(in0);
  NL_CHECK_DTYPE(in0, torch::kFloat32);
  TORCH_CHECK(in0.dim() == 2, "fused_mlp: in0 must be [N, C0]");
  if (in1.has_value()) {
    NL_CHECK_INPUT(*in1);
    NL_CHECK_DTYPE(*in1, torch::kFloat32);
    TORCH_CHECK(in1->dim() == 2 && in1->size(0) == in0.size(0), "fused_mlp: in1 must be [N, C1] with in0's N");
  }
}

// Blocks for n rows: enough to fill the GPU at the kernel's occupancy, never more than tiles.
template <typename Kernel>
unsigned int mlp_grid(Kernel kernel, size_t smem, int64_t n) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0, per_sm = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kMlpThreads, smem));
  TORCH_CHECK(per_sm > 0, "fused_mlp: ", smem, " bytes of shared memory per block do not fit this GPU");
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(tiles, static_cast<int64_t>(sms) * per_sm)));
}

}  // namespace

torch::Tensor fused_mlp_fwd(torch::Tensor in0, c10::optional<torch::Tensor> in1, std::vector<torch::Tensor> weights,
                            std::vector<torch::Tensor> biases, bool bf16) {
  check_inputs(in0, in1);
  const c10::cuda::CUDAGuard guard(in0.device());
  const MlpDims d = make_dims(in0, in1, weights, biases);
  const int64_t n = in0.size(0);
  auto out = torch::empty({n, d.out}, in0.options());
  if (n == 0) return out;
  const SmemLayout s = make_layout(d);
  const float* p1 = in1.has_value() ? in1->data_ptr<float>() : nullptr;
  if (bf16) {
    auto k = mlp_fwd_kernel<__nv_bfloat16>;
    k<<<mlp_grid(k, s.bytes_fwd, n), kMlpThreads, s.bytes_fwd, stream()>>>(in0.data_ptr<float>(), p1, n, d, s,
                                                                          out.data_ptr<float>());
  } else {
    auto k = mlp_fwd_kernel<__half>;
    k<<<mlp_grid(k, s.bytes_fwd, n), kMlpThreads, s.bytes_fwd, stream()>>>(in0.data_ptr<float>(), p1, n, d, s,
                                                                          out.data_ptr<float>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// Returns [grad_in0 (empty when not wanted), flat fp32 weight gradients, flat fp32 bias gradients];
// the flat buffers hold each layer's [out, in] / [out] gradient in layer order.
std::vector<torch::Tensor> fused_mlp_bwd(torch::Tensor grad_out, torch::Tensor in0, c10::optional<torch::Tensor> in1,
                                         std::vector<torch::Tensor> weights, std::vector<torch::Tensor> biases,
                                         bool bf16, bool need_grad_in0) {
  check_inputs(in0, in1);
  NL_CHECK_INPUT(grad_out);
  NL_CHECK_DTYPE(grad_out, torch::kFloat32);
  const c10::cuda::CUDAGuard guard(in0.device());
  const MlpDims d = make_dims(in0, in1, weights, biases);
  const int64_t n = in0.size(0);
  TORCH_CHECK(grad_out.dim() == 2 && grad_out.size(0) == n && grad_out.size(1) == d.out,
              "fused_mlp backward: grad_out must be [N, ", d.out, "]");
  int64_t n_w = 0, n_b = 0;
  for (int l = 0; l < d.n_layers; ++l) {
    n_w += static_cast<int64_t>(d.rows_out[l]) * d.rows_in[l];
    n_b += d.rows_out[l];
  }
  auto flat = torch::zeros({n_w + n_b}, in0.options());  // one memset for every parameter gradient
  auto g_w = flat.narrow(0, 0, n_w);
  auto g_b = flat.narrow(0, n_w, n_b);
  auto g_in0 = need_grad_in0 ? torch::empty({n, d.in0}, in0.options()) : torch::empty({0}, in0.options());
  if (n == 0) {
    if (need_grad_in0) g_in0.zero_();
    return {g_in0, g_w, g_b};
  }
  const SmemLayout s = make_layout(d);
  const float* p1 = in1.has_value() ? in1->data_ptr<float>() : nullptr;
  float* gi = need_grad_in0 ? g_in0.data_ptr<float>() : nullptr;
  if (bf16) {
    auto k = mlp_bwd_kernel<__nv_bfloat16>;
    k<<<mlp_grid(k, s.bytes_bwd, n), kMlpThreads, s.bytes_bwd, stream()>>>(
        in0.data_ptr<float>(), p1, n, d, s, grad_out.data_ptr<float>(), gi, g_w.data_ptr<float>(), g_b.data_ptr<float>());
  } else {
    auto k = mlp_bwd_kernel<__half>;
    k<<<mlp_grid(k, s.bytes_bwd, n), kMlpThreads, s.bytes_bwd, stream()>>>(
        in0.data_ptr<float>(), p1, n, d, s, grad_out.data_ptr<float>(), gi, g_w.data_ptr<float>(), g_b.data_ptr<float>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {g_in0, g_w, g_b};
}

}  // namespace nl
