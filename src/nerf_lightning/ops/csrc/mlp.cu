// Fully fused half-precision MLP (forward and backward) on tensor cores, for the field's two small
// networks (models/field.py): one or two ReLU hidden layers 64 wide, a linear output layer, fp32
// master weights and biases. Contract and rounding: ops/reference.py::fused_mlp.
//
// Why fused: at 2^18 samples per step the layers are 64 wide, so cuBLAS runs each layer as a
// memory-bound GEMM plus bias/activation/split-K kernels (about 20 kernels per bf16 step). Here one
// kernel runs a whole network, as tiny-cuda-nn's FullyFusedMLP does (its design
// is the reference point; no code is taken from it).
//
// Layout: a block of 4 warps takes tiles of 64 rows (16 per warp) in a grid-stride loop, with the
// weights converted from fp32 to the half type once per block. Each warp keeps its 16 rows in
// registers from layer to layer: the fp32 accumulator of an m16n8k16 MMA holds, per lane, exactly
// the elements that the A operand of the next layer's MMA needs, so an activation is rounded to the
// half type and passed on without touching memory. Rounding: the input and every hidden activation
// are rounded to the half type, products accumulate in fp32, biases are added in fp32 and the output
// stays fp32. The backward pass recomputes the activations from the input, propagates half-type
// gradients through the layers in registers, and accumulates the weight and bias gradients per
// block in fp32 shared memory (64 rows at a time, WMMA on the staged activations and gradients),
// added to the global fp32 gradients once per block.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <c10/cuda/CUDAFunctions.h>

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"

namespace nl {

namespace {

using namespace nvcuda;

constexpr int kMlpMaxLayers = 3;  // one or two hidden layers and the output layer
constexpr int kHidden = 64;
constexpr int kMaxWidth = 64;     // input and output widths up to 64
constexpr int kMlpWarps = 4;
constexpr int kMlpThreads = kMlpWarps * 32;
constexpr int kTileRows = 16 * kMlpWarps;
constexpr int kSkew = 8;  // halves of padding per shared row: a fragment's rows fall on different banks

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

// Offsets (in elements of their own type) of every shared-memory region.
struct SmemLayout {
  int w_off[kMlpMaxLayers];   // half W [n_pad, k_pad + skew]
  int w_ld[kMlpMaxLayers];
  int wt_off[kMlpMaxLayers];  // half W^T [k_pad, n_pad + skew] (backward only)
  int wt_ld[kMlpMaxLayers];
  int n_w, n_wt;
  int b_off[kMlpMaxLayers];   // fp32 biases [n_pad]
  int n_b;
  int act_ld;                 // activation / gradient staging rows (halves)
  int gw_off[kMlpMaxLayers];  // fp32 weight-gradient accumulators [n_pad, k_pad]
  int gb_off[kMlpMaxLayers];  // fp32 bias-gradient accumulators [n_pad]
  int n_gw, n_gb;
  size_t bytes_fwd, bytes_bwd;
};

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

inline SmemLayout make_layout(const MlpDims& d) {
  SmemLayout s{};
  int nw = 0, nwt = 0, nb = 0, ngw = 0;
  for (int l = 0; l < d.n_layers; ++l) {
    s.w_ld[l] = d.k_pad[l] + kSkew;
    s.w_off[l] = nw;
    nw += d.n_pad[l] * s.w_ld[l];
    s.wt_ld[l] = d.n_pad[l] + kSkew;
    s.wt_off[l] = nwt;
    nwt += d.k_pad[l] * s.wt_ld[l];
    s.b_off[l] = nb;
    s.gb_off[l] = nb;
    nb += d.n_pad[l];
    s.gw_off[l] = ngw;
    ngw += d.n_pad[l] * d.k_pad[l];
  }
  s.n_w = round_up(nw, 16);
  s.n_wt = round_up(nwt, 16);
  s.n_b = round_up(nb, 8);
  s.n_gw = ngw;
  s.n_gb = round_up(nb, 8);
  s.act_ld = kMaxWidth + kSkew;
  const size_t half = 2;
  s.bytes_fwd = s.n_w * half + s.n_b * 4;
  const size_t acts = static_cast<size_t>(d.n_layers) * kTileRows * s.act_ld * half;
  const size_t grads = 2 * static_cast<size_t>(kTileRows) * s.act_ld * half;
  s.bytes_bwd = (s.n_w + s.n_wt) * half + s.n_b * 4 + acts + grads + (static_cast<size_t>(s.n_gw) + s.n_gb) * 4;
  return s;
}

// ---------------------------------------------------------------------------- half types, MMA
// c += a * b on one m16n8k16 tile with an fp32 accumulator; TYPE: the PTX name of the half type.
#define NL_MMA_M16N8K16(TYPE, c, a, b0, b1)                                         \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE             \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"       \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

// The half type T (__half or __nv_bfloat16): conversions, pairs packed in 32 bits, and its MMA.
template <typename T>
struct HalfOps {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16");
  static constexpr bool kFp16 = std::is_same_v<T, __half>;
  using Pair = std::conditional_t<kFp16, __half2, __nv_bfloat162>;

