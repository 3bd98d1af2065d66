// CUDA leave_one_out_batch: a warp per output sequence, grid-stride, each lane writing
// every 32nd id (kernels/loo.h build_sequence, the CPU's construction) so stores are
// coalesced; a sequence finds its source row by binary search over the offsets.
// rationale_batch: a thread per sequence (a deletion's place depends on every earlier
// position), grid-stride, the CPU's build_rationale_sequence.
#include <cuda_runtime.h>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "cuda/rows.h"

namespace attnmetrics {
namespace gpu {
namespace {

__global__ void __launch_bounds__(kBlock)
    loo_kernel(const int64_t* __restrict__ tokens, const int64_t* __restrict__ lengths,
               const int64_t* __restrict__ offsets, int64_t rows, int64_t T, int64_t lead,
               bool mask, int64_t mask_token, int64_t pad, int64_t total, int64_t width,
               int64_t* __restrict__ out, int64_t* __restrict__ out_lengths,
               int64_t* __restrict__ out_source) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  loo_lane(thread / kWarp, groups, thread % kWarp, kWarp, tokens, lengths, offsets, rows, T, lead,
           mask, mask_token, pad, total, width, out, out_lengths, out_source);
}

__global__ void __launch_bounds__(kRowBlock)
    rationale_kernel(const int64_t* __restrict__ tokens, const int64_t* __restrict__ lengths,
                     const int64_t* __restrict__ rank, const int64_t* __restrict__ sizes,
                     const int64_t* __restrict__ index, int64_t total, int64_t F, int64_t T,
                     int64_t R, int64_t lead, int64_t trail, bool keep_rationale, bool mask,
                     int64_t mask_token, int64_t pad, int64_t* __restrict__ out,
                     int64_t* __restrict__ out_lengths, int64_t* __restrict__ out_row,
                     int64_t* __restrict__ out_fraction) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t b = index[i] / F;
    out_lengths[i] = loo::build_rationale_sequence(tokens + b * T, lengths[b], rank + b * R,
                                                   lead, trail, sizes[index[i]], keep_rationale,
                                                   mask, mask_token, pad, T, out + i * T);
    out_row[i] = b;
    out_fraction[i] = index[i] % F;
  }
}

}  // namespace

cudaError_t rationale_batch(const int64_t* tokens, const int64_t* lengths, const int64_t* rank,
                            const int64_t* sizes, const int64_t* index, int64_t total,
                            int64_t F, int64_t T, int64_t R, int64_t lead, int64_t trail,
                            bool keep_rationale, bool mask, int64_t mask_token, int64_t pad,
                            int64_t* out, int64_t* out_lengths, int64_t* out_row,
                            int64_t* out_fraction, cudaStream_t stream) {
  if (total <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(blocks_for(total, kRowBlock)));
  rationale_kernel<<<grid, kRowBlock, 0, stream>>>(tokens, lengths, rank, sizes, index, total, F, T,
                                                R, lead, trail, keep_rationale, mask, mask_token,
                                                pad, out, out_lengths, out_row, out_fraction);
  return cudaGetLastError();
}

cudaError_t leave_one_out_batch(const int64_t* tokens, const int64_t* lengths,
                                const int64_t* offsets, int64_t rows, int64_t T, int64_t lead,
                                bool mask, int64_t mask_token, int64_t pad, int64_t total,
                                int64_t width, int64_t* out, int64_t* out_lengths,
                                int64_t* out_source, cudaStream_t stream) {
  if (rows <= 0 || total <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(warps_for(total) / (kBlock / kWarp)));
  loo_kernel<<<grid, kBlock, 0, stream>>>(tokens, lengths, offsets, rows, T, lead, mask,
                                          mask_token, pad, total, width, out, out_lengths,
                                          out_source);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace attnmetrics
