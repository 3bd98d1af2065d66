// Shape and dtype checks that the CPU impls (csrc/cpu/*.cpp) and the CUDA glue
// (csrc/cuda/*_cuda.cpp) share, so both back ends reject the same inputs with the same
// messages. Device checks stay with each back end, and so does contiguity where a back end
// checks it together with the device.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/loo.h"
#include "kernels/rollout.h"

namespace attnmetrics {

// Every len[b] (host memory, b < batch) in [low, high], else an error naming the first
// offender: "<prefix>lengths[b] = v is outside [<low_name>, T] = [low, high]". The CPU impls
// run it on their lengths; the CUDA glue on a host copy, once a device check has failed.
inline void check_length_range(const int64_t* len, int64_t batch, int64_t low,
                               const char* low_name, int64_t high, const char* prefix = "") {
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(len[b] >= low && len[b] <= high, prefix, "lengths[", b, "] = ", len[b],
                " is outside [", low_name, ", T] = [", low, ", ", high, "]");
  }
}

// t float32 or float64: "<name> must be float32 or float64, got <dtype>".
inline void check_floating(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, name,
              " must be float32 or float64, got ", t.scalar_type());
}

// A linear head on projected values: projected [B, T, C] = values @ W.T and bias [C],
// both of attention's dtype. Returns C.
inline int64_t check_linear_head(const at::Tensor& attention, const at::Tensor& projected,
                                 const at::Tensor& bias) {
  const int64_t B = attention.size(0), T = attention.size(1);
  TORCH_CHECK(projected.dim() == 3 && projected.size(0) == B && projected.size(1) == T,
              "projected must have shape [B, T, C] = [", B, ", ", T, ", C], got ",
              projected.sizes());
  const int64_t C = projected.size(2);
  TORCH_CHECK(C >= 1, "projected must have C >= 1 classes, got C = ", C);
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == C, "bias must have shape [C] = [", C, "], got ",
              bias.sizes());
  TORCH_CHECK(projected.scalar_type() == attention.scalar_type(), "projected dtype ",
              projected.scalar_type(), " must match attention dtype ", attention.scalar_type());
  TORCH_CHECK(bias.scalar_type() == attention.scalar_type(), "bias dtype ", bias.scalar_type(),
              " must match attention dtype ", attention.scalar_type());
  return C;
}

// ---- tvd / jsd ------------------------------------------------------------------------------

// The distance in elements between consecutive rows of t [..., K] when the distance kernels can
// read t in place: unit stride along K and the rows a fixed stride apart when the batch dims are
// flattened (K for a contiguous tensor, 0 for one row expanded over the batch, as q[0].expand_as(p);
// size-1 dims ignored); -1 when they cannot (a copy is needed). attnmetrics/distances.py
// _in_place_rows is the same rule in Python.
inline int64_t row_stride(const at::Tensor& t) {
  if (t.numel() == 0) return t.size(-1);  // nothing is read
  if (t.size(-1) > 1 && t.stride(-1) != 1) return -1;
  int64_t stride = t.size(-1), span = -1;  // span: stride * size of the batch dim inside this one
  for (int64_t i = t.dim() - 2; i >= 0; --i) {
    if (t.size(i) == 1) continue;
    if (span < 0) {
      stride = t.stride(i);
    } else if (t.stride(i) != span) {
      return -1;
    }
    span = t.stride(i) * t.size(i);
  }
  return stride;
}

