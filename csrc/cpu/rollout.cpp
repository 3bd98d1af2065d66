// CPU impl of attention_rollout (schema in ops.cpp); the per-row chain is in
// kernels/rollout.h. Validates every input so that no input can make it read or write
// out of bounds; rows in parallel, each on one thread with its own L x L scratch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
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
  AT_DISPATCH_FLOATING_TYPES(attentions.scalar_type(), "attention_rollout", [&] {
    const scalar_t* att = attentions.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const scalar_t r = static_cast<scalar_t>(residual);
    const int64_t row_size = layers * heads * T * T;
    // A row costs about layers * (heads + T) * T^2 operations: aim for ~1M per task.
    const int64_t cost = std::max<int64_t>(1, row_size + layers * T * T * T);
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 20) / cost);
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> scratch;
      for (int64_t b = begin; b < end; ++b) {
        const int64_t L = len[b];
        if (L == 0) continue;
        scratch.resize(static_cast<size_t>(2 * L * L + L));
        scalar_t* R = scratch.data();
        attnmetrics::rollout::rollout_row(att + b * row_size, layers, heads, T, L, r, R,
                                          R + L * L, R + 2 * L * L);
        scalar_t* o = dst + b * T * T;
        for (int64_t i = 0; i < L; ++i) std::copy(R + i * L, R + (i + 1) * L, o + i * T);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) { m.impl("attention_rollout", &attention_rollout_cpu); }
