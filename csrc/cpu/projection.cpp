// CPU impl of project_prefix (schema in ops.cpp); the per-row loop is in
// kernels/projection.h. Validates every input so that no input can make it
// read or write out of bounds; rows in parallel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "kernels/projection.h"

namespace {

void check_cpu_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

at::Tensor project_prefix_cpu(const at::Tensor& values, const at::Tensor& weight,
                              const at::Tensor& lengths) {
  check_cpu_contiguous(values, "values");
  check_cpu_contiguous(weight, "weight");
  check_cpu_contiguous(lengths, "lengths");
  TORCH_CHECK(values.scalar_type() == at::kFloat || values.scalar_type() == at::kDouble,
              "values must be float32 or float64, got ", values.scalar_type());
  TORCH_CHECK(values.dim() == 3, "values must have shape [B, T, H], got ", values.sizes());
  const int64_t B = values.size(0), T = values.size(1), H = values.size(2);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == H, "weight must have shape [C, H] = [C, ",
              H, "], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == values.scalar_type(), "weight dtype ",
              weight.scalar_type(), " must match values dtype ", values.scalar_type());
  const int64_t C = weight.size(0);
  TORCH_CHECK(lengths.scalar_type() == at::kLong, "lengths must be int64, got ",
              lengths.scalar_type());
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == B, "lengths must have shape [B] = [", B,
              "], got ", lengths.sizes());
  const int64_t* len = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(len[b] >= 0 && len[b] <= T, "lengths[", b, "] = ", len[b],
                " is outside [0, T] = [0, ", T, "]");
  }

  auto out = at::empty({B, T, C}, values.options());
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "project_prefix", [&] {
    // 16 float or 8 double partial sums: two SSE registers' worth of lanes
    constexpr int K = sizeof(scalar_t) == 4 ? 16 : 8;
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
