// Shape and dtype checks that the CPU impls and the CUDA glue share, so both back ends
// reject the same inputs with the same messages. Device and contiguity checks stay with
// each back end.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace attnmetrics {

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

}  // namespace attnmetrics