  static __device__ __forceinline__ Pair pair_rn(float lo, float hi) {
    if constexpr (kFp16) {
      return __floats2half2_rn(lo, hi);
    } else {
      return __floats2bfloat162_rn(lo, hi);
    }
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const Pair h = pair_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t v) {
    if constexpr (kFp16) {
      return __half22float2(*reinterpret_cast<const __half2*>(&v));
    } else {
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
    }
  }
  static __device__ __forceinline__ T from_float(float v) {
    if constexpr (kFp16) {
      return __float2half_rn(v);
    } else {
      return __float2bfloat16_rn(v);
    }
  }
  static __device__ __forceinline__ float to_float(T v) {
    if constexpr (kFp16) {
      return __half2float(v);
    } else {
      return __bfloat162float(v);
    }
  }
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (kFp16) {
      NL_MMA_M16N8K16("f16", c, a, b0, b1);
    } else {
      NL_MMA_M16N8K16("bf16", c, a, b0, b1);
    }
#else
    __trap();  // never launched below sm_80 (ops/cuda.py checks the device)
#endif
  }
};

#undef NL_MMA_M16N8K16

// Fragment conventions of m16n8k16 (PTX ISA), with g = lane / 4 and q = lane % 4:
//   A (16x16, row-major) a[0] = (g, 2q..2q+1), a[1] = (g+8, 2q..), a[2] = (g, 8+2q..), a[3] = (g+8, 8+2q..)
//   B (16x8) b0 = (k = 2q..2q+1, n = g), b1 = (k = 8+2q.., n = g)
//   C (16x8, fp32) c[0..1] = (g, 2q..2q+1), c[2..3] = (g+8, 2q..2q+1)
// so the C tiles 2k and 2k+1 of one layer are, packed in pairs, the A tile k of the next one.
using Frag = uint32_t[4];

// acc[j] (16 x 8 tile j) += sum over k-tiles of a[kt] * B(kt, j), B(k, n) = m[n * ld + k] (half).
template <typename T, int KT, int NT>
__device__ __forceinline__ void warp_gemm(float (&acc)[NT][4], const Frag (&a)[KT], int k_tiles, int n_tiles,
                                          const T* m, int ld, int g, int q) {
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
    if (kt >= k_tiles) break;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (j >= n_tiles) break;
      const T* col = m + (8 * j + g) * ld + 16 * kt + 2 * q;
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(col);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(col + 8);
      HalfOps<T>::mma(acc[j], a[kt], b0, b1);
    }
  }
}

