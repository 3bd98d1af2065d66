// CUDA flip_search_linear and renormalised_contexts, and the device-side checks
// of their lengths and orders. Per-row algorithms: kernels/flip.h (shared with
// the CPU back end); thread <-> row mapping: rows.h.
#include <cuda_runtime.h>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "cuda/rows.h"

namespace attnmetrics {
namespace gpu {
namespace {

__global__ void __launch_bounds__(kRowBlock)
    check_rows_kernel(const int64_t* __restrict__ order, const int64_t* __restrict__ lengths,
                      int64_t rows, int64_t width, unsigned char* __restrict__ seen,
                      int64_t slots, int64_t* status) {
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= slots) return;
  check_rows_slot(slot, slots, order, lengths, rows, width, seen, status);
}

template <typename scalar_t, int LOCAL>
__global__ void __launch_bounds__(kRowBlock)
    flip_linear_kernel(const scalar_t* __restrict__ att, const scalar_t* __restrict__ proj,
                       const scalar_t* __restrict__ bias, const int64_t* __restrict__ order,
                       const int64_t* __restrict__ lengths, int64_t rows, int64_t width,
                       int64_t classes, double* __restrict__ scratch, int64_t slots,
                       int64_t* __restrict__ removed, scalar_t* __restrict__ mass) {
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= slots) return;
  flip_linear_slot<scalar_t, LOCAL>(slot, slots, att, proj, bias, order, lengths, rows, width,
                                    classes, scratch, removed, mass);
}

// A warp per row, a column per lane (rows.h contexts_lane).
template <typename scalar_t>
__global__ void __launch_bounds__(kBlock)
    contexts_kernel(const scalar_t* __restrict__ att, const scalar_t* __restrict__ values,
                    const int64_t* __restrict__ order, const int64_t* __restrict__ lengths,
                    const int64_t* __restrict__ offsets, int64_t rows, int64_t width,
                    int64_t hidden, scalar_t* __restrict__ out) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  contexts_lane(thread / kWarp, groups, thread % kWarp, kWarp, att, values, order, lengths,
                offsets, rows, width, hidden, out);
}

template <typename scalar_t>
cudaError_t launch_linear(const scalar_t* att, const scalar_t* proj, const scalar_t* bias,
                          const int64_t* order, const int64_t* lengths, int64_t rows,
                          int64_t width, int64_t classes, double* scratch, int64_t slots,
                          int64_t* removed, scalar_t* mass, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (slots < 1 || slots > rows || slots > kMaxSlots || classes < 1) return cudaErrorInvalidValue;
  const bool local = classes <= kLocalClasses;
  if (!local && scratch == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned int>(blocks_for(slots, kRowBlock)));
  if (local) {
    flip_linear_kernel<scalar_t, kLocalClasses><<<grid, kRowBlock, 0, stream>>>(
        att, proj, bias, order, lengths, rows, width, classes, scratch, slots, removed, mass);
  } else {
    flip_linear_kernel<scalar_t, 0><<<grid, kRowBlock, 0, stream>>>(
        att, proj, bias, order, lengths, rows, width, classes, scratch, slots, removed, mass);
  }
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch_contexts(const scalar_t* att, const scalar_t* values, const int64_t* order,
                            const int64_t* lengths, const int64_t* offsets, int64_t rows,
                            int64_t width, int64_t hidden, scalar_t* out, cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(context_warps(rows) / (kBlock / kWarp)));
  contexts_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(att, values, order, lengths, offsets,
                                                         rows, width, hidden, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t check_rows(const int64_t* order, const int64_t* lengths, int64_t rows, int64_t width,
                       unsigned char* seen, int64_t slots, int64_t* status, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (slots < 1 || slots > rows || slots > kMaxSlots) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned int>(blocks_for(slots, kRowBlock)));
  check_rows_kernel<<<grid, kRowBlock, 0, stream>>>(order, lengths, rows, width, seen, slots,
                                                    status);
  return cudaGetLastError();
}

cudaError_t flip_search_linear(const float* att, const float* proj, const float* bias,
                               const int64_t* order, const int64_t* lengths, int64_t rows,
                               int64_t width, int64_t classes, double* scratch, int64_t slots,
                               int64_t* removed, float* mass, cudaStream_t stream) {
  return launch_linear(att, proj, bias, order, lengths, rows, width, classes, scratch, slots,
                       removed, mass, stream);
}
cudaError_t flip_search_linear(const double* att, const double* proj, const double* bias,
                               const int64_t* order, const int64_t* lengths, int64_t rows,
                               int64_t width, int64_t classes, double* scratch, int64_t slots,
                               int64_t* removed, double* mass, cudaStream_t stream) {
  return launch_linear(att, proj, bias, order, lengths, rows, width, classes, scratch, slots,
                       removed, mass, stream);
}

cudaError_t renormalised_contexts(const float* att, const float* values, const int64_t* order,
                                  const int64_t* lengths, const int64_t* offsets, int64_t rows,
                                  int64_t width, int64_t hidden, float* out, cudaStream_t stream) {
  return launch_contexts(att, values, order, lengths, offsets, rows, width, hidden, out, stream);
}
cudaError_t renormalised_contexts(const double* att, const double* values, const int64_t* order,
                                  const int64_t* lengths, const int64_t* offsets, int64_t rows,
                                  int64_t width, int64_t hidden, double* out, cudaStream_t stream) {
  return launch_contexts(att, values, order, lengths, offsets, rows, width, hidden, out, stream);
}

}  // namespace gpu
}  // namespace attnmetrics
