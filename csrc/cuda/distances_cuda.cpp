// CUDA impls of tvd and jsd (schemas in ops.cpp; CPU impls in cpu/distances.cpp).
// Common to the glue files: glue.h. No check needs the data: no read back.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "cuda/glue.h"
#include "cuda/launch.h"

namespace attnmetrics {
namespace {

using namespace glue;

void check_distance_inputs(const char* op, const at::Tensor& p, const at::Tensor& q) {
  TORCH_CHECK(p.device().is_cuda() && q.device() == p.device(), op,
              " (CUDA): p and q must be CUDA tensors on one device, got ", p.device(), " and ",
              q.device());
  attnmetrics::check_distance_shapes(op, p, q);
}

// flags: null, or int32 [1] on p's device that the kernel ORs value_flags' bits into.
template <bool JSD>
at::Tensor distance_cuda(const at::Tensor& p, const at::Tensor& q, int* flags = nullptr) {
  const char* op = JSD ? "jsd" : "tvd";
  const c10::cuda::CUDAGuard guard(p.device());
  at::Tensor out = attnmetrics::distance_output(p);
  const int64_t rows = out.numel(), width = p.size(-1);
  const int64_t sp = attnmetrics::row_stride(p), sq = attnmetrics::row_stride(q);
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "distance_cuda", [&] {
    const scalar_t* ps = p.const_data_ptr<scalar_t>();
    const scalar_t* qs = q.const_data_ptr<scalar_t>();
    scalar_t* os = out.mutable_data_ptr<scalar_t>();
    const cudaError_t err = JSD ? gpu::jsd(ps, sp, qs, sq, os, rows, width, flags, current_stream())
                                : gpu::tvd(ps, sp, qs, sq, os, rows, width, flags, current_stream());
    check_launch(err, op);
  });
  return out;
}

// tvd / jsd without the value checks (the library's own callers on valid inputs).
template <bool JSD>
at::Tensor distance_plain_cuda(const at::Tensor& p, const at::Tensor& q) {
  check_distance_inputs(JSD ? "jsd" : "tvd", p, q);
  return distance_cuda<JSD>(p, q);
}

// The distance with the value checks in its own pass (rows.h tvd_partial / jsd_partial),
// ORed into the caller's flags; no read back.
template <bool JSD>
at::Tensor distance_checked_cuda(const at::Tensor& p, const at::Tensor& q, const at::Tensor& flags) {
  const char* op = JSD ? "jsd_checked" : "tvd_checked";
  check_distance_inputs(op, p, q);
  attnmetrics::check_flags_buffer(op, flags, p);
  return distance_cuda<JSD>(p, q, flags.mutable_data_ptr<int>());
}

at::Tensor value_flags_cuda(const at::Tensor& p, const at::Tensor& q) {
  attnmetrics::check_value_flags_inputs(p, q);
  TORCH_CHECK(p.device().is_cuda() && q.device() == p.device(),
              "value_flags (CUDA): p and q must be CUDA tensors on one device, got ", p.device(),
              " and ", q.device());
  const c10::cuda::CUDAGuard guard(p.device());
  at::Tensor flags = at::zeros({1}, p.options().dtype(at::kInt));
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "value_flags_cuda", [&] {
    check_launch(gpu::value_flags(p.const_data_ptr<scalar_t>(), p.numel(), q.const_data_ptr<scalar_t>(),
                                  q.numel(), flags.mutable_data_ptr<int>(), current_stream()),
                 "value_flags");
  });
  return flags;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) {
  m.impl("tvd", &distance_plain_cuda<false>);
  m.impl("jsd", &distance_plain_cuda<true>);
  m.impl("value_flags", &value_flags_cuda);
  m.impl("tvd_checked", &distance_checked_cuda<false>);
  m.impl("jsd_checked", &distance_checked_cuda<true>);
}

}  // namespace attnmetrics
