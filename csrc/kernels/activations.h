// The sigmoid and tanh as the kernels compute them, shared by the CPU impls' scalar paths and
// the CUDA kernels (lstm_runs' cell, kernels/lstm.h; spliced_attention's scores). Plain
// functions, no torch headers.
#pragma once

#include <math.h>

#include "kernels/macros.h"

namespace attnmetrics {

template <typename scalar_t>
AM_HOST_DEVICE inline scalar_t sigmoid(scalar_t x) {
  return scalar_t(1) / (scalar_t(1) + exp(-x));
}

// tanh(x) = 2 sigmoid(2x) - 1, equal up to rounding (about 2e-7 in float32): one exp, so the
// CPU impls' vector paths need only a vector exp (cpu/vec_avx2.h).
template <typename scalar_t>
AM_HOST_DEVICE inline scalar_t tanh_by_sigmoid(scalar_t x) {
  return scalar_t(2) * sigmoid(scalar_t(2) * x) - scalar_t(1);
}

}  // namespace attnmetrics
