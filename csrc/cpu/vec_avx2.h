// Eight-wide float32 exp, sigmoid and tanh for the CPU impls' vector paths (lstm_runs' cell,
// spliced_attention's scores). Compiled for AVX2 and FMA alone (a target attribute on each
// function, AM_AVX2) and chosen at run time (avx2_fma()), so the build needs no -march flag;
// each caller keeps a scalar path (kernels/activations.h) for other CPUs and float64.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AM_AVX2_PATH 1
#include <immintrin.h>

#define AM_AVX2 __attribute__((target("avx2,fma")))

namespace attnmetrics {
namespace vec {

// exp(x), about 1 ulp: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by its degree-6
// Taylor-like minimax polynomial (Cephes' expf), 2^n into the exponent bits. x is clamped to
// [-87, 88], where 2^n stays a normal float: the sigmoids it serves are 0 or 1 to float
// precision beyond that.
AM_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// 1 / (1 + exp(-x)), the division as a reciprocal estimate (12 bits) and one Newton step
// (about 2 ulp): a vector division costs several times its throughput here.
AM_AVX2 inline __m256 sigmoid8(__m256 x) {
  const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)));
  const __m256 r = _mm256_rcp_ps(d);
  return _mm256_mul_ps(r, _mm256_fnmadd_ps(d, r, _mm256_set1_ps(2.0f)));
}

AM_AVX2 inline __m256 tanh8(__m256 x) {  // 2 sigmoid(2x) - 1, as kernels/activations.h
  const __m256 two = _mm256_set1_ps(2.0f);
  return _mm256_fmsub_ps(two, sigmoid8(_mm256_mul_ps(two, x)), _mm256_set1_ps(1.0f));
}

// The sum of the eight lanes.
AM_AVX2 inline float sum8(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline bool avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace vec
}  // namespace attnmetrics
#endif
