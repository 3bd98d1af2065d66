// CPU impls of attnmetrics::tvd and attnmetrics::jsd on contiguous [N, K]
// inputs: one output per row, accumulated in double, rows in parallel; value_flags
// and the _checked forms (the distance and the value checks in one call).
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "checks.h"

namespace attnmetrics {
namespace {

void check_inputs(const char* op, const at::Tensor& p, const at::Tensor& q) {
  TORCH_CHECK(p.device().is_cpu() && q.device().is_cpu(), op,
              " (CPU): p and q must be CPU tensors");
  attnmetrics::check_distance_shapes(op, p, q);
}

// Applies row_fn(p_row, q_row, K) -> acc_t to every row, in parallel.
template <typename scalar_t, typename RowFn>
at::Tensor rowwise(const at::Tensor& p, const at::Tensor& q, RowFn row_fn) {
  const int64_t rows = p.size(0);
  const int64_t width = p.size(1);
  at::Tensor out = at::empty({rows}, p.options());
  const scalar_t* ps = p.const_data_ptr<scalar_t>();
  const scalar_t* qs = q.const_data_ptr<scalar_t>();
  scalar_t* os = out.mutable_data_ptr<scalar_t>();
  // ~32k elements per task, ATen's usual grain for elementwise work.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      os[i] = static_cast<scalar_t>(row_fn(ps + i * width, qs + i * width, width));
    }
  });
  return out;
}

at::Tensor tvd_cpu(const at::Tensor& p, const at::Tensor& q) {
  check_inputs("tvd", p, q);
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "tvd_cpu", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    out = rowwise<scalar_t>(p, q, [](const scalar_t* a, const scalar_t* b, int64_t k) {
      // Four running sums: one would make every add wait for the previous one.
      acc_t s[4] = {0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 4 <= k; i += 4) {
        for (int j = 0; j < 4; ++j) {
          s[j] += std::abs(static_cast<acc_t>(a[i + j]) - static_cast<acc_t>(b[i + j]));
        }
      }
      for (; i < k; ++i) s[0] += std::abs(static_cast<acc_t>(a[i]) - static_cast<acc_t>(b[i]));
      return acc_t(0.5) * ((s[0] + s[1]) + (s[2] + s[3]));
    });
  });
  return out;
}

at::Tensor jsd_cpu(const at::Tensor& p, const at::Tensor& q) {
  check_inputs("jsd", p, q);
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "jsd_cpu", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    out = rowwise<scalar_t>(p, q, [](const scalar_t* a, const scalar_t* b, int64_t k) {
      acc_t s = 0;
      for (int64_t i = 0; i < k; ++i) {
        const acc_t pa = a[i];
        const acc_t qb = b[i];
        const acc_t m = acc_t(0.5) * (pa + qb);
        // 0 log 0 = 0; m > 0 whenever a term is taken. The logs dominate the
        // cost here, so one running sum is as fast as several.
        if (pa > 0) s += pa * std::log(pa / m);
        if (qb > 0) s += qb * std::log(qb / m);
      }
      // Each pair's terms sum to >= 0 exactly; rounding may leave a tiny negative.
      return std::max(acc_t(0), acc_t(0.5) * s);
    });
  });
  return out;
}

// value_flags' bits of n entries: 1 NaN or infinite, 2 negative (and finite). First one
// vectorised pass that only asks whether any entry is out of [0, max] (integer ORs of
// comparisons, no branch); the bits themselves only then, entry by entry.
template <typename scalar_t>
int32_t entry_flags(const scalar_t* x, int64_t n) {
  constexpr scalar_t kMax = std::numeric_limits<scalar_t>::max();
  int32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad |= static_cast<int32_t>(!(x[i] >= scalar_t(0))) | static_cast<int32_t>(!(x[i] <= kMax));
  }
  if (bad == 0) return 0;
  int32_t f = 0;
  for (int64_t i = 0; i < n; ++i) f |= std::isfinite(x[i]) ? (x[i] < scalar_t(0) ? 2 : 0) : 1;
  return f;
}

// entry_flags over x in parallel chunks.
template <typename scalar_t>
int32_t flags_of(const scalar_t* x, int64_t n) {
  std::atomic<int32_t> flags{0};
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    const int32_t f = entry_flags(x + begin, end - begin);
    if (f != 0) flags.fetch_or(f);
  });
  return flags.load();
}

int32_t flags_of(const at::Tensor& p, const at::Tensor& q) {
  int32_t f = 0;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "value_flags_cpu", [&] {
    f = flags_of(p.const_data_ptr<scalar_t>(), p.numel()) | (flags_of(q.const_data_ptr<scalar_t>(), q.numel()) << 2);
  });
  return f;
}

at::Tensor value_flags_cpu(const at::Tensor& p, const at::Tensor& q) {
  attnmetrics::check_value_flags_inputs(p, q);
  TORCH_CHECK(p.device().is_cpu() && q.device().is_cpu(), "value_flags (CPU): p and q must be CPU tensors");
  at::Tensor out = at::empty({1}, p.options().dtype(at::kInt));
  out.mutable_data_ptr<int32_t>()[0] = flags_of(p, q);
  return out;
}

// tvd / jsd with value_flags' bits ORed into flags.
template <bool JSD>
at::Tensor distance_checked_cpu(const at::Tensor& p, const at::Tensor& q, const at::Tensor& flags) {
  const char* op = JSD ? "jsd_checked" : "tvd_checked";
  check_inputs(op, p, q);
  attnmetrics::check_flags_buffer(op, flags, p);
  at::Tensor out = JSD ? jsd_cpu(p, q) : tvd_cpu(p, q);
  flags.mutable_data_ptr<int32_t>()[0] |= flags_of(p, q);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) {
  m.impl("tvd", &tvd_cpu);
  m.impl("jsd", &jsd_cpu);
  m.impl("value_flags", &value_flags_cpu);
  m.impl("tvd_checked", &distance_checked_cpu<false>);
  m.impl("jsd_checked", &distance_checked_cpu<true>);
}

}  // namespace attnmetrics
