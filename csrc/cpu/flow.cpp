// CPU impl of attention_flow (schema in ops.cpp): attention flow's maximum flows (Abnar &
// Zuidema 2020, sec. 3), one row's graph at a time, rows in parallel. Host only, whatever the
// model's device: the attributions layer brings each chunk's per-layer matrices to the CPU
// (attributions.py: attention_flow), so the op has no CUDA impl (_ops.HOST_OPS).
//
// A row of n real positions and L >= 3 layers: node 0 the source (its edges set per token j),
// node 1 + (l - 1) n + i the position i after layer l - 1 (l = 1 .. L - 1), the last node the
// pooled position after the last layer. Dinic's algorithm on capacities floored to multiples of
// 2^-30 (int64, attributions.FLOW_SCALE), then the exact float64 capacity of the minimum cut
// whose source side is what the residual graph reaches from the source: that side is the same
// for every maximum flow of the rounded graph, so this is the value scipy's Dinic gave before
// (attnmetrics.testing.reference.scipy_max_flows), summed in the same edge order.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "checks.h"

namespace {

constexpr double kScale = 1073741824.0;  // 2^30, attributions.FLOW_SCALE
constexpr int64_t kInfinity = std::numeric_limits<int64_t>::max();
// Edge ids, node ids and capacities in 32 bits: a capacity is at most 2^30 and an edge's residual
// and its reverse's add up to its capacity, so none passes 2^30; the op checks that a row's edge ids
// fit (kMaxEdges).
using Id = int32_t;
constexpr int64_t kMaxEdges = std::numeric_limits<Id>::max() / 2;

// A capacity in [0, 1] floored to a multiple of 2^-30, in units of 2^-30.
inline Id floored(double c) { return static_cast<Id>(std::floor(c * kScale)); }

// One row's graph: edges in pairs (2e forward, 2e + 1 its reverse), adjacency by tail in CSR
// form (only edges whose floored capacity can carry flow, and the source's, which change per
// token). Forward edges are numbered in scipy's CSR order: the source's n, then each inner
// node's n heads (tail (l, k) then head i ascending), then the last layer's n edges to the sink.
class RowFlow {
 public:
  RowFlow(const double* m, int64_t L, int64_t T, int64_t n, int64_t pooled)
      : m_(m), L_(L), T_(T), n_(n), pooled_(pooled) {
    V_ = (L - 1) * n + 2;
    sink_ = V_ - 1;
    const int64_t E = n + (L - 2) * n * n + n;
    head_.resize(2 * E);
    base_.assign(2 * E, 0);
    int64_t e = 0;
    auto add = [&](int64_t u, int64_t v, double c) {
      head_[2 * e] = static_cast<Id>(v);
      head_[2 * e + 1] = static_cast<Id>(u);
      base_[2 * e] = floored(c);
      ++e;
    };
    for (int64_t i = 0; i < n; ++i) add(0, node(1, i), 0.0);  // set per token
    for (int64_t l = 1; l <= L - 2; ++l) {
      const double* a = m + l * T * T;  // a[i * T + k]: capacity (l, k) -> (l + 1, i)
      for (int64_t k = 0; k < n; ++k) {
        for (int64_t i = 0; i < n; ++i) add(node(l, k), node(l + 1, i), a[i * T + k]);
      }
    }
    const double* last = m + (L - 1) * T * T + pooled * T;
    for (int64_t k = 0; k < n; ++k) add(node(L - 1, k), sink_, last[k]);
    // adjacency: the source's edges always, the others when their floored capacity is positive
    // (an edge of capacity 0 never carries flow, so neither it nor its reverse is ever residual)
    std::vector<int64_t> degree(V_ + 1, 0);
    for (int64_t f = 0; f < E; ++f) {
      if (f < n || base_[2 * f] > 0) {
        ++degree[head_[2 * f + 1] + 1];
        ++degree[head_[2 * f] + 1];
      }
    }
    for (int64_t u = 0; u < V_; ++u) degree[u + 1] += degree[u];
    start_ = degree;
    adj_.resize(start_[V_]);
    std::vector<int64_t> fill(start_.begin(), start_.end() - 1);
    for (int64_t f = 0; f < E; ++f) {
      if (f < n || base_[2 * f] > 0) {
        adj_[fill[head_[2 * f + 1]]++] = static_cast<Id>(2 * f);
        adj_[fill[head_[2 * f]]++] = static_cast<Id>(2 * f + 1);
      }
    }
    cap_.resize(2 * E);
    level_.resize(V_);
    next_.resize(V_);
    queue_.resize(V_);
    path_.resize(V_);
  }