// tvd's or jsd's (op's) p, q [..., K] (float32/float64, one dtype, one shape, rows readable in
// place: row_stride >= 0).
inline void check_distance_shapes(const char* op, const at::Tensor& p, const at::Tensor& q) {
  TORCH_CHECK(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble, op,
              ": p must be float32 or float64, got ", p.scalar_type());
  TORCH_CHECK(q.scalar_type() == p.scalar_type(), op, ": q must have p's dtype ",
              p.scalar_type(), ", got ", q.scalar_type());
  TORCH_CHECK(p.dim() >= 1, op, ": p must be [..., K] (at least one dimension), got a 0-d tensor");
  TORCH_CHECK(q.sizes() == p.sizes(), op, ": q must have p's shape ", p.sizes(), ", got ",
              q.sizes());
  TORCH_CHECK(row_stride(p) >= 0 && row_stride(q) >= 0, op,
              ": p and q must be contiguous along K with their rows a fixed stride apart (a contiguous "
              "tensor, or one row expanded over the batch), got strides ", p.strides(), " and ",
              q.strides());
}

// The output of a distance over p's last dimension: p's shape without it; its numel() is the
// number of rows, each p.size(-1) wide.
inline at::Tensor distance_output(const at::Tensor& p) {
  return at::empty(p.sizes().slice(0, p.dim() - 1), p.options());
}

// tvd_checked / jsd_checked's flags: int32 [1] on p's device, ORed into in place.
inline void check_flags_buffer(const char* op, const at::Tensor& flags, const at::Tensor& p) {
  TORCH_CHECK(flags.scalar_type() == at::kInt && flags.numel() == 1 && flags.is_contiguous(), op,
              ": flags must be a contiguous int32 tensor of one element, got ", flags.scalar_type(), " ",
              flags.sizes());
  TORCH_CHECK(flags.device() == p.device(), op, ": flags must be on p's device ", p.device(), ", got ",
              flags.device());
}

// value_flags' p and q: float32/float64, one dtype, contiguous, any shapes.
inline void check_value_flags_inputs(const at::Tensor& p, const at::Tensor& q) {
  TORCH_CHECK(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble,
              "value_flags: p must be float32 or float64, got ", p.scalar_type());
  TORCH_CHECK(q.scalar_type() == p.scalar_type(), "value_flags: q must have p's dtype ",
              p.scalar_type(), ", got ", q.scalar_type());
  TORCH_CHECK(p.is_contiguous() && q.is_contiguous(), "value_flags: p and q must be contiguous");
}

// ---- kendall_tau ---------------------------------------------------------------------------

// kendall_tau's x, y [B, T] (float32/float64, one dtype, contiguous) and lengths [B] int64.
inline void check_kendall_shapes(const at::Tensor& x, const at::Tensor& y,
                                 const at::Tensor& lengths) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "kendall_tau: x must be float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(y.scalar_type() == x.scalar_type(), "kendall_tau: y must have x's dtype ",
              x.scalar_type(), ", got ", y.scalar_type());
  TORCH_CHECK(x.dim() == 2, "kendall_tau: x must be [B, T], got ", x.sizes());
  TORCH_CHECK(y.sizes() == x.sizes(), "kendall_tau: y must have x's shape ", x.sizes(),
              ", got ", y.sizes());
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous(),
              "kendall_tau: x and y must be contiguous");
  TORCH_CHECK(lengths.scalar_type() == at::kLong, "kendall_tau: lengths must be int64, got ",
              lengths.scalar_type());
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == x.size(0),
              "kendall_tau: lengths must be [B] = [", x.size(0), "], got ", lengths.sizes());
  TORCH_CHECK(lengths.is_contiguous(), "kendall_tau: lengths must be contiguous");
}

// ---- flip search (flip_search_linear, renormalised_contexts) -----------------------------

