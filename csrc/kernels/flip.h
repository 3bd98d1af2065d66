// Per-row flip search (S&S 2019, sec. 4; docs/definitions.md §3, §4), shared by the CPU and
// CUDA back ends. Plain functions on raw pointers, no torch headers, so that
// `nvcc -c` can compile-check them without a CUDA build of torch.
//
// Conventions: a row holds T positions of which the first L are valid; `order`
// lists the removal order (its first L entries are a permutation of 0..L-1).
// "Removing the first k items" leaves positions order[k..L-1]; their weights are
// renormalised to sum to 1 (L1), or the context is the zero vector if they sum
// to exactly 0. Everything accumulates in acc_t (double for float inputs on CPU).
#pragma once

#include <cstdint>

#include "kernels/macros.h"

namespace attnmetrics {
namespace flip {

// True iff order[0..L-1] is a permutation of 0..L-1. `seen` is scratch of at
// least L bytes. On failure *bad_pos is the offending position in `order`.
AM_HOST_DEVICE inline bool order_is_permutation(const int64_t* order, int64_t L,
                                                unsigned char* seen, int64_t* bad_pos) {
  for (int64_t i = 0; i < L; ++i) seen[i] = 0;
  for (int64_t k = 0; k < L; ++k) {
    const int64_t i = order[k];
    if (i < 0 || i >= L || seen[i]) {
      *bad_pos = k;
      return false;
    }
    seen[i] = 1;
  }
  return true;
}

// Decision for logits suffix[c] / mass + bias[c] (bias alone when mass == 0):
// argmax with ties to the lower class; with C == 1 a sigmoid, class 1 iff logit > 0.
// Computed on the fly so that no logits buffer is needed.
template <typename scalar_t, typename acc_t>
AM_HOST_DEVICE inline int64_t affine_decision(const acc_t* suffix, acc_t mass,
                                              const scalar_t* bias, int64_t C) {
  const bool empty = (mass == acc_t(0));
  if (C == 1) {
    const acc_t z = (empty ? acc_t(0) : suffix[0] / mass) + static_cast<acc_t>(bias[0]);
    return z > acc_t(0) ? 1 : 0;
  }
  int64_t best = 0;
  acc_t best_z = (empty ? acc_t(0) : suffix[0] / mass) + static_cast<acc_t>(bias[0]);
  for (int64_t c = 1; c < C; ++c) {
    const acc_t z = (empty ? acc_t(0) : suffix[c] / mass) + static_cast<acc_t>(bias[c]);
    if (z > best_z) {  // strict: ties stay with the lower class
      best = c;
      best_z = z;
    }
  }
  return best;
}

// Flip search for one row with a linear decoder, on projected values
// proj[i * C + c] = (W h_i)_c. Returns the smallest k in [1, L-1] whose decision
// differs from the decision at k = 0, or -1; *removed_mass gets the attention
// removed at the flip (sum of the first k weights in order), untouched if -1.
//
// Suffix sums are built from the end (k = L-1 down to 0), never as total minus
// prefix, which would cancel catastrophically once most of the mass is gone.
// Walking k downwards, `first_change` is the smallest k' > k whose decision
// differs from d_k; at k = 0 that answers the question in O(1) extra state.
// `suffix` is scratch of C acc_t.
template <typename scalar_t, typename acc_t>
AM_HOST_DEVICE inline int64_t linear_row(const scalar_t* att, const scalar_t* proj,
                                         const scalar_t* bias, const int64_t* order,
                                         int64_t L, int64_t C, acc_t* suffix,
                                         acc_t* removed_mass) {
  if (L <= 1) return -1;  // at most L-1 removals: nothing can be removed
  for (int64_t c = 0; c < C; ++c) suffix[c] = acc_t(0);
  acc_t mass = acc_t(0);
  int64_t next_dec = -1;      // d_{k+1}
  int64_t first_change = -1;  // smallest k' > k with d_k' != d_k (-1: none)
  for (int64_t k = L - 1; k >= 0; --k) {
    const int64_t i = order[k];
    const acc_t a = static_cast<acc_t>(att[i]);
    const scalar_t* v = proj + i * C;
    for (int64_t c = 0; c < C; ++c) suffix[c] += a * static_cast<acc_t>(v[c]);
    mass += a;
    const int64_t dec = affine_decision<scalar_t, acc_t>(suffix, mass, bias, C);
    if (k < L - 1 && dec != next_dec) first_change = k + 1;
    next_dec = dec;
  }
  if (first_change < 0) return -1;
  acc_t gone = acc_t(0);
  for (int64_t k = 0; k < first_change; ++k) gone += static_cast<acc_t>(att[order[k]]);
  *removed_mass = gone;
  return first_change;
}

// Every renormalised context of one row: out[k * H + h] for k = 0..L-1 is the
// context after removing the first k items of `order`; values[i * H + h] is h_i.
// `suffix` is scratch of H acc_t.
template <typename scalar_t, typename acc_t>
AM_HOST_DEVICE inline void contexts_row(const scalar_t* att, const scalar_t* values,
                                        const int64_t* order, int64_t L, int64_t H,
                                        acc_t* suffix, scalar_t* out) {
  for (int64_t h = 0; h < H; ++h) suffix[h] = acc_t(0);
  acc_t mass = acc_t(0);
  for (int64_t k = L - 1; k >= 0; --k) {
    const int64_t i = order[k];
    const acc_t a = static_cast<acc_t>(att[i]);
    const scalar_t* v = values + i * H;
    for (int64_t h = 0; h < H; ++h) suffix[h] += a * static_cast<acc_t>(v[h]);
    mass += a;
    scalar_t* o = out + k * H;
    if (mass == acc_t(0)) {
      for (int64_t h = 0; h < H; ++h) o[h] = scalar_t(0);
    } else {
      for (int64_t h = 0; h < H; ++h) o[h] = static_cast<scalar_t>(suffix[h] / mass);
    }
  }
}

// Column h of contexts_row (out[k * H + h] for k = 0..L-1), for back ends that
// split a row's H columns across threads (the CUDA kernel gives a row to a warp,
// one column per lane). Column h of contexts_row depends on no other column and
// `mass` is the same sequence of additions, so without floating-point contraction
// both give the same bits (checked by tests/cuda/host_harness.cpp).
template <typename scalar_t, typename acc_t>
AM_HOST_DEVICE inline void contexts_column(const scalar_t* att, const scalar_t* values,
                                           const int64_t* order, int64_t L, int64_t H, int64_t h,
                                           scalar_t* out) {
  acc_t suffix = acc_t(0);
  acc_t mass = acc_t(0);
  for (int64_t k = L - 1; k >= 0; --k) {
    const int64_t i = order[k];
    const acc_t a = static_cast<acc_t>(att[i]);
    suffix += a * static_cast<acc_t>(values[i * H + h]);
    mass += a;
    out[k * H + h] = mass == acc_t(0) ? scalar_t(0) : static_cast<scalar_t>(suffix / mass);
  }
}

}  // namespace flip
}  // namespace attnmetrics
