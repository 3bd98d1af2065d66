// Eight-wide float32 exp, sigmoid and tanh for the CPU impls' vector paths (lstm_runs' cell,
// spliced_attention's scores) and four-wide float64 log (jsd). Compiled for AVX2 and FMA alone
// (a target attribute on each function, AM_AVX2) and chosen at run time (avx2_fma()), so the
// build needs no -march flag;
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

// log(x) for four normal positive doubles (DBL_MIN <= x < inf; other lanes give garbage, so
// callers keep them out), within an ulp: x = 2^k (1 + f) with sqrt(2)/2 <= 1 + f < sqrt(2),
// s = f / (2 + f), log(1 + f) = f - (f^2/2 - s (f^2/2 + R(s^2))) with R the degree-14 minimax
// polynomial of fdlibm's e_log.c (Sun, 1993) and k ln 2 in two parts (ln2_hi k is exact).
AM_AVX2 inline __m256d log4(__m256d x) {
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256i bits = _mm256_castpd_si256(x);
  __m256d m = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000FFFFFFFFFFFFFLL)),
                                                  _mm256_set1_epi64x(0x3FF0000000000000LL)));  // [1, 2)
  // the biased exponent as a double: its 11 bits under 2^52's, minus 2^52
  const __m256d biased = _mm256_sub_pd(
      _mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x4330000000000000LL))),
      _mm256_set1_pd(4503599627370496.0));
  const __m256d high = _mm256_cmp_pd(m, _mm256_set1_pd(1.41421356237309504880), _CMP_GT_OQ);
  m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(0.5)), high);
  const __m256d k = _mm256_add_pd(_mm256_sub_pd(biased, _mm256_set1_pd(1023.0)), _mm256_and_pd(high, one));
  const __m256d f = _mm256_sub_pd(m, one);
  const __m256d s = _mm256_div_pd(f, _mm256_add_pd(_mm256_set1_pd(2.0), f));
  const __m256d z = _mm256_mul_pd(s, s);
  const __m256d w = _mm256_mul_pd(z, z);
  __m256d t1 = _mm256_fmadd_pd(w, _mm256_set1_pd(1.531383769920937332e-01), _mm256_set1_pd(2.222219843214978396e-01));
  t1 = _mm256_mul_pd(w, _mm256_fmadd_pd(w, t1, _mm256_set1_pd(3.999999999940941908e-01)));
  __m256d t2 = _mm256_fmadd_pd(w, _mm256_set1_pd(1.479819860511658591e-01), _mm256_set1_pd(1.818357216161805012e-01));
  t2 = _mm256_fmadd_pd(w, t2, _mm256_set1_pd(2.857142874366239149e-01));
  t2 = _mm256_mul_pd(z, _mm256_fmadd_pd(w, t2, _mm256_set1_pd(6.666666666666735130e-01)));
  const __m256d r = _mm256_add_pd(t2, t1);
  const __m256d hfsq = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(0.5), f), f);
  const __m256d inner = _mm256_fmadd_pd(s, _mm256_add_pd(hfsq, r), _mm256_mul_pd(k, _mm256_set1_pd(1.90821492927058770002e-10)));
  return _mm256_fmsub_pd(k, _mm256_set1_pd(6.93147180369123816490e-01), _mm256_sub_pd(_mm256_sub_pd(hfsq, inner), f));
}

// The sum of the four lanes.
AM_AVX2 inline double sum4(__m256d x) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

inline bool avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace vec
}  // namespace attnmetrics
#endif
