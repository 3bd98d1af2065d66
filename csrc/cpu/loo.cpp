// CPU impls of leave_one_out_batch and rationale_batch (schemas in ops.cpp). The per-row
// construction is in kernels/loo.h; this file validates the inputs so that no input can make
// it read or write out of bounds, sizes the output from an exclusive cumsum of the rows'
// sequence counts, and builds rows in parallel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "checks.h"
#include "kernels/loo.h"

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> leave_one_out_batch_cpu(
    const at::Tensor& tokens, const at::Tensor& lengths, int64_t lead, int64_t trail,
    std::optional<int64_t> mask_token, int64_t pad) {
  TORCH_CHECK(tokens.device().is_cpu(), "tokens must be a CPU tensor, got ", tokens.device());
  TORCH_CHECK(lengths.device().is_cpu(), "lengths must be a CPU tensor, got ", lengths.device());
  attnmetrics::check_loo_inputs(tokens, lengths, lead, trail, mask_token);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const bool mask = mask_token.has_value();
  const int64_t mask_id = mask_token.value_or(0);

  // Offsets decide where each row writes: computed here, never taken from the caller.
  const int64_t* len = lengths.data_ptr<int64_t>();
  const attnmetrics::SequencePlan plan = attnmetrics::plan_leave_one_out(len, B, T, lead, trail, mask);
  const std::vector<int64_t>& offsets = plan.offsets;
  const int64_t total = plan.total, width = plan.width;

  auto out = at::empty({total, width}, tokens.options());
  auto out_lengths = at::empty({total}, lengths.options());
  auto out_source = at::empty({total}, lengths.options());
  const int64_t* src = tokens.data_ptr<int64_t>();
  int64_t* dst = out.data_ptr<int64_t>();
  int64_t* dst_len = out_lengths.data_ptr<int64_t>();
  int64_t* dst_src = out_source.data_ptr<int64_t>();
  // A row writes about L^2 ids: aim for ~32k ids per task.
  const int64_t grain = T > 181 ? 1 : std::max<int64_t>(1, 32768 / std::max<int64_t>(1, T * T));
  at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t o = offsets[static_cast<size_t>(b)];
      attnmetrics::loo::build_row(src + b * T, len[b], lead, trail, mask, mask_id, pad, width, b,
                                  dst + o * width, dst_len + o, dst_src + o);
    }
  });
  return {out, out_lengths, out_source};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rationale_batch_cpu(
    const at::Tensor& tokens, const at::Tensor& lengths, const at::Tensor& rank,
    const at::Tensor& sizes, int64_t lead, int64_t trail, bool keep_rationale,
    std::optional<int64_t> mask_token, int64_t pad) {
  TORCH_CHECK(tokens.device().is_cpu(), "tokens must be a CPU tensor, got ", tokens.device());
  TORCH_CHECK(lengths.device().is_cpu(), "lengths must be a CPU tensor, got ", lengths.device());
  const int64_t F = attnmetrics::check_rationale_inputs(tokens, lengths, rank, sizes, lead, trail,
                                                        mask_token);
  const int64_t B = tokens.size(0), T = tokens.size(1), R = rank.size(1);
  const int64_t* len = lengths.data_ptr<int64_t>();
  // Row b's sequences start at offsets[b]: computed here, never taken from the caller.
  const int64_t* k = sizes.data_ptr<int64_t>();
  const attnmetrics::SequencePlan plan = attnmetrics::plan_rationales(len, k, B, F, T, lead, trail);
  const std::vector<int64_t>& offsets = plan.offsets;
  const int64_t total = plan.total;
  auto out = at::empty({total, T}, tokens.options());
  auto out_lengths = at::empty({total}, lengths.options());
  auto out_row = at::empty({total}, lengths.options());
  auto out_fraction = at::empty({total}, lengths.options());
  const int64_t* src = tokens.data_ptr<int64_t>();
  const int64_t* ranks = rank.data_ptr<int64_t>();
  int64_t* dst = out.data_ptr<int64_t>();
  int64_t* dst_len = out_lengths.data_ptr<int64_t>();
  int64_t* dst_row = out_row.data_ptr<int64_t>();
  int64_t* dst_fraction = out_fraction.data_ptr<int64_t>();
  const bool mask = mask_token.has_value();
  const int64_t mask_id = mask_token.value_or(0);
  // A row writes about F * T ids: aim for ~32k ids per task.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, F * T));
  at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      int64_t o = offsets[static_cast<size_t>(b)];
      for (int64_t f = 0; f < F; ++f) {
        if (k[b * F + f] < 0) continue;
        dst_len[o] = attnmetrics::loo::build_rationale_sequence(
            src + b * T, len[b], ranks + b * R, lead, trail, k[b * F + f], keep_rationale, mask,
            mask_id, pad, T, dst + o * T);
        dst_row[o] = b;
        dst_fraction[o] = f;
        ++o;
      }
    }
  });
  return {out, out_lengths, out_row, out_fraction};
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) {
  m.impl("leave_one_out_batch", &leave_one_out_batch_cpu);
  m.impl("rationale_batch", &rationale_batch_cpu);
}