// attention [B, T] float32/float64, order [B, T] int64 and lengths [B] int64 (contiguity:
// each back end; values of lengths and order prefixes: the CPU impls' check_rows, the
// CUDA glue's run_row_checks).
inline void check_flip_shapes(const at::Tensor& attention, const at::Tensor& order,
                              const at::Tensor& lengths) {
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

// renormalised_contexts' values [B, T, H] of attention's dtype and offsets [B] int64, after
// check_flip_shapes (values of offsets: each back end). Returns H.
inline int64_t check_contexts_shapes(const at::Tensor& attention, const at::Tensor& values,
                                     const at::Tensor& offsets) {
  const int64_t B = attention.size(0), T = attention.size(1);
  TORCH_CHECK(values.dim() == 3 && values.size(0) == B && values.size(1) == T,
              "values must have shape [B, T, H] = [", B, ", ", T, ", H], got ", values.sizes());
  TORCH_CHECK(values.scalar_type() == attention.scalar_type(), "values dtype ",
              values.scalar_type(), " must match attention dtype ", attention.scalar_type());
  TORCH_CHECK(offsets.scalar_type() == at::kLong, "offsets must be int64, got ",
              offsets.scalar_type());
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == B, "offsets must have shape [B] = [", B,
              "], got ", offsets.sizes());
  return values.size(2);
}

// ---- permutation test (attention_permutations, permutation_tvd_linear) -------------------

// The generator draws bounded(x, n) with n <= L < 2^32 (kernels/permutation.h).
constexpr int64_t kMaxPermutationWidth = (int64_t(1) << 32) - 1;

// lengths [B] = [batch] int64 for rows of `width` items, width < 2^32 (values: check_length_range).
inline void check_permutation_lengths(const at::Tensor& lengths, int64_t batch, int64_t width) {
  TORCH_CHECK(lengths.is_contiguous(), "lengths must be contiguous");
  TORCH_CHECK(lengths.scalar_type() == at::kLong, "lengths must be int64, got ",
              lengths.scalar_type());
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, "lengths must have shape [B] = [",
              batch, "], got ", lengths.sizes());
  TORCH_CHECK(width >= 0 && width <= kMaxPermutationWidth,
              "width must lie in [0, 2^32 - 1], got ", width);
}

inline void check_permutation_counts(int64_t permutations, int64_t row_offset) {
  TORCH_CHECK(permutations >= 1, "permutations must be >= 1, got ", permutations);
  TORCH_CHECK(row_offset >= 0, "row_offset must be >= 0, got ", row_offset);
}

// attention_permutations' arguments but the values of lengths (check_length_range).
inline void check_permutations_args(const at::Tensor& lengths, int64_t width, int64_t permutations,
                                    int64_t row_offset, int64_t permutation_offset) {
  TORCH_CHECK(lengths.dim() == 1, "lengths must have shape [B], got ", lengths.sizes());
  check_permutation_lengths(lengths, lengths.size(0), width);
  check_permutation_counts(permutations, row_offset);
  TORCH_CHECK(permutation_offset >= 0, "permutation_offset must be >= 0, got ",
              permutation_offset);
}

// attention [B, T] float32/float64, contiguous, and its lengths [B].
inline void check_permutation_attention(const at::Tensor& attention, const at::Tensor& lengths) {
  TORCH_CHECK(attention.is_contiguous(), "attention must be contiguous");
  check_floating(attention, "attention");
  TORCH_CHECK(attention.dim() == 2, "attention must have shape [B, T], got ", attention.sizes());
  check_permutation_lengths(lengths, attention.size(0), attention.size(1));
}

// ---- project_prefix ------------------------------------------------------------------------

// values [B, T, H] float32/float64, weight [C, H] of its dtype, lengths [B] int64, all
// contiguous. Returns C.
inline int64_t check_projection_inputs(const at::Tensor& values, const at::Tensor& weight,
                                       const at::Tensor& lengths) {
  TORCH_CHECK(values.is_contiguous(), "values must be contiguous");
  TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous");
  TORCH_CHECK(lengths.is_contiguous(), "lengths must be contiguous");
  check_floating(values, "values");
  TORCH_CHECK(values.dim() == 3, "values must have shape [B, T, H], got ", values.sizes());
  const int64_t B = values.size(0), H = values.size(2);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == H, "weight must have shape [C, H] = [C, ",
              H, "], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == values.scalar_type(), "weight dtype ",
              weight.scalar_type(), " must match values dtype ", values.scalar_type());
  TORCH_CHECK(lengths.scalar_type() == at::kLong, "lengths must be int64, got ",
              lengths.scalar_type());
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == B, "lengths must have shape [B] = [", B,
              "], got ", lengths.sizes());
  return weight.size(0);
}

