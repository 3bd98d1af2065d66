// Helpers of the CUDA impls (csrc/cuda/*_cuda.cpp, one per op family, as csrc/cpu/*.cpp;
// schemas in ops.cpp). Each glue file validates the tensors with the CPU impls' messages
// (the shape and dtype checks themselves are shared, in checks.h), allocates outputs and
// scratch with ATen (the caching allocator, on the current stream), calls the torch-free
// launchers of csrc/cuda/*.cu on the current stream, and checks the launch error. Built
// only when the loader finds a GPU and nvcc (attnmetrics/_ops.py). Only the glue includes
// this header: unlike the other headers here, it needs torch's.
//
// Checks that need the data (and so a device -> host read, which waits for the
// stream) cost at most one read per call, made before any kernel that trusts them;
// each glue file's comment says what its ops check and read back. Only on failure are
// a few more values copied back, to name the offending entry as the CPU impls do.
// Unlike the CPU impls, every shape/dtype check runs before the data checks, so an
// input with several faults may be reported by another one.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "checks.h"

namespace attnmetrics {
namespace glue {

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// A launcher's cudaError_t as a c10::Error naming the op (kernel launch failures
// and, for kendall_tau's first call on a device, the exact table's upload).
inline void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " (CUDA): ", cudaGetErrorString(err));
}

// t on `device` (the anchor argument's) and contiguous.
inline void check_cuda_contiguous(const at::Tensor& t, const char* name, const c10::Device& device,
                                  const char* anchor = "attention") {
  TORCH_CHECK(t.device() == device, name, " must be a CUDA tensor on ", device, " (", anchor,
              "'s device), got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// Error path only: the first length outside [low, width], as the CPU loop finds it.
[[noreturn]] inline void fail_on_first_bad_length(const at::Tensor& lengths, int64_t width,
                                                  const char* prefix, int64_t low = 0,
                                                  const char* low_name = "0") {
  const at::Tensor host = lengths.cpu();
  attnmetrics::check_length_range(host.const_data_ptr<int64_t>(), host.size(0), low, low_name,
                                  width, prefix);
  TORCH_CHECK(false, prefix, "lengths changed while being checked");  // not reached
}

// Host values on `device` without waiting for it: staged in pinned memory and copied on the
// current stream (the caching host allocator keeps the pinned block until the copy is done).
// For the ops that plan from lengths given on the host (no read back).
inline at::Tensor upload(const std::vector<int64_t>& values, const c10::Device& device) {
  at::Tensor host = at::empty({static_cast<int64_t>(values.size())},
                              at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::copy(values.begin(), values.end(), host.mutable_data_ptr<int64_t>());
  return host.to(device, at::kLong, /*non_blocking=*/true);
}

// lengths [B >= 1] on the device all in [0, width], in one read back (min and max).
inline void check_lengths_on_device(const at::Tensor& lengths, int64_t width) {
  const auto [low, high] = at::aminmax(lengths);
  const at::Tensor range = at::stack({low, high}).cpu();
  const int64_t* h = range.const_data_ptr<int64_t>();
  if (h[0] < 0 || h[1] > width) fail_on_first_bad_length(lengths, width, "");
}

}  // namespace glue
}  // namespace attnmetrics
