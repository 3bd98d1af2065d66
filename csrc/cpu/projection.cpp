// CPU impl of project_prefix (schema in ops.cpp); the per-row loop is in
// kernels/projection.h. Validates every input so that no input can make it
// read or write out of bounds; rows in parallel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <utility>

#include "checks.h"
#include "kernels/projection.h"

namespace {

at::Tensor project_prefix_cpu(const at::Tensor& values, const at::Tensor& weight,
                              const at::Tensor& lengths) {
  for (const auto& [t, name] : {std::pair{&values, "values"}, {&weight, "weight"}, {&lengths, "lengths"}}) {
    TORCH_CHECK(t->device().is_cpu(), name, " must be a CPU tensor, got ", t->device());
  }
  const int64_t C = attnmetrics::check_projection_inputs(values, weight, lengths);
  const int64_t B = values.size(0), T = values.size(1), H = values.size(2);
  const int64_t* len = lengths.data_ptr<int64_t>();
  attnmetrics::check_length_range(len, B, 0, "0", T);

  auto out = at::empty({B, T, C}, values.options());
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "project_prefix", [&] {
    constexpr int K = attnmetrics::projection::partial_sums<scalar_t>();
    const scalar_t* val = values.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, T * H));
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        attnmetrics::projection::project_row<scalar_t, K>(val + b * T * H, w, len[b], T, H, C,
                                                          dst + b * T * C);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) { m.impl("project_prefix", &project_prefix_cpu); }
