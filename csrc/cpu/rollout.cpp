// CPU impl of attention_rollout (schema in ops.cpp). Rows in parallel, each on one
// thread with its own scratch: every layer's mixed attention by kernels/rollout.h
// (mix_layer), the product through the layers by BLAS (at::mm_out on the row's L x L
// blocks), which beats any loop of ours past a few dozen tokens. Validates every input
// so that no input can make it read or write out of bounds, and the attention values
// (finite, non-negative) as the mixing reads them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "checks.h"
#include "kernels/rollout.h"

namespace {

at::Tensor attention_rollout_cpu(const at::Tensor& attentions, const at::Tensor& lengths,
                                 double residual) {
  TORCH_CHECK(attentions.device().is_cpu(), "attentions must be a CPU tensor, got ",
              attentions.device());
  TORCH_CHECK(lengths.device().is_cpu(), "lengths must be a CPU tensor, got ", lengths.device());
  attnmetrics::check_rollout_inputs(attentions, lengths, residual);
  const int64_t B = attentions.size(0), layers = attentions.size(1), heads = attentions.size(2),
                T = attentions.size(3);
  const int64_t* len = lengths.data_ptr<int64_t>();
  attnmetrics::check_length_range(len, B, 0, "0", T);

  auto out = at::zeros({B, T, T}, attentions.options());
  // Values are checked while they are read (mix_layer): a bad row is marked, and named once
  // every thread is done.
  std::vector<char> bad(static_cast<size_t>(B), 0);
  AT_DISPATCH_FLOATING_TYPES(attentions.scalar_type(), "attention_rollout", [&] {
    const scalar_t* att = attentions.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const scalar_t r = static_cast<scalar_t>(residual);
    const int64_t layer_size = heads * T * T;
    const auto options = attentions.options();
    // A row costs about layers * (heads + T) * T^2 operations: aim for ~1M per task.
    const int64_t cost = std::max<int64_t>(1, layers * (heads + T) * T * T);
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 20) / cost);
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> scratch;
      for (int64_t b = begin; b < end; ++b) {
        const int64_t L = len[b];
        if (L == 0) continue;
        scratch.resize(static_cast<size_t>(3 * L * L));
        scalar_t* row = scratch.data();
        at::Tensor R = at::from_blob(row, {L, L}, options);
        at::Tensor next = at::from_blob(row + L * L, {L, L}, options);
        const at::Tensor M = at::from_blob(row + 2 * L * L, {L, L}, options);
        const scalar_t* a = att + b * layers * layer_size;
        bool ok = attnmetrics::rollout::mix_layer(a, heads, T, L, r, R.data_ptr<scalar_t>());
        for (int64_t l = 1; l < layers && ok; ++l) {
          ok = attnmetrics::rollout::mix_layer(a + l * layer_size, heads, T, L, r,
                                               M.data_ptr<scalar_t>());
          at::mm_out(next, M, R);  // R <- M_l R
          std::swap(R, next);
        }
        if (!ok) {
          bad[static_cast<size_t>(b)] = 1;
          continue;
        }
        const scalar_t* result = R.data_ptr<scalar_t>();
        scalar_t* o = dst + b * T * T;
        for (int64_t i = 0; i < L; ++i) std::copy(result + i * L, result + (i + 1) * L, o + i * T);
      }
    });
  });
  if (std::find(bad.begin(), bad.end(), 1) != bad.end()) {
    attnmetrics::check_rollout_values(attentions, lengths);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) { m.impl("attention_rollout", &attention_rollout_cpu); }
