// Launchers of the CUDA kernels (csrc/cuda/*.cu): raw pointers, sizes and a
// stream in, the launch's cudaError_t out. No torch headers, so the .cu files
// compile with plain `nvcc -c -I csrc` (tests/test_cuda_compile.py); the glue in
// *_cuda.cpp (one file per op family) validates the tensors, allocates outputs and
// scratch with ATen and calls these on the current stream.
//
// Every pointer is to contiguous device memory on the current device; rows may
// be 0 (nothing is launched). Launches are asynchronous: the returned error is
// the launch's (cudaGetLastError), not the kernel's completion status.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace attnmetrics {
namespace gpu {

// tvd / jsd of p, q [rows, width] into out [rows], row r of p at p + r * p_stride and of q at
// q + r * q_stride (checks.h row_stride: width when packed, 0 for one row against every row);
// accumulated in double. flags: null, or ORs value_flags' bits of p and q into *flags in the
// same pass (see below).
cudaError_t tvd(const float* p, int64_t p_stride, const float* q, int64_t q_stride, float* out,
                int64_t rows, int64_t width, int* flags, cudaStream_t stream);
cudaError_t tvd(const double* p, int64_t p_stride, const double* q, int64_t q_stride, double* out,
                int64_t rows, int64_t width, int* flags, cudaStream_t stream);
cudaError_t jsd(const float* p, int64_t p_stride, const float* q, int64_t q_stride, float* out,
                int64_t rows, int64_t width, int* flags, cudaStream_t stream);
cudaError_t jsd(const double* p, int64_t p_stride, const double* q, int64_t q_stride, double* out,
                int64_t rows, int64_t width, int* flags, cudaStream_t stream);
// value_flags of p [np] and q [nq]: ORs into *flags (zeroed by the caller) bit 0 / 1
// for a NaN or infinite / a negative entry of p, bits 2 / 3 for q.
cudaError_t value_flags(const float* p, int64_t np, const float* q, int64_t nq, int* flags,
                        cudaStream_t stream);
cudaError_t value_flags(const double* p, int64_t np, const double* q, int64_t nq, int* flags,
                        cudaStream_t stream);

// Kendall tau-b and p-value of x, y [rows, width] over each row's prefix of
// lengths[b] items, which must lie in [0, max_len] with max_len <= width (checked
// by the caller). scratch: slots * kendall_slot_bytes<scalar_t>(max_len) bytes
// (rows.h), 16-byte aligned; slots in [1, rows]. On first use on a device this
// uploads the exact-p table (kernels/kendall.h) to it, synchronising `stream` once.
cudaError_t kendall_tau(const float* x, const float* y, const int64_t* lengths, int64_t rows,
                        int64_t width, int64_t max_len, unsigned char* scratch, int64_t slots,
                        float* tau, float* pvalue, cudaStream_t stream);
cudaError_t kendall_tau(const double* x, const double* y, const int64_t* lengths, int64_t rows,
                        int64_t width, int64_t max_len, unsigned char* scratch, int64_t slots,
                        double* tau, double* pvalue, cudaStream_t stream);

// Input checks of the flip ops, on the device: status[kBadLength] and
// status[kBadOrder] (rows.h; the caller presets both to INT64_MAX) receive the
// smallest row whose length lies outside [0, width], and the smallest row of
// valid length whose order prefix is not a permutation of 0..L-1.
// seen: slots * width bytes of scratch; slots in [1, rows].
cudaError_t check_rows(const int64_t* order, const int64_t* lengths, int64_t rows, int64_t width,
                       unsigned char* seen, int64_t slots, int64_t* status, cudaStream_t stream);

// Flip search with a linear decoder on projected [rows, width, classes] (kernels/flip.h
// linear_row), inputs checked by check_rows. scratch: slots * classes doubles when
// classes > kLocalClasses (geometry.h), else unused (may be null); slots in [1, rows].
cudaError_t flip_search_linear(const float* att, const float* proj, const float* bias,
                               const int64_t* order, const int64_t* lengths, int64_t rows,
                               int64_t width, int64_t classes, double* scratch, int64_t slots,
                               int64_t* removed, float* mass, cudaStream_t stream);
cudaError_t flip_search_linear(const double* att, const double* proj, const double* bias,
                               const int64_t* order, const int64_t* lengths, int64_t rows,
                               int64_t width, int64_t classes, double* scratch, int64_t slots,
                               int64_t* removed, double* mass, cudaStream_t stream);

// Every renormalised context (kernels/flip.h contexts_column) of values
// [rows, width, hidden] into out [sum(lengths), hidden]; offsets = exclusive cumsum
// of lengths, inputs checked by check_rows and the caller.
cudaError_t renormalised_contexts(const float* att, const float* values, const int64_t* order,
                                  const int64_t* lengths, const int64_t* offsets, int64_t rows,
                                  int64_t width, int64_t hidden, float* out, cudaStream_t stream);
cudaError_t renormalised_contexts(const double* att, const double* values, const int64_t* order,
                                  const int64_t* lengths, const int64_t* offsets, int64_t rows,
                                  int64_t width, int64_t hidden, double* out, cudaStream_t stream);

// attention_permutations into out [rows, permutations, width] (kernels/permutation.h,
// rows.h permutations_item); lengths in [0, width], width < 2^32, checked by the caller.
cudaError_t attention_permutations(const int64_t* lengths, int64_t rows, int64_t width,
                                   int64_t permutations, uint64_t seed, uint64_t row_offset,
                                   uint64_t permutation_offset, int64_t* out, cudaStream_t stream);

// permutation_tvd_linear on projected [rows, width, classes] into median [rows] and tvd
// [rows, permutations]; lengths checked by the caller. Rows run in chunks of chunk_rows
// (geometry.h permutation_chunk_rows); chunk_tvds: chunk_rows * permutations doubles.
// scratch: slots * permutation_slot_bytes(width, classes) bytes (rows.h), 8-byte aligned;
// slots in [1, chunk_rows * permutations].
cudaError_t permutation_tvd_linear(const float* att, const float* proj, const float* bias,
                                   const int64_t* lengths, int64_t rows, int64_t width,
                                   int64_t classes, int64_t permutations, uint64_t seed,
                                   uint64_t row_offset, double* chunk_tvds, int64_t chunk_rows,
                                   unsigned char* scratch, int64_t slots, float* median,
                                   float* tvd, cudaStream_t stream);
cudaError_t permutation_tvd_linear(const double* att, const double* proj, const double* bias,
                                   const int64_t* lengths, int64_t rows, int64_t width,
                                   int64_t classes, int64_t permutations, uint64_t seed,
                                   uint64_t row_offset, double* chunk_tvds, int64_t chunk_rows,
                                   unsigned char* scratch, int64_t slots, double* median,
                                   double* tvd, cudaStream_t stream);

// project_prefix of values [rows, width, hidden] by weight [classes, hidden] into out
// [rows, width, classes] (kernels/projection.h dot); lengths checked by the caller.
cudaError_t project_prefix(const float* values, const float* weight, const int64_t* lengths,
                           int64_t rows, int64_t width, int64_t hidden, int64_t classes,
                           float* out, cudaStream_t stream);
cudaError_t project_prefix(const double* values, const double* weight, const int64_t* lengths,
                           int64_t rows, int64_t width, int64_t hidden, int64_t classes,
                           double* out, cudaStream_t stream);

// leave_one_out_batch of tokens [rows, T] (kernels/loo.h) into out [total, width],
// out_lengths and out_source [total]; lengths in [lead + trail, T] (checked by the
// caller), offsets = exclusive cumsum of lengths - lead - trail, total their sum, width
// the longest sequence.
cudaError_t leave_one_out_batch(const int64_t* tokens, const int64_t* lengths,
                                const int64_t* offsets, int64_t rows, int64_t T, int64_t lead,
                                bool mask, int64_t mask_token, int64_t pad, int64_t total,
                                int64_t width, int64_t* out, int64_t* out_lengths,
                                int64_t* out_source, cudaStream_t stream);

// rationale_batch of tokens [rows, T] (kernels/loo.h build_rationale_sequence): sequence i
// of `total` is row index[i] / F with the rationale size sizes[index[i]] (index: the flat
// indices of sizes [rows, F] that are >= 0, ascending), written to out [total, T] with its
// length, row and fraction; lengths in [lead + trail, T] and rank [rows, R], R >= T - lead -
// trail, checked by the caller.
cudaError_t rationale_batch(const int64_t* tokens, const int64_t* lengths, const int64_t* rank,
                            const int64_t* sizes, const int64_t* index, int64_t total,
                            int64_t F, int64_t T, int64_t R, int64_t lead, int64_t trail,
                            bool keep_rationale, bool mask, int64_t mask_token, int64_t pad,
                            int64_t* out, int64_t* out_lengths, int64_t* out_row,
                            int64_t* out_fraction, cudaStream_t stream);

// attention_rollout of att [rows, layers, heads, width, width] into out [rows, width, width]
// (kernels/rollout.h); lengths in [0, width], checked by the caller. scratch: slots * 3 *
// width^2 entries (geometry.h slots_for); slots in [1, rows].
cudaError_t attention_rollout(const float* att, const int64_t* lengths, int64_t rows,
                              int64_t layers, int64_t heads, int64_t width, float residual,
                              float* scratch, int64_t slots, float* out, cudaStream_t stream);
cudaError_t attention_rollout(const double* att, const int64_t* lengths, int64_t rows,
                              int64_t layers, int64_t heads, int64_t width, double residual,
                              double* scratch, int64_t slots, double* out, cudaStream_t stream);

// One step of lstm_runs (kernels/lstm.h cell): for runs k < now and units j < hidden, the
// pre-activations gates[index[k], :] + pre[k, :4 hidden] update c, h [runs, hidden]; and
// out [runs, features] (the step before's features) takes pre[k, 4 hidden:] for k < done,
// zero after. pre: [runs, 4 hidden + features], rows of index checked by the caller; out
// may be null when features are not written (the first step). states, if not null, takes the
// new h of unit j of run k at states[k * hidden + j] and its c at states[cell_offset + k *
// hidden + j].
cudaError_t lstm_step(const float* gates, const int64_t* index, const float* pre, int64_t runs,
                      int64_t now, int64_t done, int64_t hidden, int64_t features, float* c,
                      float* h, float* out, float* states, int64_t cell_offset,
                      cudaStream_t stream);
cudaError_t lstm_step(const double* gates, const int64_t* index, const double* pre, int64_t runs,
                      int64_t now, int64_t done, int64_t hidden, int64_t features, double* c,
                      double* h, double* out, double* states, int64_t cell_offset,
                      cudaStream_t stream);

// spliced_attention (schema in ops.cpp) into out [rows, dim - att]: a warp per sequence, the
// scores of its positions lead <= j < lengths[i] - trail into scores [rows, width] (scratch),
// then their softmax's weights applied to the features past att. pairs [rows, width, 2] and
// lengths checked by the caller.
cudaError_t spliced_attention(const float* table, const int64_t* pairs, const int64_t* lengths,
                              const float* v, int64_t rows, int64_t width, int64_t dim,
                              int64_t att, int64_t lead, int64_t trail, bool tanh, float* scores,
                              float* out, cudaStream_t stream);
cudaError_t spliced_attention(const double* table, const int64_t* pairs, const int64_t* lengths,
                              const double* v, int64_t rows, int64_t width, int64_t dim,
                              int64_t att, int64_t lead, int64_t trail, bool tanh,
                              double* scores, double* out, cudaStream_t stream);

}  // namespace gpu
}  // namespace attnmetrics
