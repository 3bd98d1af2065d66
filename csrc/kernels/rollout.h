// Attention rollout (Abnar & Zuidema 2020, sec. 3; docs/definitions.md §17), shared by
// the CPU and CUDA back ends. Plain functions on raw pointers, no torch headers, so
// that `nvcc -c` can compile-check them without a CUDA build of torch.
//
// One batch row: attentions [layers, heads, T, T] (contiguous) of which the top-left
// L x L block is valid. Layer l's mixed attention is
//     M_l[i, j] = (1 - r) * mean_h A[l, h, i, j] + r * [i == j],   i, j < L,
// each row then divided by its sum (a row summing to 0 stays 0), and the rollout is the
// product R = M_{layers-1} ... M_1 M_0. Both back ends call these functions with the
// same summation orders (heads, then columns, then the product's k ascending), so with
// --fmad=false they give the same bits.
#pragma once

#include <cstdint>

#include "kernels/macros.h"

namespace attnmetrics {
namespace rollout {

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

// The whole chain for one row on one thread (the CPU's): R [L, L] receives the rollout,
// next [L, L] and m_row [L] are scratch. The product runs row by row with k outside j,
// so the inner loop is a contiguous axpy that vectorises; every entry still sums its k
// in ascending order from 0, as product_entry does.
template <typename scalar_t>
inline void rollout_row(const scalar_t* att, int64_t layers, int64_t heads, int64_t T, int64_t L,
                        scalar_t residual, scalar_t* R, scalar_t* next, scalar_t* m_row) {
  const int64_t layer_size = heads * T * T;
  for (int64_t i = 0; i < L; ++i) mixed_row(att, heads, T, L, i, residual, R + i * L);
  for (int64_t l = 1; l < layers; ++l) {
    const scalar_t* layer = att + l * layer_size;
    for (int64_t i = 0; i < L; ++i) {
      mixed_row(layer, heads, T, L, i, residual, m_row);
      scalar_t* out = next + i * L;
      for (int64_t j = 0; j < L; ++j) out[j] = 0;
      for (int64_t k = 0; k < L; ++k) {
        const scalar_t m = m_row[k];
        const scalar_t* r = R + k * L;
        for (int64_t j = 0; j < L; ++j) out[j] += m * r[j];
      }
    }
    scalar_t* swap = R;
    R = next;
    next = swap;
  }
  // After an odd number of products the result sits in the caller's `next`: move it back.
  if ((layers - 1) % 2 == 1) {
    for (int64_t e = 0; e < L * L; ++e) next[e] = R[e];
  }
}

}  // namespace rollout
}  // namespace attnmetrics
