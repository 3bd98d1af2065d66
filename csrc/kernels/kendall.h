// Kendall tau-b and its two-sided p-value for one row, reproducing
// scipy.stats.kendalltau(x, y) with its defaults (variant 'b', method 'auto').
//
// Plain functions on raw pointers, without torch headers or std:: algorithms,
// so the CPU op and a CUDA kernel can share them. Every floating-point
// expression follows scipy's order of operations, so tau and the exact p-value
// come out bit for bit; the asymptotic p-value goes through libm's erf/erfc
// where scipy uses cephes', which differ in the last few bits.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/factorial.h"
#include "kernels/macros.h"

namespace attnmetrics {
namespace kendall {

// scipy's 'auto' takes the exact p-value for tie-free rows of at most this length
// (or with at most one discordant / concordant pair, which needs no table).
constexpr int64_t kExactMaxN = 33;
constexpr double kSqrtHalf = 0.70710678118654752440;

// The comparisons below use & and | rather than && and ||, and the merges select
// with masks: on random data every branch there would mispredict half the time,
// and sorting is most of the cost of a row.

// Sort keys of a row, by input dtype. pair_t orders lexicographically by (x, y);
// y_t orders by y. Sizes of the scratch tau_row needs: 2n of each.
template <typename scalar_t>
struct RowKeys;

// float64: the values themselves.
struct Pair {
  double x, y;
};

template <>
struct RowKeys<double> {
  using pair_t = Pair;
  using y_t = double;
  AM_HOST_DEVICE static pair_t make(double x, double y) { return Pair{x, y}; }
  AM_HOST_DEVICE static bool same_x(const pair_t& a, const pair_t& b) { return a.x == b.x; }
  AM_HOST_DEVICE static bool same_pair(const pair_t& a, const pair_t& b) {
    return (a.x == b.x) & (a.y == b.y);
  }
  AM_HOST_DEVICE static y_t y_of(const pair_t& a) { return a.y; }
  struct PairLess {
    AM_HOST_DEVICE bool operator()(const pair_t& a, const pair_t& b) const {
      return (a.x < b.x) | ((a.x == b.x) & (a.y < b.y));
    }
  };
};

// float32: each value mapped to a uint32 with the same order, and (x, y) packed
// into one uint64, so both sorts compare single integers of half the size.
AM_HOST_DEVICE inline uint32_t order_bits(float v) {
  v += 0.0f;  // -0 -> +0: they compare equal, so they must share a key
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  // Negative: flip every bit (larger magnitude sorts first); else set the sign bit.
  return u ^ ((0u - (u >> 31)) | 0x80000000u);
}

template <>
struct RowKeys<float> {
  using pair_t = uint64_t;
  using y_t = uint32_t;
  AM_HOST_DEVICE static pair_t make(float x, float y) {
    return (static_cast<uint64_t>(order_bits(x)) << 32) | order_bits(y);
  }
  AM_HOST_DEVICE static bool same_x(pair_t a, pair_t b) { return (a >> 32) == (b >> 32); }
  AM_HOST_DEVICE static bool same_pair(pair_t a, pair_t b) { return a == b; }
  AM_HOST_DEVICE static y_t y_of(pair_t a) { return static_cast<uint32_t>(a); }
  struct PairLess {
    AM_HOST_DEVICE bool operator()(pair_t a, pair_t b) const { return a < b; }
  };
};

template <typename T>
struct Less {
  AM_HOST_DEVICE bool operator()(T a, T b) const { return a < b; }
};

// Merges src[lo, lo+h) and src[lo+h, lo+2h) into dst from both ends at once (two
// independent dependency chains; h steps each, which cannot overrun when the halves
// are equal). Stable: the front takes the left element on a tie, the back the right.
// Returns the strict inversions between the halves: each is counted when the first
// of its two elements is placed, against what is left of the other half.
template <typename T, typename Less>
AM_HOST_DEVICE int64_t merge_equal(const T* src, T* dst, int64_t lo, int64_t h, Less less) {
  const T* l = src + lo;               // front of the left half
  const T* r = src + lo + h;           // front of the right half
  const T* le = r - 1;                 // back of the left half
  const T* re = src + lo + 2 * h - 1;  // back of the right half
  T* out = dst + lo;
  T* out_back = dst + lo + 2 * h - 1;
  int64_t inv = 0;
  for (int64_t s = 0; s < h; ++s) {
    const bool take_r = less(*r, *l);
    *out++ = *(take_r ? r : l);
    inv += -static_cast<int64_t>(take_r) & ((le - l) + 1);  // jumps the left ones not yet placed
    r += take_r;
    l += !take_r;
    const bool take_l = less(*re, *le);
    *out_back-- = *(take_l ? le : re);
    inv += -static_cast<int64_t>(take_l) & ((re - r) + 1);  // jumps the right ones not yet placed
    le -= take_l;
    re -= !take_l;
  }
  return inv;
}

// Merges src[lo, mid) and src[mid, hi) of any lengths into dst; returns the inversions.
template <typename T, typename Less>
AM_HOST_DEVICE int64_t merge_any(const T* src, T* dst, int64_t lo, int64_t mid, int64_t hi,
                                 Less less) {
  int64_t i = lo, j = mid, k = lo, inv = 0;
  while (i < mid && j < hi) {
    const bool take_r = less(src[j], src[i]);
    dst[k++] = *(take_r ? src + j : src + i);
    inv += -static_cast<int64_t>(take_r) & (mid - i);
    j += take_r;
    i += !take_r;
  }
  while (i < mid) dst[k++] = src[i++];
  while (j < hi) dst[k++] = src[j++];
  return inv;
}

// Stable bottom-up merge sort of a[0, n) using buf[0, n); adds the number of
// strict inversions (i < j with a[j] < a[i]) to *inversions. Returns whichever
// of a / buf ends up holding the sorted sequence.
template <typename T, typename Less>
AM_HOST_DEVICE T* merge_sort(T* a, T* buf, int64_t n, Less less, int64_t* inversions) {
  int64_t inv = 0;
  T* src = a;
  T* dst = buf;
  for (int64_t width = 1; width < n; width *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      const int64_t mid = lo + width < n ? lo + width : n;
      const int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
      inv += hi - mid == width ? merge_equal(src, dst, lo, width, less)
                               : merge_any(src, dst, lo, mid, hi, less);
    }
    T* t = src;
    src = dst;
    dst = t;
  }
  *inversions += inv;
  return src;
}

// Statistics of groups of tied values, as scipy's count_rank_tie:
// pairs = sum c(c-1)/2, v0 = sum c(c-1)(c-2), v1 = sum c(c-1)(2c+5).
// v0 and v1 are summed in double like scipy (exact below 2^53).
struct TieStats {
  int64_t pairs = 0;
  double v0 = 0.0, v1 = 0.0;
  AM_HOST_DEVICE void add(int64_t c) {
    if (c < 2) return;
    const double cd = static_cast<double>(c);
    pairs += c * (c - 1) / 2;
    v0 += cd * (cd - 1.0) * (cd - 2.0);
    v1 += cd * (cd - 1.0) * (2.0 * cd + 5.0);
  }
};

// numpy's pairwise summation (np.sum of a contiguous float64 array), so the
// exact p-value rounds as scipy's does.
AM_HOST_DEVICE inline double pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += a[i];
    return s;
  }
  if (n <= 128) {
    double r[8];
    for (int k = 0; k < 8; ++k) r[k] = a[k];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int k = 0; k < 8; ++k) r[k] += a[i + k];
    double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) s += a[i];
    return s;
  }
  int64_t half = n / 2;
  half -= half % 8;
  return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}

