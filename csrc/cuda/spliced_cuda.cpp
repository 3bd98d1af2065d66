// CUDA impl of spliced_attention (schema in ops.cpp; CPU impl in cpu/spliced.cpp). Reads back
// four values at once: the least and greatest length (in [0, W]) and the least and greatest
// table row among the pairs that get attention (in [0, R)); only if one is outside are the
// inputs copied back, for the CPU's check to name the first offender. Scratch: the scores,
// [N, W].
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <utility>

#include "checks.h"
#include "cuda/glue.h"
#include "cuda/launch.h"

namespace attnmetrics {
namespace {

using namespace glue;

at::Tensor spliced_attention_cuda(const at::Tensor& table, const at::Tensor& pairs,
                                  const at::Tensor& lengths, const at::Tensor& v, int64_t lead,
                                  int64_t trail, bool tanh) {
  TORCH_CHECK(table.device().is_cuda(), "table must be a CUDA tensor, got ", table.device());
  for (const auto& [t, name] : {std::pair{&pairs, "pairs"}, {&lengths, "lengths"}, {&v, "v"}}) {
    check_cuda_contiguous(*t, name, table.device(), "table");
  }
  const auto [N, W, D, A] = check_spliced_attention_inputs(table, pairs, lengths, v, lead, trail);
  const c10::cuda::CUDAGuard guard(table.device());
  if (N == 0) return at::zeros({0, D - A}, table.options());
  if (W == 0) {  // nothing to read but the lengths, which must all be 0
    check_lengths_on_device(lengths, 0);
    return at::zeros({N, D - A}, table.options());
  }
  const at::Tensor j = at::arange(W, lengths.options());
  const at::Tensor attended = j.ge(lead).logical_and(j.lt(lengths.sub(trail).unsqueeze(1)));
  const at::Tensor rows = at::where(attended.unsqueeze(-1), pairs, 0);
  const auto [short_, long_] = at::aminmax(lengths);
  const auto [low, high] = at::aminmax(rows);
  const at::Tensor range = at::stack({short_, long_, low, high}).cpu();
  const int64_t* h = range.const_data_ptr<int64_t>();
  // a zero filled in where no pair is read is a false alarm only for an empty table
  if (h[0] < 0 || h[1] > W || h[2] < 0 || h[3] >= table.size(0)) {
    const at::Tensor host_lengths = lengths.cpu(), host_pairs = pairs.cpu();
    check_spliced_attention_values(host_lengths.const_data_ptr<int64_t>(),
                                   host_pairs.const_data_ptr<int64_t>(), N, W, table.size(0),
                                   lead, trail);
  }
  at::Tensor out = at::empty({N, D - A}, table.options());
  at::Tensor scores = at::empty({N, W}, table.options());
  AT_DISPATCH_FLOATING_TYPES(table.scalar_type(), "spliced_attention_cuda", [&] {
    check_launch(gpu::spliced_attention(table.const_data_ptr<scalar_t>(),
                                        pairs.const_data_ptr<int64_t>(),
                                        lengths.const_data_ptr<int64_t>(),
                                        v.const_data_ptr<scalar_t>(), N, W, D, A, lead, trail,
                                        tanh, scores.mutable_data_ptr<scalar_t>(),
                                        out.mutable_data_ptr<scalar_t>(), current_stream()),
                 "spliced_attention");
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) { m.impl("spliced_attention", &spliced_attention_cuda); }

}  // namespace attnmetrics