// Pack C tiles (fp32) into A tiles (half) of the next GEMM, optionally through a ReLU.
template <typename T, int NT>
__device__ __forceinline__ void pack_a(const float (&acc)[NT][4], Frag (&a)[NT / 2], bool relu) {
#pragma unroll
  for (int k = 0; k < NT / 2; ++k) {
    float v[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = acc[2 * k][e];
      v[4 + e] = acc[2 * k + 1][e];
    }
    if (relu) {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = fmaxf(v[e], 0.0f);
    }
    a[k][0] = HalfOps<T>::pack(v[0], v[1]);
    a[k][1] = HalfOps<T>::pack(v[2], v[3]);
    a[k][2] = HalfOps<T>::pack(v[4], v[5]);
    a[k][3] = HalfOps<T>::pack(v[6], v[7]);
  }
}

// acc tiles := bias (columns 8j + 2q, +1 of rows g and g + 8).
template <int NT>
__device__ __forceinline__ void bias_init(float (&acc)[NT][4], const float* bias, int n_tiles, int q) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const float b0 = j < n_tiles ? bias[8 * j + 2 * q] : 0.0f;
    const float b1 = j < n_tiles ? bias[8 * j + 2 * q + 1] : 0.0f;
    acc[j][0] = b0;
    acc[j][1] = b1;
    acc[j][2] = b0;
    acc[j][3] = b1;
  }
}

// Input rows [row0, row0 + 16) of cat(in0, in1), as A tiles of the first layer (zeros past n and
// past the real width).
template <typename T>
__device__ __forceinline__ void load_input(const MlpDims& d, const float* __restrict__ in0,
                                           const float* __restrict__ in1, int64_t n, int64_t row0, int g, int q,
                                           Frag (&a)[kMaxWidth / 16]) {
  const int width = d.in0 + d.in1;
  auto at = [&](int64_t row, int c) -> float {
    if (row >= n || c >= width) return 0.0f;
    return c < d.in0 ? in0[row * d.in0 + c] : in1[row * d.in1 + (c - d.in0)];
  };
#pragma unroll
  for (int kt = 0; kt < kMaxWidth / 16; ++kt) {
    if (16 * kt >= d.k_pad[0]) {
      a[kt][0] = a[kt][1] = a[kt][2] = a[kt][3] = 0u;
      continue;
    }
    const int c = 16 * kt + 2 * q;
    const int64_t r0 = row0 + g, r1 = row0 + g + 8;
    a[kt][0] = HalfOps<T>::pack(at(r0, c), at(r0, c + 1));
    a[kt][1] = HalfOps<T>::pack(at(r1, c), at(r1, c + 1));
    a[kt][2] = HalfOps<T>::pack(at(r0, c + 8), at(r0, c + 9));
    a[kt][3] = HalfOps<T>::pack(at(r1, c + 8), at(r1, c + 9));
  }
}

// A tiles -> rows [16, 16 * k_tiles) of a staging buffer (half, leading dimension ld).
template <typename T, int KT>
__device__ __forceinline__ void stage_a(const Frag (&a)[KT], int k_tiles, T* strip, int ld, int g, int q) {
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
    if (kt >= k_tiles) break;
    const int c = 16 * kt + 2 * q;
    *reinterpret_cast<uint32_t*>(strip + g * ld + c) = a[kt][0];
    *reinterpret_cast<uint32_t*>(strip + (g + 8) * ld + c) = a[kt][1];
    *reinterpret_cast<uint32_t*>(strip + g * ld + c + 8) = a[kt][2];
    *reinterpret_cast<uint32_t*>(strip + (g + 8) * ld + c + 8) = a[kt][3];
  }
}

// Weights (fp32, global) -> half W [n_pad, k_pad] (and W^T [k_pad, n_pad]) in shared memory,
// zero-padded; biases -> fp32 shared, zero-padded.
template <typename T>
__device__ void load_weights(const MlpDims& d, const SmemLayout& s, T* w_s, T* wt_s, float* b_s) {
  for (int l = 0; l < d.n_layers; ++l) {
    const int n_pad = d.n_pad[l], k_pad = d.k_pad[l];
    const int rows = d.rows_out[l], cols = d.rows_in[l];
    const float* w = d.w[l];
    for (int i = threadIdx.x; i < n_pad * k_pad; i += blockDim.x) {
      const int r = i / k_pad, c = i - r * k_pad;
      const T v = HalfOps<T>::from_float((r < rows && c < cols) ? w[r * cols + c] : 0.0f);
      w_s[s.w_off[l] + r * s.w_ld[l] + c] = v;
      if (wt_s != nullptr) wt_s[s.wt_off[l] + c * s.wt_ld[l] + r] = v;
    }
    for (int i = threadIdx.x; i < n_pad; i += blockDim.x) b_s[s.b_off[l] + i] = i < rows ? d.b[l][i] : 0.0f;
  }
}