// Counts of permutations of n items by number of inversions k (Mahonian numbers),
// k <= n(n-1)/4, for n = 0 .. kExactMaxN, laid out row after row: what the exact
// p-value sums. Built once (build_exact_table) with scipy's recurrence, in double,
// so the values round as scipy's do: row n of a run truncated at c agrees with the
// full row on k <= c, since no step mixes in a higher entry.
AM_HOST_DEVICE inline int64_t exact_row_length(int64_t n) { return n * (n - 1) / 4 + 1; }
AM_HOST_DEVICE inline int64_t exact_row_offset(int64_t n) {
  int64_t offset = 0;
  for (int64_t m = 0; m < n; ++m) offset += exact_row_length(m);
  return offset;
}
AM_HOST_DEVICE inline int64_t exact_table_size() { return exact_row_offset(kExactMaxN + 1); }

AM_HOST_DEVICE inline void build_exact_table(double* table) {
  for (int64_t n = 0; n <= kExactMaxN; ++n) {
    double* row = table + exact_row_offset(n);
    const int64_t c = exact_row_length(n) - 1;
    for (int64_t k = 0; k <= c; ++k) row[k] = k < 2 ? 1.0 : 0.0;
    for (int64_t j = 3; j <= n; ++j) {
      for (int64_t k = 1; k <= c; ++k) row[k] += row[k - 1];
      if (j <= c)  // descending, so each term uses the value before this step
        for (int64_t k = c; k >= j; --k) row[k] -= row[k - j];
    }
  }
}

