// CUDA project_prefix: a thread per output element (row, position, class), grid-stride,
// each running the CPU's dot product (kernels/projection.h, the same partial sums, so
// with --fmad=false the same bits); padding positions are written as 0 and never read.
#include <cuda_runtime.h>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "cuda/rows.h"

namespace attnmetrics {
namespace gpu {
namespace {

template <typename scalar_t>
__global__ void __launch_bounds__(kBlock)
    project_kernel(const scalar_t* __restrict__ values, const scalar_t* __restrict__ weight,
                   const int64_t* __restrict__ lengths, int64_t rows, int64_t width,
                   int64_t hidden, int64_t classes, scalar_t* __restrict__ out) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  project_item(item, stride, values, weight, lengths, rows, width, hidden, classes, out);
}

template <typename scalar_t>
cudaError_t launch(const scalar_t* values, const scalar_t* weight, const int64_t* lengths,
                   int64_t rows, int64_t width, int64_t hidden, int64_t classes, scalar_t* out,
                   cudaStream_t stream) {
  const int64_t items = rows * width * classes;
  if (items <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(blocks_for(items, kBlock)));
  project_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(values, weight, lengths, rows, width,
                                                        hidden, classes, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t project_prefix(const float* values, const float* weight, const int64_t* lengths,
                           int64_t rows, int64_t width, int64_t hidden, int64_t classes,
                           float* out, cudaStream_t stream) {
  return launch(values, weight, lengths, rows, width, hidden, classes, out, stream);
}
cudaError_t project_prefix(const double* values, const double* weight, const int64_t* lengths,
                           int64_t rows, int64_t width, int64_t hidden, int64_t classes,
                           double* out, cudaStream_t stream) {
  return launch(values, weight, lengths, rows, width, hidden, classes, out, stream);
}

}  // namespace gpu
}  // namespace attnmetrics
