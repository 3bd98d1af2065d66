// CUDA impl of kendall_tau (schema in ops.cpp; CPU impl in cpu/kendall.cpp).
// Common to the glue files: glue.h. The check that needs the data, lengths in [0, T],
// is a min/max reduction on the device, its two numbers read back (they also size the
// scratch).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "checks.h"
#include "cuda/geometry.h"
#include "cuda/glue.h"
#include "cuda/launch.h"
#include "cuda/rows.h"

namespace attnmetrics {
namespace {

using namespace glue;

void check_kendall_inputs(const at::Tensor& x, const at::Tensor& y, const at::Tensor& lengths) {
  TORCH_CHECK(x.device().is_cuda() && y.device() == x.device() && lengths.device() == x.device(),
              "kendall_tau (CUDA): all inputs must be CUDA tensors on one device, got ",
              x.device(), ", ", y.device(), ", ", lengths.device());
  attnmetrics::check_kendall_shapes(x, y, lengths);
}

std::tuple<at::Tensor, at::Tensor> kendall_tau_cuda(const at::Tensor& x, const at::Tensor& y,
                                                    const at::Tensor& lengths) {
  check_kendall_inputs(x, y, lengths);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t batch = x.size(0);
  const int64_t width = x.size(1);
  at::Tensor tau = at::empty({batch}, x.options());
  at::Tensor pvalue = at::empty({batch}, x.options());
  if (batch == 0) return {tau, pvalue};

  // The one read back: min and max length (range check and scratch size).
  const auto [low, high] = at::aminmax(lengths);
  const at::Tensor range = at::stack({low, high}).cpu();
  const int64_t min_len = range.const_data_ptr<int64_t>()[0];
  const int64_t max_len = range.const_data_ptr<int64_t>()[1];
  if (min_len < 0 || max_len > width) fail_on_first_bad_length(lengths, width, "kendall_tau: ");

  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kendall_tau_cuda", [&] {
    // the pairwise kernel of rows up to kKendallPairwiseMaxLen needs no scratch
    const int64_t slot_bytes = gpu::kendall_pairwise(max_len) ? 0 : gpu::kendall_slot_bytes<scalar_t>(max_len);
    const int64_t slots = gpu::slots_for(batch, slot_bytes);
    at::Tensor scratch = at::empty({std::max<int64_t>(1, slots * slot_bytes)},
                                   x.options().dtype(at::kByte));
    check_launch(gpu::kendall_tau(x.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(),
                                  lengths.const_data_ptr<int64_t>(), batch, width, max_len,
                                  scratch.mutable_data_ptr<uint8_t>(), slots,
                                  tau.mutable_data_ptr<scalar_t>(),
                                  pvalue.mutable_data_ptr<scalar_t>(), current_stream()),
                 "kendall_tau");
  });
  return {tau, pvalue};
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) { m.impl("kendall_tau", &kendall_tau_cuda); }

}  // namespace attnmetrics