// Two-sided exact p-value of c concordant pairs among n tie-free items, as
// scipy.stats._mstats_basic._kendall_p_exact. min(c, tot - c) >= 2 needs
// n <= kExactMaxN, all that 'auto' ever asks for; NaN otherwise.
AM_HOST_DEVICE inline double p_exact(int64_t n, int64_t c, const double* table) {
  const int64_t tot = n * (n - 1) / 2;
  c = c < tot - c ? c : tot - c;  // the null distribution is symmetric
  double prob;
  if (n <= 2) {
    prob = 1.0;
  } else if (c == 0) {
    prob = n < 171 ? 2.0 / factorial_double(static_cast<int>(n)) : 0.0;
  } else if (c == 1) {
    prob = n < 172 ? 2.0 / factorial_double(static_cast<int>(n - 1)) : 0.0;
  } else if (4 * c == n * (n - 1)) {
    prob = 1.0;
  } else if (n <= kExactMaxN) {
    prob = 2.0 * pairwise_sum(table + exact_row_offset(n), c + 1) /
           factorial_double(static_cast<int>(n));
  } else {
    return static_cast<double>(NAN);
  }
  return prob < 0.0 ? 0.0 : (prob > 1.0 ? 1.0 : prob);
}

// Two-sided normal p-value 2 * ndtr(-|z|), with ndtr's own split between erf and erfc.
AM_HOST_DEVICE inline double two_sided_normal(double z) {
  const double x = -fabs(z) * kSqrtHalf;
  const double ax = fabs(x);
  const double y = ax < kSqrtHalf ? 0.5 + 0.5 * erf(x) : 0.5 * erfc(ax);
  return 2.0 * y;
}

