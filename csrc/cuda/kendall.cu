// CUDA kendall_tau. Rows of at most kKendallPairwiseMaxLen items (every attention
// row of SST or IMDB, and L = 4,096): a block per row counting all pairs at once.
// Longer rows: one thread per row running kernels/kendall.h's tau_row (the CPU back
// end's algorithm) on per-slot scratch in global memory, rows grid-strided over the
// slots (rows.h kendall_slot).
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

// Rows of at most kKendallPairwiseMaxLen items: a block per row (grid-stride over
// rows), each thread comparing its share of the items with all n (kendall.h
// pair_counts), the block's counts summed field by field (integers: the order of the
// sums cannot change them), and thread 0 finishing as tau_row does: the same bits.
template <typename scalar_t>
__global__ void __launch_bounds__(kBlock)
    kendall_pairwise_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ y,
                            const int64_t* __restrict__ lengths, int64_t rows, int64_t width,
                            const double* __restrict__ exact_table, scalar_t* __restrict__ tau,
                            scalar_t* __restrict__ pvalue) {
  constexpr int kWarps = kBlock / kWarp;
  constexpr int kFields = kendall::kPairCountFields;
  __shared__ long long sums[kWarps][kFields];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t n = lengths[row];
    kendall::PairCounts c =
        kendall::pair_counts(x + row * width, y + row * width, n, threadIdx.x, kBlock);
#pragma unroll
    for (int k = 0; k < kFields; ++k) {
      long long v = static_cast<long long>(c.field(k));
#pragma unroll
      for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
      }
      if (lane == 0) sums[warp][k] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      kendall::PairCounts total;
      for (int w = 0; w < kWarps; ++w) {
        for (int k = 0; k < kFields; ++k) total.field(k) += static_cast<int64_t>(sums[w][k]);
      }
      double tv, pv;
      kendall::tau_from_pair_counts(total, n, exact_table, &tv, &pv);
      tau[row] = static_cast<scalar_t>(tv);
      pvalue[row] = static_cast<scalar_t>(pv);
    }
    __syncthreads();  // sums is reused for the next row
  }
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
  if (kendall_pairwise(max_len)) {  // a block per row; no scratch
    const dim3 grid(static_cast<unsigned int>(blocks_for(rows, 1)));
    kendall_pairwise_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(x, y, lengths, rows, width,
                                                                    table, tau, pvalue);
    return cudaGetLastError();
  }
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
