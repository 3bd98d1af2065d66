// CUDA attention_permutations and permutation_tvd_linear. The generator and the per-row
// test are kernels/permutation.h (shared with the CPU back end, so a permutation is the
// same integers on both); the thread <-> item mapping is rows.h.
#include <cuda_runtime.h>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "cuda/rows.h"

namespace attnmetrics {
namespace gpu {
namespace {

// A thread per (row, permutation): each Fisher-Yates shuffle is sequential.
__global__ void __launch_bounds__(kRowBlock)
    permutations_kernel(const int64_t* __restrict__ lengths, int64_t rows, int64_t width,
                        int64_t permutations, uint64_t seed, uint64_t row_offset,
                        uint64_t permutation_offset, int64_t* __restrict__ out) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  permutations_item(item, stride, lengths, rows, width, permutations, seed, row_offset,
                    permutation_offset, out);
}

template <typename scalar_t, int LOCAL>
__global__ void __launch_bounds__(kRowBlock)
    tvd_kernel(const scalar_t* __restrict__ att, const scalar_t* __restrict__ proj,
               const scalar_t* __restrict__ bias, const int64_t* __restrict__ lengths,
               int64_t begin, int64_t end, int64_t width, int64_t classes, int64_t permutations,
               uint64_t seed, uint64_t row_offset, unsigned char* __restrict__ scratch,
               int64_t slots, double* __restrict__ chunk, scalar_t* __restrict__ tvd) {
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= slots) return;
  permutation_tvd_slot<scalar_t, LOCAL>(slot, slots, att, proj, bias, lengths, begin, end, width,
                                        classes, permutations, seed, row_offset, scratch, chunk,
                                        tvd);
}

template <typename scalar_t>
__global__ void __launch_bounds__(kRowBlock)
    median_kernel(int64_t begin, int64_t end, int64_t permutations, double* __restrict__ chunk,
                  scalar_t* __restrict__ median) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  permutation_median_row(row, stride, begin, end, permutations, chunk, median);
}

template <typename scalar_t>
cudaError_t launch_tvd(const scalar_t* att, const scalar_t* proj, const scalar_t* bias,
                       const int64_t* lengths, int64_t rows, int64_t width, int64_t classes,
                       int64_t permutations, uint64_t seed, uint64_t row_offset, double* chunk,
                       int64_t chunk_rows, unsigned char* scratch, int64_t slots,
                       scalar_t* median, scalar_t* tvd, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (classes < 1 || permutations < 1 || chunk_rows < 1 || slots < 1 || slots > kMaxSlots ||
      slots > chunk_rows * permutations || chunk == nullptr || scratch == nullptr)
    return cudaErrorInvalidValue;
  const bool local = classes <= kLocalClasses;
  const dim3 grid(static_cast<unsigned int>(blocks_for(slots, kRowBlock)));
  // Chunks run one after another on the stream, reusing `chunk` and `scratch`.
  for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
    const int64_t end = min64(rows, begin + chunk_rows);
    if (local) {
      tvd_kernel<scalar_t, kLocalClasses><<<grid, kRowBlock, 0, stream>>>(
          att, proj, bias, lengths, begin, end, width, classes, permutations, seed, row_offset,
          scratch, slots, chunk, tvd);
    } else {
      tvd_kernel<scalar_t, 0><<<grid, kRowBlock, 0, stream>>>(
          att, proj, bias, lengths, begin, end, width, classes, permutations, seed, row_offset,
          scratch, slots, chunk, tvd);
    }
    const dim3 median_grid(static_cast<unsigned int>(blocks_for(end - begin, kRowBlock)));
    median_kernel<scalar_t><<<median_grid, kRowBlock, 0, stream>>>(begin, end, permutations,
                                                                    chunk, median);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t attention_permutations(const int64_t* lengths, int64_t rows, int64_t width,
                                   int64_t permutations, uint64_t seed, uint64_t row_offset,
                                   uint64_t permutation_offset, int64_t* out, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return cudaSuccess;  // width 0: nothing to write
  if (permutations < 1) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned int>(blocks_for(rows * permutations, kRowBlock)));
  permutations_kernel<<<grid, kRowBlock, 0, stream>>>(lengths, rows, width, permutations, seed,
                                                      row_offset, permutation_offset, out);
  return cudaGetLastError();
}

cudaError_t permutation_tvd_linear(const float* att, const float* proj, const float* bias,
                                   const int64_t* lengths, int64_t rows, int64_t width,
                                   int64_t classes, int64_t permutations, uint64_t seed,
                                   uint64_t row_offset, double* chunk_tvds, int64_t chunk_rows,
                                   unsigned char* scratch, int64_t slots, float* median,
                                   float* tvd, cudaStream_t stream) {
  return launch_tvd(att, proj, bias, lengths, rows, width, classes, permutations, seed,
                    row_offset, chunk_tvds, chunk_rows, scratch, slots, median, tvd, stream);
}
cudaError_t permutation_tvd_linear(const double* att, const double* proj, const double* bias,
                                   const int64_t* lengths, int64_t rows, int64_t width,
                                   int64_t classes, int64_t permutations, uint64_t seed,
                                   uint64_t row_offset, double* chunk_tvds, int64_t chunk_rows,
                                   unsigned char* scratch, int64_t slots, double* median,
                                   double* tvd, cudaStream_t stream) {
  return launch_tvd(att, proj, bias, lengths, rows, width, classes, permutations, seed,
                    row_offset, chunk_tvds, chunk_rows, scratch, slots, median, tvd, stream);
}

}  // namespace gpu
}  // namespace attnmetrics
