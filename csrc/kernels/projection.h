// Projection of a row's valid prefix by a linear map (docs/definitions.md §3: linear decoders
// work on projected values v_t = W h_t), shared by the CPU and CUDA back ends.
// Plain functions on raw pointers, no torch headers.
//
// Padding is never read: with ragged rows this reads only the sum of the lengths
// instead of B * T vectors. Each dot product keeps K partial sums (independent
// chains the compiler can vectorise), added pairwise at the end; accumulation is
// in scalar_t, as a BLAS matmul of the same dtype does.
#pragma once

#include <cstdint>

#include "kernels/macros.h"

namespace attnmetrics {
namespace projection {

// Partial sums per dot product: 16 float or 8 double, two SSE registers' worth of
// lanes on the CPU; the CUDA kernel uses the same K, so both round alike.
template <typename scalar_t>
AM_HOST_DEVICE constexpr int partial_sums() {
  return sizeof(scalar_t) == 4 ? 16 : 8;
}

// sum_h x[h] * w[h] in K partial sums (h mod K), added pairwise at the end.
template <typename scalar_t, int K>
AM_HOST_DEVICE inline scalar_t dot(const scalar_t* x, const scalar_t* w, int64_t H) {
  scalar_t part[K];
  for (int k = 0; k < K; ++k) part[k] = scalar_t(0);
  int64_t h = 0;
  for (; h + K <= H; h += K) {
    for (int k = 0; k < K; ++k) part[k] += x[h + k] * w[h + k];
  }
  for (int64_t r = 0; h < H; ++h, ++r) part[r] += x[h] * w[h];
  for (int width = K / 2; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) part[k] += part[k + width];
  }
  return part[0];
}

// out[t * C + c] = sum_h values[t * H + h] * weight[c * H + h] for t < L, 0 for
// L <= t < T.
template <typename scalar_t, int K>
AM_HOST_DEVICE inline void project_row(const scalar_t* values, const scalar_t* weight, int64_t L,
                                       int64_t T, int64_t H, int64_t C, scalar_t* out) {
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t c = 0; c < C; ++c) out[t * C + c] = dot<scalar_t, K>(values + t * H, weight + c * H, H);
  }
  for (int64_t i = L * C; i < T * C; ++i) out[i] = scalar_t(0);
}

}  // namespace projection
}  // namespace attnmetrics
