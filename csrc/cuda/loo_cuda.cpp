// CUDA impls of leave_one_out_batch and rationale_batch (schemas in ops.cpp; CPU impls in
// cpu/loo.cpp).
// Common to the glue files: glue.h. The check that needs the data, lengths in
// [lead + trail, T], and the output's size (and width) need the lengths' values: with lengths
// on the device, one read back (min and max length, size and width, computed there); with
// lengths given on the host (tokens on the device), none: the host plans as the CPU impl does
// (checks.h plan_*) and uploads what the kernel reads without waiting for the device.
#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cuda/glue.h"
#include "cuda/launch.h"

namespace attnmetrics {
namespace {

using namespace glue;

// tokens on a CUDA device; lengths there too, or on the host (then planned there, no read back).
void check_tokens_and_lengths(const at::Tensor& tokens, const at::Tensor& lengths) {
  TORCH_CHECK(tokens.device().is_cuda(), "tokens must be a CUDA tensor, got ", tokens.device());
  TORCH_CHECK(lengths.device() == tokens.device() || lengths.device().is_cpu(),
              "lengths must be a CUDA tensor on ", tokens.device(),
              " (tokens' device) or a CPU tensor, got ", lengths.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> leave_one_out_batch_cuda(
    const at::Tensor& tokens, const at::Tensor& lengths, int64_t lead, int64_t trail,
    std::optional<int64_t> mask_token, int64_t pad) {
  check_tokens_and_lengths(tokens, lengths);
  attnmetrics::check_loo_inputs(tokens, lengths, lead, trail, mask_token);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const bool mask = mask_token.has_value();

  const c10::cuda::CUDAGuard guard(tokens.device());
  if (B == 0) {
    return {at::empty({0, 0}, tokens.options()), at::empty({0}, tokens.options()),
            at::empty({0}, tokens.options())};
  }
  // Offsets are computed here, never taken from the caller.
  at::Tensor lens, offsets;
  int64_t total = 0, width = 0;
  if (lengths.device().is_cpu()) {
    const int64_t* len = lengths.const_data_ptr<int64_t>();
    const attnmetrics::SequencePlan plan = attnmetrics::plan_leave_one_out(len, B, T, lead, trail, mask);
    std::vector<int64_t> staged(len, len + B);
    staged.insert(staged.end(), plan.offsets.begin(), plan.offsets.end());
    const at::Tensor both = upload(staged, tokens.device());
    lens = both.narrow(0, 0, B);
    offsets = both.narrow(0, B, B);
    total = plan.total;
    width = plan.width;
  } else {
    // The one read back: min and max length (range check), the number of sequences and the
    // longest one (only rows that yield a sequence count, as on the CPU) size the outputs.
    const at::Tensor real = lengths.sub(lead + trail);
    offsets = real.cumsum(0).sub(real);
    const at::Tensor seq_len = mask ? lengths : lengths.sub(1);
    const auto [low, high] = at::aminmax(lengths);
    const at::Tensor host = at::stack({low, high, real.sum(),
                                       at::where(real.gt(0), seq_len, 0).max()}).cpu();
    const int64_t* h = host.const_data_ptr<int64_t>();
    if (h[0] < lead + trail || h[1] > T) {
      fail_on_first_bad_length(lengths, T, "", lead + trail, "lead + trail");
    }
    lens = lengths;
    total = h[2];
    width = h[3];
  }
  at::Tensor out = at::empty({total, width}, tokens.options());
  at::Tensor out_lengths = at::empty({total}, tokens.options());
  at::Tensor out_source = at::empty({total}, tokens.options());
  check_launch(gpu::leave_one_out_batch(
                   tokens.const_data_ptr<int64_t>(), lens.const_data_ptr<int64_t>(),
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
  check_tokens_and_lengths(tokens, lengths);
  const int64_t F = attnmetrics::check_rationale_inputs(tokens, lengths, rank, sizes, lead, trail,
                                                        mask_token);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const c10::cuda::CUDAGuard guard(tokens.device());
  at::Tensor lens = lengths, ks = sizes, index;
  if (lengths.device().is_cpu()) {
    const int64_t* len = lengths.const_data_ptr<int64_t>();
    const attnmetrics::SequencePlan plan =
        attnmetrics::plan_rationales(len, sizes.const_data_ptr<int64_t>(), B, F, T, lead, trail);
    std::vector<int64_t> staged(len, len + B);
    staged.insert(staged.end(), sizes.const_data_ptr<int64_t>(), sizes.const_data_ptr<int64_t>() + B * F);
    staged.insert(staged.end(), plan.index.begin(), plan.index.end());
    const at::Tensor all = upload(staged, tokens.device());
    lens = all.narrow(0, 0, B);
    ks = all.narrow(0, B, B * F);
    index = all.narrow(0, B + B * F, plan.total);
  } else {
    if (B > 0) {
      const auto [low, high] = at::aminmax(lengths);
      const at::Tensor host = at::stack({low, high}).cpu();
      const int64_t* h = host.const_data_ptr<int64_t>();
      if (h[0] < lead + trail || h[1] > T) {
        fail_on_first_bad_length(lengths, T, "", lead + trail, "lead + trail");
      }
    }
    // The sequences, in row-major order of sizes: one read back (nonzero's count).
    index = sizes.ge(0).flatten().nonzero().view(-1);
  }
  const int64_t total = index.numel();
  at::Tensor out = at::empty({total, T}, tokens.options());
  at::Tensor out_lengths = at::empty({total}, tokens.options());
  at::Tensor out_row = at::empty({total}, tokens.options());
  at::Tensor out_fraction = at::empty({total}, tokens.options());
  check_launch(gpu::rationale_batch(tokens.const_data_ptr<int64_t>(),
                                    lens.const_data_ptr<int64_t>(),
                                    rank.const_data_ptr<int64_t>(), ks.const_data_ptr<int64_t>(),
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
