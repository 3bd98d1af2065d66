// CPU impls of flip_search_linear and renormalised_contexts (schemas in ops.cpp).
// The per-row algorithm is in kernels/flip.h; this file validates the inputs so
// that no input can make it read or write out of bounds, and runs rows in
// parallel.
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include "checks.h"
#include "kernels/flip.h"

namespace {

void check_cpu_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// Checks shared by both ops: attention [B, T] float, order [B, T] int64,
// lengths [B] int64 in [0, T], and each order prefix a permutation of 0..L-1.
void check_rows(const at::Tensor& attention, const at::Tensor& order, const at::Tensor& lengths) {
  check_cpu_contiguous(attention, "attention");
  check_cpu_contiguous(order, "order");
  check_cpu_contiguous(lengths, "lengths");
  attnmetrics::check_flip_shapes(attention, order, lengths);
  const int64_t B = attention.size(0), T = attention.size(1);

  const int64_t* len = lengths.data_ptr<int64_t>();
  attnmetrics::check_length_range(len, B, 0, "0", T);
  const int64_t* ord = order.data_ptr<int64_t>();
  at::parallel_for(0, B, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, T)),
                   [&](int64_t begin, int64_t end) {
                     std::vector<unsigned char> seen(static_cast<size_t>(T));
                     for (int64_t b = begin; b < end; ++b) {
                       const int64_t* o = ord + b * T;
                       int64_t k = 0;
                       TORCH_CHECK(attnmetrics::flip::order_is_permutation(o, len[b], seen.data(), &k),
                                   "order[", b, "][:", len[b], "] must be a permutation of 0..",
                                   len[b] - 1, ": entry order[", b, "][", k, "] = ", o[k],
                                   " is out of range or repeated");
                     }
                   });
}

std::tuple<at::Tensor, at::Tensor> flip_search_linear_cpu(const at::Tensor& attention,
                                                          const at::Tensor& projected,
                                                          const at::Tensor& bias,
                                                          const at::Tensor& order,
                                                          const at::Tensor& lengths) {
  check_rows(attention, order, lengths);
  check_cpu_contiguous(projected, "projected");
  check_cpu_contiguous(bias, "bias");
  const int64_t B = attention.size(0), T = attention.size(1);
  const int64_t C = attnmetrics::check_linear_head(attention, projected, bias);

  auto removed = at::empty({B}, attention.options().dtype(at::kLong));
  auto mass = at::empty({B}, attention.options());
  AT_DISPATCH_FLOATING_TYPES(attention.scalar_type(), "flip_search_linear", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    const scalar_t* att = attention.data_ptr<scalar_t>();
    const scalar_t* proj = projected.data_ptr<scalar_t>();
    const scalar_t* bi = bias.data_ptr<scalar_t>();
    const int64_t* ord = order.data_ptr<int64_t>();
    const int64_t* len = lengths.data_ptr<int64_t>();
    int64_t* out_removed = removed.data_ptr<int64_t>();
    scalar_t* out_mass = mass.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, T * C));
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> suffix(static_cast<size_t>(C));
      for (int64_t b = begin; b < end; ++b) {
        acc_t m = acc_t(0);
        const int64_t k = attnmetrics::flip::linear_row<scalar_t, acc_t>(
            att + b * T, proj + b * T * C, bi, ord + b * T, len[b], C, suffix.data(), &m);
        out_removed[b] = k;
        out_mass[b] = k < 0 ? std::numeric_limits<scalar_t>::quiet_NaN() : static_cast<scalar_t>(m);
      }
    });
  });
  return {removed, mass};
}

at::Tensor renormalised_contexts_cpu(const at::Tensor& attention, const at::Tensor& values,
                                     const at::Tensor& order, const at::Tensor& lengths,
                                     const at::Tensor& offsets) {
  check_rows(attention, order, lengths);
  check_cpu_contiguous(values, "values");
  check_cpu_contiguous(offsets, "offsets");
  const int64_t B = attention.size(0), T = attention.size(1);
  const int64_t H = attnmetrics::check_contexts_shapes(attention, values, offsets);
  // Offsets decide where each row writes: they must be exactly the exclusive
  // cumsum of lengths, or rows would overlap or run past the output.
  const int64_t* len = lengths.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(off[b] == total, "offsets must be the exclusive cumsum of lengths: offsets[", b,
                "] = ", off[b], ", expected ", total);
    total += len[b];
  }

  auto out = at::empty({total, H}, values.options());
  AT_DISPATCH_FLOATING_TYPES(attention.scalar_type(), "renormalised_contexts", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    const scalar_t* att = attention.data_ptr<scalar_t>();
    const scalar_t* val = values.data_ptr<scalar_t>();
    const int64_t* ord = order.data_ptr<int64_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, T * H));
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> suffix(static_cast<size_t>(H));
      for (int64_t b = begin; b < end; ++b) {
        attnmetrics::flip::contexts_row<scalar_t, acc_t>(att + b * T, val + b * T * H,
                                                         ord + b * T, len[b], H, suffix.data(),
                                                         dst + off[b] * H);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) {
  m.impl("flip_search_linear", &flip_search_linear_cpu);
  m.impl("renormalised_contexts", &renormalised_contexts_cpu);
}
