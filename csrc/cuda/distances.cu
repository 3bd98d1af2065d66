// CUDA tvd / jsd on [rows, width] whose rows lie a fixed stride apart (launch.h; an expanded
// row has stride 0 and is read from cache): each row's sum in double, split
// across a group of lanes (4, a warp, or a block by width; geometry.h), the
// partial sums added in a fixed tree order, so results do not vary run to run.
#include <cuda_runtime.h>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "cuda/rows.h"

namespace attnmetrics {
namespace gpu {
namespace {

template <bool JSD, typename scalar_t>
__device__ __forceinline__ double partial(const scalar_t* a, const scalar_t* b, int64_t width,
                                          int64_t lane, int64_t lanes, int& flags) {
  return JSD ? jsd_partial(a, b, width, lane, lanes, flags) : tvd_partial(a, b, width, lane, lanes, flags);
}

// ORs the warp's lanes' flags into *flags (when given), one atomic per warp with a flag
// set. Every lane of the warp must call it.
__device__ __forceinline__ void gather_flags(int f, int* flags) {
  if (flags == nullptr) return;  // the same for the whole grid
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) f |= __shfl_xor_sync(0xffffffffu, f, offset);
  if (threadIdx.x % kWarp == 0 && f != 0) atomicOr(flags, f);
}

template <bool JSD>
__device__ __forceinline__ double finish(double sum) {
  return JSD ? jsd_finish(sum) : tvd_finish(sum);
}

// Sum over aligned groups of G lanes (G a power of two <= 32); lane 0 of each
// group gets the total. Every lane of the warp must call it.
template <int G>
__device__ __forceinline__ double group_sum(double s) {
#pragma unroll
  for (int offset = G / 2; offset > 0; offset /= 2) {
    s += __shfl_down_sync(0xffffffffu, s, offset, G);
  }
  return s;
}

// G lanes per row, kBlock / G rows per block, grid-stride over rows. The loop
// bound is the same for the whole block, so every lane reaches the shuffles;
// lanes past the last row add zeros. flags: null, or value_flags' bits ORed in.
template <typename scalar_t, int G, bool JSD>
__global__ void __launch_bounds__(kBlock)
    per_group_kernel(const scalar_t* __restrict__ p, int64_t p_stride, const scalar_t* __restrict__ q,
                    int64_t q_stride, scalar_t* __restrict__ out, int64_t rows, int64_t width,
                    int* __restrict__ flags) {
  int f = 0;
  constexpr int64_t kRowsPerBlock = kBlock / G;
  const int64_t lane = threadIdx.x % G;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; base < rows;
       base += stride) {
    const int64_t row = base + threadIdx.x / G;
    double s = 0.0;
    if (row < rows) s = partial<JSD>(p + row * p_stride, q + row * q_stride, width, lane, G, f);
    s = group_sum<G>(s);
    if (row < rows && lane == 0) out[row] = static_cast<scalar_t>(finish<JSD>(s));
  }
  gather_flags(f, flags);
}

// One block per row (wide rows), grid-stride over rows.
template <typename scalar_t, bool JSD>
__global__ void __launch_bounds__(kBlock)
    per_block_kernel(const scalar_t* __restrict__ p, int64_t p_stride, const scalar_t* __restrict__ q,
                    int64_t q_stride, scalar_t* __restrict__ out, int64_t rows, int64_t width,
                    int* __restrict__ flags) {
  constexpr int kWarps = kBlock / kWarp;
  int f = 0;
  __shared__ double warp_sums[kWarps];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    double s = partial<JSD>(p + row * p_stride, q + row * q_stride, width, threadIdx.x, kBlock, f);
    s = group_sum<kWarp>(s);
    if (lane == 0) warp_sums[warp] = s;
    __syncthreads();
    if (warp == 0) {
      s = lane < kWarps ? warp_sums[lane] : 0.0;
      s = group_sum<kWarp>(s);
      if (lane == 0) out[row] = static_cast<scalar_t>(finish<JSD>(s));
    }
    __syncthreads();  // warp_sums is reused for the next row
  }
  gather_flags(f, flags);
}