// Forward of one warp's 16 rows through the hidden layers: x[l] = A tiles of layer l's input.
template <typename T, int NH>
__device__ __forceinline__ void hidden_forward(const MlpDims& d, const SmemLayout& s, const T* w_s,
                                               const float* b_s, Frag (&x)[NH + 1][kMaxWidth / 16], int g, int q) {
#pragma unroll
  for (int l = 0; l < NH; ++l) {
    float acc[kHidden / 8][4];
    bias_init(acc, b_s + s.b_off[l], kHidden / 8, q);
    warp_gemm<T>(acc, x[l], d.k_pad[l] / 16, kHidden / 8, w_s + s.w_off[l], s.w_ld[l], g, q);
    pack_a<T>(acc, x[l + 1], true);
  }
}

template <typename T, int NH>
__global__ void __launch_bounds__(kMlpThreads) mlp_fwd_kernel(const float* __restrict__ in0,
                                                              const float* __restrict__ in1, int64_t n,
                                                              const __grid_constant__ MlpDims d,
                                                              const __grid_constant__ SmemLayout s,
                                                              float* __restrict__ out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800  // m16n8k16 MMA and bf16 WMMA: Ampere and later
  extern __shared__ __align__(128) unsigned char smem[];
  T* w_s = reinterpret_cast<T*>(smem);
  float* b_s = reinterpret_cast<float*>(w_s + s.n_w);
  load_weights<T>(d, s, w_s, nullptr, b_s);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int out_tiles = (d.out + 7) / 8;
  const int64_t n_tiles = (n + kTileRows - 1) / kTileRows;
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int64_t row0 = tile * kTileRows + warp * 16;
    if (row0 >= n) continue;  // warp-uniform: no block-wide barrier inside the loop
    Frag x[NH + 1][kMaxWidth / 16];
    load_input<T>(d, in0, in1, n, row0, g, q, x[0]);
    hidden_forward<T, NH>(d, s, w_s, b_s, x, g, q);
    float acc[kMaxWidth / 8][4];
    bias_init(acc, b_s + s.b_off[NH], out_tiles, q);
    warp_gemm<T>(acc, x[NH], kHidden / 16, out_tiles, w_s + s.w_off[NH], s.w_ld[NH], g, q);
#pragma unroll
    for (int j = 0; j < kMaxWidth / 8; ++j) {
      if (j >= out_tiles) break;
      const int c = 8 * j + 2 * q;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = row0 + g + 8 * h;
        if (row >= n) continue;
        if (c < d.out) out[row * d.out + c] = acc[j][2 * h];
        if (c + 1 < d.out) out[row * d.out + c + 1] = acc[j][2 * h + 1];
      }
    }
  }
#endif
}

