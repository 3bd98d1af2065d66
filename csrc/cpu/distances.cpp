// CPU impls of attnmetrics::tvd and attnmetrics::jsd on [..., K] inputs whose rows lie a
// fixed stride apart (checks.h row_stride: contiguous, or one row expanded over the batch):
// one output per row, accumulated in double, rows in parallel; value_flags and the _checked
// forms (the distance and the value checks in one call).
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
#include "cpu/vec_avx2.h"
#include "kernels/distances.h"

namespace attnmetrics {
namespace {

#ifdef AM_AVX2_PATH
using vec::avx2_fma;
#endif

void check_inputs(const char* op, const at::Tensor& p, const at::Tensor& q) {
  TORCH_CHECK(p.device().is_cpu() && q.device().is_cpu(), op,
              " (CPU): p and q must be CPU tensors");
  attnmetrics::check_distance_shapes(op, p, q);
}

// value_flags' bits of n entries (kernels/distances.h entry_flag, ORed). First one
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
  for (int64_t i = 0; i < n; ++i) f |= entry_flag(x[i]);
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

// entry_flags over the entries of t [..., K] that its rows cover (row_stride >= 0): one pass
// over the memory when the rows are packed (or one row is expanded), else row by row (the gaps
// between rows are not t's).
int32_t row_entry_flags(const at::Tensor& t) {
  const int64_t width = t.size(-1), rows = width == 0 ? 0 : t.numel() / width, stride = row_stride(t);
  int32_t f = 0;
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "value_flags_cpu", [&] {
    const scalar_t* x = t.const_data_ptr<scalar_t>();
    if (rows <= 1 || stride == 0) {
      f = flags_of(x, std::min<int64_t>(rows, 1) * width);
    } else if (stride == width) {
      f = flags_of(x, rows * width);
    } else {
      std::atomic<int32_t> flags{0};
      at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(width, 1)),
                       [&](int64_t begin, int64_t end) {
                         int32_t g = 0;
                         for (int64_t r = begin; r < end; ++r) g |= entry_flags(x + r * stride, width);
                         if (g != 0) flags.fetch_or(g);
                       });
      f = flags.load();
    }
  });
  return f;
}

// value_flags' exact bits of a row pair that a kernel marked bad (only then: the error's path).
template <typename scalar_t>
int32_t row_flags(const scalar_t* a, const scalar_t* b, int64_t k) {
  return entry_flags(a, k) | entry_flags(b, k) << 2;
}

// Runs rows_fn(a, sa, b, sb, out, n, K) -> flags over chunks of the rows of p and q in parallel
// (a chunk's n rows start at a and b, sa and sb elements apart: checks.h row_stride; their
// outputs at out), into p's shape without its last dim; returns the chunks' flags ORed. A chunk
// function loops over its rows itself, so the row kernels inline into it (an AVX2 one into an
// AVX2 loop).
template <typename scalar_t, typename RowsFn>
std::pair<at::Tensor, int32_t> rowwise(const at::Tensor& p, const at::Tensor& q, RowsFn rows_fn) {
  at::Tensor out = attnmetrics::distance_output(p);
  const int64_t rows = out.numel(), width = p.size(-1);
  const int64_t sp = row_stride(p), sq = row_stride(q);
  const scalar_t* ps = p.const_data_ptr<scalar_t>();
  const scalar_t* qs = q.const_data_ptr<scalar_t>();
  scalar_t* os = out.mutable_data_ptr<scalar_t>();
  std::atomic<int32_t> flags{0};
  // ~32k elements per task, ATen's usual grain for elementwise work.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    const int32_t f = rows_fn(ps + begin * sp, sp, qs + begin * sq, sq, os + begin, end - begin, width);
    if (f != 0) flags.fetch_or(f);
  });
  return {out, flags.load()};
}