// ---- leave_one_out_batch -------------------------------------------------------------------

// tokens [B, T] and lengths [B] int64, contiguous; lead, trail in [0, T]; mask_token >= 0
// (values of lengths: check_length_range over [lead + trail, T]).
inline void check_loo_inputs(const at::Tensor& tokens, const at::Tensor& lengths, int64_t lead,
                             int64_t trail, std::optional<int64_t> mask_token) {
  TORCH_CHECK(tokens.scalar_type() == at::kLong, "tokens must be int64, got ",
              tokens.scalar_type());
  TORCH_CHECK(lengths.scalar_type() == at::kLong, "lengths must be int64, got ",
              lengths.scalar_type());
  TORCH_CHECK(tokens.dim() == 2, "tokens must have shape [B, T], got ", tokens.sizes());
  TORCH_CHECK(tokens.is_contiguous(), "tokens must be contiguous");
  TORCH_CHECK(lengths.is_contiguous(), "lengths must be contiguous");
  const int64_t B = tokens.size(0), T = tokens.size(1);
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == B, "lengths must have shape [B] = [", B,
              "], got ", lengths.sizes());
  // Bounded by T first, so that lead + trail cannot overflow later.
  TORCH_CHECK(lead >= 0 && trail >= 0 && lead <= T && trail <= T,
              "lead and trail must lie in [0, T] = [0, ", T, "], got lead = ", lead,
              ", trail = ", trail);
  TORCH_CHECK(!mask_token.has_value() || *mask_token >= 0, "mask_token must be >= 0, got ",
              mask_token.value_or(0));
}

// ---- rationale_batch -----------------------------------------------------------------------

// leave_one_out_batch's tokens, lengths, lead, trail and mask_token, plus rank [B, R] int64 with
// R >= T - lead - trail (every real position of any valid row has an entry) and sizes [B, F]
// int64, both contiguous. Returns F.
inline int64_t check_rationale_inputs(const at::Tensor& tokens, const at::Tensor& lengths,
                                      const at::Tensor& rank, const at::Tensor& sizes,
                                      int64_t lead, int64_t trail,
                                      std::optional<int64_t> mask_token) {
  check_loo_inputs(tokens, lengths, lead, trail, mask_token);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  TORCH_CHECK(rank.scalar_type() == at::kLong, "rank must be int64, got ", rank.scalar_type());
  TORCH_CHECK(sizes.scalar_type() == at::kLong, "sizes must be int64, got ", sizes.scalar_type());
  TORCH_CHECK(rank.is_contiguous(), "rank must be contiguous");
  TORCH_CHECK(sizes.is_contiguous(), "sizes must be contiguous");
  const int64_t real = std::max<int64_t>(T - lead - trail, 0);
  TORCH_CHECK(rank.dim() == 2 && rank.size(0) == B && rank.size(1) >= real,
              "rank must have shape [B, R] = [", B, ", >= T - lead - trail = ", real, "], got ",
              rank.sizes());
  TORCH_CHECK(sizes.dim() == 2 && sizes.size(0) == B, "sizes must have shape [B, F] = [", B,
              ", F], got ", sizes.sizes());
  TORCH_CHECK(rank.device() == tokens.device(), "rank must be on tokens' device ", tokens.device(),
              ", got ", rank.device());
  TORCH_CHECK(sizes.device() == lengths.device(), "sizes must be on lengths' device ",
              lengths.device(), ", got ", sizes.device());
  return sizes.size(1);
}

// ---- host plans of leave_one_out_batch and rationale_batch ---------------------------------
// From lengths (and sizes) in host memory, after the range check: where each row's sequences
// start, how many there are and how wide. The CPU impls plan this way, and so does the CUDA
// glue when lengths come on the host (no read back of the device).

