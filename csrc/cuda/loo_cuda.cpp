// CUDA impls of leave_one_out_batch and rationale_batch (schemas in ops.cpp; CPU impls in
// cpu/loo.cpp).
// Common to the glue files: glue.h. The check that needs the data, lengths in
// [lead + trail, T], reads back the min and max length, with the output's size and
// width, computed from the lengths on the device.
#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "checks.h"
#include "cuda/glue.h"
#include "cuda/launch.h"

namespace attnmetrics {
namespace {

using namespace glue;

std::tuple<at::Tensor, at::Tensor, at::Tensor> leave_one_out_batch_cuda(
    const at::Tensor& tokens, const at::Tensor& lengths, int64_t lead, int64_t trail,
    std::optional<int64_t> mask_token, int64_t pad) {
  TORCH_CHECK(tokens.device().is_cuda(), "tokens must be a CUDA tensor, got ", tokens.device());
  TORCH_CHECK(lengths.device() == tokens.device(), "lengths must be a CUDA tensor on ",
              tokens.device(), " (tokens' device), got ", lengths.device());
  attnmetrics::check_loo_inputs(tokens, lengths, lead, trail, mask_token);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const bool mask = mask_token.has_value();

  const c10::cuda::CUDAGuard guard(tokens.device());
  if (B == 0) {
    return {at::empty({0, 0}, tokens.options()), at::empty({0}, lengths.options()),
            at::empty({0}, lengths.options())};
  }
  // The one read back: min and max length (range check), the number of sequences and the
  // longest one (only rows that yield a sequence count, as on the CPU) size the outputs.
  // Offsets are computed here, never taken from the caller.
  const at::Tensor real = lengths.sub(lead + trail);
  const at::Tensor offsets = real.cumsum(0).sub(real);
  const at::Tensor seq_len = mask ? lengths : lengths.sub(1);
  const auto [low, high] = at::aminmax(lengths);
  const at::Tensor host = at::stack({low, high, real.sum(),
                                     at::where(real.gt(0), seq_len, 0).max()}).cpu();
  const int64_t* h = host.const_data_ptr<int64_t>();
  if (h[0] < lead + trail || h[1] > T) {
    fail_on_first_bad_length(lengths, T, "", lead + trail, "lead + trail");
  }
  const int64_t total = h[2], width = h[3];
  at::Tensor out = at::empty({total, width}, tokens.options());
  at::Tensor out_lengths = at::empty({total}, lengths.options());
  at::Tensor out_source = at::empty({total}, lengths.options());
  check_launch(gpu::leave_one_out_batch(
                   tokens.const_data_ptr<int64_t>(), lengths.const_data_ptr<int64_t>(),
                   offsets.const_data_ptr<int64_t>(), B, T, lead, mask, mask_token.value_or(0),
                   pad, total, width, out.mutable_data_ptr<int64_t>(),
                   out_lengths.mutable_data_ptr<int64_t>(),
                   out_source.mutable_data_ptr<int64_t>(), current_stream()),
               "leave_one_out_batch");
  return {out, out_lengths, out_source};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rationale_batch_cuda(
    const at::Tensor& tokens, const at::Tensor& lengths, const at::Tensor& rank,
    const at::Tensor& sizes, int64_t lead, int64_t trail, bool keep_rationale,
    std::optional<int64_t> mask_token, int64_t pad) {
  TORCH_CHECK(tokens.device().is_cuda(), "tokens must be a CUDA tensor, got ", tokens.device());
  TORCH_CHECK(lengths.device() == tokens.device(), "lengths must be a CUDA tensor on ",
              tokens.device(), " (tokens' device), got ", lengths.device());
  const int64_t F = attnmetrics::check_rationale_inputs(tokens, lengths, rank, sizes, lead, trail,
                                                        mask_token);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const c10::cuda::CUDAGuard guard(tokens.device());
  if (B > 0) {
    const auto [low, high] = at::aminmax(lengths);
    const at::Tensor host = at::stack({low, high}).cpu();
    const int64_t* h = host.const_data_ptr<int64_t>();
    if (h[0] < lead + trail || h[1] > T) {
      fail_on_first_bad_length(lengths, T, "", lead + trail, "lead + trail");
    }
  }
  // The sequences, in row-major order of sizes: one read back (nonzero's count).
  const at::Tensor index = sizes.ge(0).flatten().nonzero().view(-1);
  const int64_t total = index.numel();
  at::Tensor out = at::empty({total, T}, tokens.options());
  at::Tensor out_lengths = at::empty({total}, lengths.options());
  at::Tensor out_row = at::empty({total}, lengths.options());
  at::Tensor out_fraction = at::empty({total}, lengths.options());
  check_launch(gpu::rationale_batch(tokens.const_data_ptr<int64_t>(),
                                    lengths.const_data_ptr<int64_t>(),
                                    rank.const_data_ptr<int64_t>(), sizes.const_data_ptr<int64_t>(),
                                    index.const_data_ptr<int64_t>(), total, F, T, rank.size(1),
                                    lead, trail, keep_rationale, mask_token.has_value(),
                                    mask_token.value_or(0), pad, out.mutable_data_ptr<int64_t>(),
                                    out_lengths.mutable_data_ptr<int64_t>(),
                                    out_row.mutable_data_ptr<int64_t>(),
                                    out_fraction.mutable_data_ptr<int64_t>(), current_stream()),
               "rationale_batch");
  return {out, out_lengths, out_row, out_fraction};
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) {
  m.impl("leave_one_out_batch", &leave_one_out_batch_cuda);
  m.impl("rationale_batch", &rationale_batch_cuda);
}

}  // namespace attnmetrics
