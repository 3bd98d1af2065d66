// Kendall tau-b and its two-sided p-value for one row, reproducing
// scipy.stats.kendalltau(x, y) with its defaults (variant 'b', method 'auto').
//
// Plain functions on raw pointers, without torch headers or std:: algorithms,
// so the CPU op and a CUDA kernel can share them. Every
// floating-point expression follows scipy's order of operations, so tau and the
// exact p-value come out bit for bit; the asymptotic p-value goes through libm's
// erf/erfc where scipy uses cephes', which differ in the last few bits.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/factorial.h"
#include "kernels/macros.h"

namespace attnmetrics {
namespace kendall {

// scipy's 'auto' takes the exact p-value for tie-free rows of at most this length
// (or with at most one discordant / concordant pair, which needs no table).
constexpr int64_t kExactMaxN = 33;
// The exact p-value's table holds min(c, tot - c) + 1 <= tot / 2 + 1 counts.
constexpr int64_t kExactWork = kExactMaxN * (kExactMaxN - 1) / 4 + 1;
// Runs shorter than this are insertion-sorted before merging.
constexpr int64_t kRun = 16;
constexpr double kSqrtHalf = 0.70710678118654752440;

struct Pair {
  double x, y;
};

// Scratch one row of length <= n needs: `pairs` and `values` arguments of tau_row.
AM_HOST_DEVICE inline int64_t pair_work_size(int64_t n) { return 2 * n; }
AM_HOST_DEVICE inline int64_t value_work_size(int64_t n) { return 2 * n + kExactWork; }

struct PairLess {
  AM_HOST_DEVICE bool operator()(const Pair& a, const Pair& b) const {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
  }
};

struct ValueLess {
  AM_HOST_DEVICE bool operator()(double a, double b) const { return a < b; }
};

// Stable bottom-up merge sort of a[0, n) using buf[0, n); adds the number of
// strict inversions (i < j with a[j] < a[i]) to *inversions. Returns whichever
// of a / buf ends up holding the sorted sequence.
template <typename T, typename Less>
AM_HOST_DEVICE T* merge_sort(T* a, T* buf, int64_t n, Less less, int64_t* inversions) {
  int64_t inv = 0;
  for (int64_t lo = 0; lo < n; lo += kRun) {
    const int64_t hi = lo + kRun < n ? lo + kRun : n;
    for (int64_t i = lo + 1; i < hi; ++i) {
      const T v = a[i];
      int64_t j = i;
      while (j > lo && less(v, a[j - 1])) {
        a[j] = a[j - 1];
        --j;
      }
      inv += i - j;
      a[j] = v;
    }
  }
  T* src = a;
  T* dst = buf;
  for (int64_t width = kRun; width < n; width *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      const int64_t mid = lo + width < n ? lo + width : n;
      const int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
      int64_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) {
        if (less(src[j], src[i])) {
          inv += mid - i;  // src[j] jumps every element left in the first half
          dst[k++] = src[j++];
        } else {
          dst[k++] = src[i++];  // equal keys stay in order: ties are not inversions
        }
      }
      while (i < mid) dst[k++] = src[i++];
      while (j < hi) dst[k++] = src[j++];
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

// Two-sided exact p-value of c concordant pairs among n tie-free items
// (scipy.stats._mstats_basic._kendall_p_exact). work holds min(c, tot-c) + 1 doubles.
AM_HOST_DEVICE inline double p_exact(int64_t n, int64_t c, double* work) {
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
  } else {
    // work[k] = number of permutations of j items with k inversions (k <= c),
    // built up one item at a time; past 170! scipy rescales by j each step.
    work[0] = 1.0;
    work[1] = 1.0;
    for (int64_t k = 2; k <= c; ++k) work[k] = 0.0;
    for (int64_t j = 3; j <= n; ++j) {
      for (int64_t k = 1; k <= c; ++k) work[k] += work[k - 1];
      if (n >= 171)
        for (int64_t k = 0; k <= c; ++k) work[k] /= static_cast<double>(j);
      if (j <= c)  // descending, so each term uses the value before this step
        for (int64_t k = c; k >= j; --k) work[k] -= work[k - j];
    }
    const double s = pairwise_sum(work, c + 1);
    prob = n < 171 ? 2.0 * s / factorial_double(static_cast<int>(n)) : s;
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

// tau-b and its two-sided p-value for x[0, n), y[0, n), written to *tau, *pvalue.
// NaN for n < 2, for a row with every x (or every y) tied, and for a row holding
// NaN (scipy's nan_policy='propagate'). pairs: pair_work_size(n) Pairs;
// values: value_work_size(n) doubles.
template <typename scalar_t>
AM_HOST_DEVICE void tau_row(const scalar_t* x, const scalar_t* y, int64_t n, Pair* pairs,
                            double* values, double* tau, double* pvalue) {
  const double nan = static_cast<double>(NAN);
  *tau = nan;
  *pvalue = nan;
  if (n < 2) return;
  for (int64_t i = 0; i < n; ++i) {
    const double xi = static_cast<double>(x[i]);
    const double yi = static_cast<double>(y[i]);
    if (xi != xi || yi != yi) return;
    pairs[i] = Pair{xi, yi};
  }

  // Sorted by (x, y): x ties sit together with their y ascending, so the
  // strict inversions of the y sequence are exactly the discordant pairs.
  int64_t unused = 0;
  const Pair* s = merge_sort(pairs, pairs + n, n, PairLess{}, &unused);
  TieStats xt;
  int64_t joint = 0;  // pairs tied in both x and y
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && s[j].x == s[i].x) ++j;
    xt.add(j - i);
    for (int64_t a = i; a < j;) {
      int64_t b = a + 1;
      while (b < j && s[b].y == s[a].y) ++b;
      joint += (b - a) * (b - a - 1) / 2;
      a = b;
    }
    i = j;
  }
  for (int64_t i = 0; i < n; ++i) values[i] = s[i].y;
  int64_t dis = 0;
  const double* ys = merge_sort(values, values + n, n, ValueLess{}, &dis);
  TieStats yt;
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && ys[j] == ys[i]) ++j;
    yt.add(j - i);
    i = j;
  }

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
    *pvalue = p_exact(n, tot - dis, values + 2 * n);
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

}  // namespace kendall
}  // namespace attnmetrics
