// Leave-one-out input construction (J&W 2019, sec. 4.1; docs/definitions.md §7) and ERASER's
// rationale sequences, its generalisation to many tokens at once, shared by the
// CPU and CUDA back ends. Plain functions on raw pointers, no torch headers, so
// that `nvcc -c` can compile-check them without a CUDA build of torch.
//
// Conventions: a source row holds L token ids (special tokens included) of which
// positions lead .. L-trail-1 are real. Each real position t gives one sequence:
// with `mask` false, the row with t deleted (length L-1); with `mask` true, the
// row with t replaced by `mask_token` (length L). Sequences are written into
// rows of `width` ids; the positions past the sequence's length hold `pad`.
#pragma once

#include <cstdint>

#include "kernels/macros.h"

namespace attnmetrics {
namespace loo {

// Real positions of a row: L - lead - trail (callers check L >= lead + trail).
AM_HOST_DEVICE inline int64_t real_count(int64_t L, int64_t lead, int64_t trail) {
  return L - lead - trail;
}

// Length of each sequence built from a row of length L.
AM_HOST_DEVICE inline int64_t sequence_length(int64_t L, bool mask) { return mask ? L : L - 1; }

// One sequence: `row` (length L) with position t < L deleted or masked, padded to
// `width` (>= its length) with `pad`. Writes out[j] for j = lane, lane + lanes, ... only,
// so the CPU writes a whole sequence (lane 0 of 1) and a CUDA warp splits one across its
// lanes with coalesced stores; each range is a plain copy.
AM_HOST_DEVICE inline void build_sequence(const int64_t* row, int64_t L, int64_t t, bool mask,
                                          int64_t mask_token, int64_t pad, int64_t width,
                                          int64_t* out, int64_t lane = 0, int64_t lanes = 1) {
  const int64_t len = sequence_length(L, mask);
  const int64_t shift = mask ? 0 : 1;  // deletion: ids after t shift left
  int64_t j = lane;
  for (; j < t; j += lanes) out[j] = row[j];
  if (mask && j == t) {
    out[j] = mask_token;
    j += lanes;
  }
  for (; j < len; j += lanes) out[j] = row[j + shift];
  for (; j < width; j += lanes) out[j] = pad;
}

// Every sequence of one row: out[k * width ..] for k = 0 .. real_count - 1 is the
// sequence for position lead + k; out_lengths[k] its length, out_source[k] = source.
AM_HOST_DEVICE inline void build_row(const int64_t* row, int64_t L, int64_t lead, int64_t trail,
                                     bool mask, int64_t mask_token, int64_t pad, int64_t width,
                                     int64_t source, int64_t* out, int64_t* out_lengths,
                                     int64_t* out_source) {
  const int64_t n = real_count(L, lead, trail);
  const int64_t len = sequence_length(L, mask);
  for (int64_t k = 0; k < n; ++k) {
    build_sequence(row, L, lead + k, mask, mask_token, pad, width, out + k * width);
    out_lengths[k] = len;
    out_source[k] = source;
  }
}

// ---- ERASER's rationale sequences (DeYoung et al. 2020, sec. 4; docs/definitions.md §18) ----
//
// One perturbed row: its real positions t (lead <= t < L - trail) with rank[t - lead] < k form
// the rationale. Sufficiency (keep_rationale) keeps them alone, comprehensiveness removes them;
// a removed token is deleted (the rest close up, special tokens stay) or, with `mask`, replaced
// by `mask_token`. Writes out[0 .. width), padded with `pad`, and returns the sequence's length
// (<= L <= width). rank is only compared, never used as an index, so any values are safe; it
// must hold L - lead - trail entries. One thread writes a whole sequence: a deletion's place in
// the output depends on every earlier position.
AM_HOST_DEVICE inline int64_t build_rationale_sequence(const int64_t* row, int64_t L,
                                                       const int64_t* rank, int64_t lead,
                                                       int64_t trail, int64_t k,
                                                       bool keep_rationale, bool mask,
                                                       int64_t mask_token, int64_t pad,
                                                       int64_t width, int64_t* out) {
  int64_t j = 0;
  for (int64_t t = 0; t < L; ++t) {
    const bool real = t >= lead && t < L - trail;
    if (!real || (rank[t - lead] < k) == keep_rationale) {
      out[j++] = row[t];
    } else if (mask) {
      out[j++] = mask_token;
    }
  }
  const int64_t length = j;
  for (; j < width; ++j) out[j] = pad;
  return length;
}

}  // namespace loo
}  // namespace attnmetrics