// tau-b and its p-value of a row of n >= 2 NaN-free items from its counts: dis
// discordant pairs, the ties of x (xt) and of y (yt), joint pairs tied in both;
// *tau and *pvalue stay as they are (NaN) for a constant row.
AM_HOST_DEVICE inline void finish_row(int64_t n, int64_t dis, const TieStats& xt, const TieStats& yt,
                                      int64_t joint, const double* exact_table, double* tau,
                                      double* pvalue) {
  const int64_t tot = n * (n - 1) / 2;
  if (xt.pairs == tot || yt.pairs == tot) return;  // a constant row has no ranking

  // tot = con + dis + xtie + ytie - joint
  const int64_t con_minus_dis = tot - xt.pairs - yt.pairs + joint - 2 * dis;
  double t = static_cast<double>(con_minus_dis) / sqrt(static_cast<double>(tot - xt.pairs)) /
             sqrt(static_cast<double>(tot - yt.pairs));
  t = t > -1.0 ? t : -1.0;  // clip rounding overshoot, as scipy does
  *tau = t < 1.0 ? t : 1.0;

  const int64_t extreme = dis < tot - dis ? dis : tot - dis;
  if (xt.pairs == 0 && yt.pairs == 0 && (n <= kExactMaxN || extreme <= 1)) {
    *pvalue = p_exact(n, tot - dis, exact_table);
    return;
  }
  // con - dis is asymptotically normal with this tie-corrected variance (Noether 1967).
  const double size = static_cast<double>(n);
  const double m = size * (size - 1.0);
  const double var = (m * static_cast<double>(2 * n + 5) - xt.v1 - yt.v1) / 18.0 +
                     (2.0 * static_cast<double>(xt.pairs) * static_cast<double>(yt.pairs)) / m +
                     xt.v0 * yt.v0 / (9.0 * m * static_cast<double>(n - 2));
  *pvalue = two_sided_normal(static_cast<double>(con_minus_dis) / sqrt(var));
}

// tau-b and its two-sided p-value for x[0, n), y[0, n), written to *tau, *pvalue.
// NaN for n < 2, for a row with every x (or every y) tied, and for a row holding
// NaN (scipy's nan_policy='propagate'). pairs and ys: 2n entries each of scratch;
// exact_table: exact_table_size() doubles filled by build_exact_table.
template <typename scalar_t>
AM_HOST_DEVICE void tau_row(const scalar_t* x, const scalar_t* y, int64_t n,
                            typename RowKeys<scalar_t>::pair_t* pairs,
                            typename RowKeys<scalar_t>::y_t* ys, const double* exact_table,
                            double* tau, double* pvalue) {
  using K = RowKeys<scalar_t>;
  using y_t = typename K::y_t;
  const double nan = static_cast<double>(NAN);
  *tau = nan;
  *pvalue = nan;
  if (n < 2) return;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != x[i] || y[i] != y[i]) return;
    pairs[i] = K::make(x[i], y[i]);
  }

  // Sorted by (x, y): x ties sit together with their y ascending, so the
  // strict inversions of the y sequence are exactly the discordant pairs.
  int64_t unused = 0;
  const auto* s = merge_sort(pairs, pairs + n, n, typename K::PairLess{}, &unused);
  TieStats xt;
  int64_t joint = 0;  // pairs tied in both x and y
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && K::same_x(s[j], s[i])) ++j;
    xt.add(j - i);
    for (int64_t a = i; a < j;) {
      int64_t b = a + 1;
      while (b < j && K::same_pair(s[b], s[a])) ++b;
      joint += (b - a) * (b - a - 1) / 2;
      a = b;
    }
    i = j;
  }
  for (int64_t i = 0; i < n; ++i) ys[i] = K::y_of(s[i]);
  int64_t dis = 0;
  const y_t* sorted_y = merge_sort(ys, ys + n, n, Less<y_t>{}, &dis);
  TieStats yt;
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && sorted_y[j] == sorted_y[i]) ++j;
    yt.add(j - i);
    i = j;
  }

  finish_row(n, dis, xt, yt, joint, exact_table, tau, pvalue);
}

// ---- all pairs at once: a block of lanes per row (the CUDA back end's long rows) ----------

