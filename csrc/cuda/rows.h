// What one CUDA thread does, as plain AM_HOST_DEVICE functions of its index:
// the __global__ kernels in csrc/cuda/*.cu are thin wrappers around these, and
// tests/cuda/host_harness.cpp runs the same functions on the CPU by looping over
// every thread of a grid, which checks the row <-> thread <-> scratch mapping
// without a GPU. The per-row algorithms themselves are csrc/kernels/*.h, shared
// with the CPU back end. No torch or CUDA runtime headers.
//
// Thread-per-row kernels use grid-stride loops over "slots": thread `slot` of
// `slots` handles rows slot, slot + slots, ... and owns slot's piece of scratch.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/flip.h"
#include "kernels/kendall.h"
#include "kernels/macros.h"

namespace attnmetrics {
namespace gpu {

// ---- tvd / jsd -----------------------------------------------------------------------
// Lane `lane` of the `lanes` lanes given to a row sums items lane, lane + lanes, ...
// in double; the kernel then adds the lanes' partial sums in a fixed tree order.

template <typename scalar_t>
AM_HOST_DEVICE inline double tvd_partial(const scalar_t* a, const scalar_t* b, int64_t width,
                                         int64_t lane, int64_t lanes) {
  double s = 0.0;
  for (int64_t i = lane; i < width; i += lanes) {
    s += fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
  }
  return s;
}

template <typename scalar_t>
AM_HOST_DEVICE inline double jsd_partial(const scalar_t* a, const scalar_t* b, int64_t width,
                                         int64_t lane, int64_t lanes) {
  double s = 0.0;
  for (int64_t i = lane; i < width; i += lanes) {
    const double pa = static_cast<double>(a[i]);
    const double qb = static_cast<double>(b[i]);
    const double m = 0.5 * (pa + qb);
    // 0 log 0 = 0; m > 0 whenever a term is taken (as the CPU kernel).
    if (pa > 0.0) s += pa * log(pa / m);
    if (qb > 0.0) s += qb * log(qb / m);
  }
  return s;
}

AM_HOST_DEVICE inline double tvd_finish(double sum) { return 0.5 * sum; }

// Each pair's terms sum to >= 0 exactly; rounding may leave a tiny negative.
// Like the CPU's std::max(0, x), NaN gives 0.
AM_HOST_DEVICE inline double jsd_finish(double sum) {
  const double v = 0.5 * sum;
  return v > 0.0 ? v : 0.0;
}

// ---- kendall_tau ---------------------------------------------------------------------

// Scratch of one slot for rows of at most max_len items: tau_row's 2n sort keys
// of each kind. All slots' pair keys come first, then all slots' y keys.
template <typename scalar_t>
inline int64_t kendall_slot_bytes(int64_t max_len) {
  using K = kendall::RowKeys<scalar_t>;
  return 2 * max_len * static_cast<int64_t>(sizeof(typename K::pair_t) + sizeof(typename K::y_t));
}

template <typename scalar_t>
AM_HOST_DEVICE inline void kendall_slot(int64_t slot, int64_t slots, const scalar_t* x,
                                        const scalar_t* y, const int64_t* lengths, int64_t rows,
                                        int64_t width, int64_t max_len, unsigned char* scratch,
                                        const double* exact_table, scalar_t* tau,
                                        scalar_t* pvalue) {
  using K = kendall::RowKeys<scalar_t>;
  using pair_t = typename K::pair_t;
  using y_t = typename K::y_t;
  const int64_t keys = 2 * max_len;  // per slot, of each kind
  pair_t* pairs = reinterpret_cast<pair_t*>(scratch) + slot * keys;
  y_t* ys = reinterpret_cast<y_t*>(scratch + slots * keys * static_cast<int64_t>(sizeof(pair_t))) +
            slot * keys;
  for (int64_t b = slot; b < rows; b += slots) {
    double t, p;
    kendall::tau_row(x + b * width, y + b * width, lengths[b], pairs, ys, exact_table, &t, &p);
    tau[b] = static_cast<scalar_t>(t);
    pvalue[b] = static_cast<scalar_t>(p);
  }
}

// ---- flip search: input checks -------------------------------------------------------

AM_HOST_DEVICE inline void min_into(int64_t* target, int64_t value) {
#if defined(__CUDA_ARCH__)
  atomicMin(reinterpret_cast<long long*>(target), static_cast<long long>(value));
#else
  if (value < *target) *target = value;
#endif
}

// Index of the status entries written by check_rows_slot (preset to INT64_MAX).
constexpr int kBadLength = 0;  // smallest b with lengths[b] outside [0, width]
constexpr int kBadOrder = 1;   // smallest b (of valid length) whose order prefix is no permutation

// `seen`: width bytes per slot.
AM_HOST_DEVICE inline void check_rows_slot(int64_t slot, int64_t slots, const int64_t* order,
                                           const int64_t* lengths, int64_t rows, int64_t width,
                                           unsigned char* seen, int64_t* status) {
  unsigned char* mine = seen + slot * width;
  for (int64_t b = slot; b < rows; b += slots) {
    const int64_t L = lengths[b];
    if (L < 0 || L > width) {
      min_into(status + kBadLength, b);
      continue;
    }
    int64_t bad_pos = 0;
    if (!flip::order_is_permutation(order + b * width, L, mine, &bad_pos)) {
      min_into(status + kBadOrder, b);
    }
  }
}

// ---- flip search: linear decoder -----------------------------------------------------

// LOCAL > 0: the C <= LOCAL suffix sums live in a per-thread array; LOCAL == 0:
// in scratch, C doubles per slot. Lengths are trusted (checked beforehand).
template <typename scalar_t, int LOCAL>
AM_HOST_DEVICE inline void flip_linear_slot(int64_t slot, int64_t slots, const scalar_t* att,
                                            const scalar_t* proj, const scalar_t* bias,
                                            const int64_t* order, const int64_t* lengths,
                                            int64_t rows, int64_t width, int64_t classes,
                                            double* scratch, int64_t* removed, scalar_t* mass) {
  double local[LOCAL > 0 ? LOCAL : 1];
  double* suffix = LOCAL > 0 ? local : scratch + slot * classes;
  for (int64_t b = slot; b < rows; b += slots) {
    double m = 0.0;
    const int64_t k = flip::linear_row<scalar_t, double>(att + b * width,
                                                         proj + b * width * classes, bias,
                                                         order + b * width, lengths[b], classes,
                                                         suffix, &m);
    removed[b] = k;
    mass[b] = k < 0 ? static_cast<scalar_t>(NAN) : static_cast<scalar_t>(m);
  }
}

// ---- renormalised contexts -----------------------------------------------------------

// Row group `group` of `groups` (a warp) handles rows group, group + groups, ...;
// lane `lane` of `lanes` computes columns lane, lane + lanes, ... of each, so a
// warp reads and writes consecutive columns. Lengths and offsets are trusted.
template <typename scalar_t>
AM_HOST_DEVICE inline void contexts_lane(int64_t group, int64_t groups, int64_t lane,
                                         int64_t lanes, const scalar_t* att,
                                         const scalar_t* values, const int64_t* order,
                                         const int64_t* lengths, const int64_t* offsets,
                                         int64_t rows, int64_t width, int64_t hidden,
                                         scalar_t* out) {
  for (int64_t b = group; b < rows; b += groups) {
    for (int64_t h = lane; h < hidden; h += lanes) {
      flip::contexts_column<scalar_t, double>(att + b * width, values + b * width * hidden,
                                              order + b * width, lengths[b], hidden, h,
                                              out + offsets[b] * hidden);
    }
  }
}

}  // namespace gpu
}  // namespace attnmetrics
