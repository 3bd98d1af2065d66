// Per-row permutation test (J&W 2019, sec. 4.2; docs/definitions.md §9), shared
// by the CPU and CUDA back ends. Plain functions on raw pointers, no torch
// headers, so that `nvcc -c` can compile-check them without a CUDA build of torch.
//
// Random permutations come from a counter-based generator: permutation p of row
// r under a 64-bit seed is a pure function of (seed, r, p), so any subset of rows
// or permutations can be generated in any order, chunk or thread, and a row's
// permutations do not depend on the other rows. They do depend on the row's
// index r (its global position in the batch).
//
//   fin(z)    = splitmix64 finaliser: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//               z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
//   mix(z)    = fin(z + 0x9E3779B97F4A7C15)
//   state_0   = mix(mix(mix(seed) ^ r) ^ p)
//   next64()  : state += 0x9E3779B97F4A7C15; return fin(state)   (splitmix64)
//   bounded(x, n), x a uniform 32-bit number, 1 <= n < 2^32: uniform in [0, n) by
//               Lemire's multiply-and-reject method (unbiased): m = x * n; while
//               (m mod 2^32) < (2^32 - n) mod n: m = (next64() mod 2^32) * n;
//               return m >> 32
//   permutation: perm[t] = t; for i = L-1 down to 1, swap(perm[i], perm[j_i]) with
//               j_i = bounded(x_i, i + 1) (Fisher-Yates: every one of the L! orders
//               has probability 1/L!). The x_i come in pairs: z = next64(), x_i =
//               its low 32 bits, x_{i-1} its high 32 bits; a lone x_1 is the low
//               32 bits of one more next64().
//
// The permuted attention of a row is alpha'_t = alpha_{perm[t]}: the weights move,
// the hidden states stay, and the context is sum_t alpha_{perm[t]} h_t.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/macros.h"

