// CUDA impls of flip_search_linear and renormalised_contexts (schemas in ops.cpp; CPU
// impls in cpu/flip.cpp). Common to the glue files: glue.h. The checks that need the
// data, lengths in [0, T] and each order prefix a permutation, run in a check kernel
// that sets device-side flags, read back with the offsets check and sum(lengths)
// (which sizes renormalised_contexts' output).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/where.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cuda/geometry.h"
#include "cuda/glue.h"
#include "cuda/launch.h"
#include "cuda/rows.h"
#include "kernels/flip.h"

namespace attnmetrics {
namespace {

using namespace glue;

// No offending row: the preset of check_rows' status entries and the offsets check's.
constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

// Shape, dtype and device checks shared by both ops (the CPU impls' check_rows
// without its data checks, which run_row_checks does on the device).
void check_rows_static(const at::Tensor& attention, const at::Tensor& order,
                       const at::Tensor& lengths) {
  TORCH_CHECK(attention.device().is_cuda(), "attention must be a CUDA tensor, got ",
              attention.device());
  const c10::Device device = attention.device();
  check_cuda_contiguous(attention, "attention", device);
  check_cuda_contiguous(order, "order", device);
  check_cuda_contiguous(lengths, "lengths", device);
  attnmetrics::check_flip_shapes(attention, order, lengths);
}

// The data checks, on the device, in one read back: lengths in [0, T], order
// prefixes, and with `offsets` given, offsets == exclusive cumsum of lengths.
// Returns sum(lengths). B >= 1.
int64_t run_row_checks(const at::Tensor& order, const at::Tensor& lengths,
                       const at::Tensor* offsets) {
  const int64_t B = order.size(0), T = order.size(1);
  at::Tensor status = at::full({2}, kNone, lengths.options());
  const int64_t slots = gpu::slots_for(B, T);
  at::Tensor seen = at::empty({std::max<int64_t>(1, slots * T)}, lengths.options().dtype(at::kByte));
  check_launch(gpu::check_rows(order.const_data_ptr<int64_t>(), lengths.const_data_ptr<int64_t>(),
                               B, T, seen.mutable_data_ptr<uint8_t>(), slots,
                               status.mutable_data_ptr<int64_t>(), current_stream()),
               "flip search input check");
  std::vector<at::Tensor> parts{status, lengths.sum().reshape({1})};
  if (offsets != nullptr) {
    const at::Tensor expected = lengths.cumsum(0).sub(lengths);
    const at::Tensor rows = at::arange(B, lengths.options());
    parts.push_back(at::where(offsets->ne(expected), rows, kNone).min().reshape({1}));
  }
  const at::Tensor host = at::cat(parts).cpu();  // the one read back
  const int64_t* h = host.const_data_ptr<int64_t>();

  if (h[gpu::kBadLength] != kNone) fail_on_first_bad_length(lengths, T, "");
  if (h[gpu::kBadOrder] != kNone) {
    const int64_t b = h[gpu::kBadOrder];
    const int64_t L = lengths[b].item<int64_t>();
    const at::Tensor row = order[b].cpu();
    std::vector<unsigned char> seen_host(static_cast<size_t>(T));
    int64_t k = 0;
    const int64_t* o = row.const_data_ptr<int64_t>();
    const bool ok = flip::order_is_permutation(o, L, seen_host.data(), &k);
    TORCH_CHECK(ok, "order[", b, "][:", L, "] must be a permutation of 0..", L - 1, ": entry order[",
                b, "][", k, "] = ", o[k], " is out of range or repeated");
    TORCH_CHECK(false, "order changed while being checked");  // not reached
  }
  if (offsets != nullptr && h[3] != kNone) {
    const int64_t b = h[3];
    const int64_t expected = b == 0 ? 0 : lengths.narrow(0, 0, b).sum().item<int64_t>();
    TORCH_CHECK(false, "offsets must be the exclusive cumsum of lengths: offsets[", b, "] = ",
                (*offsets)[b].item<int64_t>(), ", expected ", expected);
  }
  return h[2];
}

std::tuple<at::Tensor, at::Tensor> flip_search_linear_cuda(const at::Tensor& attention,
                                                           const at::Tensor& projected,
                                                           const at::Tensor& bias,
                                                           const at::Tensor& order,
                                                           const at::Tensor& lengths) {
  check_rows_static(attention, order, lengths);
  const c10::Device device = attention.device();
  check_cuda_contiguous(projected, "projected", device);
  check_cuda_contiguous(bias, "bias", device);
  const int64_t B = attention.size(0), T = attention.size(1);
  const int64_t C = attnmetrics::check_linear_head(attention, projected, bias);

  const c10::cuda::CUDAGuard guard(device);
  auto removed = at::empty({B}, attention.options().dtype(at::kLong));
  auto mass = at::empty({B}, attention.options());
  if (B == 0) return {removed, mass};
  run_row_checks(order, lengths, nullptr);

  const bool local = C <= gpu::kLocalClasses;
  const int64_t slots = gpu::slots_for(B, local ? 0 : C * static_cast<int64_t>(sizeof(double)));
  at::Tensor scratch;
  if (!local) scratch = at::empty({slots * C}, attention.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(attention.scalar_type(), "flip_search_linear_cuda", [&] {
    check_launch(
        gpu::flip_search_linear(
            attention.const_data_ptr<scalar_t>(), projected.const_data_ptr<scalar_t>(),
            bias.const_data_ptr<scalar_t>(), order.const_data_ptr<int64_t>(),
            lengths.const_data_ptr<int64_t>(), B, T, C,
            local ? nullptr : scratch.mutable_data_ptr<double>(), slots,
            removed.mutable_data_ptr<int64_t>(), mass.mutable_data_ptr<scalar_t>(),
            current_stream()),
        "flip_search_linear");
  });
  return {removed, mass};
}

at::Tensor renormalised_contexts_cuda(const at::Tensor& attention, const at::Tensor& values,
                                      const at::Tensor& order, const at::Tensor& lengths,
                                      const at::Tensor& offsets) {
  check_rows_static(attention, order, lengths);
  const c10::Device device = attention.device();
  check_cuda_contiguous(values, "values", device);
  check_cuda_contiguous(offsets, "offsets", device);
  const int64_t B = attention.size(0), T = attention.size(1);
  const int64_t H = attnmetrics::check_contexts_shapes(attention, values, offsets);

  const c10::cuda::CUDAGuard guard(device);
  if (B == 0) return at::empty({0, H}, values.options());
  const int64_t total = run_row_checks(order, lengths, &offsets);
  auto out = at::empty({total, H}, values.options());
  if (total == 0 || H == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(attention.scalar_type(), "renormalised_contexts_cuda", [&] {
    check_launch(gpu::renormalised_contexts(
                     attention.const_data_ptr<scalar_t>(), values.const_data_ptr<scalar_t>(),
                     order.const_data_ptr<int64_t>(), lengths.const_data_ptr<int64_t>(),
                     offsets.const_data_ptr<int64_t>(), B, T, H,
                     out.mutable_data_ptr<scalar_t>(), current_stream()),
                 "renormalised_contexts");
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) {
  m.impl("flip_search_linear", &flip_search_linear_cuda);
  m.impl("renormalised_contexts", &renormalised_contexts_cuda);
}

}  // namespace attnmetrics