// tvd of one row, in acc_t: four running sums (one would make every add wait for the previous).
template <typename acc_t, typename scalar_t>
inline acc_t tvd_row(const scalar_t* a, const scalar_t* b, int64_t k) {
  acc_t s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) {
    for (int j = 0; j < 4; ++j) s[j] += std::abs(static_cast<acc_t>(a[i + j]) - static_cast<acc_t>(b[i + j]));
  }
  for (; i < k; ++i) s[0] += std::abs(static_cast<acc_t>(a[i]) - static_cast<acc_t>(b[i]));
  return acc_t(0.5) * ((s[0] + s[1]) + (s[2] + s[3]));
}

at::Tensor tvd_scalar(const at::Tensor& p, const at::Tensor& q) {
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "tvd_cpu", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    out = rowwise<scalar_t>(p, q, [](const scalar_t* a, int64_t sa, const scalar_t* b, int64_t sb, scalar_t* o,
                                     int64_t n, int64_t k) {
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<scalar_t>(tvd_row<acc_t>(a + i * sa, b + i * sb, k));
      return 0;
    }).first;
  });
  return out;
}

// One entry pair's JSD terms, x log(x / m) + y log(y / m) with m = (x + y) / 2, 0 log 0 = 0
// (m > 0 whenever a term is taken).
template <typename acc_t>
inline acc_t jsd_terms(acc_t x, acc_t y) {
  const acc_t m = acc_t(0.5) * (x + y);
  acc_t s = 0;
  if (x > 0) s += x * std::log(x / m);
  if (y > 0) s += y * std::log(y / m);
  return s;
}

#ifdef AM_AVX2_PATH
// Four entry pairs' JSD terms added into s, in double: the smaller of each pair as the ratio
// u = min / m <= 1 and the larger as 2 - u (one division for both), their logs four-wide
// (vec::log4). Returns the lanes it leaves out of s for the scalar formula, as bits 0-3: a
// negative entry, or m NaN or infinite (a NaN or infinite entry, or a sum past DBL_MAX). A
// positive u below DBL_MIN (outside log4's domain: its log off by up to ~30) is kept: its
// term, min log u with min < DBL_MIN m, is off by less than 1e-305 m, far below an ulp of the
// larger entry's term (max log(2 - u) ~ m ln 2).
AM_AVX2 inline int jsd_step4(__m256d x, __m256d y, __m256d& s) {
  const __m256d zero = _mm256_setzero_pd(), one = _mm256_set1_pd(1.0);
  const __m256d lo = _mm256_min_pd(x, y), hi = _mm256_max_pd(x, y);
  const __m256d m = _mm256_mul_pd(_mm256_set1_pd(0.5), _mm256_add_pd(x, y));
  __m256d u = _mm256_div_pd(lo, m);
  u = _mm256_blendv_pd(u, one, _mm256_cmp_pd(hi, zero, _CMP_EQ_OQ));  // both 0: no terms
  const __m256d v = _mm256_sub_pd(_mm256_set1_pd(2.0), u);
  const __m256d terms = _mm256_fmadd_pd(lo, vec::log4(_mm256_blendv_pd(u, one, _mm256_cmp_pd(lo, zero, _CMP_EQ_OQ))),
                                        _mm256_mul_pd(hi, vec::log4(v)));
  // unordered comparisons (NaN) count as out of range
  const __m256d bad = _mm256_or_pd(_mm256_cmp_pd(lo, zero, _CMP_NGE_UQ),
                                   _mm256_cmp_pd(m, _mm256_set1_pd(std::numeric_limits<double>::max()), _CMP_NLE_UQ));
  s = _mm256_add_pd(s, _mm256_andnot_pd(bad, terms));
  return _mm256_movemask_pd(bad);
}

// Four entries of a row widened to double: all four, or the first n < 4 and zeros (which add
// no term) through a masked load.
AM_AVX2 inline __m256d load4(const float* x) { return _mm256_cvtps_pd(_mm_loadu_ps(x)); }
AM_AVX2 inline __m256d load4(const double* x) { return _mm256_loadu_pd(x); }
AM_AVX2 inline __m256d load4(const float* x, int64_t n) {
  const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(n)), _mm_setr_epi32(0, 1, 2, 3));
  return _mm256_cvtps_pd(_mm_maskload_ps(x, mask));
}
AM_AVX2 inline __m256d load4(const double* x, int64_t n) {
  const __m256i mask = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
  return _mm256_maskload_pd(x, mask);
}