namespace attnmetrics {
namespace permutation {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

AM_HOST_DEVICE inline uint64_t finalise(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

AM_HOST_DEVICE inline uint64_t mix(uint64_t z) { return finalise(z + kGolden); }

// state_0 = mix(row_key ^ p) with row_key = mix(mix(seed) ^ r), computed once per row.
AM_HOST_DEVICE inline uint64_t row_key(uint64_t seed, uint64_t row) {
  return mix(mix(seed) ^ row);
}

AM_HOST_DEVICE inline uint64_t next64(uint64_t& state) {
  state += kGolden;
  return finalise(state);
}

// Uniform in [0, n) for 1 <= n < 2^32 from the uniform 32-bit x, drawing more
// from the stream only to reject (probability < n / 2^32).
AM_HOST_DEVICE inline uint32_t bounded(uint32_t x, uint32_t n, uint64_t& state) {
  uint64_t m = static_cast<uint64_t>(x) * n;
  if (static_cast<uint32_t>(m) < n) {
    const uint32_t threshold = (0u - n) % n;  // 2^32 mod n
    while (static_cast<uint32_t>(m) < threshold) {
      m = static_cast<uint64_t>(static_cast<uint32_t>(next64(state))) * n;
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

// Fisher-Yates for permutation p of the row whose row_key is `key`, into
// perm[0..L-1] (L < 2^32; positions L.. untouched), calling visit(i, perm[i])
// for i = L-1 down to 0 as each position becomes final, so callers can consume
// the permutation in the same pass that draws it. Index: any integer type
// holding 0..L-1.
template <typename Index, typename Visit>
AM_HOST_DEVICE inline void shuffle(uint64_t key, uint64_t p, int64_t L, Index* perm,
                                   Visit&& visit) {
  if (L <= 0) return;
  for (int64_t t = 0; t < L; ++t) perm[t] = static_cast<Index>(t);
  uint64_t state = mix(key ^ p);
  auto step = [&](int64_t i, uint32_t x) {
    const uint32_t j = bounded(x, static_cast<uint32_t>(i + 1), state);
    const Index picked = perm[j];
    perm[j] = perm[i];
    perm[i] = picked;
    visit(i, static_cast<int64_t>(picked));
  };
  int64_t i = L - 1;
  for (; i >= 2; i -= 2) {
    const uint64_t z = next64(state);
    step(i, static_cast<uint32_t>(z));
    step(i - 1, static_cast<uint32_t>(z >> 32));
  }
  if (i == 1) step(1, static_cast<uint32_t>(next64(state)));
  visit(int64_t(0), static_cast<int64_t>(perm[0]));
}

AM_HOST_DEVICE inline void permutation_row(uint64_t key, uint64_t p, int64_t L, int64_t* perm) {
  shuffle(key, p, L, perm, [](int64_t, int64_t) {});
}

// The k-th smallest of a[0..n-1] (0-based), reordering a (Hoare quickselect,
// middle pivot). Every scan is bounded, so NaN input cannot run out of range.
template <typename acc_t>
AM_HOST_DEVICE inline acc_t select_kth(acc_t* a, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const acc_t pivot = a[lo + (hi - lo) / 2];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (i <= hi && a[i] < pivot) ++i;
      while (j >= lo && a[j] > pivot) --j;
      if (i <= j) {
        const acc_t tmp = a[i];
        a[i] = a[j];
        a[j] = tmp;
        ++i;
        --j;
      }
    }
    // now a[lo..j] <= pivot <= a[i..hi] and every a[j+1..i-1] equals the pivot
    if (k <= j) {
      hi = j;
    } else if (k >= i) {
      lo = i;
    } else {
      return a[k];
    }
  }
  return a[k];
}

// numpy's median (np.median): the middle value, or for even n the mean of the
// two middle values. Reorders a; n >= 1.
template <typename acc_t>
AM_HOST_DEVICE inline acc_t median(acc_t* a, int64_t n) {
  const int64_t k = (n - 1) / 2;
  const acc_t low = select_kth(a, n, k);
  if (n % 2 == 1) return low;
  acc_t high = a[k + 1];  // after selection a[k+1..n-1] >= a[k]: the next one is their min
  for (int64_t i = k + 2; i < n; ++i) high = a[i] < high ? a[i] : high;
  return (low + high) / acc_t(2);
}

// In place: logits z[0..C-1] -> the output distribution. C == 1: z[0] becomes the
// sigmoid p (the distribution is (1 - p, p)); C >= 2: softmax (max subtracted).
template <typename acc_t>
AM_HOST_DEVICE inline void distribution(acc_t* z, int64_t C) {
  if (C == 1) {
    z[0] = acc_t(1) / (acc_t(1) + exp(-z[0]));
    return;
  }
  acc_t top = z[0];
  for (int64_t c = 1; c < C; ++c) top = z[c] > top ? z[c] : top;
  acc_t total = acc_t(0);
  for (int64_t c = 0; c < C; ++c) {
    z[c] = exp(z[c] - top);
    total += z[c];
  }
  for (int64_t c = 0; c < C; ++c) z[c] /= total;
}

// TVD between two distributions as left by `distribution` (C == 1: ½(|Δ(1-p)| + |Δp|) = |Δp|).
template <typename acc_t>
AM_HOST_DEVICE inline acc_t tvd(const acc_t* p, const acc_t* q, int64_t C) {
  if (C == 1) return fabs(p[0] - q[0]);
  acc_t s = acc_t(0);
  for (int64_t c = 0; c < C; ++c) s += fabs(p[c] - q[c]);
  return acc_t(0.5) * s;
}

// ---- Permutation test of one row with a linear decoder --------------------------------
// On projected values proj[t * C + c] = (W h_t)_c: logits = sum_t alpha_{perm[t]} proj_t +
// bias for each permutation p (global index `row` for the generator), TVD of the output
// distribution from the original one (identity permutation). Sums run over t = L-1 down
// to 0 (the order the shuffle finalises positions), the original's too, so a permutation
// that changes no weight gives exactly TVD 0.
// C <= 2 needs one number per token: the output is sigmoid(d) with d the logit (C == 1)
// or the logit difference z_1 - z_0 (C == 2, the softmax of two), and
// TVD = |sigmoid(d) - sigmoid(d_0)|.
// The CPU runs a row's permutations in one thread (linear_row); the CUDA kernel gives each
// (row, permutation) its own thread (linear_original + linear_permuted): the same calls.

template <typename acc_t>
AM_HOST_DEVICE inline acc_t sigmoid(acc_t d) {
  return acc_t(1) / (acc_t(1) + exp(-d));
}

// C <= 2: token t's logit (C == 1) or logit difference (C == 2).
template <typename scalar_t, typename acc_t>
AM_HOST_DEVICE inline acc_t binary_logit(const scalar_t* proj, int64_t t, int64_t C) {
  return C == 1 ? static_cast<acc_t>(proj[t])
                : static_cast<acc_t>(proj[2 * t + 1]) - static_cast<acc_t>(proj[2 * t]);
}

// C <= 2: the bias's logit (difference).
template <typename scalar_t, typename acc_t>
AM_HOST_DEVICE inline acc_t binary_offset(const scalar_t* bias, int64_t C) {
  const acc_t offset = static_cast<acc_t>(bias[0]);
  return C == 2 ? static_cast<acc_t>(bias[1]) - offset : offset;
}

// The original output (L >= 1) into base: C <= 2: base[0] = sigmoid(d_0); else the
// distribution (C entries). u: the binary logits of the row's tokens, or null to
// compute them from proj (the same values).
template <typename scalar_t, typename acc_t>
AM_HOST_DEVICE inline void linear_original(const scalar_t* att, const scalar_t* proj,
                                           const scalar_t* bias, int64_t L, int64_t C,
                                           const acc_t* u, acc_t* base) {
  if (C <= 2) {
    acc_t d0 = acc_t(0);
    for (int64_t t = L - 1; t >= 0; --t) {
      d0 += static_cast<acc_t>(att[t]) * (u ? u[t] : binary_logit<scalar_t, acc_t>(proj, t, C));
    }
    base[0] = sigmoid(d0 + binary_offset<scalar_t, acc_t>(bias, C));
    return;
  }
  for (int64_t c = 0; c < C; ++c) base[c] = acc_t(0);
  for (int64_t t = L - 1; t >= 0; --t) {
    const acc_t a = static_cast<acc_t>(att[t]);
    for (int64_t c = 0; c < C; ++c) base[c] += a * static_cast<acc_t>(proj[t * C + c]);
  }
  for (int64_t c = 0; c < C; ++c) base[c] += static_cast<acc_t>(bias[c]);
  distribution(base, C);
}

// Output TVD of permutation p of the row whose row_key is `key` (L >= 2), from `base`
// as left by linear_original. Scratch: perm (L uint32), z (C acc_t; unused for C <= 2).
template <typename scalar_t, typename acc_t>
AM_HOST_DEVICE inline acc_t linear_permuted(const scalar_t* att, const scalar_t* proj,
                                            const scalar_t* bias, int64_t L, int64_t C,
                                            uint64_t key, uint64_t p, const acc_t* u,
                                            const acc_t* base, uint32_t* perm, acc_t* z) {
  if (C <= 2) {
    acc_t d = acc_t(0);
    shuffle(key, p, L, perm, [&](int64_t t, int64_t from) {
      d += static_cast<acc_t>(att[from]) * (u ? u[t] : binary_logit<scalar_t, acc_t>(proj, t, C));
    });
    return fabs(sigmoid(d + binary_offset<scalar_t, acc_t>(bias, C)) - base[0]);
  }
  for (int64_t c = 0; c < C; ++c) z[c] = acc_t(0);
  shuffle(key, p, L, perm, [&](int64_t t, int64_t from) {
    const acc_t a = static_cast<acc_t>(att[from]);
    for (int64_t c = 0; c < C; ++c) z[c] += a * static_cast<acc_t>(proj[t * C + c]);
  });
  for (int64_t c = 0; c < C; ++c) z[c] += static_cast<acc_t>(bias[c]);
  distribution(z, C);
  return tvd(z, base, C);
}

// The whole test of one row: writes tvds[0..P-1] and returns their median; rows with
// L <= 1 get TVD 0. Scratch: perm (L uint32), u (L acc_t), z and base (C acc_t each),
// sorted (P acc_t).
template <typename scalar_t, typename acc_t>
AM_HOST_DEVICE inline acc_t linear_row(const scalar_t* att, const scalar_t* proj,
                                       const scalar_t* bias, int64_t L, int64_t C, int64_t P,
                                       uint64_t seed, uint64_t row, uint32_t* perm, acc_t* u,
                                       acc_t* z, acc_t* base, acc_t* tvds, acc_t* sorted) {
  if (L <= 1) {
    for (int64_t p = 0; p < P; ++p) tvds[p] = acc_t(0);
    return acc_t(0);
  }
  const uint64_t key = row_key(seed, row);
  const acc_t* logits = nullptr;
  if (C <= 2) {  // each token's binary logit, once for all P permutations
    for (int64_t t = 0; t < L; ++t) u[t] = binary_logit<scalar_t, acc_t>(proj, t, C);
    logits = u;
  }
  linear_original(att, proj, bias, L, C, logits, base);
  for (int64_t p = 0; p < P; ++p) {
    tvds[p] = linear_permuted(att, proj, bias, L, C, key, static_cast<uint64_t>(p), logits, base,
                              perm, z);
    sorted[p] = tvds[p];
  }
  return median(sorted, P);
}

}  // namespace permutation
}  // namespace attnmetrics