template <typename T, int NH>
__global__ void __launch_bounds__(kMlpThreads) mlp_bwd_kernel(const float* __restrict__ in0,
                                                              const float* __restrict__ in1, int64_t n,
                                                              const __grid_constant__ MlpDims d,
                                                              const __grid_constant__ SmemLayout s,
                                                              const float* __restrict__ g_out,
                                                              float* __restrict__ g_in0, float* __restrict__ g_in1,
                                                              float* __restrict__ g_w, float* __restrict__ g_b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800  // m16n8k16 MMA and bf16 WMMA: Ampere and later
  constexpr int L = NH + 1;
  constexpr int KT = kMaxWidth / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  T* w_s = reinterpret_cast<T*>(smem);
  T* wt_s = w_s + s.n_w;
  float* b_s = reinterpret_cast<float*>(wt_s + s.n_wt);
  T* acts = reinterpret_cast<T*>(b_s + s.n_b);                  // [L][64][act_ld]: input of layer l
  T* grads = acts + static_cast<size_t>(L) * kTileRows * s.act_ld;  // 2 x [64][act_ld]
  float* gw_s = reinterpret_cast<float*>(grads + 2 * kTileRows * s.act_ld);
  float* gb_s = gw_s + s.n_gw;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int ld = s.act_ld;
  const int tile_elems = kTileRows * ld;
  const int out_tiles = (d.out + 7) / 8;

  load_weights<T>(d, s, w_s, wt_s, b_s);
  for (int i = threadIdx.x; i < s.n_gw + s.n_gb; i += blockDim.x) gw_s[i] = 0.0f;
  __syncthreads();

  const int64_t n_tiles = (n + kTileRows - 1) / kTileRows;
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int64_t row0 = tile * kTileRows + warp * 16;
    const int strip = warp * 16 * ld;
    // 1. forward recompute in registers (rows past n are zeros: their output gradient is 0, so
    //    they add nothing), every layer's input staged for the weight gradients
    Frag x[L][KT];
    load_input<T>(d, in0, in1, n, row0, g, q, x[0]);
    hidden_forward<T, NH>(d, s, w_s, b_s, x, g, q);
#pragma unroll
    for (int l = 0; l < L; ++l) stage_a<T>(x[l], d.k_pad[l] / 16, acts + l * tile_elems + strip, ld, g, q);
    // 2. output gradient -> A tiles (k = output columns, zero-padded to 16) and staged
    Frag dy[KT];
    {
      float acc[kMaxWidth / 8][4];
#pragma unroll
      for (int j = 0; j < kMaxWidth / 8; ++j) {
        const int c = 8 * j + 2 * q;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = row0 + g + 8 * h;
          const bool ok = row < n;
          acc[j][2 * h] = ok && c < d.out ? g_out[row * d.out + c] : 0.0f;
          acc[j][2 * h + 1] = ok && c + 1 < d.out ? g_out[row * d.out + c + 1] : 0.0f;
        }
      }
      pack_a<T>(acc, dy, false);
      stage_a<T>(dy, d.n_pad[L - 1] / 16, grads + strip, ld, g, q);
      // the output layer's bias gradient from the fp32 output gradient (column sums over the
      // warp's 16 rows: the lanes of one q hold the same two columns)
#pragma unroll
      for (int j = 0; j < kMaxWidth / 8; ++j) {
        if (j >= out_tiles) break;
        float s0 = acc[j][0] + acc[j][2], s1 = acc[j][1] + acc[j][3];
#pragma unroll
        for (int m = 4; m < 32; m *= 2) {
          s0 += __shfl_xor_sync(0xffffffffu, s0, m);
          s1 += __shfl_xor_sync(0xffffffffu, s1, m);
        }
        if (g == 0) {
          atomicAdd(gb_s + s.gb_off[L - 1] + 8 * j + 2 * q, s0);
          atomicAdd(gb_s + s.gb_off[L - 1] + 8 * j + 2 * q + 1, s1);
        }
      }
    }
    int cur = 0;
    // one layer, from the last to the first; l is a compile-time constant so that x[l] stays in registers
    auto layer = [&](auto l_const) {
      constexpr int l = decltype(l_const)::value;
      const T* x_l = acts + l * tile_elems;    // layer input, all 64 rows
      const T* gy = grads + cur * tile_elems;  // gradient at the layer's output, all 64 rows
      const int n_pad = d.n_pad[l], k_pad = d.k_pad[l];
      __syncthreads();  // every warp's strip of gy and x_l is staged
      // 3a. weight gradient gW[n_pad, k_pad] += gy^T x_l over the tile's 64 rows; the warps split
      //     the 16x16 output tiles
      const int frags_n = n_pad / 16, frags_k = k_pad / 16;
      float* gw = gw_s + s.gw_off[l];
      for (int f = warp; f < frags_n * frags_k; f += kMlpWarps) {
        const int nt = f / frags_k, kt = f - nt * frags_k;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::load_matrix_sync(acc, gw + nt * 16 * k_pad + kt * 16, k_pad, wmma::mem_row_major);
#pragma unroll
        for (int rt = 0; rt < kTileRows / 16; ++rt) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> a;  // gy^T
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;  // x_l
          wmma::load_matrix_sync(a, gy + rt * 16 * ld + nt * 16, ld);
          wmma::load_matrix_sync(b, x_l + rt * 16 * ld + kt * 16, ld);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(gw + nt * 16 * k_pad + kt * 16, acc, k_pad, wmma::mem_row_major);
      }
      // 3b. bias gradient of a hidden layer: column sums of gy (one thread per column)
      for (int c = threadIdx.x; l + 1 < L && c < n_pad; c += blockDim.x) {
        float sum = 0.0f;
        for (int r = 0; r < kTileRows; ++r) sum += HalfOps<T>::to_float(gy[r * ld + c]);
        gb_s[s.gb_off[l] + c] += sum;
      }
      // 3c. input gradient of this warp's rows in registers: gx = gy W (B from W^T), through the
      //     ReLU whose output is x_l (l > 0), or out to g_in0 / g_in1 (l = 0; the columns of in1 only
      //     when its gradient is asked for)
      if (l > 0 || g_in0 != nullptr || g_in1 != nullptr) {
        const int n_out = l > 0 ? kHidden / 8 : (d.in0 + (g_in1 != nullptr ? d.in1 : 0) + 7) / 8;
        float acc[kMaxWidth / 8][4];
#pragma unroll
        for (int j = 0; j < kMaxWidth / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        warp_gemm<T>(acc, dy, n_pad / 16, n_out, wt_s + s.wt_off[l], s.wt_ld[l], g, q);
        if constexpr (l > 0) {
#pragma unroll
          for (int k = 0; k < KT; ++k) {
            // C tiles 2k, 2k+1 sit where A tile k of x_l holds the same elements
            const float2 x0 = HalfOps<T>::unpack(x[l][k][0]), x1 = HalfOps<T>::unpack(x[l][k][1]);
            const float2 x2 = HalfOps<T>::unpack(x[l][k][2]), x3 = HalfOps<T>::unpack(x[l][k][3]);
            acc[2 * k][0] = x0.x > 0.0f ? acc[2 * k][0] : 0.0f;
            acc[2 * k][1] = x0.y > 0.0f ? acc[2 * k][1] : 0.0f;
            acc[2 * k][2] = x1.x > 0.0f ? acc[2 * k][2] : 0.0f;
            acc[2 * k][3] = x1.y > 0.0f ? acc[2 * k][3] : 0.0f;
            acc[2 * k + 1][0] = x2.x > 0.0f ? acc[2 * k + 1][0] : 0.0f;
            acc[2 * k + 1][1] = x2.y > 0.0f ? acc[2 * k + 1][1] : 0.0f;
            acc[2 * k + 1][2] = x3.x > 0.0f ? acc[2 * k + 1][2] : 0.0f;
            acc[2 * k + 1][3] = x3.y > 0.0f ? acc[2 * k + 1][3] : 0.0f;
          }
          pack_a<T>(acc, dy, false);
          stage_a<T>(dy, kHidden / 16, grads + (cur ^ 1) * tile_elems + strip, ld, g, q);
        } else {
#pragma unroll
          for (int j = 0; j < kMaxWidth / 8; ++j) {
            if (j >= n_out) break;
            const int c = 8 * j + 2 * q;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int64_t row = row0 + g + 8 * h;
              if (row >= n) continue;
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int col = c + e;
                if (col < d.in0) {
                  if (g_in0 != nullptr) g_in0[row * d.in0 + col] = acc[j][2 * h + e];
                } else if (g_in1 != nullptr && col < d.in0 + d.in1) {
                  g_in1[row * d.in1 + col - d.in0] = acc[j][2 * h + e];
                }
              }
            }
          }
        }
      }
      cur ^= 1;
    };
    if constexpr (NH == 2) layer(std::integral_constant<int, 2>{});
    layer(std::integral_constant<int, 1>{});
    layer(std::integral_constant<int, 0>{});
    __syncthreads();  // the next tile overwrites the buffers every warp read in 3a/3b
  }
  // 4. this block's sums -> the global fp32 gradients (real rows and columns only)
  float* gw_global = g_w;
  float* gb_global = g_b;
  for (int l = 0; l < L; ++l) {
    const int rows = d.rows_out[l], cols = d.rows_in[l], k_pad = d.k_pad[l];
    const float* gw = gw_s + s.gw_off[l];
    for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
      const int r = i / cols, c = i - r * cols;
      atomicAdd(gw_global + i, gw[r * k_pad + c]);
    }
    for (int i = threadIdx.x; i < rows; i += blockDim.x) atomicAdd(gb_global + i, gb_s[s.gb_off[l] + i]);
    gw_global += rows * cols;
    gb_global += rows;
  }
