// CUDA impl of project_prefix (schema in ops.cpp; CPU impl in cpu/projection.cpp).
// Common to the glue files: glue.h. The check that needs the data, lengths in [0, T],
// reads back the min and max length.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "cuda/glue.h"
#include "cuda/launch.h"

namespace attnmetrics {
namespace {

using namespace glue;

at::Tensor project_prefix_cuda(const at::Tensor& values, const at::Tensor& weight,
                               const at::Tensor& lengths) {
  TORCH_CHECK(values.device().is_cuda(), "values must be a CUDA tensor, got ", values.device());
  check_cuda_contiguous(weight, "weight", values.device(), "values");
  check_cuda_contiguous(lengths, "lengths", values.device(), "values");
  const int64_t C = attnmetrics::check_projection_inputs(values, weight, lengths);
  const int64_t B = values.size(0), T = values.size(1), H = values.size(2);

  const c10::cuda::CUDAGuard guard(values.device());
  at::Tensor out = at::empty({B, T, C}, values.options());
  if (B == 0) return out;
  check_lengths_on_device(lengths, T);
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "project_prefix_cuda", [&] {
    check_launch(gpu::project_prefix(values.const_data_ptr<scalar_t>(),
                                     weight.const_data_ptr<scalar_t>(),
                                     lengths.const_data_ptr<int64_t>(), B, T, H, C,
                                     out.mutable_data_ptr<scalar_t>(), current_stream()),
                 "project_prefix");
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) { m.impl("project_prefix", &project_prefix_cuda); }

}  // namespace attnmetrics