// One row's JSD, four entries a step, the last one to three through a masked load; the lanes
// jsd_step4 leaves out through jsd_terms, and bad set (any entry negative or not finite is among
// them, so the checks need no pass of their own).
template <typename scalar_t>
AM_AVX2 double jsd_row_avx2(const scalar_t* a, const scalar_t* b, int64_t k, bool& bad) {
  __m256d s = _mm256_setzero_pd();
  double rest = 0;
  for (int64_t i = 0; i < k; i += 4) {
    const int64_t n = std::min<int64_t>(4, k - i);
    const int out = n == 4 ? jsd_step4(load4(a + i), load4(b + i), s) : jsd_step4(load4(a + i, n), load4(b + i, n), s);
    bad |= out != 0;
    for (int64_t j = 0; out != 0 && j < n; ++j) {
      if (out >> j & 1) rest += jsd_terms<double>(a[i + j], b[i + j]);
    }
  }
  // Each pair's terms sum to >= 0 exactly; rounding may leave a tiny negative.
  return std::max(0.0, 0.5 * (vec::sum4(s) + rest));
}
#endif

at::Tensor jsd_scalar(const at::Tensor& p, const at::Tensor& q) {
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "jsd_cpu", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    out = rowwise<scalar_t>(p, q, [](const scalar_t* a, int64_t sa, const scalar_t* b, int64_t sb, scalar_t* o,
                                     int64_t n, int64_t k) {
      for (int64_t i = 0; i < n; ++i, a += sa, b += sb) {
        acc_t s = 0;  // the logs dominate the cost here, so one running sum is as fast as several
        for (int64_t j = 0; j < k; ++j) s += jsd_terms<acc_t>(a[j], b[j]);
        o[i] = static_cast<scalar_t>(std::max(acc_t(0), acc_t(0.5) * s));  // see jsd_row_avx2
      }
      return 0;
    }).first;
  });
  return out;
}

#ifdef AM_AVX2_PATH
// Eight entries of a float32 row: |x - y| widened to double into s_lo / s_hi (four lanes
// each), and whether an entry of x / y lies outside [0, max] (NaN, infinite or negative:
// unordered comparisons count as true) ORed into out_x / out_y as comparison masks.
AM_AVX2 inline void tvd_step8(__m256 x, __m256 y, __m256d& s_lo, __m256d& s_hi, __m256& out_x, __m256& out_y) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 largest = _mm256_set1_ps(std::numeric_limits<float>::max());
  const __m256d sign = _mm256_set1_pd(-0.0);
  out_x = _mm256_or_ps(out_x, _mm256_or_ps(_mm256_cmp_ps(x, zero, _CMP_NGE_UQ), _mm256_cmp_ps(x, largest, _CMP_NLE_UQ)));
  out_y = _mm256_or_ps(out_y, _mm256_or_ps(_mm256_cmp_ps(y, zero, _CMP_NGE_UQ), _mm256_cmp_ps(y, largest, _CMP_NLE_UQ)));
  const __m256d lo = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
  const __m256d hi = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
  s_lo = _mm256_add_pd(s_lo, _mm256_andnot_pd(sign, lo));
  s_hi = _mm256_add_pd(s_hi, _mm256_andnot_pd(sign, hi));
}

// One float32 row's TVD sum and whether an entry of a / b lies outside [0, max]: eight
// entries a step (tvd_step8), the last one to seven through a masked load (the zeros past
// the row pass the checks and add nothing). One pass where the scalar path needs the
// distance's and the checks' (the checks alone cost as much as the distance on SST-sized
// inputs: both read memory past L2).
AM_AVX2 inline double tvd_row_avx2(const float* a, const float* b, int64_t k, bool& bad_a, bool& bad_b) {
  __m256d s_lo = _mm256_setzero_pd(), s_hi = _mm256_setzero_pd();
  __m256 out_a = _mm256_setzero_ps(), out_b = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) tvd_step8(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s_lo, s_hi, out_a, out_b);
  if (i < k) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k - i)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    tvd_step8(_mm256_maskload_ps(a + i, mask), _mm256_maskload_ps(b + i, mask), s_lo, s_hi, out_a, out_b);
  }
  bad_a = _mm256_movemask_ps(out_a) != 0;
  bad_b = _mm256_movemask_ps(out_b) != 0;
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(s_lo, s_hi));
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