// The GPU counts rows up to cuda/geometry.h's kKendallPairwiseMaxLen this way: O(n^2)
// comparisons spread over a block of threads, against tau_row's O(n log n) merge
// sorts on one thread.
// What a lane's share of a row's items i (lane, lane + lanes, ...) contributes when
// each is compared with all n items. Every pair is seen from both ends, so the pair
// counts are doubled; t_i, the items equal to item i in x (itself included), gives
// each tie group's sums item by item: sum_groups c(c-1) = sum_i (t_i - 1), and so on.
// Integers throughout, so the lanes' sums do not depend on their order.
struct PairCounts {
  int64_t dis2 = 0, joint2 = 0;    // discordant pairs, pairs tied in x and y (doubled)
  int64_t xpairs2 = 0, ypairs2 = 0;  // pairs tied in x, in y (doubled)
  int64_t xv0 = 0, xv1 = 0, yv0 = 0, yv1 = 0;  // sum (t-1)(t-2), sum (t-1)(2t+5)
  int64_t nan = 0;  // NaN items
  AM_HOST_DEVICE void add(const PairCounts& o) {
    dis2 += o.dis2;
    joint2 += o.joint2;
    xpairs2 += o.xpairs2;
    ypairs2 += o.ypairs2;
    xv0 += o.xv0;
    xv1 += o.xv1;
    yv0 += o.yv0;
    yv1 += o.yv1;
    nan += o.nan;
  }
  // Field k of kPairCountFields, by name (a constant k folds the switch away).
  AM_HOST_DEVICE int64_t& field(int k) {
    switch (k) {
      case 0: return dis2;
      case 1: return joint2;
      case 2: return xpairs2;
      case 3: return ypairs2;
      case 4: return xv0;
      case 5: return xv1;
      case 6: return yv0;
      case 7: return yv1;
      default: return nan;
    }
  }
};

// The number of int64 fields of PairCounts, for reductions that go field by field
// (PairCounts::field).
constexpr int kPairCountFields = 9;

template <typename scalar_t>
AM_HOST_DEVICE inline PairCounts pair_counts(const scalar_t* x, const scalar_t* y, int64_t n,
                                             int64_t lane, int64_t lanes) {
  PairCounts c;
  for (int64_t i = lane; i < n; i += lanes) {
    const scalar_t xi = x[i], yi = y[i];
    if (xi != xi || yi != yi) {
      c.nan += 1;
      continue;
    }
    int64_t tx = 0, ty = 0, joint = 0, dis = 0;
    for (int64_t j = 0; j < n; ++j) {
      const scalar_t xj = x[j], yj = y[j];
      const int64_t ex = xi == xj, ey = yi == yj;  // -0 == +0, as tau_row's keys
      tx += ex;
      ty += ey;
      joint += ex & ey;
      dis += ((xi < xj) & (yi > yj)) | ((xi > xj) & (yi < yj));
    }
    c.dis2 += dis;
    c.joint2 += joint - 1;  // not itself
    c.xpairs2 += tx - 1;
    c.ypairs2 += ty - 1;
    c.xv0 += (tx - 1) * (tx - 2);
    c.xv1 += (tx - 1) * (2 * tx + 5);
    c.yv0 += (ty - 1) * (ty - 2);
    c.yv1 += (ty - 1) * (2 * ty + 5);
  }
  return c;
}

// tau_row's tau and p-value (the same bits) from a row's summed PairCounts.
AM_HOST_DEVICE inline void tau_from_pair_counts(const PairCounts& c, int64_t n,
                                                const double* exact_table, double* tau,
                                                double* pvalue) {
  const double nan = static_cast<double>(NAN);
  *tau = nan;
  *pvalue = nan;
  if (n < 2 || c.nan > 0) return;
  TieStats xt, yt;
  xt.pairs = c.xpairs2 / 2;
  xt.v0 = static_cast<double>(c.xv0);
  xt.v1 = static_cast<double>(c.xv1);
  yt.pairs = c.ypairs2 / 2;
  yt.v0 = static_cast<double>(c.yv0);
  yt.v1 = static_cast<double>(c.yv1);
  finish_row(n, c.dis2 / 2, xt, yt, c.joint2 / 2, exact_table, tau, pvalue);
}

}  // namespace kendall
}  // namespace attnmetrics
