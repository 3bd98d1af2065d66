// Attention rollout (Abnar & Zuidema 2020, sec. 3; docs/definitions.md §17), shared by
// the CPU and CUDA back ends. Plain functions on raw pointers, no torch headers, so
// that `nvcc -c` can compile-check them without a CUDA build of torch.
//
// One batch row: attentions [layers, heads, T, T] (contiguous) of which the top-left
// L x L block is valid. Layer l's mixed attention is
//     M_l[i, j] = (1 - r) * mean_h A[l, h, i, j] + r * [i == j],   i, j < L,
// each row then divided by its sum (a row summing to 0 stays 0), and the rollout is the
// product R = M_{layers-1} ... M_1 M_0. Both back ends mix with the same operations in the
// same order (heads ascending, then the row sum over columns), so their M_l are the same
// bits (--fmad=false); the CPU multiplies with BLAS, the GPU with product_entry, so the
// rollouts agree to rounding.
#pragma once

#include <cstdint>

#include "kernels/macros.h"

namespace attnmetrics {
namespace rollout {

// The largest finite value of the type (no <limits>: the header also builds with nvcc).
template <typename scalar_t>
constexpr scalar_t kHuge = sizeof(scalar_t) == 4 ? scalar_t(3.4028234663852886e38)
                                                  : scalar_t(1.7976931348623157e308);

// M_l[i, j] before renormalisation; `layer` points at A[l, 0, 0, 0].
template <typename scalar_t>
AM_HOST_DEVICE inline scalar_t mixed_entry(const scalar_t* layer, int64_t heads, int64_t T,
                                           int64_t i, int64_t j, scalar_t residual) {
  scalar_t sum = 0;
  for (int64_t h = 0; h < heads; ++h) sum += layer[(h * T + i) * T + j];
  scalar_t v = (scalar_t(1) - residual) * (sum / static_cast<scalar_t>(heads));
  if (i == j) v += residual;
  return v;
}

// Divides row[0 .. L) by its sum, summed in column order (a row summing to 0 stays 0).
template <typename scalar_t>
AM_HOST_DEVICE inline void normalise_row(scalar_t* row, int64_t L) {
  scalar_t total = 0;
  for (int64_t j = 0; j < L; ++j) total += row[j];
  for (int64_t j = 0; j < L; ++j) row[j] = total > 0 ? row[j] / total : scalar_t(0);
}

// Row i of the renormalised M_l into out[0 .. L).
template <typename scalar_t>
AM_HOST_DEVICE inline void mixed_row(const scalar_t* layer, int64_t heads, int64_t T, int64_t L,
                                     int64_t i, scalar_t residual, scalar_t* out) {
  for (int64_t j = 0; j < L; ++j) out[j] = mixed_entry(layer, heads, T, i, j, residual);
  normalise_row(out, L);
}

// (M R)[i, j] for M's row i `m_row` [L] and R [L, L] with row stride ld.
template <typename scalar_t>
AM_HOST_DEVICE inline scalar_t product_entry(const scalar_t* m_row, const scalar_t* R, int64_t ld,
                                             int64_t L, int64_t j) {
  scalar_t acc = 0;
  for (int64_t k = 0; k < L; ++k) acc += m_row[k] * R[k * ld + j];
  return acc;
}

// A valid attention value: finite and non-negative (false for NaN).
template <typename scalar_t>
AM_HOST_DEVICE inline bool valid_value(scalar_t a) {
  return a >= scalar_t(0) && a <= kHuge<scalar_t>;
}

// The CPU's mixing of a whole layer into M [L, L] (row stride L): the same operations per
// entry as mixed_entry and mixed_row, with heads outside the column loop so that it
// vectorises. Returns whether every value read was valid (checked on the way: the
// values are read once).
template <typename scalar_t>
inline bool mix_layer(const scalar_t* layer, int64_t heads, int64_t T, int64_t L,
                      scalar_t residual, scalar_t* M) {
  const scalar_t keep = scalar_t(1) - residual, n = static_cast<scalar_t>(heads);
  int ok = 1;
  for (int64_t i = 0; i < L; ++i) {
    scalar_t* out = M + i * L;
    for (int64_t j = 0; j < L; ++j) out[j] = 0;
    for (int64_t h = 0; h < heads; ++h) {
      const scalar_t* a = layer + (h * T + i) * T;
      for (int64_t j = 0; j < L; ++j) {
        out[j] += a[j];
        ok &= static_cast<int>(valid_value(a[j]));
      }
    }
    for (int64_t j = 0; j < L; ++j) out[j] = keep * (out[j] / n);
    out[i] += residual;
    normalise_row(out, L);
  }
  return ok != 0;
}

// The first (layer, head) of one row whose valid L x L block holds an invalid value, as
// layer * heads + head; -1 when there is none. Error path only.
template <typename scalar_t>
inline int64_t first_invalid_head(const scalar_t* att, int64_t layers, int64_t heads, int64_t T,
                                  int64_t L) {
  for (int64_t lh = 0; lh < layers * heads; ++lh) {
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t j = 0; j < L; ++j) {
        if (!valid_value(att[(lh * T + i) * T + j])) return lh;
      }
    }
  }
  return -1;
}

}  // namespace rollout
}  // namespace attnmetrics