// tvd's AVX2 row pays a masked step and a horizontal sum per row: on narrower rows (model
// outputs, C = 2) the scalar row and a checks pass of their own are faster (100,000 x 2:
// 473 + 151 us against 720 us, one thread; from 8 entries the AVX2 row wins: 666 against 852 us).
constexpr int64_t kTvdAvx2Width = 8;

// Chunks of rows on AVX2 and FMA CPUs (rowwise's rows_fn), with value_flags' bits of the rows
// the kernels mark bad: tvd of float32 rows, jsd of float32 or float64 rows.
AM_AVX2 int32_t tvd_rows_avx2(const float* a, int64_t sa, const float* b, int64_t sb, float* out, int64_t n,
                              int64_t k) {
  int32_t f = 0;
  for (int64_t i = 0; i < n; ++i, a += sa, b += sb) {
    bool bad_a = false, bad_b = false;
    out[i] = static_cast<float>(0.5 * tvd_row_avx2(a, b, k, bad_a, bad_b));
    if (bad_a || bad_b) f |= row_flags(a, b, k);
  }
  return f;
}

template <typename scalar_t>
AM_AVX2 int32_t jsd_rows_avx2(const scalar_t* a, int64_t sa, const scalar_t* b, int64_t sb, scalar_t* out,
                              int64_t n, int64_t k) {
  int32_t f = 0;
  for (int64_t i = 0; i < n; ++i, a += sa, b += sb) {
    bool bad = false;
    out[i] = static_cast<scalar_t>(jsd_row_avx2(a, b, k, bad));
    if (bad) f |= row_flags(a, b, k);
  }
  return f;
}

std::pair<at::Tensor, int32_t> jsd_avx2(const at::Tensor& p, const at::Tensor& q) {
  std::pair<at::Tensor, int32_t> out;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "jsd_cpu", [&] { out = rowwise<scalar_t>(p, q, jsd_rows_avx2<scalar_t>); });
  return out;
}
#endif

// tvd or jsd of p and q; with `flags`, value_flags' bits of their entries ORed into it: from
// the distance's own pass where the AVX2 kernels run (jsd; tvd of float32 rows of at least
// kTvdAvx2Width entries), else in a pass of their own (none without `flags`).
template <bool JSD>
at::Tensor distance_rows(const at::Tensor& p, const at::Tensor& q, int32_t* flags) {
#ifdef AM_AVX2_PATH
  if (avx2_fma() && (JSD || (p.scalar_type() == at::kFloat && p.size(-1) >= kTvdAvx2Width))) {
    auto [out, f] = JSD ? jsd_avx2(p, q) : rowwise<float>(p, q, tvd_rows_avx2);
    if (flags != nullptr) *flags |= f;
    return out;
  }
#endif
  if (flags != nullptr) *flags |= row_entry_flags(p) | row_entry_flags(q) << 2;
  return JSD ? jsd_scalar(p, q) : tvd_scalar(p, q);
}

template <bool JSD>
at::Tensor distance_cpu(const at::Tensor& p, const at::Tensor& q) {
  check_inputs(JSD ? "jsd" : "tvd", p, q);
  return distance_rows<JSD>(p, q, nullptr);
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
  return distance_rows<JSD>(p, q, flags.mutable_data_ptr<int32_t>());
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) {
  m.impl("tvd", &distance_cpu<false>);
  m.impl("jsd", &distance_cpu<true>);
  m.impl("value_flags", &value_flags_cpu);
  m.impl("tvd_checked", &distance_checked_cpu<false>);
  m.impl("jsd_checked", &distance_checked_cpu<true>);
}

}  // namespace attnmetrics
