// CUDA impls of attention_permutations and permutation_tvd_linear (schemas in ops.cpp;
// CPU impls in cpu/permutation.cpp). Common to the glue files: glue.h. The check that
// needs the data, lengths in [0, T], reads back the min and max length.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "checks.h"
#include "cuda/geometry.h"
#include "cuda/glue.h"
#include "cuda/launch.h"
#include "cuda/rows.h"

namespace attnmetrics {
namespace {

using namespace glue;

at::Tensor attention_permutations_cuda(const at::Tensor& lengths, int64_t width,
                                       int64_t permutations, int64_t seed, int64_t row_offset,
                                       int64_t permutation_offset) {
  TORCH_CHECK(lengths.device().is_cuda(), "lengths must be a CUDA tensor, got ", lengths.device());
  attnmetrics::check_permutations_args(lengths, width, permutations, row_offset,
                                       permutation_offset);
  const c10::cuda::CUDAGuard guard(lengths.device());
  const int64_t B = lengths.size(0);
  at::Tensor out = at::empty({B, permutations, width}, lengths.options());
  if (B == 0) return out;
  check_lengths_on_device(lengths, width);
  check_launch(gpu::attention_permutations(
                   lengths.const_data_ptr<int64_t>(), B, width, permutations,
                   static_cast<uint64_t>(seed), static_cast<uint64_t>(row_offset),
                   static_cast<uint64_t>(permutation_offset), out.mutable_data_ptr<int64_t>(),
                   current_stream()),
               "attention_permutations");
  return out;
}

std::tuple<at::Tensor, at::Tensor> permutation_tvd_linear_cuda(
    const at::Tensor& attention, const at::Tensor& projected, const at::Tensor& bias,
    const at::Tensor& lengths, int64_t permutations, int64_t seed, int64_t row_offset) {
  TORCH_CHECK(attention.device().is_cuda(), "attention must be a CUDA tensor, got ",
              attention.device());
  const c10::Device device = attention.device();
  check_cuda_contiguous(lengths, "lengths", device);
  check_cuda_contiguous(projected, "projected", device);
  check_cuda_contiguous(bias, "bias", device);
  attnmetrics::check_permutation_attention(attention, lengths);
  attnmetrics::check_permutation_counts(permutations, row_offset);
  const int64_t C = attnmetrics::check_linear_head(attention, projected, bias);
  const int64_t B = attention.size(0), T = attention.size(1), P = permutations;

  const c10::cuda::CUDAGuard guard(device);
  at::Tensor median = at::empty({B}, attention.options());
  at::Tensor tvd = at::empty({B, P}, attention.options());
  if (B == 0) return {median, tvd};
  check_lengths_on_device(lengths, T);

  const int64_t chunk_rows = gpu::permutation_chunk_rows(B, P);
  const int64_t slot_bytes = gpu::permutation_slot_bytes(T, C);
  const int64_t slots = gpu::slots_for(chunk_rows * P, slot_bytes, gpu::kScratchBudget / 2);
  at::Tensor chunk = at::empty({chunk_rows * P}, attention.options().dtype(at::kDouble));
  at::Tensor scratch = at::empty({std::max<int64_t>(1, slots * slot_bytes)},
                                 attention.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES(attention.scalar_type(), "permutation_tvd_linear_cuda", [&] {
    check_launch(gpu::permutation_tvd_linear(
                     attention.const_data_ptr<scalar_t>(), projected.const_data_ptr<scalar_t>(),
                     bias.const_data_ptr<scalar_t>(), lengths.const_data_ptr<int64_t>(), B, T, C,
                     P, static_cast<uint64_t>(seed), static_cast<uint64_t>(row_offset),
                     chunk.mutable_data_ptr<double>(), chunk_rows,
                     scratch.mutable_data_ptr<uint8_t>(), slots,
                     median.mutable_data_ptr<scalar_t>(), tvd.mutable_data_ptr<scalar_t>(),
                     current_stream()),
                 "permutation_tvd_linear");
  });
  return {median, tvd};
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) {
  m.impl("attention_permutations", &attention_permutations_cuda);
  m.impl("permutation_tvd_linear", &permutation_tvd_linear_cuda);
}

}  // namespace attnmetrics
