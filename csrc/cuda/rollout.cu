// CUDA attention_rollout: a block per batch row (grid-stride over the rows; each block
// owns a scratch slot of three T x T matrices: the layer's mixed attention M, the
// rollout so far R and the next product). Each phase runs the CPU's per-entry code
// (kernels/rollout.h) with a thread per entry (mixing, coalesced along j; product) or per
// row (renormalisation); the mixing gives the CPU's bits, the product (k ascending) agrees
// with the CPU's BLAS to rounding.
#include <cuda_runtime.h>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "kernels/rollout.h"

namespace attnmetrics {
namespace gpu {
namespace {

// M[0 .. L*L) <- layer's renormalised mixed attention (row stride L).
template <typename scalar_t>
__device__ void mix_layer(const scalar_t* layer, int64_t heads, int64_t T, int64_t L,
                          scalar_t residual, scalar_t* M) {
  for (int64_t e = threadIdx.x; e < L * L; e += blockDim.x) {
    M[e] = rollout::mixed_entry(layer, heads, T, e / L, e % L, residual);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) rollout::normalise_row(M + i * L, L);
  __syncthreads();
}

template <typename scalar_t>
__global__ void __launch_bounds__(kBlock)
    rollout_kernel(const scalar_t* __restrict__ att, const int64_t* __restrict__ lengths,
                   int64_t rows, int64_t layers, int64_t heads, int64_t T, scalar_t residual,
                   scalar_t* __restrict__ scratch, scalar_t* __restrict__ out) {
  const int64_t area = T * T;
  scalar_t* M = scratch + static_cast<int64_t>(blockIdx.x) * 3 * area;
  for (int64_t b = blockIdx.x; b < rows; b += gridDim.x) {
    const int64_t L = lengths[b];
    const scalar_t* row = att + b * layers * heads * area;
    scalar_t* R = M + area;
    scalar_t* next = R + area;
    mix_layer(row, heads, T, L, residual, R);
    for (int64_t l = 1; l < layers; ++l) {
      mix_layer(row + l * heads * area, heads, T, L, residual, M);
      for (int64_t e = threadIdx.x; e < L * L; e += blockDim.x) {
        next[e] = rollout::product_entry(M + (e / L) * L, R, L, L, e % L);
      }
      __syncthreads();
      scalar_t* swap = R;
      R = next;
      next = swap;
    }
    scalar_t* o = out + b * area;
    for (int64_t e = threadIdx.x; e < area; e += blockDim.x) {
      const int64_t i = e / T, j = e % T;
      o[e] = (i < L && j < L) ? R[i * L + j] : scalar_t(0);
    }
    __syncthreads();  // the next row reuses the slot
  }
}

template <typename scalar_t>
cudaError_t launch(const scalar_t* att, const int64_t* lengths, int64_t rows, int64_t layers,
                   int64_t heads, int64_t width, scalar_t residual, scalar_t* scratch,
                   int64_t slots, scalar_t* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(min64(slots, rows)));
  rollout_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(att, lengths, rows, layers, heads, width,
                                                        residual, scratch, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t attention_rollout(const float* att, const int64_t* lengths, int64_t rows,
                              int64_t layers, int64_t heads, int64_t width, float residual,
                              float* scratch, int64_t slots, float* out, cudaStream_t stream) {
  return launch(att, lengths, rows, layers, heads, width, residual, scratch, slots, out, stream);
}
cudaError_t attention_rollout(const double* att, const int64_t* lengths, int64_t rows,
                              int64_t layers, int64_t heads, int64_t width, double residual,
                              double* scratch, int64_t slots, double* out, cudaStream_t stream) {
  return launch(att, lengths, rows, layers, heads, width, residual, scratch, slots, out, stream);
}

}  // namespace gpu
}  // namespace attnmetrics
