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

#include "cuda/geometry.h"
#include "kernels/distances.h"
#include "kernels/flip.h"
#include "kernels/kendall.h"
#include "kernels/loo.h"
#include "kernels/macros.h"
#include "kernels/permutation.h"
#include "kernels/projection.h"

namespace attnmetrics {
namespace gpu {

// ---- tvd / jsd -----------------------------------------------------------------------
// Lane `lane` of the `lanes` lanes given to a row sums items lane, lane + lanes, ...
// in double; the kernel then adds the lanes' partial sums in a fixed tree order. Each
// lane also ORs value_flags' bits of the entries it reads into `flags`
// (kernels/distances.h entry_flag), which the checked launches gather: the checks cost
// no second pass over the inputs.

template <typename scalar_t>
AM_HOST_DEVICE inline double tvd_partial(const scalar_t* a, const scalar_t* b, int64_t width,
                                         int64_t lane, int64_t lanes, int& flags) {
  double s = 0.0;
  for (int64_t i = lane; i < width; i += lanes) {
    flags |= entry_flag(a[i]) | (entry_flag(b[i]) << 2);
    s += fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
  }
  return s;
}

template <typename scalar_t>
AM_HOST_DEVICE inline double jsd_partial(const scalar_t* a, const scalar_t* b, int64_t width,
                                         int64_t lane, int64_t lanes, int& flags) {
  double s = 0.0;
  for (int64_t i = lane; i < width; i += lanes) {
    flags |= entry_flag(a[i]) | (entry_flag(b[i]) << 2);
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

// ---- attention_permutations ---------------------------------------------------------

// Item i = b * P + p of rows * P (thread `item` of `stride` takes items item,
// item + stride, ...): permutation permutation_offset + p of row row_offset + b into
// out[i * width ..], the identity on padding. Lengths are trusted (checked beforehand).
AM_HOST_DEVICE inline void permutations_item(int64_t item, int64_t stride, const int64_t* lengths,
                                             int64_t rows, int64_t width, int64_t permutations,
                                             uint64_t seed, uint64_t row_offset,
                                             uint64_t permutation_offset, int64_t* out) {
  const int64_t items = rows * permutations;
  for (int64_t i = item; i < items; i += stride) {
    const int64_t b = i / permutations, p = i % permutations;
    const int64_t L = lengths[b];
    int64_t* o = out + i * width;
    // unsigned sums, as the CPU impl: offsets near INT64_MAX wrap instead of overflowing
    permutation::permutation_row(permutation::row_key(seed, row_offset + static_cast<uint64_t>(b)),
                                 permutation_offset + static_cast<uint64_t>(p), L, o);
    for (int64_t t = L; t < width; ++t) o[t] = t;
  }
}

// ---- permutation_tvd_linear ----------------------------------------------------------
// Thread per (row, permutation) item of a chunk of rows [begin, end): the CPU runs a
// row's P permutations in one thread, but a GPU needs the P-fold parallelism (a few
// thousand rows would not fill it). Each item recomputes its row's original output
// (O(L C), as much as its own permutation), where a shared copy would need another
// pass or a block-wide barrier; it is the same arithmetic, so the same bits.

// Scratch of one slot: z and base (C doubles each) when C > kLocalClasses (all slots'
// doubles first), then the shuffle's width uint32.
AM_HOST_DEVICE inline int64_t permutation_slot_doubles(int64_t classes) {
  return classes > kLocalClasses ? 2 * classes : 0;
}
inline int64_t permutation_slot_bytes(int64_t width, int64_t classes) {
  return permutation_slot_doubles(classes) * 8 + width * 4;
}

// LOCAL > 0: z and base in per-thread arrays (C <= LOCAL). Writes tvd[b * P + p] and
// chunk[(b - begin) * P + p] in double, the medians' input.
template <typename scalar_t, int LOCAL>
AM_HOST_DEVICE inline void permutation_tvd_slot(int64_t slot, int64_t slots, const scalar_t* att,
                                                const scalar_t* proj, const scalar_t* bias,
                                                const int64_t* lengths, int64_t begin,
                                                int64_t end, int64_t width, int64_t classes,
                                                int64_t permutations, uint64_t seed,
                                                uint64_t row_offset, unsigned char* scratch,
                                                double* chunk, scalar_t* tvd) {
  const int64_t doubles = permutation_slot_doubles(classes);
  double local[LOCAL > 0 ? 2 * LOCAL : 1];
  double* z = LOCAL > 0 ? local : reinterpret_cast<double*>(scratch) + slot * doubles;
  double* base = z + (LOCAL > 0 ? LOCAL : classes);
  uint32_t* perm = reinterpret_cast<uint32_t*>(scratch + slots * doubles * 8) + slot * width;
  const int64_t items = (end - begin) * permutations;
  for (int64_t i = slot; i < items; i += slots) {
    const int64_t b = begin + i / permutations, p = i % permutations;
    const int64_t L = lengths[b];
    double v = 0.0;  // rows with L <= 1: TVD 0
    if (L >= 2) {
      const scalar_t* a = att + b * width;
      const scalar_t* v_proj = proj + b * width * classes;
      permutation::linear_original<scalar_t, double>(a, v_proj, bias, L, classes, nullptr, base);
      v = permutation::linear_permuted<scalar_t, double>(
          a, v_proj, bias, L, classes, permutation::row_key(seed, row_offset + static_cast<uint64_t>(b)),
          static_cast<uint64_t>(p), nullptr, base, perm, z);
    }
    chunk[i] = v;
    tvd[b * permutations + p] = static_cast<scalar_t>(v);
  }
}

// Thread `row` of `stride` takes chunk rows row, row + stride, ...: the numpy median of
// the row's P double TVDs (kernels/permutation.h median, the CPU's quickselect, run by
// one thread on the row's chunk entries; it reorders them).
template <typename scalar_t>
AM_HOST_DEVICE inline void permutation_median_row(int64_t row, int64_t stride, int64_t begin,
                                                  int64_t end, int64_t permutations,
                                                  double* chunk, scalar_t* median) {
  for (int64_t r = row; r < end - begin; r += stride) {
    median[begin + r] = static_cast<scalar_t>(permutation::median(chunk + r * permutations, permutations));
  }
}

// ---- project_prefix ------------------------------------------------------------------

// Output element i = (b * width + t) * C + c of [rows, width, C] per thread (grid-stride):
// the CPU's dot product (same partial sums), or 0 on padding. Lengths are trusted.
template <typename scalar_t>
AM_HOST_DEVICE inline void project_item(int64_t item, int64_t stride, const scalar_t* values,
                                        const scalar_t* weight, const int64_t* lengths,
                                        int64_t rows, int64_t width, int64_t hidden,
                                        int64_t classes, scalar_t* out) {
  const int64_t items = rows * width * classes;
  for (int64_t i = item; i < items; i += stride) {
    const int64_t bt = i / classes, c = i % classes;
    const int64_t b = bt / width, t = bt % width;
    out[i] = t < lengths[b] ? projection::dot<scalar_t, projection::partial_sums<scalar_t>()>(
                                  values + bt * hidden, weight + c * hidden, hidden)
                            : scalar_t(0);
  }
}

// ---- leave_one_out_batch -------------------------------------------------------------

// The row sequence k comes from: the last b with offsets[b] <= k (offsets = exclusive
// cumsum of the rows' real counts, so rows without real tokens share the next offset).
AM_HOST_DEVICE inline int64_t loo_source_row(const int64_t* offsets, int64_t rows, int64_t k) {
  int64_t lo = 0, hi = rows - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (offsets[mid] <= k) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Sequence group, group + groups, ... of `total` per group of `lanes` lanes (a warp),
// lane `lane` writing ids lane, lane + lanes, ... of each (coalesced). Lengths and
// offsets are trusted (the glue computes offsets itself).
AM_HOST_DEVICE inline void loo_lane(int64_t group, int64_t groups, int64_t lane, int64_t lanes,
                                    const int64_t* tokens, const int64_t* lengths,
                                    const int64_t* offsets, int64_t rows, int64_t T, int64_t lead,
                                    bool mask, int64_t mask_token, int64_t pad, int64_t total,
                                    int64_t width, int64_t* out, int64_t* out_lengths,
                                    int64_t* out_source) {
  for (int64_t k = group; k < total; k += groups) {
    const int64_t b = loo_source_row(offsets, rows, k);
    const int64_t L = lengths[b];
    loo::build_sequence(tokens + b * T, L, lead + (k - offsets[b]), mask, mask_token, pad, width,
                        out + k * width, lane, lanes);
    if (lane == 0) {
      out_lengths[k] = loo::sequence_length(L, mask);
      out_source[k] = b;
    }
  }
}

}  // namespace gpu
}  // namespace attnmetrics