struct SequencePlan {
  std::vector<int64_t> offsets;  // leave-one-out: [B], row b's first sequence; ERASER: [B + 1]
  std::vector<int64_t> index;    // ERASER only: b * F + f of each sequence, row-major
  int64_t total = 0;             // the number of sequences
  int64_t width = 0;             // leave-one-out only: the longest sequence (ERASER's are T wide)
};

// len [B] in [lead + trail, T] (else the error names the first offender).
inline SequencePlan plan_leave_one_out(const int64_t* len, int64_t B, int64_t T, int64_t lead,
                                       int64_t trail, bool mask) {
  check_length_range(len, B, lead + trail, "lead + trail", T);
  SequencePlan plan;
  plan.offsets.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = loo::real_count(len[b], lead, trail);
    plan.offsets[static_cast<size_t>(b)] = plan.total;
    plan.total += n;
    // Only rows that yield a sequence set the width: no padding beyond the longest.
    if (n > 0) plan.width = std::max(plan.width, loo::sequence_length(len[b], mask));
  }
  return plan;
}

// len [B] as plan_leave_one_out; k [B, F]: one sequence per entry >= 0.
inline SequencePlan plan_rationales(const int64_t* len, const int64_t* k, int64_t B, int64_t F,
                                    int64_t T, int64_t lead, int64_t trail) {
  check_length_range(len, B, lead + trail, "lead + trail", T);
  SequencePlan plan;
  plan.offsets.assign(static_cast<size_t>(B) + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t f = 0; f < F; ++f) {
      if (k[b * F + f] >= 0) plan.index.push_back(b * F + f);
    }
    plan.offsets[static_cast<size_t>(b) + 1] = static_cast<int64_t>(plan.index.size());
  }
  plan.total = static_cast<int64_t>(plan.index.size());
  return plan;
}

// ---- attention_rollout ---------------------------------------------------------------------

// attentions [B, layers, heads, T, T] float32/float64 with layers, heads >= 1, lengths [B]
// int64, both contiguous; residual in [0, 1] (values of lengths: check_length_range over
// [0, T]; finite, non-negative attention: the Python wrapper, attnmetrics.attention_rollout).
inline void check_rollout_inputs(const at::Tensor& attentions, const at::Tensor& lengths,
                                 double residual) {
  check_floating(attentions, "attentions");
  TORCH_CHECK(attentions.dim() == 5 && attentions.size(3) == attentions.size(4),
              "attentions must have shape [B, layers, heads, T, T], got ", attentions.sizes());
  TORCH_CHECK(attentions.size(1) >= 1 && attentions.size(2) >= 1,
              "attentions must have layers >= 1 and heads >= 1, got ", attentions.sizes());
  TORCH_CHECK(attentions.is_contiguous(), "attentions must be contiguous");
  TORCH_CHECK(lengths.scalar_type() == at::kLong, "lengths must be int64, got ",
              lengths.scalar_type());
  const int64_t B = attentions.size(0);
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == B, "lengths must have shape [B] = [", B,
              "], got ", lengths.sizes());
  TORCH_CHECK(lengths.is_contiguous(), "lengths must be contiguous");
  TORCH_CHECK(residual >= 0.0 && residual <= 1.0, "residual must lie in [0, 1], got ", residual);
}

// Error path of attention_rollout: attentions and lengths in host memory (values of lengths
// already checked). Names the first row, layer and head whose valid L x L block holds a
// NaN, infinite or negative value; returns if there is none (padding may hold anything).
inline void check_rollout_values(const at::Tensor& attentions, const at::Tensor& lengths) {
  const int64_t B = attentions.size(0), layers = attentions.size(1), heads = attentions.size(2),
                T = attentions.size(3);
  const int64_t* len = lengths.const_data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(attentions.scalar_type(), "check_rollout_values", [&] {
    const scalar_t* att = attentions.const_data_ptr<scalar_t>();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t lh = rollout::first_invalid_head(att + b * layers * heads * T * T, layers,
                                                     heads, T, len[b]);
      TORCH_CHECK(lh < 0, "attentions contains NaN, infinite or negative values in the valid block "
                  "of row ", b, " (layer ", lh / heads, ", head ", lh % heads,
                  "); attention probabilities must be finite and non-negative");
    }
  });
}

