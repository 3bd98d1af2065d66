// CUDA impls of every op (schemas in ops.cpp): validate the tensors with the CPU
// impls' messages, allocate outputs and scratch with ATen (the caching allocator,
// on the current stream), call the torch-free launchers of csrc/cuda/*.cu on the
// current stream, and check the launch error. Built only when the loader finds a
// GPU and nvcc (attnmetrics/_ops.py).
//
// Checks that need the data (and so a device -> host read, which waits for the
// stream) cost at most one read per call, made before any kernel that trusts them:
//   tvd, jsd               none;
//   kendall_tau            lengths in [0, T]: a min/max reduction on the device,
//                          its two numbers read back (they also size the scratch);
//   flip_search_linear,    lengths in [0, T] and each order prefix a permutation:
//   renormalised_contexts  a check kernel sets device-side flags, read back with the
//                          offsets check and sum(lengths) (which sizes the output).
//   attention_permutations, lengths in [lo, T]: min and max length read back
//   permutation_tvd_linear, (leave_one_out_batch: with the output's size and width,
//   project_prefix,         computed from the lengths on the device).
//   leave_one_out_batch
// Only on failure are a few more values copied back, to name the offending entry
// as the CPU impls do. Unlike the CPU impls, every shape/dtype check runs before the
// data checks, so an input with several faults may be reported by another one.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "cuda/geometry.h"
#include "cuda/launch.h"
#include "cuda/rows.h"
#include "checks.h"
#include "kernels/flip.h"

namespace attnmetrics {
namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// A launcher's cudaError_t as a c10::Error naming the op (kernel launch failures
// and, for kendall_tau's first call on a device, the exact table's upload).
void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " (CUDA): ", cudaGetErrorString(err));
}

// ---- tvd / jsd ---------------------------------------------------------------------------

void check_distance_inputs(const char* op, const at::Tensor& p, const at::Tensor& q) {
  TORCH_CHECK(p.device().is_cuda() && q.device() == p.device(), op,
              " (CUDA): p and q must be CUDA tensors on one device, got ", p.device(), " and ",
              q.device());
  TORCH_CHECK(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble, op,
              ": p must be float32 or float64, got ", p.scalar_type());
  TORCH_CHECK(q.scalar_type() == p.scalar_type(), op, ": q must have p's dtype ",
              p.scalar_type(), ", got ", q.scalar_type());
  TORCH_CHECK(p.dim() == 2, op, ": p must be [N, K], got ", p.sizes());
  TORCH_CHECK(q.sizes() == p.sizes(), op, ": q must have p's shape ", p.sizes(), ", got ",
              q.sizes());
  TORCH_CHECK(p.is_contiguous() && q.is_contiguous(), op, ": p and q must be contiguous");
}

template <bool JSD>
at::Tensor distance_cuda(const at::Tensor& p, const at::Tensor& q) {
  const char* op = JSD ? "jsd" : "tvd";
  check_distance_inputs(op, p, q);
  const c10::cuda::CUDAGuard guard(p.device());
  at::Tensor out = at::empty({p.size(0)}, p.options());
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "distance_cuda", [&] {
    const scalar_t* ps = p.const_data_ptr<scalar_t>();
    const scalar_t* qs = q.const_data_ptr<scalar_t>();
    scalar_t* os = out.mutable_data_ptr<scalar_t>();
    const cudaError_t err = JSD ? gpu::jsd(ps, qs, os, p.size(0), p.size(1), current_stream())
                                : gpu::tvd(ps, qs, os, p.size(0), p.size(1), current_stream());
    check_launch(err, op);
  });
  return out;
}

at::Tensor tvd_cuda(const at::Tensor& p, const at::Tensor& q) { return distance_cuda<false>(p, q); }
at::Tensor jsd_cuda(const at::Tensor& p, const at::Tensor& q) { return distance_cuda<true>(p, q); }

// ---- kendall_tau -------------------------------------------------------------------------

void check_kendall_inputs(const at::Tensor& x, const at::Tensor& y, const at::Tensor& lengths) {
  TORCH_CHECK(x.device().is_cuda() && y.device() == x.device() && lengths.device() == x.device(),
              "kendall_tau (CUDA): all inputs must be CUDA tensors on one device, got ",
              x.device(), ", ", y.device(), ", ", lengths.device());
  attnmetrics::check_kendall_shapes(x, y, lengths);
}

