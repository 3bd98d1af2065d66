// CUDA impl of attention_rollout (schema in ops.cpp; CPU impl in cpu/rollout.cpp).
// Common to the glue files: glue.h. The checks that need the data read back the min and
// max length (lengths in [0, T]) and the min and max attention value (finite,
// non-negative; on failure the CPU's check names the offender in a valid block, or finds
// the bad values all in padding). Scratch: three T x T matrices per row in flight, within
// geometry.h's budget.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>

#include "checks.h"
#include "cuda/geometry.h"
#include "cuda/glue.h"
#include "cuda/launch.h"

namespace attnmetrics {
namespace {

using namespace glue;

at::Tensor attention_rollout_cuda(const at::Tensor& attentions, const at::Tensor& lengths,
                                  double residual) {
  TORCH_CHECK(attentions.device().is_cuda(), "attentions must be a CUDA tensor, got ",
              attentions.device());
  check_cuda_contiguous(lengths, "lengths", attentions.device(), "attentions");
  attnmetrics::check_rollout_inputs(attentions, lengths, residual);
  const int64_t B = attentions.size(0), layers = attentions.size(1), heads = attentions.size(2),
                T = attentions.size(3);

  const c10::cuda::CUDAGuard guard(attentions.device());
  at::Tensor out = at::empty({B, T, T}, attentions.options());
  if (B == 0) return out;
  check_lengths_on_device(lengths, T);
  // Attention values: one pass over the whole tensor (min and max, one read back); only if
  // something is wrong somewhere are the inputs copied back to find it in a valid block.
  const auto [low, high] = at::aminmax(attentions);
  const at::Tensor range = at::stack({low, high}).to(at::kDouble).cpu();
  const double* h = range.const_data_ptr<double>();
  if (!(h[0] >= 0.0 && std::isfinite(h[1]))) {  // NaN fails both
    attnmetrics::check_rollout_values(attentions.cpu(), lengths.cpu());
  }
  const int64_t slots = gpu::slots_for(B, 3 * T * T * attentions.element_size());
  at::Tensor scratch = at::empty({slots * 3 * T * T}, attentions.options());
  AT_DISPATCH_FLOATING_TYPES(attentions.scalar_type(), "attention_rollout_cuda", [&] {
    check_launch(gpu::attention_rollout(attentions.const_data_ptr<scalar_t>(),
                                        lengths.const_data_ptr<int64_t>(), B, layers, heads, T,
                                        static_cast<scalar_t>(residual),
                                        scratch.mutable_data_ptr<scalar_t>(), slots,
                                        out.mutable_data_ptr<scalar_t>(), current_stream()),
                 "attention_rollout");
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) {
  m.impl("attention_rollout", &attention_rollout_cuda);
}

}  // namespace attnmetrics