// ---- lstm_runs -------------------------------------------------------------------------------

struct LstmRunsSizes {
  int64_t steps, runs, hidden, features;
};

// lstm_runs' shapes and dtypes (schema in ops.cpp), every tensor contiguous. Returns S, N, H, D.
inline LstmRunsSizes check_lstm_runs_inputs(const at::Tensor& gates, const at::Tensor& index,
                                            const at::Tensor& counts, const at::Tensor& h0,
                                            const at::Tensor& c0, const at::Tensor& weight,
                                            const at::Tensor& out,
                                            const std::optional<at::Tensor>& states) {
  check_floating(gates, "gates");
  TORCH_CHECK(gates.dim() == 2 && gates.size(1) % 4 == 0 && gates.size(1) > 0,
              "gates must have shape [R, 4 * hidden], got ", gates.sizes());
  const int64_t H = gates.size(1) / 4;
  TORCH_CHECK(index.dim() == 2, "index must have shape [S, N], got ", index.sizes());
  const int64_t S = index.size(0), N = index.size(1);
  TORCH_CHECK(index.scalar_type() == at::kLong, "index must be int64, got ", index.scalar_type());
  TORCH_CHECK(counts.scalar_type() == at::kLong, "counts must be int64, got ",
              counts.scalar_type());
  TORCH_CHECK(counts.dim() == 1 && counts.size(0) == N, "counts must have shape [N] = [", N,
              "], got ", counts.sizes());
  for (const auto& [t, name] : {std::pair{&h0, "h0"}, {&c0, "c0"}}) {
    TORCH_CHECK(t->dim() == 2 && t->size(0) == N && t->size(1) == H, name,
                " must have shape [N, hidden] = [", N, ", ", H, "], got ", t->sizes());
  }
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == H && weight.size(1) >= 4 * H,
              "weight must have shape [hidden, 4 * hidden + D] = [", H, ", ", 4 * H,
              " + D], got ", weight.sizes());
  const int64_t D = weight.size(1) - 4 * H;
  TORCH_CHECK(out.dim() == 3 && out.size(0) == S && out.size(1) == N && out.size(2) == D,
              "out must have shape [S, N, D] = [", S, ", ", N, ", ", D, "], got ", out.sizes());
  if (states) {
    TORCH_CHECK(states->dim() == 4 && states->size(0) == 2 && states->size(1) == S &&
                    states->size(2) == N && states->size(3) == H,
                "states must have shape [2, S, N, hidden] = [2, ", S, ", ", N, ", ", H, "], got ",
                states->sizes());
    TORCH_CHECK(states->scalar_type() == gates.scalar_type(), "states dtype ",
                states->scalar_type(), " must match gates dtype ", gates.scalar_type());
    TORCH_CHECK(states->is_contiguous(), "states must be contiguous");
  }
  for (const auto& [t, name] : {std::pair{&h0, "h0"}, {&c0, "c0"}, {&weight, "weight"},
                                {&out, "out"}}) {
    TORCH_CHECK(t->scalar_type() == gates.scalar_type(), name, " dtype ", t->scalar_type(),
                " must match gates dtype ", gates.scalar_type());
  }
  for (const auto& [t, name] : {std::pair{&gates, "gates"}, {&index, "index"},
                                {&counts, "counts"}, {&h0, "h0"}, {&c0, "c0"},
                                {&weight, "weight"}, {&out, "out"}}) {
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
  }
  return {S, N, H, D};
}

