// CUDA leave_one_out_batch: a warp per output sequence, grid-stride, each lane writing
// every 32nd id (kernels/loo.h build_sequence, the CPU's construction) so stores are
// coalesced; a sequence finds its source row by binary search over the offsets.
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

}  // namespace

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
