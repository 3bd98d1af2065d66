// Launch geometry of the CUDA kernels: plain host arithmetic, no CUDA or torch
// headers, shared by the launchers (csrc/cuda/*.cu), the glue that sizes scratch
// (*_cuda.cpp) and the host harness that checks it (tests/cuda/host_harness.cpp).
//
// Every kernel loops over its rows (grid-stride), so a grid never needs more
// blocks than kMaxBlocks, far below CUDA's grid.x limit of 2^31 - 1, however
// many rows there are; all row and element offsets are int64.
#pragma once

#include <stdint.h>

namespace attnmetrics {
namespace gpu {

constexpr int kBlock = 256;          // threads per block of the reductions and contexts
constexpr int kRowBlock = 128;       // threads per block of the thread-per-row kernels
constexpr int kWarp = 32;
constexpr int64_t kMaxBlocks = int64_t(1) << 20;

// Rows in flight at once in the thread-per-row kernels (each owning a scratch
// slot): 2^18 threads fill an H100/H200 (132 SMs x 2048 resident threads).
constexpr int64_t kMaxSlots = int64_t(1) << 18;
// Bound on the per-slot scratch the glue allocates for one launch, in bytes.
constexpr int64_t kScratchBudget = int64_t(256) << 20;
// A capped grid of thread-per-row blocks still has a thread for every slot.
static_assert(kMaxSlots <= kMaxBlocks * kRowBlock, "every slot needs a thread");

// tvd / jsd: rows of at most kSmallWidth items go to 4-lane groups, rows below
// kBlockWidth to one warp each, wider rows to one block each.
constexpr int64_t kSmallWidth = 16;
constexpr int64_t kBlockWidth = 2048;
constexpr int kSmallGroup = 4;

// flip_search_linear keeps the C suffix sums of a row in a local array when
// C <= kLocalClasses, otherwise in global scratch (one slot of C doubles per thread).
constexpr int kLocalClasses = 16;

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Blocks to cover `items` at `per_block` items per block: in [1, kMaxBlocks].
inline int64_t blocks_for(int64_t items, int64_t per_block) {
  const int64_t blocks = items / per_block + (items % per_block != 0);
  return max64(1, min64(blocks, kMaxBlocks));
}

// Scratch slots for `rows` rows needing `bytes_per_slot` each: at most rows,
// kMaxSlots and what the budget holds, at least 1 (a single row larger than the
// budget still runs).
inline int64_t slots_for(int64_t rows, int64_t bytes_per_slot, int64_t budget = kScratchBudget) {
  int64_t slots = min64(max64(rows, 1), kMaxSlots);
  if (bytes_per_slot > 0) slots = min64(slots, max64(1, budget / bytes_per_slot));
  return slots;
}

// Lanes per row of tvd / jsd: kSmallGroup, kWarp, or kBlock (a block per row).
inline int distance_lanes(int64_t width) {
  return width <= kSmallWidth ? kSmallGroup : (width < kBlockWidth ? kWarp : kBlock);
}

// Blocks of the tvd / jsd launch for `lanes` lanes per row.
inline int64_t distance_blocks(int64_t rows, int lanes) {
  return blocks_for(rows, lanes >= kBlock ? 1 : kBlock / lanes);
}

// kendall_tau's rows go to the pairwise block-per-row kernel (kernels/kendall.h
// pair_counts) up to this many items, longer ones to a thread per row (tau_row).
constexpr int64_t kKendallPairwiseMaxLen = 8192;
inline bool kendall_pairwise(int64_t max_len) { return max_len <= kKendallPairwiseMaxLen; }

// Blocks of value_flags over n elements: a few elements a thread (grid-stride), at
// most 8 blocks of kBlock threads per SM of a 132-SM H100/H200.
inline int64_t value_flag_blocks(int64_t n) { return min64(blocks_for(n, kBlock * 4), 132 * 8); }

// Warps in flight of a warp-per-item kernel (kBlock threads a block), grid-stride.
inline int64_t warps_for(int64_t items) {
  return blocks_for(items, kBlock / kWarp) * (kBlock / kWarp);
}

// Warps (rows in flight) of renormalised_contexts: a row per warp.
inline int64_t context_warps(int64_t rows) { return warps_for(rows); }

// permutation_tvd_linear runs rows in chunks whose [rows, P] double TVDs (the medians'
// input, kept at the CPU's precision) fit in half the scratch budget; the per-thread
// scratch gets the other half.
inline int64_t permutation_chunk_rows(int64_t rows, int64_t permutations) {
  return max64(1, min64(rows, (kScratchBudget / 2) / max64(1, permutations * 8)));
}

}  // namespace gpu
}  // namespace attnmetrics
