// CPU impl of lstm_runs (schema in ops.cpp). Per step: one GEMM for every run still going,
// h @ [W_hh.T | M.T] (the gates' recurrent part of this step and the features of the last),
// then one fused pass per run over its units: gate table row + product, the four gates, the
// cell and hidden states (kernels/lstm.h). In float32 on a CPU with AVX2 and FMA the pass
// runs eight units at a time with a vector exp; that path is compiled for those
// instructions alone (a target attribute) and chosen at run time, so the build needs no
// -march flag.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "checks.h"
#include "cpu/vec_avx2.h"
#include "kernels/lstm.h"

namespace {

using attnmetrics::lstm::cell;

// One run's step over its H units: in (its gate table row) + pre (its recurrent product),
// both [4H]; c, h [H] updated in place.
template <typename scalar_t>
void cells(const scalar_t* in, const scalar_t* pre, scalar_t* c, scalar_t* h, int64_t H,
           int64_t from = 0) {
  for (int64_t j = from; j < H; ++j) {
    h[j] = cell(in[j] + pre[j], in[H + j] + pre[H + j], in[2 * H + j] + pre[2 * H + j],
                in[3 * H + j] + pre[3 * H + j], c[j]);
  }
}

#ifdef AM_AVX2_PATH
using namespace attnmetrics::vec;

// Pre-activations of the eight units from `at` (a lambda would not inherit the target).
AM_AVX2 inline __m256 gate8(const float* in, const float* pre, int64_t at) {
  return _mm256_add_ps(_mm256_loadu_ps(in + at), _mm256_loadu_ps(pre + at));
}

AM_AVX2 void cells_avx2(const float* in, const float* pre, float* c, float* h, int64_t H) {
  int64_t j = 0;
  for (; j + 8 <= H; j += 8) {
    const __m256 c1 = _mm256_fmadd_ps(sigmoid8(gate8(in, pre, H + j)), _mm256_loadu_ps(c + j),
                                      _mm256_mul_ps(sigmoid8(gate8(in, pre, j)),
                                                    tanh8(gate8(in, pre, 2 * H + j))));
    _mm256_storeu_ps(c + j, c1);
    _mm256_storeu_ps(h + j, _mm256_mul_ps(sigmoid8(gate8(in, pre, 3 * H + j)), tanh8(c1)));
  }
  cells(in, pre, c, h, H, j);
}
#endif

void run_cells(const float* in, const float* pre, float* c, float* h, int64_t H) {
#ifdef AM_AVX2_PATH
  if (avx2_fma()) return cells_avx2(in, pre, c, h, H);
#endif
  cells(in, pre, c, h, H);
}

void run_cells(const double* in, const double* pre, double* c, double* h, int64_t H) {
  cells(in, pre, c, h, H);
}

void lstm_runs_cpu(const at::Tensor& gates, const at::Tensor& index, const at::Tensor& counts,
                   const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& weight,
                   at::Tensor out, const std::optional<at::Tensor>& states) {
  for (const auto& [t, name] : {std::pair{&gates, "gates"}, {&index, "index"},
                                {&counts, "counts"}, {&h0, "h0"}, {&c0, "c0"},
                                {&weight, "weight"}, {&out, "out"}}) {
    TORCH_CHECK(t->device().is_cpu(), name, " must be a CPU tensor, got ", t->device());
  }
  TORCH_CHECK(!states || states->device().is_cpu(), "states must be a CPU tensor, got ",
              states->device());
  const auto [S, N, H, D] =
      attnmetrics::check_lstm_runs_inputs(gates, index, counts, h0, c0, weight, out, states);
  const int64_t* cnt = counts.const_data_ptr<int64_t>();
  const int64_t* idx = index.const_data_ptr<int64_t>();
  attnmetrics::check_lstm_runs_values(cnt, idx, S, N, gates.size(0));
  const int64_t W = 4 * H + D;

  at::Tensor h = h0.clone(), c = c0.clone(), pre = at::empty({N, W}, gates.options());
  if (states) states->zero_();
  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lstm_runs", [&] {
    const scalar_t* table = gates.const_data_ptr<scalar_t>();
    const scalar_t* p = pre.const_data_ptr<scalar_t>();
    scalar_t *hs = h.mutable_data_ptr<scalar_t>(), *cs = c.mutable_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    scalar_t* kept = states ? states->mutable_data_ptr<scalar_t>() : nullptr;  // h, then c
    // Step s (s = S: the last features only): the runs that did step s - 1 (`done`, whose
    // features this step's product holds) and those doing step s (`now`, a prefix of them).
    int64_t done = 0, now = N;
    for (int64_t s = 0; s <= S; ++s) {
      while (now > 0 && (s == S || cnt[now - 1] <= s)) --now;
      const int64_t rows = std::max(done, now);
      scalar_t* features = s > 0 ? dst + (s - 1) * N * D : nullptr;
      if (rows > 0) {
        at::Tensor into = pre.narrow(0, 0, rows);
        at::mm_out(into, h.narrow(0, 0, rows), weight);
      }
      at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / W), [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          if (k < done) std::memcpy(features + k * D, p + k * W + 4 * H, D * sizeof(scalar_t));
          if (k >= now) continue;
          run_cells(table + idx[s * N + k] * 4 * H, p + k * W, cs + k * H, hs + k * H, H);
          if (kept != nullptr) {
            std::memcpy(kept + (s * N + k) * H, hs + k * H, H * sizeof(scalar_t));
            std::memcpy(kept + ((S + s) * N + k) * H, cs + k * H, H * sizeof(scalar_t));
          }
        }
      });
      if (s > 0) std::fill(features + done * D, features + N * D, scalar_t(0));
      done = now;
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) { m.impl("lstm_runs", &lstm_runs_cpu); }
