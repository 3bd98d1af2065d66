// CUDA impl of lstm_runs (schema in ops.cpp; CPU impl in cpu/lstm.cpp). The step loop runs
// on the host, as the CPU impl's: per step one product h @ [W_hh.T | M.T] (ATen's mm, cuBLAS)
// and one launch of gpu::lstm_step. Reads back counts and index once (the loop needs the
// counts; both are checked on the host with the CPU impl's messages).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <utility>

#include "checks.h"
#include "cuda/glue.h"
#include "cuda/launch.h"

namespace attnmetrics {
namespace {

using namespace glue;

void lstm_runs_cuda(const at::Tensor& gates, const at::Tensor& index, const at::Tensor& counts,
                    const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& weight,
                    at::Tensor out, const std::optional<at::Tensor>& states) {
  TORCH_CHECK(gates.device().is_cuda(), "gates must be a CUDA tensor, got ", gates.device());
  for (const auto& [t, name] : {std::pair{&index, "index"}, {&counts, "counts"}, {&h0, "h0"},
                                {&c0, "c0"}, {&weight, "weight"}, {&out, "out"}}) {
    check_cuda_contiguous(*t, name, gates.device(), "gates");
  }
  if (states) check_cuda_contiguous(*states, "states", gates.device(), "gates");
  const auto [S, N, H, D] = check_lstm_runs_inputs(gates, index, counts, h0, c0, weight, out, states);
  const at::Tensor host_counts = counts.cpu(), host_index = index.cpu();
  const int64_t* cnt = host_counts.const_data_ptr<int64_t>();
  check_lstm_runs_values(cnt, host_index.const_data_ptr<int64_t>(), S, N, gates.size(0));

  const c10::cuda::CUDAGuard guard(gates.device());
  at::Tensor h = h0.clone(), c = c0.clone(), pre = at::empty({N, 4 * H + D}, gates.options());
  if (states) states->zero_();
  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lstm_runs_cuda", [&] {
    int64_t done = 0, now = N;  // as the CPU impl: runs that did step s - 1, runs doing step s
    for (int64_t s = 0; s <= S; ++s) {
      while (now > 0 && (s == S || cnt[now - 1] <= s)) --now;
      const int64_t rows = std::max(done, now);
      if (rows > 0) {
        at::Tensor into = pre.narrow(0, 0, rows);
        at::mm_out(into, h.narrow(0, 0, rows), weight);
      }
      check_launch(
          gpu::lstm_step(gates.const_data_ptr<scalar_t>(),
                         s < S ? index.const_data_ptr<int64_t>() + s * N : nullptr,
                         pre.const_data_ptr<scalar_t>(), N, now, done, H, D,
                         c.mutable_data_ptr<scalar_t>(), h.mutable_data_ptr<scalar_t>(),
                         s > 0 ? out.mutable_data_ptr<scalar_t>() + (s - 1) * N * D : nullptr,
                         states && s < S ? states->mutable_data_ptr<scalar_t>() + s * N * H
                                         : nullptr,
                         S * N * H, current_stream()),
          "lstm_runs");
      done = now;
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) { m.impl("lstm_runs", &lstm_runs_cuda); }

}  // namespace attnmetrics
