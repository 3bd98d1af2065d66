// CPU impl of attnmetrics::kendall_tau: rows in parallel, the per-row
// algorithm shared with the CUDA build (kernels/kendall.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "checks.h"
#include "kernels/kendall.h"

namespace attnmetrics {
namespace {

void check_inputs(const at::Tensor& x, const at::Tensor& y, const at::Tensor& lengths) {
  for (const auto* t : {&x, &y, &lengths}) {
    TORCH_CHECK(t->device().is_cpu(), "kendall_tau (CPU): all inputs must be CPU tensors");
  }
  attnmetrics::check_kendall_shapes(x, y, lengths);
  const int64_t* len = lengths.const_data_ptr<int64_t>();
  attnmetrics::check_length_range(len, lengths.size(0), 0, "0", x.size(1), "kendall_tau: ");
}

// Counts behind the exact p-value, built on first use (thread-safe static).
const double* exact_table() {
  static const std::vector<double> table = [] {
    std::vector<double> t(kendall::exact_table_size());
    kendall::build_exact_table(t.data());
    return t;
  }();
  return table.data();
}

std::tuple<at::Tensor, at::Tensor> kendall_tau_cpu(const at::Tensor& x, const at::Tensor& y,
                                                   const at::Tensor& lengths) {
  check_inputs(x, y, lengths);
  const int64_t batch = x.size(0);
  const int64_t width = x.size(1);
  at::Tensor tau = at::empty({batch}, x.options());
  at::Tensor pvalue = at::empty({batch}, x.options());
  if (batch == 0) return {tau, pvalue};

  // A row costs ~T log T: a few thousand elements per task amortise the
  // scratch allocation and the thread hand-off.
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(width, 1));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kendall_tau_cpu", [&] {
    const scalar_t* xs = x.const_data_ptr<scalar_t>();
    const scalar_t* ys = y.const_data_ptr<scalar_t>();
    const int64_t* len = lengths.const_data_ptr<int64_t>();
    scalar_t* tau_out = tau.mutable_data_ptr<scalar_t>();
    scalar_t* p_out = pvalue.mutable_data_ptr<scalar_t>();
    const double* table = exact_table();
    at::parallel_for(0, batch, grain, [&](int64_t begin, int64_t end) {
      // Scratch sized for the widest row, allocated once per chunk.
      using Keys = kendall::RowKeys<scalar_t>;
      std::vector<typename Keys::pair_t> pairs(2 * width);
      std::vector<typename Keys::y_t> y_keys(2 * width);
      for (int64_t b = begin; b < end; ++b) {
        double t, p;
        kendall::tau_row(xs + b * width, ys + b * width, len[b], pairs.data(), y_keys.data(), table,
                         &t, &p);
        tau_out[b] = static_cast<scalar_t>(t);
        p_out[b] = static_cast<scalar_t>(p);
      }
    });
  });
  return {tau, pvalue};
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) { m.impl("kendall_tau", &kendall_tau_cpu); }

}  // namespace attnmetrics
