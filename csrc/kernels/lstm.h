// One LSTM cell update from its pre-activations, shared by the CPU impl of lstm_runs (its
// scalar path; cpu/lstm.cpp) and the CUDA kernel (cuda/lstm.cu). Plain functions, no torch
// headers.
#pragma once

#include "kernels/activations.h"
#include "kernels/macros.h"

namespace attnmetrics {
namespace lstm {

// Pre-activations i, f, g, o (torch's gate order) of one unit: c <- sigma(f) c + sigma(i)
// tanh(g); returns h = sigma(o) tanh(c).
template <typename scalar_t>
AM_HOST_DEVICE inline scalar_t cell(scalar_t i, scalar_t f, scalar_t g, scalar_t o, scalar_t& c) {
  c = sigmoid(f) * c + sigmoid(i) * tanh_by_sigmoid(g);
  return sigmoid(o) * tanh_by_sigmoid(c);
}

}  // namespace lstm
}  // namespace attnmetrics