// Error path only: the first length outside [low, width], as the CPU loop finds it.
[[noreturn]] void fail_on_first_bad_length(const at::Tensor& lengths, int64_t width,
                                           const char* prefix, int64_t low = 0,
                                           const char* low_name = "0") {
  const at::Tensor host = lengths.cpu();
  attnmetrics::check_length_range(host.const_data_ptr<int64_t>(), host.size(0), low, low_name,
                                  width, prefix);
  TORCH_CHECK(false, prefix, "lengths changed while being checked");  // not reached
}

// lengths [B >= 1] on the device all in [0, width], in one read back (min and max).
void check_lengths_on_device(const at::Tensor& lengths, int64_t width) {
  const auto [low, high] = at::aminmax(lengths);
  const at::Tensor range = at::stack({low, high}).cpu();
  const int64_t* h = range.const_data_ptr<int64_t>();
  if (h[0] < 0 || h[1] > width) fail_on_first_bad_length(lengths, width, "");
}

std::tuple<at::Tensor, at::Tensor> kendall_tau_cuda(const at::Tensor& x, const at::Tensor& y,
                                                    const at::Tensor& lengths) {
  check_kendall_inputs(x, y, lengths);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t batch = x.size(0);
  const int64_t width = x.size(1);
  at::Tensor tau = at::empty({batch}, x.options());
  at::Tensor pvalue = at::empty({batch}, x.options());
  if (batch == 0) return {tau, pvalue};

  // The one read back: min and max length (range check and scratch size).
  const auto [low, high] = at::aminmax(lengths);
  const at::Tensor range = at::stack({low, high}).cpu();
  const int64_t min_len = range.const_data_ptr<int64_t>()[0];
  const int64_t max_len = range.const_data_ptr<int64_t>()[1];
  if (min_len < 0 || max_len > width) fail_on_first_bad_length(lengths, width, "kendall_tau: ");

  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kendall_tau_cuda", [&] {
    const int64_t slot_bytes = gpu::kendall_slot_bytes<scalar_t>(max_len);
    const int64_t slots = gpu::slots_for(batch, slot_bytes);
    at::Tensor scratch = at::empty({std::max<int64_t>(1, slots * slot_bytes)},
                                   x.options().dtype(at::kByte));
    check_launch(gpu::kendall_tau(x.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(),
                                  lengths.const_data_ptr<int64_t>(), batch, width, max_len,
                                  scratch.mutable_data_ptr<uint8_t>(), slots,
                                  tau.mutable_data_ptr<scalar_t>(),
                                  pvalue.mutable_data_ptr<scalar_t>(), current_stream()),
                 "kendall_tau");
  });
  return {tau, pvalue};
}

// ---- flip search -------------------------------------------------------------------------

void check_cuda_contiguous(const at::Tensor& t, const char* name, const c10::Device& device,
                           const char* anchor = "attention") {
  TORCH_CHECK(t.device() == device, name, " must be a CUDA tensor on ", device, " (", anchor,
              "'s device), got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_floating(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, name,
              " must be float32 or float64, got ", t.scalar_type());
}

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
  check_floating(attention, "attention");
  TORCH_CHECK(attention.dim() == 2, "attention must have shape [B, T], got ", attention.sizes());
  TORCH_CHECK(order.scalar_type() == at::kLong, "order must be int64, got ", order.scalar_type());
  TORCH_CHECK(lengths.scalar_type() == at::kLong, "lengths must be int64, got ",
              lengths.scalar_type());
  TORCH_CHECK(order.sizes() == attention.sizes(), "order must have the shape of attention ",
              attention.sizes(), ", got ", order.sizes());
  const int64_t B = attention.size(0);
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == B, "lengths must have shape [B] = [", B,
              "], got ", lengths.sizes());
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
  TORCH_CHECK(values.dim() == 3 && values.size(0) == B && values.size(1) == T,
              "values must have shape [B, T, H] = [", B, ", ", T, ", H], got ", values.sizes());
  TORCH_CHECK(values.scalar_type() == attention.scalar_type(), "values dtype ",
              values.scalar_type(), " must match attention dtype ", attention.scalar_type());
  TORCH_CHECK(offsets.scalar_type() == at::kLong, "offsets must be int64, got ",
              offsets.scalar_type());
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == B, "offsets must have shape [B] = [", B,
              "], got ", offsets.sizes());
  const int64_t H = values.size(2);

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

// ---- permutation test --------------------------------------------------------------------

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