  // The exact capacity of the rounded graph's minimum cut for the source token j.
  double flow_from(int64_t j) {
    std::memcpy(cap_.data(), base_.data(), cap_.size() * sizeof(Id));
    for (int64_t i = 0; i < n_; ++i) {
      cap_[2 * i] = floored(m_[i * T_ + j]);
    }
    while (levels()) augment();  // the last BFS, which missed the sink, leaves the residual
                                 // graph's reach from the source: level >= 0
    double total = 0.0;
    for (int64_t i = 0; i < n_; ++i) {
      if (level_[node(1, i)] < 0) total += m_[i * T_ + j];
    }
    for (int64_t l = 1; l <= L_ - 2; ++l) {
      const double* a = m_ + l * T_ * T_;
      for (int64_t k = 0; k < n_; ++k) {
        if (level_[node(l, k)] < 0) continue;
        for (int64_t i = 0; i < n_; ++i) {
          if (level_[node(l + 1, i)] < 0) total += a[i * T_ + k];
        }
      }
    }
    const double* last = m_ + (L_ - 1) * T_ * T_ + pooled_ * T_;
    for (int64_t k = 0; k < n_; ++k) {
      if (level_[node(L_ - 1, k)] >= 0) total += last[k];  // the sink is never reached
    }
    return total;
  }

 private:
  int64_t node(int64_t l, int64_t i) const { return 1 + (l - 1) * n_ + i; }

  // BFS levels over residual edges from the source; whether the sink is reached.
  bool levels() {
    std::fill(level_.begin(), level_.end(), -1);
    int64_t front = 0, back = 0;
    queue_[back++] = 0;
    level_[0] = 0;
    while (front < back) {
      const int64_t u = queue_[front++];
      for (int64_t a = start_[u]; a < start_[u + 1]; ++a) {
        const int64_t e = adj_[a];
        if (cap_[e] > 0 && level_[head_[e]] < 0) {
          level_[head_[e]] = level_[u] + 1;
          queue_[back++] = head_[e];
        }
      }
    }
    return level_[sink_] >= 0;
  }

  // One blocking flow of the level graph: an iterative depth-first search with per-node edge
  // pointers (next_), dead ends removed from the level graph (level -1).
  void augment() {
    for (int64_t u = 0; u < V_; ++u) next_[u] = start_[u];
    int64_t depth = 0, u = 0;
    while (true) {
      if (u == sink_) {
        int64_t push = kInfinity;
        for (int64_t d = 0; d < depth; ++d) push = std::min<int64_t>(push, cap_[path_[d]]);
        int64_t back = depth;
        for (int64_t d = depth - 1; d >= 0; --d) {
          cap_[path_[d]] -= static_cast<Id>(push);
          cap_[path_[d] ^ 1] += static_cast<Id>(push);
          if (cap_[path_[d]] == 0) back = d;  // the earliest saturated edge
        }
        depth = back;  // resume from its tail
        u = depth == 0 ? 0 : head_[path_[depth - 1]];
        continue;
      }
      bool advanced = false;
      for (int64_t& a = next_[u]; a < start_[u + 1]; ++a) {
        const int64_t e = adj_[a];
        if (cap_[e] > 0 && level_[head_[e]] == level_[u] + 1) {
          path_[depth++] = e;
          u = head_[e];
          advanced = true;
          break;
        }
      }
      if (advanced) continue;
      if (u == 0) return;
      level_[u] = -1;  // a dead end
      --depth;
      u = depth == 0 ? 0 : head_[path_[depth - 1]];
      ++next_[u];
    }
  }