// lstm_runs' counts and index in host memory: counts non-increasing in [0, S], and every
// index a run reads (s < counts[k]) in [0, R).
inline void check_lstm_runs_values(const int64_t* counts, const int64_t* index, int64_t S,
                                   int64_t N, int64_t R) {
  for (int64_t k = 0; k < N; ++k) {
    TORCH_CHECK(counts[k] >= 0 && counts[k] <= S, "counts[", k, "] = ", counts[k],
                " is outside [0, S] = [0, ", S, "]");
    TORCH_CHECK(k == 0 || counts[k] <= counts[k - 1], "counts must be non-increasing (runs "
                "longest first), got counts[", k - 1, "] = ", counts[k - 1], " < counts[", k,
                "] = ", counts[k]);
  }
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t k = 0; k < N && counts[k] > s; ++k) {
      const int64_t i = index[s * N + k];
      TORCH_CHECK(i >= 0 && i < R, "index[", s, ", ", k, "] = ", i,
                  " is outside the gate table's rows [0, R) = [0, ", R, ")");
    }
  }
}

// ---- spliced_attention -----------------------------------------------------------------------

struct SplicedSizes {
  int64_t N, W, D, A;
};

// spliced_attention's shapes and dtypes (schema in ops.cpp), every tensor contiguous. Returns
// N, W, D, A.
inline SplicedSizes check_spliced_attention_inputs(const at::Tensor& table, const at::Tensor& pairs,
                                                   const at::Tensor& lengths, const at::Tensor& v,
                                                   int64_t lead, int64_t trail) {
  check_floating(table, "table");
  TORCH_CHECK(table.dim() == 2, "table must have shape [R, D], got ", table.sizes());
  const int64_t D = table.size(1);
  TORCH_CHECK(pairs.scalar_type() == at::kLong, "pairs must be int64, got ", pairs.scalar_type());
  TORCH_CHECK(pairs.dim() == 3 && pairs.size(2) == 2, "pairs must have shape [N, W, 2], got ",
              pairs.sizes());
  const int64_t N = pairs.size(0), W = pairs.size(1);
  TORCH_CHECK(lengths.scalar_type() == at::kLong, "lengths must be int64, got ",
              lengths.scalar_type());
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == N, "lengths must have shape [N] = [", N,
              "], got ", lengths.sizes());
  TORCH_CHECK(v.scalar_type() == table.scalar_type(), "v dtype ", v.scalar_type(),
              " must match table dtype ", table.scalar_type());
  TORCH_CHECK(v.dim() == 1 && v.size(0) >= 1 && v.size(0) <= D,
              "v must have shape [A] with 1 <= A <= D = ", D, ", got ", v.sizes());
  TORCH_CHECK(lead >= 0 && trail >= 0, "lead and trail must be >= 0, got lead = ", lead,
              ", trail = ", trail);
  for (const auto& [t, name] : {std::pair{&table, "table"}, {&pairs, "pairs"},
                                {&lengths, "lengths"}, {&v, "v"}}) {
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
  }
  return {N, W, D, v.size(0)};
}

// spliced_attention's lengths and pairs in host memory: lengths in [0, W], and both rows of
// every position that gets attention (lead <= j < lengths[i] - trail) in [0, R).
inline void check_spliced_attention_values(const int64_t* len, const int64_t* pairs, int64_t N,
                                           int64_t W, int64_t R, int64_t lead, int64_t trail) {
  check_length_range(len, N, 0, "0", W);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = lead; j < len[i] - trail; ++j) {
      for (int64_t k = 0; k < 2; ++k) {
        const int64_t r = pairs[(i * W + j) * 2 + k];
        TORCH_CHECK(r >= 0 && r < R, "pairs[", i, ", ", j, ", ", k, "] = ", r,
                    " is outside the table's rows [0, R) = [0, ", R, ")");
      }
    }
  }
}

}  // namespace attnmetrics
