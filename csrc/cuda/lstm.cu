// CUDA step of lstm_runs: a thread per (run, unit) for the cell update (kernels/lstm.h, as
// the CPU's scalar path) and a thread per (run, feature) for the step before's features;
// grid-stride. The product h @ [W_hh.T | M.T] is the glue's (cuBLAS through ATen).
#include <cuda_runtime.h>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "kernels/lstm.h"

namespace attnmetrics {
namespace gpu {
namespace {

template <typename scalar_t>
__global__ void __launch_bounds__(kBlock)
    cell_kernel(const scalar_t* __restrict__ gates, const int64_t* __restrict__ index,
                const scalar_t* __restrict__ pre, int64_t now, int64_t hidden, int64_t width,
                scalar_t* __restrict__ c, scalar_t* __restrict__ h, scalar_t* __restrict__ states,
                int64_t cell_offset) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       item < now * hidden; item += stride) {
    const int64_t k = item / hidden, j = item % hidden;
    const scalar_t* in = gates + index[k] * 4 * hidden + j;
    const scalar_t* p = pre + k * width + j;
    h[item] = lstm::cell(in[0] + p[0], in[hidden] + p[hidden], in[2 * hidden] + p[2 * hidden],
                         in[3 * hidden] + p[3 * hidden], c[item]);
    if (states != nullptr) {
      states[item] = h[item];
      states[cell_offset + item] = c[item];
    }
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kBlock)
    features_kernel(const scalar_t* __restrict__ pre, int64_t runs, int64_t done, int64_t hidden,
                    int64_t features, scalar_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       item < runs * features; item += stride) {
    const int64_t k = item / features, d = item % features;
    out[item] = k < done ? pre[k * (4 * hidden + features) + 4 * hidden + d] : scalar_t(0);
  }
}

template <typename scalar_t>
cudaError_t launch(const scalar_t* gates, const int64_t* index, const scalar_t* pre,
                   int64_t runs, int64_t now, int64_t done, int64_t hidden, int64_t features,
                   scalar_t* c, scalar_t* h, scalar_t* out, scalar_t* states,
                   int64_t cell_offset, cudaStream_t stream) {
  if (out != nullptr && runs * features > 0) {  // before the cells: pre stays unchanged anyway
    const dim3 grid(static_cast<unsigned int>(blocks_for(runs * features, kBlock)));
    features_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(pre, runs, done, hidden, features, out);
  }
  if (now * hidden > 0) {
    const dim3 grid(static_cast<unsigned int>(blocks_for(now * hidden, kBlock)));
    cell_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(gates, index, pre, now, hidden,
                                                        4 * hidden + features, c, h, states,
                                                        cell_offset);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t lstm_step(const float* gates, const int64_t* index, const float* pre, int64_t runs,
                      int64_t now, int64_t done, int64_t hidden, int64_t features, float* c,
                      float* h, float* out, float* states, int64_t cell_offset,
                      cudaStream_t stream) {
  return launch(gates, index, pre, runs, now, done, hidden, features, c, h, out, states,
                cell_offset, stream);
}
cudaError_t lstm_step(const double* gates, const int64_t* index, const double* pre, int64_t runs,
                      int64_t now, int64_t done, int64_t hidden, int64_t features, double* c,
                      double* h, double* out, double* states, int64_t cell_offset,
                      cudaStream_t stream) {
  return launch(gates, index, pre, runs, now, done, hidden, features, c, h, out, states,
                cell_offset, stream);
}

}  // namespace gpu
}  // namespace attnmetrics
