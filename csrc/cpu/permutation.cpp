// CPU impls of attention_permutations and permutation_tvd_linear (schemas in
// ops.cpp). The per-row algorithm is in kernels/permutation.h; this file
// validates the inputs so that no input can make it read or write out of
// bounds, and runs rows in parallel.
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "checks.h"
#include "kernels/permutation.h"

namespace {

namespace perm = attnmetrics::permutation;

void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
}

at::Tensor attention_permutations_cpu(const at::Tensor& lengths, int64_t width,
                                      int64_t permutations, int64_t seed, int64_t row_offset,
                                      int64_t permutation_offset) {
  check_cpu(lengths, "lengths");
  attnmetrics::check_permutations_args(lengths, width, permutations, row_offset,
                                       permutation_offset);
  attnmetrics::check_length_range(lengths.data_ptr<int64_t>(), lengths.size(0), 0, "0", width);
  const int64_t B = lengths.size(0), T = width, P = permutations;
  auto out = at::empty({B, P, T}, lengths.options());
  const int64_t* len = lengths.data_ptr<int64_t>();
  int64_t* dst = out.data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, P * T));
  at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      // unsigned sums: offsets near INT64_MAX wrap instead of overflowing
      const uint64_t key = perm::row_key(static_cast<uint64_t>(seed),
                                         static_cast<uint64_t>(row_offset) + static_cast<uint64_t>(b));
      for (int64_t p = 0; p < P; ++p) {
        int64_t* o = dst + (b * P + p) * T;
        perm::permutation_row(key, static_cast<uint64_t>(permutation_offset) + static_cast<uint64_t>(p),
                              len[b], o);
        for (int64_t t = len[b]; t < T; ++t) o[t] = t;  // padding: identity
      }
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> permutation_tvd_linear_cpu(
    const at::Tensor& attention, const at::Tensor& projected, const at::Tensor& bias,
    const at::Tensor& lengths, int64_t permutations, int64_t seed, int64_t row_offset) {
  check_cpu(attention, "attention");
  check_cpu(lengths, "lengths");
  attnmetrics::check_permutation_attention(attention, lengths);
  attnmetrics::check_length_range(lengths.data_ptr<int64_t>(), attention.size(0), 0, "0",
                                  attention.size(1));
  attnmetrics::check_permutation_counts(permutations, row_offset);
  check_cpu(projected, "projected");
  TORCH_CHECK(projected.is_contiguous(), "projected must be contiguous");
  check_cpu(bias, "bias");
  TORCH_CHECK(bias.is_contiguous(), "bias must be contiguous");
  const int64_t B = attention.size(0), T = attention.size(1), P = permutations;
  const int64_t C = attnmetrics::check_linear_head(attention, projected, bias);

  auto median = at::empty({B}, attention.options());
  auto tvd = at::empty({B, P}, attention.options());
  AT_DISPATCH_FLOATING_TYPES(attention.scalar_type(), "permutation_tvd_linear", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    const scalar_t* att = attention.data_ptr<scalar_t>();
    const scalar_t* proj = projected.data_ptr<scalar_t>();
    const scalar_t* bi = bias.data_ptr<scalar_t>();
    const int64_t* len = lengths.data_ptr<int64_t>();
    scalar_t* out_median = median.data_ptr<scalar_t>();
    scalar_t* out_tvd = tvd.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, T * C * P));
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      std::vector<uint32_t> order(static_cast<size_t>(T));  // T < 2^32 is checked
      std::vector<acc_t> u(static_cast<size_t>(T));
      std::vector<acc_t> z(static_cast<size_t>(C)), base(static_cast<size_t>(C));
      std::vector<acc_t> tvds(static_cast<size_t>(P)), sorted(static_cast<size_t>(P));
      for (int64_t b = begin; b < end; ++b) {
        const acc_t m = perm::linear_row<scalar_t, acc_t>(
            att + b * T, proj + b * T * C, bi, len[b], C, P, static_cast<uint64_t>(seed),
            static_cast<uint64_t>(row_offset) + static_cast<uint64_t>(b), order.data(), u.data(),
            z.data(), base.data(), tvds.data(), sorted.data());
        out_median[b] = static_cast<scalar_t>(m);
        for (int64_t p = 0; p < P; ++p) out_tvd[b * P + p] = static_cast<scalar_t>(tvds[p]);
      }
    });
  });
  return {median, tvd};
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) {
  m.impl("attention_permutations", &attention_permutations_cpu);
  m.impl("permutation_tvd_linear", &permutation_tvd_linear_cpu);
}