#endif
}

MlpDims make_dims(const torch::Tensor& in0, const c10::optional<torch::Tensor>& in1,
                  const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases) {
  const int L = static_cast<int>(weights.size());
  TORCH_CHECK(L >= 2 && L <= kMlpMaxLayers, "fused_mlp: 1 or 2 hidden layers supported, got ", L - 1);
  TORCH_CHECK(static_cast<int>(biases.size()) == L, "fused_mlp: one bias per weight");
  MlpDims d{};
  d.n_layers = L;
  d.in0 = static_cast<int>(in0.size(1));
  d.in1 = in1.has_value() ? static_cast<int>(in1->size(1)) : 0;
  int width = d.in0 + d.in1;
  for (int l = 0; l < L; ++l) {
    const auto& w = weights[l];
    const auto& b = biases[l];
    NL_CHECK_INPUTS(w, b);
    NL_CHECK_DTYPES(torch::kFloat32, w, b);
    TORCH_CHECK(w.dim() == 2 && w.size(1) == width, "fused_mlp: weight ", l, " must be [out, ", width, "], got ",
                w.sizes());
    TORCH_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "fused_mlp: bias ", l, " must be [", w.size(0), "]");
    d.rows_in[l] = width;
    d.rows_out[l] = static_cast<int>(w.size(0));
    d.k_pad[l] = round_up(width, 16);
    d.n_pad[l] = round_up(d.rows_out[l], 16);
    TORCH_CHECK(d.k_pad[l] <= kMaxWidth && d.n_pad[l] <= kMaxWidth, "fused_mlp: layers up to ", kMaxWidth,
                " wide, layer ", l, " is ", d.rows_out[l], "x", width);
    TORCH_CHECK(l + 1 == L || d.rows_out[l] == kHidden, "fused_mlp: hidden layers must be ", kHidden,
                " wide, layer ", l, " has ", d.rows_out[l]);
    d.w[l] = w.data_ptr<float>();
    d.b[l] = b.data_ptr<float>();
    width = d.rows_out[l];
  }
  d.out = width;
  return d;
}

