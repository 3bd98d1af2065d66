// CUDA kendall_tau: one thread per row running kernels/kendall.h's tau_row (the
// CPU back end's algorithm) on per-slot scratch in global memory, rows
// grid-strided over the slots (rows.h kendall_slot).
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <vector>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "cuda/rows.h"

namespace attnmetrics {
namespace gpu {
namespace {

template <typename scalar_t>
__global__ void __launch_bounds__(kRowBlock)
    kendall_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ y,
                   const int64_t* __restrict__ lengths, int64_t rows, int64_t width,
                   int64_t max_len, unsigned char* __restrict__ scratch, int64_t slots,
                   const double* __restrict__ exact_table, scalar_t* __restrict__ tau,
                   scalar_t* __restrict__ pvalue) {
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= slots) return;
  kendall_slot(slot, slots, x, y, lengths, rows, width, max_len, scratch, exact_table, tau,
               pvalue);
}

// The exact-p table (~24 KB) in global memory of each device, built on the host
// with kernels/kendall.h's build_exact_table and uploaded once per device;
// deliberately never freed (it lives as long as the process).
cudaError_t device_exact_table(cudaStream_t stream, const double** table) {
  static std::mutex mutex;
  static std::map<int, const double*> tables;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = tables.find(device);
  if (it == tables.end()) {
    std::vector<double> host(static_cast<size_t>(kendall::exact_table_size()));
    kendall::build_exact_table(host.data());
    const size_t bytes = host.size() * sizeof(double);
    double* dev = nullptr;
    err = cudaMalloc(&dev, bytes);
    if (err != cudaSuccess) return err;
    err = cudaMemcpyAsync(dev, host.data(), bytes, cudaMemcpyHostToDevice, stream);
    // `host` is pageable and about to go away: wait for the copy.
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      cudaFree(dev);
      return err;
    }
    it = tables.emplace(device, dev).first;
  }
  *table = it->second;
  return cudaSuccess;
}

template <typename scalar_t>
cudaError_t launch(const scalar_t* x, const scalar_t* y, const int64_t* lengths, int64_t rows,
                   int64_t width, int64_t max_len, unsigned char* scratch, int64_t slots,
                   scalar_t* tau, scalar_t* pvalue, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (slots < 1 || slots > rows || slots > kMaxSlots || max_len < 0 || max_len > width) return cudaErrorInvalidValue;
  const double* table = nullptr;
  const cudaError_t err = device_exact_table(stream, &table);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned int>(blocks_for(slots, kRowBlock)));
  kendall_kernel<scalar_t><<<grid, kRowBlock, 0, stream>>>(x, y, lengths, rows, width, max_len,
                                                           scratch, slots, table, tau, pvalue);
  return cudaGetLastError();
}

}  // namespace

cudaError_t kendall_tau(const float* x, const float* y, const int64_t* lengths, int64_t rows,
                        int64_t width, int64_t max_len, unsigned char* scratch, int64_t slots,
                        float* tau, float* pvalue, cudaStream_t stream) {
  return launch(x, y, lengths, rows, width, max_len, scratch, slots, tau, pvalue, stream);
}
cudaError_t kendall_tau(const double* x, const double* y, const int64_t* lengths, int64_t rows,
                        int64_t width, int64_t max_len, unsigned char* scratch, int64_t slots,
                        double* tau, double* pvalue, cudaStream_t stream) {
  return launch(x, y, lengths, rows, width, max_len, scratch, slots, tau, pvalue, stream);
}

}  // namespace gpu
}  // namespace attnmetrics
