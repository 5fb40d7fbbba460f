// Shared helpers of the nerf_lightning CUDA extension.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

#define NL_CHECK_CUDA(x) TORCH_CHECK((x).is_cuda(), #x " must be a CUDA tensor")
#define NL_CHECK_CONTIG(x) TORCH_CHECK((x).is_contiguous(), #x " must be contiguous")
#define NL_CHECK_INPUT(x) \
  NL_CHECK_CUDA(x);       \
  NL_CHECK_CONTIG(x)

// Checks of several tensor arguments at once, each error naming the argument as written at the
// call (the arguments are tensor expressions without commas: `a`, `(*b)`).
//   NL_CHECK_INPUTS(a, b):        a and b are contiguous CUDA tensors (a first, then b)
//   NL_CHECK_DTYPES(t, a, b):     a and b have dtype t
//   NL_CHECK_TENSORS(t, a, b):    a is a contiguous CUDA tensor of dtype t, then b is
#define NL_CHECK_INPUTS(...) ::nl::detail::check_inputs(#__VA_ARGS__, {__VA_ARGS__})
#define NL_CHECK_DTYPES(t, ...) ::nl::detail::check_dtypes(#__VA_ARGS__, (t), #t, {__VA_ARGS__})
#define NL_CHECK_TENSORS(t, ...) ::nl::detail::check_tensors(#__VA_ARGS__, (t), #t, {__VA_ARGS__})

namespace nl {

namespace detail {

using Tensors = std::initializer_list<std::reference_wrapper<const torch::Tensor>>;

// Entry i of `names`, the text of a macro's comma-separated arguments; only built for an error.
inline std::string nth_name(const char* names, size_t i) {
  const std::string all(names);
  size_t start = 0;
  for (; i > 0; --i) start = all.find(',', start) + 1;
  const size_t end = std::min(all.find(',', start), all.size());
  const size_t first = all.find_first_not_of(' ', start);
  const size_t last = all.find_last_not_of(' ', end - 1);
  return first < end ? all.substr(first, last + 1 - first) : std::string();
}

inline void check_input(const torch::Tensor& x, const char* names, size_t i) {
  TORCH_CHECK(x.is_cuda(), nth_name(names, i), " must be a CUDA tensor");
  TORCH_CHECK(x.is_contiguous(), nth_name(names, i), " must be contiguous");
}

inline void check_dtype(const torch::Tensor& x, c10::ScalarType dtype, const char* dtype_name, const char* names,
                        size_t i) {
  TORCH_CHECK(x.scalar_type() == dtype, nth_name(names, i), " must have dtype ", dtype_name);
}

inline void check_inputs(const char* names, Tensors xs) {
  size_t i = 0;
  for (const torch::Tensor& x : xs) check_input(x, names, i++);
}

inline void check_dtypes(const char* names, c10::ScalarType dtype, const char* dtype_name, Tensors xs) {
  size_t i = 0;
  for (const torch::Tensor& x : xs) check_dtype(x, dtype, dtype_name, names, i++);
}

inline void check_tensors(const char* names, c10::ScalarType dtype, const char* dtype_name, Tensors xs) {
  size_t i = 0;
  for (const torch::Tensor& x : xs) {
    check_input(x, names, i);
    check_dtype(x, dtype, dtype_name, names, i++);
  }
}

}  // namespace detail

inline unsigned int n_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(b, 0x7fffffffLL)));
}

inline cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream(); }

}  // namespace nl
