// CUDA spliced_attention: a warp per sequence (grid-stride over sequences), as the CPU impl's
// two passes. Each position's score is split over the lanes (features k = lane, lane + 32,
// ...) and summed by a butterfly, so every lane holds it; lane 0 keeps it in the scores
// scratch. Then the maximum and the softmax's total over the positions (lanes stride over
// them), and the pooled features past att, one lane per feature.
#include <cuda_runtime.h>
#include <math.h>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "kernels/activations.h"

namespace attnmetrics {
namespace gpu {
namespace {

template <typename scalar_t>
__device__ __forceinline__ scalar_t warp_sum(scalar_t s) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
  return s;
}

template <typename scalar_t>
__device__ __forceinline__ scalar_t warp_max(scalar_t s) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    s = fmax(s, __shfl_xor_sync(0xffffffffu, s, offset));
  }
  return s;
}

template <typename scalar_t>
__global__ void __launch_bounds__(kBlock)
    spliced_kernel(const scalar_t* __restrict__ table, const int64_t* __restrict__ pairs,
                   const int64_t* __restrict__ lengths, const scalar_t* __restrict__ v,
                   int64_t rows, int64_t width, int64_t dim, int64_t att, int64_t lead,
                   int64_t trail, bool tanh, scalar_t* __restrict__ scores,
                   scalar_t* __restrict__ out) {
  constexpr int kWarps = kBlock / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  // the loop bound is the warp's, so every lane reaches the shuffles
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp; i < rows;
       i += stride) {
    const int64_t hi = lengths[i] - trail, classes = dim - att;
    scalar_t* o = out + i * classes;
    if (hi <= lead) {  // no position gets attention: the zero context
      for (int64_t c = lane; c < classes; c += kWarp) o[c] = scalar_t(0);
      continue;
    }
    const int64_t* p = pairs + i * width * 2;
    scalar_t* s = scores + i * width;
    for (int64_t j = lead; j < hi; ++j) {
      const scalar_t *a = table + p[2 * j] * dim, *b = table + p[2 * j + 1] * dim;
      scalar_t part = 0;
      for (int64_t k = lane; k < att; k += kWarp) {
        const scalar_t x = a[k] + b[k];
        part += v[k] * (tanh ? tanh_by_sigmoid(x) : x);
      }
      part = warp_sum(part);
      if (lane == 0) s[j] = part;
    }
    __syncwarp();  // the scores, written by lane 0, read by every lane
    scalar_t top = -INFINITY, total = 0;
    for (int64_t j = lead + lane; j < hi; j += kWarp) top = fmax(top, s[j]);
    top = warp_max(top);
    for (int64_t j = lead + lane; j < hi; j += kWarp) total += exp(s[j] - top);
    total = warp_sum(total);
    for (int64_t c = lane; c < classes; c += kWarp) {
      scalar_t sum = 0;
      for (int64_t j = lead; j < hi; ++j) {
        sum += exp(s[j] - top) * (table[p[2 * j] * dim + att + c] + table[p[2 * j + 1] * dim + att + c]);
      }
      o[c] = sum / total;
    }
    __syncwarp();  // the next sequence's scores go elsewhere; keep the lanes together
  }
}

template <typename scalar_t>
cudaError_t launch(const scalar_t* table, const int64_t* pairs, const int64_t* lengths,
                   const scalar_t* v, int64_t rows, int64_t width, int64_t dim, int64_t att,
                   int64_t lead, int64_t trail, bool tanh, scalar_t* scores, scalar_t* out,
                   cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(blocks_for(rows, kBlock / kWarp)));
  spliced_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(table, pairs, lengths, v, rows, width, dim,
                                                        att, lead, trail, tanh, scores, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t spliced_attention(const float* table, const int64_t* pairs, const int64_t* lengths,
                              const float* v, int64_t rows, int64_t width, int64_t dim,
                              int64_t att, int64_t lead, int64_t trail, bool tanh, float* scores,
                              float* out, cudaStream_t stream) {
  return launch(table, pairs, lengths, v, rows, width, dim, att, lead, trail, tanh, scores, out,
                stream);
}
cudaError_t spliced_attention(const double* table, const int64_t* pairs, const int64_t* lengths,
                              const double* v, int64_t rows, int64_t width, int64_t dim,
                              int64_t att, int64_t lead, int64_t trail, bool tanh,
                              double* scores, double* out, cudaStream_t stream) {
  return launch(table, pairs, lengths, v, rows, width, dim, att, lead, trail, tanh, scores, out,
                stream);
}

}  // namespace gpu
}  // namespace attnmetrics