// ---- project_prefix ----------------------------------------------------------------------

at::Tensor project_prefix_cuda(const at::Tensor& values, const at::Tensor& weight,
                               const at::Tensor& lengths) {
  TORCH_CHECK(values.device().is_cuda(), "values must be a CUDA tensor, got ", values.device());
  check_cuda_contiguous(weight, "weight", values.device(), "values");
  check_cuda_contiguous(lengths, "lengths", values.device(), "values");
  const int64_t C = attnmetrics::check_projection_inputs(values, weight, lengths);
  const int64_t B = values.size(0), T = values.size(1), H = values.size(2);

  const c10::cuda::CUDAGuard guard(values.device());
  at::Tensor out = at::empty({B, T, C}, values.options());
  if (B == 0) return out;
  check_lengths_on_device(lengths, T);
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "project_prefix_cuda", [&] {
    check_launch(gpu::project_prefix(values.const_data_ptr<scalar_t>(),
                                     weight.const_data_ptr<scalar_t>(),
                                     lengths.const_data_ptr<int64_t>(), B, T, H, C,
                                     out.mutable_data_ptr<scalar_t>(), current_stream()),
                 "project_prefix");
  });
  return out;
}

// ---- leave_one_out_batch -----------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor> leave_one_out_batch_cuda(
    const at::Tensor& tokens, const at::Tensor& lengths, int64_t lead, int64_t trail,
    std::optional<int64_t> mask_token, int64_t pad) {
  TORCH_CHECK(tokens.device().is_cuda(), "tokens must be a CUDA tensor, got ", tokens.device());
  TORCH_CHECK(lengths.device() == tokens.device(), "lengths must be a CUDA tensor on ",
              tokens.device(), " (tokens' device), got ", lengths.device());
  attnmetrics::check_loo_inputs(tokens, lengths, lead, trail, mask_token);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const bool mask = mask_token.has_value();

  const c10::cuda::CUDAGuard guard(tokens.device());
  if (B == 0) {
    return {at::empty({0, 0}, tokens.options()), at::empty({0}, lengths.options()),
            at::empty({0}, lengths.options())};
  }
  // The one read back: min and max length (range check), the number of sequences and the
  // longest one (only rows that yield a sequence count, as on the CPU) size the outputs.
  // Offsets are computed here, never taken from the caller.
  const at::Tensor real = lengths.sub(lead + trail);
  const at::Tensor offsets = real.cumsum(0).sub(real);
  const at::Tensor seq_len = mask ? lengths : lengths.sub(1);
  const auto [low, high] = at::aminmax(lengths);
  const at::Tensor host = at::stack({low, high, real.sum(),
                                     at::where(real.gt(0), seq_len, 0).max()}).cpu();
  const int64_t* h = host.const_data_ptr<int64_t>();
  if (h[0] < lead + trail || h[1] > T) {
    fail_on_first_bad_length(lengths, T, "", lead + trail, "lead + trail");
  }
  const int64_t total = h[2], width = h[3];
  at::Tensor out = at::empty({total, width}, tokens.options());
  at::Tensor out_lengths = at::empty({total}, lengths.options());
  at::Tensor out_source = at::empty({total}, lengths.options());
  check_launch(gpu::leave_one_out_batch(
                   tokens.const_data_ptr<int64_t>(), lengths.const_data_ptr<int64_t>(),
                   offsets.const_data_ptr<int64_t>(), B, T, lead, mask, mask_token.value_or(0),
                   pad, total, width, out.mutable_data_ptr<int64_t>(),
                   out_lengths.mutable_data_ptr<int64_t>(),
                   out_source.mutable_data_ptr<int64_t>(), current_stream()),
               "leave_one_out_batch");
  return {out, out_lengths, out_source};
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CUDA, m) {
  m.impl("tvd", &tvd_cuda);
  m.impl("jsd", &jsd_cuda);
  m.impl("kendall_tau", &kendall_tau_cuda);
  m.impl("flip_search_linear", &flip_search_linear_cuda);
  m.impl("renormalised_contexts", &renormalised_contexts_cuda);
  m.impl("attention_permutations", &attention_permutations_cuda);
  m.impl("permutation_tvd_linear", &permutation_tvd_linear_cuda);
  m.impl("project_prefix", &project_prefix_cuda);
  m.impl("leave_one_out_batch", &leave_one_out_batch_cuda);
}

}  // namespace attnmetrics