template <bool JSD, typename scalar_t>
cudaError_t launch(const scalar_t* p, int64_t ps, const scalar_t* q, int64_t qs, scalar_t* out,
                   int64_t rows, int64_t width, int* flags, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int lanes = distance_lanes(width);
  const dim3 grid(static_cast<unsigned int>(distance_blocks(rows, lanes)));
  if (lanes == kSmallGroup) {
    per_group_kernel<scalar_t, kSmallGroup, JSD><<<grid, kBlock, 0, stream>>>(p, ps, q, qs, out, rows, width, flags);
  } else if (lanes == kWarp) {
    per_group_kernel<scalar_t, kWarp, JSD><<<grid, kBlock, 0, stream>>>(p, ps, q, qs, out, rows, width, flags);
  } else {
    per_block_kernel<scalar_t, JSD><<<grid, kBlock, 0, stream>>>(p, ps, q, qs, out, rows, width, flags);
  }
  return cudaGetLastError();
}

// value_flags: one grid-stride pass over p, then q (rows.h entry_flag); each warp ORs
// its lanes' flags and one lane per warp with a flag set ORs them into *flags (zeroed by
// the caller).
template <typename scalar_t>
__global__ void __launch_bounds__(kBlock)
    value_flags_kernel(const scalar_t* __restrict__ p, int64_t np, const scalar_t* __restrict__ q,
                       int64_t nq, int* __restrict__ flags) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kBlock;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  int f = 0;
  for (int64_t i = first; i < np; i += stride) f |= entry_flag(p[i]);
  for (int64_t i = first; i < nq; i += stride) f |= entry_flag(q[i]) << 2;
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) f |= __shfl_xor_sync(0xffffffffu, f, offset);
  if (threadIdx.x % kWarp == 0 && f != 0) atomicOr(flags, f);
}

template <typename scalar_t>
cudaError_t launch_flags(const scalar_t* p, int64_t np, const scalar_t* q, int64_t nq, int* flags,
                         cudaStream_t stream) {
  const int64_t n = np > nq ? np : nq;
  if (n <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(value_flag_blocks(n)));
  value_flags_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(p, np, q, nq, flags);
  return cudaGetLastError();
}

}  // namespace

cudaError_t value_flags(const float* p, int64_t np, const float* q, int64_t nq, int* flags,
                        cudaStream_t stream) {
  return launch_flags(p, np, q, nq, flags, stream);
}
cudaError_t value_flags(const double* p, int64_t np, const double* q, int64_t nq, int* flags,
                        cudaStream_t stream) {
  return launch_flags(p, np, q, nq, flags, stream);
}

cudaError_t tvd(const float* p, int64_t p_stride, const float* q, int64_t q_stride, float* out,
                int64_t rows, int64_t width, int* flags, cudaStream_t stream) {
  return launch<false>(p, p_stride, q, q_stride, out, rows, width, flags, stream);
}
cudaError_t tvd(const double* p, int64_t p_stride, const double* q, int64_t q_stride, double* out,
                int64_t rows, int64_t width, int* flags, cudaStream_t stream) {
  return launch<false>(p, p_stride, q, q_stride, out, rows, width, flags, stream);
}
cudaError_t jsd(const float* p, int64_t p_stride, const float* q, int64_t q_stride, float* out,
                int64_t rows, int64_t width, int* flags, cudaStream_t stream) {
  return launch<true>(p, p_stride, q, q_stride, out, rows, width, flags, stream);
}
cudaError_t jsd(const double* p, int64_t p_stride, const double* q, int64_t q_stride, double* out,
                int64_t rows, int64_t width, int* flags, cudaStream_t stream) {
  return launch<true>(p, p_stride, q, q_stride, out, rows, width, flags, stream);
}

}  // namespace gpu
}  // namespace attnmetrics