void check_inputs(const torch::Tensor& in0, const c10::optional<torch::Tensor>& in1) {
  NL_CHECK_TENSORS(torch::kFloat32, in0);
  TORCH_CHECK(in0.dim() == 2, "fused_mlp: in0 must be [N, C0]");
  if (in1.has_value()) {
    NL_CHECK_TENSORS(torch::kFloat32, *in1);
    TORCH_CHECK(in1->dim() == 2 && in1->size(0) == in0.size(0), "fused_mlp: in1 must be [N, C1] with in0's N");
  }
}

// Blocks for n rows: enough to fill the GPU at the kernel's occupancy, never more than tiles. The
// attribute and occupancy queries run once per (kernel, shared memory, device): later calls, such as
// those inside a CUDA-graph capture, make no CUDA API call here.
template <typename Kernel>
unsigned int mlp_grid(Kernel kernel, size_t smem, int64_t n) {
  static std::mutex mutex;
  // (kernel, shared memory, device) -> blocks that fit on the GPU at once
  static std::map<std::tuple<const void*, size_t, int>, int64_t> resident;
  const int device = c10::cuda::current_device();
  int64_t blocks = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), smem, device);
    auto it = resident.find(key);
    if (it == resident.end()) {
      int sms = 0, per_sm = 0;
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      C10_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kMlpThreads, smem));
      TORCH_CHECK(per_sm > 0, "fused_mlp: ", smem, " bytes of shared memory per block do not fit this GPU");
      it = resident.emplace(key, static_cast<int64_t>(sms) * per_sm).first;
    }
    blocks = it->second;
  }
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(tiles, blocks)));
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
  auto launch = [&](auto kernel) {
    kernel<<<mlp_grid(kernel, s.bytes_fwd, n), kMlpThreads, s.bytes_fwd, stream()>>>(in0.data_ptr<float>(), p1, n,
                                                                                     d, s, out.data_ptr<float>());
  };
  if (bf16) {
    d.n_layers == 2 ? launch(mlp_fwd_kernel<__nv_bfloat16, 1>) : launch(mlp_fwd_kernel<__nv_bfloat16, 2>);
  } else {
    d.n_layers == 2 ? launch(mlp_fwd_kernel<__half, 1>) : launch(mlp_fwd_kernel<__half, 2>);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// Returns [grad_in0 (empty when not wanted), flat fp32 weight gradients, flat fp32 bias gradients],
// and grad_in1 as a fourth entry when need_grad_in1 (learned camera poses: the view directions'
// encoding is in1 of the colour network); the flat buffers hold each layer's [out, in] / [out]
// gradient in layer order.
std::vector<torch::Tensor> fused_mlp_bwd(torch::Tensor grad_out, torch::Tensor in0, c10::optional<torch::Tensor> in1,
                                         std::vector<torch::Tensor> weights, std::vector<torch::Tensor> biases,
                                         bool bf16, bool need_grad_in0, bool need_grad_in1) {
  check_inputs(in0, in1);
  NL_CHECK_TENSORS(torch::kFloat32, grad_out);
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
  TORCH_CHECK(!need_grad_in1 || in1.has_value(), "fused_mlp backward: need_grad_in1 without in1");
  auto g_in0 = need_grad_in0 ? torch::empty({n, d.in0}, in0.options()) : torch::empty({0}, in0.options());
  auto g_in1 = need_grad_in1 ? torch::empty({n, d.in1}, in0.options()) : torch::empty({0}, in0.options());
  auto result = [&]() -> std::vector<torch::Tensor> {
    if (need_grad_in1) return {g_in0, g_w, g_b, g_in1};
    return {g_in0, g_w, g_b};
  };
  if (n == 0) {
    if (need_grad_in0) g_in0.zero_();
    if (need_grad_in1) g_in1.zero_();
    return result();
  }
  const SmemLayout s = make_layout(d);
  const float* p1 = in1.has_value() ? in1->data_ptr<float>() : nullptr;
  float* gi = need_grad_in0 ? g_in0.data_ptr<float>() : nullptr;
  float* gi1 = need_grad_in1 ? g_in1.data_ptr<float>() : nullptr;
  auto launch = [&](auto kernel) {
    kernel<<<mlp_grid(kernel, s.bytes_bwd, n), kMlpThreads, s.bytes_bwd, stream()>>>(
        in0.data_ptr<float>(), p1, n, d, s, grad_out.data_ptr<float>(), gi, gi1, g_w.data_ptr<float>(),
        g_b.data_ptr<float>());
  };
  if (bf16) {
    d.n_layers == 2 ? launch(mlp_bwd_kernel<__nv_bfloat16, 1>) : launch(mlp_bwd_kernel<__nv_bfloat16, 2>);
  } else {
    d.n_layers == 2 ? launch(mlp_bwd_kernel<__half, 1>) : launch(mlp_bwd_kernel<__half, 2>);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return result();
}

}  // namespace nl