  const double* m_;
  int64_t L_, T_, n_, pooled_, V_, sink_;
  std::vector<Id> head_, base_, cap_, adj_;  // per edge (adj_: per edge end)
  std::vector<int64_t> start_, level_, next_, queue_, path_;  // per node
};

at::Tensor attention_flow_cpu(const at::Tensor& graphs, const at::Tensor& lengths,
                              const at::Tensor& pooled, int64_t lead, int64_t trail) {
  for (const auto& [t, name] : {std::pair{&graphs, "graphs"}, {&lengths, "lengths"}, {&pooled, "pooled"}}) {
    TORCH_CHECK(t->device().is_cpu(), "attention_flow: ", name, " must be a CPU tensor, got ", t->device());
    TORCH_CHECK(t->is_contiguous(), "attention_flow: ", name, " must be contiguous");
  }
  TORCH_CHECK(graphs.scalar_type() == at::kDouble, "attention_flow: graphs must be float64, got ",
              graphs.scalar_type());
  TORCH_CHECK(graphs.dim() == 4 && graphs.size(1) >= 1 && graphs.size(2) == graphs.size(3),
              "attention_flow: graphs must be [B, L, T, T] with L >= 1, got ", graphs.sizes());
  const int64_t B = graphs.size(0), L = graphs.size(1), T = graphs.size(2);
  for (const auto& [t, name] : {std::pair{&lengths, "lengths"}, {&pooled, "pooled"}}) {
    TORCH_CHECK(t->scalar_type() == at::kLong, "attention_flow: ", name, " must be int64, got ",
                t->scalar_type());
    TORCH_CHECK(t->dim() == 1 && t->size(0) == B, "attention_flow: ", name, " must be [B] = [", B,
                "], got ", t->sizes());
  }
  TORCH_CHECK(lead >= 0 && trail >= 0, "attention_flow: lead and trail must be >= 0, got ", lead,
              " and ", trail);
  const int64_t* len = lengths.const_data_ptr<int64_t>();
  const int64_t* pool = pooled.const_data_ptr<int64_t>();
  attnmetrics::check_length_range(len, B, 0, "0", T, "attention_flow: ");
  const double* m = graphs.const_data_ptr<double>();
  // Per row: finite (else NaN flows: the caller names the row) and, when finite, capacities in
  // [0, 1] (rollout's row-normalised matrices) and a pooled position among its n.
  std::vector<char> finite(B, 1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = len[b];
    if (n - trail <= lead) continue;
    TORCH_CHECK(pool[b] >= 0 && pool[b] < n, "attention_flow: pooled[", b, "] = ", pool[b],
                " is outside [0, lengths[", b, "]) = [0, ", n, ")");
    TORCH_CHECK(L < 3 || 2 * n + (L - 2) * n * n <= kMaxEdges, "attention_flow: row ", b, "'s graph (",
                L, " layers, ", n, " positions) has more than ", kMaxEdges, " edges");
    const double* row = m + b * L * T * T;
    for (int64_t l = 0; l < L && finite[b]; ++l) {
      for (int64_t i = 0; i < n && finite[b]; ++i) {
        for (int64_t k = 0; k < n; ++k) {
          if (!std::isfinite(row[(l * T + i) * T + k])) {
            finite[b] = 0;
            break;
          }
        }
      }
    }
    if (!finite[b]) continue;
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t k = 0; k < n; ++k) {
          const double c = row[(l * T + i) * T + k];
          TORCH_CHECK(c >= 0.0 && c <= 1.0, "attention_flow: graphs[", b, ", ", l, ", ", i, ", ", k,
                      "] = ", c, " is not a capacity in [0, 1] (a row-normalised rollout matrix)");
        }
      }
    }
  }

  at::Tensor out = at::zeros({B, T}, graphs.options());
  double* dst = out.data_ptr<double>();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n = len[b], p = pool[b];
      if (n - trail <= lead) continue;
      double* o = dst + b * T;
      if (!finite[b]) {
        for (int64_t j = lead; j < n - trail; ++j) o[j] = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      const double* row = m + b * L * T * T;
      if (L == 1) {  // one edge from (0, j) to (1, p)
        for (int64_t j = lead; j < n - trail; ++j) o[j] = row[p * T + j];
      } else if (L == 2) {  // the paths (0, j) -> (1, k) -> (2, p) share no edge
        const double* top = row + T * T + p * T;
        for (int64_t j = lead; j < n - trail; ++j) {
          double total = 0.0;
          for (int64_t k = 0; k < n; ++k) total += std::min(row[k * T + j], top[k]);
          o[j] = total;
        }
      } else {
        RowFlow flow(row, L, T, n, p);
        for (int64_t j = lead; j < n - trail; ++j) o[j] = flow.flow_from(j);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnmetrics, CPU, m) { m.impl("attention_flow", &attention_flow_cpu); }
