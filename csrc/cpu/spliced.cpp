// CPU impl of spliced_attention (schema in ops.cpp). Sequences in parallel, each in two
// passes over the positions that get attention: the scores (the two table rows' first A
// features added, through tanh or not, dotted with v), then the softmax's weights and the
// weighted sum of the remaining features. In float32 on a CPU with AVX2 and FMA the scores
// take eight features at a time (cpu/vec_avx2.h); float64 and other CPUs the scalar path.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "checks.h"
#include "cpu/vec_avx2.h"
#include "kernels/activations.h"

namespace {

// v . act(a + b) over [from, A), act tanh or the identity.
template <typename scalar_t>
scalar_t score_scalar(const scalar_t* a, const scalar_t* b, const scalar_t* v, int64_t A,
                      bool tanh, int64_t from = 0) {
  scalar_t s = 0;
  for (int64_t k = from; k < A; ++k) {
    const scalar_t x = a[k] + b[k];
    s += v[k] * (tanh ? attnmetrics::tanh_by_sigmoid(x) : x);
  }
  return s;
}

#ifdef AM_AVX2_PATH
using namespace attnmetrics::vec;

AM_AVX2 float score_avx2(const float* a, const float* b, const float* v, int64_t A, bool tanh) {
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= A; k += 8) {
    __m256 x = _mm256_add_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k));
    if (tanh) x = tanh8(x);
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(v + k), x, acc);
  }
  return sum8(acc) + score_scalar(a, b, v, A, tanh, k);
}
#endif

float score(const float* a, const float* b, const float* v, int64_t A, bool tanh) {
#ifdef AM_AVX2_PATH
  if (avx2_fma()) return score_avx2(a, b, v, A, tanh);
#endif
  return score_scalar(a, b, v, A, tanh);
}

double score(const double* a, const double* b, const double* v, int64_t A, bool tanh) {
  return score_scalar(a, b, v, A, tanh);
}

at::Tensor spliced_attention_cpu(const at::Tensor& table, const at::Tensor& pairs,
                                 const at::Tensor& lengths, const at::Tensor& v, int64_t lead,
                                 int64_t trail, bool tanh) {
  for (const auto& [t, name] : {std::pair{&table, "table"}, {&pairs, "pairs"},
                                {&lengths, "lengths"}, {&v, "v"}}) {
    TORCH_CHECK(t->device().is_cpu(), name, " must be a CPU tensor, got ", t->device());
  }
  const auto [N, W, D, A] =
      attnmetrics::check_spliced_attention_inputs(table, pairs, lengths, v, lead, trail);
  const int64_t* len = lengths.const_data_ptr<int64_t>();
  const int64_t* pair = pairs.const_data_ptr<int64_t>();
  attnmetrics::check_spliced_attention_values(len, pair, N, W, table.size(0), lead, trail);
  const int64_t C = D - A;

  at::Tensor out = at::zeros({N, C}, table.options());
  AT_DISPATCH_FLOATING_TYPES(table.scalar_type(), "spliced_attention", [&] {
    const scalar_t* rows = table.const_data_ptr<scalar_t>();
    const scalar_t* w = v.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, W * D));
    at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> scores(static_cast<size_t>(W));
      for (int64_t i = begin; i < end; ++i) {
        const int64_t hi = len[i] - trail;
        if (hi <= lead) continue;  // no position gets attention: the zero context
        const int64_t* p = pair + i * W * 2;
        scalar_t top = -INFINITY;
        for (int64_t j = lead; j < hi; ++j) {
          scores[j] = score(rows + p[2 * j] * D, rows + p[2 * j + 1] * D, w, A, tanh);
          top = std::max(top, scores[j]);
        }
        scalar_t total = 0;
        scalar_t* o = dst + i * C;
        for (int64_t j = lead; j < hi; ++j) {
          const scalar_t e = std::exp(scores[j] - top);
          total += e;
          const scalar_t *a = rows + p[2 * j] * D + A, *b = rows + p[2 * j + 1] * D + A;
          for (int64_t c = 0; c < C; ++c) o[c] += e * (a[c] + b[c]);
        }
        for (int64_t c = 0; c < C; ++c) o[c] /= total;
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) { m.impl("spliced_attention", &spliced_attention_cpu); }
