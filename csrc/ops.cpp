// Op schemas, registered once. Back ends live in cpu/ (and cuda/) and register
// their impls under TORCH_LIBRARY_IMPL(attnmetrics, <key>, m).
// Going through the dispatcher keeps every op visible to torch.compile; the
// fake (meta) impls are registered in Python (attnmetrics/_ops.py).
#include <torch/library.h>

TORCH_LIBRARY(attnmetrics, m) {
  // Distances between distributions along the last dim of [..., K] inputs whose rows
  // lie a fixed stride apart (checks.h row_stride: contiguous, or one row expanded):
  // TVD = 1/2 sum |p - q|; JSD in nats (0 log 0 = 0). Returns [...].
  m.def("tvd(Tensor p, Tensor q) -> Tensor");
  m.def("jsd(Tensor p, Tensor q) -> Tensor");
  // The value checks of tvd/jsd's inputs in one pass over contiguous p and q (any
  // shapes, one float dtype): int32 [1], bit 0 p holds NaN or inf, bit 1 p a
  // negative (finite) value, bits 2 and 3 the same for q. One read of it is the
  // public function's one device read.
  m.def("value_flags(Tensor p, Tensor q) -> Tensor");
  // tvd / jsd with the value checks in the same pass: value_flags' bits ORed into
  // flags (int32 [1] on p's device, in place), so chunks share one flags tensor and
  // the public function reads it once.
  m.def("tvd_checked(Tensor p, Tensor q, Tensor(a!) flags) -> Tensor");
  m.def("jsd_checked(Tensor p, Tensor q, Tensor(a!) flags) -> Tensor");

  // Kendall tau-b and its two-sided p-value (scipy.stats.kendalltau defaults)
  // over each row's valid prefix: x, y [B, T] float, lengths [B] int64.
  m.def("kendall_tau(Tensor x, Tensor y, Tensor lengths) -> (Tensor, Tensor)");

  // Flip search with a linear decoder, closed form on projected values
  // (S&S 2019, sec. 4). attention [B, T], projected [B, T, C] = values @ W.T,
  // bias [C], order [B, T] int64 (removal order; first lengths[b] entries are a
  // permutation of 0..lengths[b]-1), lengths [B] int64.
  // Returns removed [B] int64 (-1: never flips) and removed_mass [B] (NaN: never).
  m.def("flip_search_linear(Tensor attention, Tensor projected, Tensor bias, "
        "Tensor order, Tensor lengths) -> (Tensor, Tensor)");

  // Every renormalised context of every row, for a general decoder:
  // attention [B, T], values [B, T, H], order [B, T] int64, lengths [B] int64,
  // offsets [B] int64 (exclusive cumsum of lengths). Returns [sum(lengths), H];
  // row b's block k (k = 0 .. L-1) is the context after removing the first k
  // items of its order, renormalised (zero when the remaining mass is 0).
  m.def("renormalised_contexts(Tensor attention, Tensor values, Tensor order, "
        "Tensor lengths, Tensor offsets) -> Tensor");

  // Permutation test (J&W 2019, sec. 4.2). Permutation p of row r is a pure
  // function of (seed, r, p): splitmix64 stream keyed by them, Fisher-Yates
  // (kernels/permutation.h), so chunks of rows or permutations pass their global
  // offsets. alpha'_t = alpha_{perm[t]}; the hidden states stay in place.
  // attention_permutations: lengths [B] int64 in [0, width] -> [B, P, width]
  // int64, row b / slot p holding permutation (permutation_offset + p) of row
  // (row_offset + b) on its prefix, the identity on padding.
  m.def("attention_permutations(Tensor lengths, int width, int permutations, int seed, "
        "int row_offset=0, int permutation_offset=0) -> Tensor");
  // Linear decoder, on projected values: attention [B, T], projected [B, T, C]
  // = values @ W.T, bias [C], lengths [B] int64. Returns median [B] (numpy's:
  // mean of the two middle values for even P) and tvd [B, P], the output TVD of
  // each permutation from the unpermuted output (0 for rows with L <= 1).
  m.def("permutation_tvd_linear(Tensor attention, Tensor projected, Tensor bias, "
        "Tensor lengths, int permutations, int seed, int row_offset=0) -> (Tensor, Tensor)");
  // Projection of each row's valid prefix for linear decoders: values [B, T, H],
  // weight [C, H], lengths [B] int64 -> [B, T, C] = values @ weight.T on
  // t < lengths[b], zero on padding (never read).
  m.def("project_prefix(Tensor values, Tensor weight, Tensor lengths) -> Tensor");
  // Leave-one-out inputs (J&W 2019, sec. 4.1): for each row of tokens [B, T]
  // int64 with lengths [B] int64 in [lead + trail, T], one sequence per real
  // position t = lead .. L-trail-1: the row with t deleted (length L-1), or with
  // t replaced by mask_token if given (length L). Returns sequences [N, W] int64
  // (N = sum(L - lead - trail), row b's block in position order, W = the longest
  // sequence, shorter ones padded with pad), their lengths [N] and source rows [N], all on
  // tokens' device. With tokens on a GPU, lengths may come on the host: the op then plans
  // there and never waits for the device (on the device, it reads back sizes once a call).
  m.def("leave_one_out_batch(Tensor tokens, Tensor lengths, int lead, int trail, "
        "int? mask_token=None, int pad=0) -> (Tensor, Tensor, Tensor)");
  // ERASER's perturbed rows (DeYoung et al. 2020, sec. 4; kernels/loo.h): tokens, lengths,
  // lead, trail as leave_one_out_batch; rank [B, R] int64 (R >= T - lead - trail), the place
  // of real token lead + r in the importance order; sizes [B, F] int64, the rationale size of
  // each row and fraction (< 0: no sequence). One sequence per (b, f) with sizes[b, f] >= 0,
  // in row-major order: the rationale (the real tokens ranked below the size) alone when
  // keep_rationale, else removed; removed tokens deleted, or replaced by mask_token if
  // given. Returns sequences [N, T] int64 padded with pad, their lengths [N], and b [N] and
  // f [N] of each, on tokens' device. rank is on tokens' device, sizes on lengths' (the host
  // too, as leave_one_out_batch's lengths: then no read back).
  m.def("rationale_batch(Tensor tokens, Tensor lengths, Tensor rank, Tensor sizes, int lead, "
        "int trail, bool keep_rationale, int? mask_token=None, int pad=0) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  // One LSTM direction over runs whose inputs' gates are rows of a table (leave-one-out's
  // re-encoded runs of a bidirectional LSTM, models/deletions.py; kernels/lstm.h): gates
  // [R, 4H] float32/float64 (W_ih x + b_ih + b_hh of each input, torch's gate order i, f, g,
  // o); index [S, N] int64, step s of run k reads gates[index[s, k]]; counts [N] int64,
  // non-increasing, in [0, S], each run's steps; h0, c0 [N, H] the start states; weight
  // [H, 4H + D] = [W_hh.T | M.T], the recurrent weights and a feature map M [D, H]. Writes
  // M h of step s of run k to out [S, N, D], zero past counts[k]; no step of a finished run
  // is computed. With states [2, S, N, H] also its h (states[0]) and c (states[1]), zero past
  // counts[k].
  m.def("lstm_runs(Tensor gates, Tensor index, Tensor counts, Tensor h0, Tensor c0, "
        "Tensor weight, Tensor(a!) out, Tensor(b!)? states=None) -> ()");
  // Attention rollout (Abnar & Zuidema 2020, sec. 3; kernels/rollout.h): attentions
  // [B, layers, heads, T, T], lengths [B] int64 in [0, T], residual in [0, 1]. Per row and
  // layer the head mean on the valid L x L block, mixed (1 - residual) * A + residual * I and
  // renormalised by rows, multiplied through the layers (last layer leftmost). Returns
  // [B, T, T], zero outside each row's L x L block.
  m.def("attention_rollout(Tensor attentions, Tensor lengths, float residual) -> Tensor");
  // Attention pooling over spliced features (leave-one-out's reused states, models/deletions.py):
  // table [R, D] float32/float64; pairs [N, W, 2] int64, position j of sequence i has the
  // features f = table[pairs[i, j, 0]] + table[pairs[i, j, 1]]; lengths [N] int64 in [0, W],
  // positions lead <= j < lengths[i] - trail get attention (no other pair is read); v [A],
  // 1 <= A <= D. Scores v . act(f[:A]), act tanh if `tanh` else the identity; returns [N, D - A],
  // the sum of the positions' f[A:] weighted by the softmax of their scores (zero for a
  // sequence where no position gets attention).
  m.def("spliced_attention(Tensor table, Tensor pairs, Tensor lengths, Tensor v, int lead, "
        "int trail, bool tanh) -> Tensor");
  // Attention flow's maximum flows (Abnar & Zuidema 2020, sec. 3; cpu/flow.cpp, host only):
  // graphs [B, L, T, T] float64, graphs[b, l, i, k] the capacity in [0, 1] of the edge from
  // (l, k) to (l + 1, i) (attention rollout's per-layer matrices), lengths [B] int64 in [0, T],
  // pooled [B] int64 in [0, lengths[b]). Returns [B, T] float64: the maximum flow from (0, j) to
  // (L, pooled[b]) over row b's first lengths[b] positions for lead <= j < lengths[b] - trail
  // (capacities floored to multiples of 2^-30 for L >= 3, the minimum cut's exact capacity
  // returned), NaN there for a row whose graph is not finite, zero elsewhere.
  m.def("attention_flow(Tensor graphs, Tensor lengths, Tensor pooled, int lead, int trail) -> Tensor");
}
