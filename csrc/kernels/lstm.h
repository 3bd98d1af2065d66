// One LSTM cell update from its pre-activations, shared by the CPU impl of lstm_runs (its
// scalar path; cpu/lstm.cpp) and the CUDA kernel (cuda/lstm.cu). Plain functions, no torch
// headers.
#pragma once

#include <math.h>

#include "kernels/macros.h"

namespace attnmetrics {
namespace lstm {

template <typename scalar_t>
AM_HOST_DEVICE inline scalar_t sigmoid(scalar_t x) {
  return scalar_t(1) / (scalar_t(1) + exp(-x));
}

// tanh(x) = 2 sigmoid(2x) - 1, equal up to rounding (about 2e-7 in float32): one exp, so the
// CPU impl's vector path needs only a vector exp.
template <typename scalar_t>
AM_HOST_DEVICE inline scalar_t tanh_by_sigmoid(scalar_t x) {
  return scalar_t(2) * sigmoid(scalar_t(2) * x) - scalar_t(1);
}

// Pre-activations i, f, g, o (torch's gate order) of one unit: c <- sigma(f) c + sigma(i)
// tanh(g); returns h = sigma(o) tanh(c).
template <typename scalar_t>
AM_HOST_DEVICE inline scalar_t cell(scalar_t i, scalar_t f, scalar_t g, scalar_t o, scalar_t& c) {
  c = sigmoid(f) * c + sigmoid(i) * tanh_by_sigmoid(g);
  return sigmoid(o) * tanh_by_sigmoid(c);
}

}  // namespace lstm
}  // namespace attnmetrics
