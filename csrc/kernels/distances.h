// Shared by the CPU and CUDA distance kernels (cpu/distances.cpp, cuda/rows.h): the value
// checks' bits of one entry, as value_flags and tvd_checked / jsd_checked report them.
#pragma once

#include <math.h>

#include "kernels/macros.h"

namespace attnmetrics {

// 1: NaN or infinite; 2: negative (and finite); 0 otherwise. An input's bits go in bits 0-1
// of the flags (p) or, shifted by 2, bits 2-3 (q).
template <typename scalar_t>
AM_HOST_DEVICE inline int entry_flag(scalar_t x) {
  return isfinite(x) ? (x < scalar_t(0) ? 2 : 0) : 1;
}

}  // namespace attnmetrics
