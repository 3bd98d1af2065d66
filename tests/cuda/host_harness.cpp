// Host-only checks of the CUDA back end's index arithmetic, without a GPU.
//
// The kernels in csrc/cuda/*.cu are thin wrappers around the per-thread functions
// of csrc/cuda/rows.h. This program runs those functions on the CPU for every
// thread of the grids the launchers would use (csrc/cuda/geometry.h), emulating
// the wrappers' index math and, for tvd / jsd, the warp shuffles' exact
// semantics, and checks that
//   - every row is handled once and every output element written (sentinels),
//   - nothing is read or written past the scratch and output buffers (canaries),
//   - results equal the per-row functions of csrc/kernels/*.h called directly
//     (bit for bit; the tvd / jsd tree sums to a tight tolerance),
//   - flip::contexts_column gives the bits of flip::contexts_row,
//   - launch geometry stays in CUDA's limits for up to 2^40 rows.
// With an output folder as argument (`./harness DIR`), it also writes the inputs and
// outputs of its permutation, projection and leave-one-out runs there (raw arrays named
// in DIR/manifest.txt), which the test compares with the CPU ops on the same inputs.
// It does not run device code: warp scheduling, memory coalescing, atomics and the
// device math library are untested here. Built and run by tests/test_cuda_compile.py:
//   g++ -std=c++20 -O1 -I csrc tests/cuda/host_harness.cpp -o harness && ./harness
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "cuda/geometry.h"
#include "cuda/rows.h"
#include "kernels/flip.h"
#include "kernels/kendall.h"
#include "kernels/loo.h"
#include "kernels/permutation.h"
#include "kernels/projection.h"

using namespace attnmetrics;
using namespace attnmetrics::gpu;

static int failures = 0;

#define EXPECT(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      ++failures;                                                \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
    }                                                            \
  } while (0)

template <typename T>
static bool same_bits(T a, T b) {
  return memcmp(&a, &b, sizeof(T)) == 0;
}

// A buffer of n elements followed by canary bytes, to catch writes past its end.
template <typename T>
struct Guarded {
  static constexpr size_t kCanary = 256;
  std::vector<unsigned char> bytes;
  size_t n;
  explicit Guarded(size_t n_) : bytes(n_ * sizeof(T), 0), n(n_) {
    bytes.insert(bytes.end(), kCanary, 0xA5);
  }
  T* data() { return reinterpret_cast<T*>(bytes.data()); }
  bool intact() const {
    for (size_t i = n * sizeof(T); i < bytes.size(); ++i)
      if (bytes[i] != 0xA5) return false;
    return true;
  }
};

// ---- geometry -----------------------------------------------------------------------------

static void check_geometry() {
  const int64_t rows_list[] = {0, 1, 2, 7, 63, 64, 65, 255, 256, 257, 1000, 262143, 262144, 262145,
                               1000000, 5000000, int64_t(1) << 31, int64_t(1) << 40};
  const int64_t widths[] = {0, 1, 2, 16, 17, 50, 2047, 2048, 4096, 1 << 20};
  for (int64_t rows : rows_list) {
    EXPECT(blocks_for(rows, kRowBlock) >= 1 && blocks_for(rows, kRowBlock) <= kMaxBlocks, "rows %lld",
           (long long)rows);
    EXPECT(blocks_for(rows, 1) <= 0x7fffffff, "grid.x limit");
    const int64_t warps = context_warps(rows);
    EXPECT(warps >= 1 && warps % (kBlock / kWarp) == 0 && warps / (kBlock / kWarp) <= kMaxBlocks,
           "context warps %lld for rows %lld", (long long)warps, (long long)rows);
    if (rows > 0 && rows <= kMaxBlocks * (kBlock / kWarp))
      EXPECT(warps >= rows && warps - rows < kBlock / kWarp, "one warp per row when they fit");
    for (int64_t width : widths) {
      const int lanes = distance_lanes(width);
      EXPECT(lanes == kSmallGroup || lanes == kWarp || lanes == kBlock, "lanes");
      const int64_t blocks = distance_blocks(rows, lanes);
      EXPECT(blocks >= 1 && blocks <= kMaxBlocks, "distance blocks");
      for (int64_t per_slot : {int64_t(0), int64_t(1), width, 2 * width * 24, int64_t(1) << 30}) {
        const int64_t slots = slots_for(rows, per_slot);
        EXPECT(slots >= 1 && slots <= (rows > 0 ? rows : 1) && slots <= kMaxSlots, "slots %lld",
               (long long)slots);
        EXPECT(slots == 1 || slots * per_slot <= kScratchBudget, "scratch budget");
        EXPECT(blocks_for(slots, kRowBlock) * kRowBlock >= slots, "a thread per slot");
      }
    }
  }
}

// ---- tvd / jsd: the two kernels' reductions, shuffles included ----------------------------

// __shfl_down_sync(mask, v, offset, width) over one warp's 32 values: lane l gets
// lane l + offset's value when that lies in l's segment of `width` lanes, else its own.
static void shfl_down_add(double* warp, int offset, int width) {
  double got[kWarp];
  for (int l = 0; l < kWarp; ++l) {
    const int src = l + offset;
    got[l] = (src / width == l / width) ? warp[src] : warp[l];
  }
  for (int l = 0; l < kWarp; ++l) warp[l] += got[l];
}

static void group_sum(double* warp, int G) {
  for (int offset = G / 2; offset > 0; offset /= 2) shfl_down_add(warp, offset, G);
}

template <bool JSD, typename T>
static double partial(const T* a, const T* b, int64_t width, int64_t lane, int64_t lanes, int& flags) {
  return JSD ? jsd_partial(a, b, width, lane, lanes, flags) : tvd_partial(a, b, width, lane, lanes, flags);
}

// Emulates launch<JSD> of distances.cu: out must be pre-filled with a sentinel. Returns
// the value_flags bits the checked launch ORs in (every thread's, as gather_flags).
template <bool JSD, typename T>
static int emulate_distance(const T* p, const T* q, T* out, int64_t rows, int64_t width) {
  int flags = 0;
  if (rows <= 0) return flags;
  const int lanes = distance_lanes(width);
  const int64_t grid = distance_blocks(rows, lanes);
  for (int64_t block = 0; block < grid; ++block) {
    if (lanes < kBlock) {  // per_group_kernel<G = lanes>
      const int64_t rows_per_block = kBlock / lanes;
      for (int64_t base = block * rows_per_block; base < rows; base += grid * rows_per_block) {
        for (int w = 0; w < kBlock / kWarp; ++w) {
          double warp[kWarp];
          for (int l = 0; l < kWarp; ++l) {
            const int t = w * kWarp + l;
            const int64_t row = base + t / lanes;
            warp[l] = row < rows ? partial<JSD>(p + row * width, q + row * width, width, t % lanes, lanes, flags) : 0.0;
          }
          group_sum(warp, lanes);
          for (int l = 0; l < kWarp; ++l) {
            const int t = w * kWarp + l;
            const int64_t row = base + t / lanes;
            if (row < rows && t % lanes == 0) {
              EXPECT(same_bits(out[row], T(-7)), "row %lld written twice", (long long)row);
              out[row] = static_cast<T>(JSD ? jsd_finish(warp[l]) : tvd_finish(warp[l]));
            }
          }
        }
      }
    } else {  // per_block_kernel
      for (int64_t row = block; row < rows; row += grid) {
        double warp_sums[kBlock / kWarp];
        for (int w = 0; w < kBlock / kWarp; ++w) {
          double warp[kWarp];
          for (int l = 0; l < kWarp; ++l)
            warp[l] = partial<JSD>(p + row * width, q + row * width, width, w * kWarp + l, kBlock, flags);
          group_sum(warp, kWarp);
          warp_sums[w] = warp[0];
        }
        double warp[kWarp];
        for (int l = 0; l < kWarp; ++l) warp[l] = l < kBlock / kWarp ? warp_sums[l] : 0.0;
        group_sum(warp, kWarp);
        EXPECT(same_bits(out[row], T(-7)), "row %lld written twice", (long long)row);
        out[row] = static_cast<T>(JSD ? jsd_finish(warp[0]) : tvd_finish(warp[0]));
      }
    }
  }
  return flags;
}

template <typename T>
static void check_distances(std::mt19937_64& rng) {
  const int64_t shapes[][2] = {{1, 1}, {3, 2}, {70, 5}, {65, 16}, {9, 17}, {33, 300}, {5, 2047},
                               {4, 2048}, {3, 5000}, {2000, 3}};
  std::exponential_distribution<double> expo(1.0);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  for (auto& shape : shapes) {
    const int64_t rows = shape[0], width = shape[1];
    std::vector<T> p(rows * width), q(rows * width);
    for (int64_t r = 0; r < rows; ++r) {
      double sp = 0, sq = 0;
      for (int64_t i = 0; i < width; ++i) {
        const double a = unif(rng) < 0.3 ? 0.0 : expo(rng);
        const double b = unif(rng) < 0.3 ? 0.0 : expo(rng);
        p[r * width + i] = static_cast<T>(a);
        q[r * width + i] = static_cast<T>(b);
        sp += a;
        sq += b;
      }
      for (int64_t i = 0; i < width; ++i) {
        if (sp > 0) p[r * width + i] = static_cast<T>(p[r * width + i] / sp);
        if (sq > 0) q[r * width + i] = static_cast<T>(q[r * width + i] / sq);
      }
    }
    for (int jsd = 0; jsd < 2; ++jsd) {
      Guarded<T> out(rows);
      for (int64_t r = 0; r < rows; ++r) out.data()[r] = T(-7);
      const int flags = jsd ? emulate_distance<true>(p.data(), q.data(), out.data(), rows, width)
                            : emulate_distance<false>(p.data(), q.data(), out.data(), rows, width);
      EXPECT(out.intact(), "distance output overrun");
      EXPECT(flags == 0, "flags %d on distributions", flags);
      for (int64_t r = 0; r < rows; ++r) {
        // plain sequential sum in double
        const T* a = p.data() + r * width;
        const T* b = q.data() + r * width;
        int unused = 0;
        const double want = jsd ? jsd_finish(jsd_partial(a, b, width, 0, 1, unused))
                                : tvd_finish(tvd_partial(a, b, width, 0, 1, unused));
        const double got = static_cast<double>(out.data()[r]);
        const double tol = (sizeof(T) == 4 ? 1e-6 : 1e-13) * (fabs(want) + 1e-300) + 1e-300;
        EXPECT(fabs(got - static_cast<double>(static_cast<T>(want))) <= tol,
               "%s row %lld of [%lld, %lld]: got %.17g want %.17g", jsd ? "jsd" : "tvd",
               (long long)r, (long long)rows, (long long)width, got, want);
      }
    }
  }
}

// The checked launches' flags: bad entries planted at random in p and q reach the gathered
// bits through whichever lane of whichever grid reads them (every shape's geometry).
template <typename T>
static void check_distance_flags(std::mt19937_64& rng) {
  const int64_t shapes[][2] = {{1, 1}, {70, 5}, {9, 17}, {33, 300}, {4, 2048}, {3, 5000}, {2000, 3}};
  const T bad[] = {T(NAN), T(INFINITY), -T(INFINITY), T(-0.5)};
  for (auto& shape : shapes) {
    const int64_t rows = shape[0], width = shape[1], n = rows * width;
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<T> p(n, T(0.25)), q(n, T(0.5));
      for (int k = 0; k < trial % 3; ++k) {  // 0, 1 or 2 bad entries in each input
        p[rng() % n] = bad[rng() % 4];
        q[rng() % n] = bad[rng() % 4];
      }
      int want = 0;  // by the definition: a NaN or infinite entry (bit 0), a negative finite one (bit 1)
      for (int64_t i = 0; i < n; ++i) {
        want |= (std::isfinite(p[i]) ? (p[i] < 0 ? 2 : 0) : 1) | ((std::isfinite(q[i]) ? (q[i] < 0 ? 2 : 0) : 1) << 2);
      }
      for (int jsd = 0; jsd < 2; ++jsd) {
        std::vector<T> out(rows, T(-7));
        const int got = jsd ? emulate_distance<true>(p.data(), q.data(), out.data(), rows, width)
                            : emulate_distance<false>(p.data(), q.data(), out.data(), rows, width);
        EXPECT(got == want, "%s flags of [%lld, %lld]: got %d want %d", jsd ? "jsd" : "tvd", (long long)rows,
               (long long)width, got, want);
      }
    }
  }
}

// ---- kendall_tau --------------------------------------------------------------------------

template <typename T>
static void check_kendall(std::mt19937_64& rng) {
  std::vector<double> table(kendall::exact_table_size());
  kendall::build_exact_table(table.data());
  std::normal_distribution<double> normal;
  const int64_t cases[][3] = {{1, 5, 5}, {50, 40, 7}, {300, 33, 300}, {40, 120, 3}, {17, 0, 4}};
  for (auto& c : cases) {
    const int64_t rows = c[0], width = c[1], slots_wanted = c[2];
    std::vector<T> x(rows * width), y(rows * width);
    std::vector<int64_t> len(rows);
    int64_t max_len = 0;
    for (int64_t r = 0; r < rows; ++r) {
      len[r] = width == 0 ? 0 : static_cast<int64_t>(rng() % (width + 1));
      max_len = len[r] > max_len ? len[r] : max_len;
      const bool ties = r % 3 == 0;
      for (int64_t i = 0; i < width; ++i) {
        const double a = normal(rng), b = 0.5 * a + normal(rng);
        x[r * width + i] = static_cast<T>(ties ? round(2 * a) : a);
        y[r * width + i] = static_cast<T>(ties ? round(2 * b) : b);
      }
      if (width > 0 && r % 7 == 1) x[r * width + (r % width)] = static_cast<T>(NAN);  // NaN propagates
      if (r % 11 == 2) {  // one value throughout y: no ranking
        for (int64_t i = 0; i < width; ++i) y[r * width + i] = T(1);
      }
      if (r % 5 == 3 && width > 1) x[r * width] = T(-0.0), x[r * width + 1] = T(0.0);  // a tie
    }
    const int64_t slot_bytes = kendall_slot_bytes<T>(max_len);
    const int64_t slots = slots_for(rows, slot_bytes, slots_wanted * slot_bytes);
    EXPECT(slots == (slots_wanted < rows ? slots_wanted : rows) || slot_bytes == 0, "slots");
    Guarded<unsigned char> scratch(static_cast<size_t>(slots * slot_bytes));
    Guarded<T> tau(rows), pvalue(rows);
    for (int64_t r = 0; r < rows; ++r) tau.data()[r] = pvalue.data()[r] = T(-7);
    // kendall_kernel over blocks_for(slots, kRowBlock) blocks of kRowBlock threads
    const int64_t threads = blocks_for(slots, kRowBlock) * kRowBlock;
    for (int64_t t = 0; t < threads; ++t) {
      if (t >= slots) continue;
      kendall_slot(t, slots, x.data(), y.data(), len.data(), rows, width, max_len, scratch.data(),
                   table.data(), tau.data(), pvalue.data());
    }
    EXPECT(scratch.intact() && tau.intact() && pvalue.intact(), "kendall overrun");
    using K = kendall::RowKeys<T>;
    std::vector<typename K::pair_t> pairs(2 * width + 1);
    std::vector<typename K::y_t> ys(2 * width + 1);
    for (int64_t r = 0; r < rows; ++r) {
      double t, p;
      kendall::tau_row(x.data() + r * width, y.data() + r * width, len[r], pairs.data(), ys.data(),
                       table.data(), &t, &p);
      EXPECT(same_bits(tau.data()[r], static_cast<T>(t)) && same_bits(pvalue.data()[r], static_cast<T>(p)),
             "kendall row %lld", (long long)r);
      // kendall_pairwise_kernel: a block of kBlock lanes (and an odd 7) sharing the row
      for (int64_t lanes : {int64_t(kBlock), int64_t(7)}) {
        kendall::PairCounts total, by_field;  // by_field: the kernel's field-by-field sum
        for (int64_t lane = 0; lane < lanes; ++lane) {
          kendall::PairCounts c = kendall::pair_counts(x.data() + r * width, y.data() + r * width, len[r], lane, lanes);
          total.add(c);
          for (int k = 0; k < kendall::kPairCountFields; ++k) by_field.field(k) += c.field(k);
        }
        for (int k = 0; k < kendall::kPairCountFields; ++k) {
          EXPECT(by_field.field(k) == total.field(k), "kendall pair count field %d", k);
        }
        double t2, p2;
        kendall::tau_from_pair_counts(total, len[r], table.data(), &t2, &p2);
        EXPECT(same_bits(t2, t) && same_bits(p2, p), "kendall pairwise row %lld (%lld lanes): %.17g %.17g vs %.17g %.17g",
               (long long)r, (long long)lanes, t2, p2, t, p);
      }
    }
  }
}

// ---- flip search ----------------------------------------------------------------------------

struct FlipBatch {
  int64_t rows, width;
  std::vector<int64_t> len, order;
};

static FlipBatch flip_batch(std::mt19937_64& rng, int64_t rows, int64_t width) {
  FlipBatch f{rows, width, std::vector<int64_t>(rows), std::vector<int64_t>(rows * width)};
  for (int64_t r = 0; r < rows; ++r) {
    f.len[r] = width == 0 ? 0 : static_cast<int64_t>(rng() % (width + 1));
    int64_t* o = f.order.data() + r * width;
    for (int64_t i = 0; i < width; ++i) o[i] = i;
    std::shuffle(o, o + f.len[r], rng);
  }
  return f;
}

static void check_row_checks(std::mt19937_64& rng) {
  for (int64_t slots_wanted : {1, 3, 64, 1000}) {
    FlipBatch f = flip_batch(rng, 200, 12);
    int64_t want_len = INT64_MAX, want_order = INT64_MAX;
    if (slots_wanted != 64) {  // one clean run
      f.len[150] = 13;
      f.len[77] = -1;
      want_len = 77;
      f.order[40 * 12 + 0] = f.order[40 * 12 + 1];  // repeated (if L >= 2)
      f.len[40] = 5;
      f.order[123 * 12 + 2] = 12;  // out of range
      f.len[123] = 4;
      want_order = 40;
    }
    const int64_t slots = slots_for(f.rows, f.width, slots_wanted * f.width);
    Guarded<unsigned char> seen(static_cast<size_t>(slots * f.width));
    int64_t status[2] = {INT64_MAX, INT64_MAX};
    const int64_t threads = blocks_for(slots, kRowBlock) * kRowBlock;
    for (int64_t t = 0; t < threads; ++t)
      if (t < slots) check_rows_slot(t, slots, f.order.data(), f.len.data(), f.rows, f.width, seen.data(), status);
    EXPECT(seen.intact(), "seen overrun");
    EXPECT(status[kBadLength] == want_len && status[kBadOrder] == want_order,
           "status %lld %lld, want %lld %lld", (long long)status[0], (long long)status[1],
           (long long)want_len, (long long)want_order);
  }
}

template <typename T>
static void check_flip_linear(std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  for (int64_t classes : {1, 3, 16, 17, 40}) {
    for (int64_t slots_wanted : {1, 5, 1000}) {
      FlipBatch f = flip_batch(rng, 120, 15);
      const int64_t rows = f.rows, width = f.width;
      std::vector<T> att(rows * width, T(0)), proj(rows * width * classes), bias(classes);
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t i = 0; i < f.len[r]; ++i) s += (att[r * width + i] = static_cast<T>(exp(2 * normal(rng))));
        for (int64_t i = 0; i < f.len[r]; ++i) att[r * width + i] = static_cast<T>(att[r * width + i] / s);
      }
      for (auto& v : proj) v = static_cast<T>(normal(rng));
      for (auto& v : bias) v = static_cast<T>(0.1 * normal(rng));
      const bool local = classes <= kLocalClasses;
      const int64_t per_slot = local ? 0 : classes * int64_t(sizeof(double));
      const int64_t slots = slots_for(rows, per_slot, local ? kScratchBudget : slots_wanted * per_slot);
      Guarded<double> scratch(static_cast<size_t>(local ? 0 : slots * classes));
      Guarded<int64_t> removed(rows);
      Guarded<T> mass(rows);
      for (int64_t r = 0; r < rows; ++r) removed.data()[r] = -7;
      const int64_t threads = blocks_for(slots, kRowBlock) * kRowBlock;
      for (int64_t t = 0; t < threads; ++t) {
        if (t >= slots) continue;
        if (local)
          flip_linear_slot<T, kLocalClasses>(t, slots, att.data(), proj.data(), bias.data(), f.order.data(),
                                             f.len.data(), rows, width, classes, nullptr, removed.data(), mass.data());
        else
          flip_linear_slot<T, 0>(t, slots, att.data(), proj.data(), bias.data(), f.order.data(), f.len.data(),
                                 rows, width, classes, scratch.data(), removed.data(), mass.data());
      }
      EXPECT(scratch.intact() && removed.intact() && mass.intact(), "flip linear overrun");
      std::vector<double> suffix(classes);
      int64_t flips = 0;
      for (int64_t r = 0; r < rows; ++r) {
        double m = 0;
        const int64_t k = flip::linear_row<T, double>(att.data() + r * width, proj.data() + r * width * classes,
                                                      bias.data(), f.order.data() + r * width, f.len[r],
                                                      classes, suffix.data(), &m);
        flips += k > 0;
        EXPECT(removed.data()[r] == k, "removed row %lld: %lld vs %lld", (long long)r,
               (long long)removed.data()[r], (long long)k);
        if (k >= 0) EXPECT(same_bits(mass.data()[r], static_cast<T>(m)), "mass row %lld", (long long)r);
        else EXPECT(mass.data()[r] != mass.data()[r], "NaN mass row %lld", (long long)r);
      }
      EXPECT(flips > 0, "a meaningful test: some rows flip (C = %lld)", (long long)classes);
    }
  }
}

template <typename T>
static void check_contexts(std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  for (int64_t hidden : {1, 3, 32, 40, 70}) {
    FlipBatch f = flip_batch(rng, 90, 11);
    const int64_t rows = f.rows, width = f.width;
    std::vector<T> att(rows * width), values(rows * width * hidden);
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t i = 0; i < width; ++i) s += (att[r * width + i] = static_cast<T>(exp(normal(rng))));
      for (int64_t i = 0; i < width; ++i) att[r * width + i] = static_cast<T>(att[r * width + i] / s);
      if (r % 7 == 0 && f.len[r] > 2) att[r * width + f.order[r * width + f.len[r] - 1]] = T(0);  // zero mass at the end
    }
    for (auto& v : values) v = static_cast<T>(normal(rng));
    std::vector<int64_t> offsets(rows);
    int64_t total = 0;
    for (int64_t r = 0; r < rows; ++r) {
      offsets[r] = total;
      total += f.len[r];
    }
    Guarded<T> out(static_cast<size_t>(total * hidden));
    for (int64_t i = 0; i < total * hidden; ++i) out.data()[i] = T(-7);
    // contexts_kernel: context_warps(rows) / 8 blocks of kBlock threads
    const int64_t threads = context_warps(rows) * kWarp;
    const int64_t groups = threads / kWarp;
    for (int64_t t = 0; t < threads; ++t)
      contexts_lane(t / kWarp, groups, t % kWarp, kWarp, att.data(), values.data(), f.order.data(),
                    f.len.data(), offsets.data(), rows, width, hidden, out.data());
    EXPECT(out.intact(), "contexts overrun");
    std::vector<T> want(width * hidden);
    std::vector<double> suffix(hidden);
    for (int64_t r = 0; r < rows; ++r) {
      flip::contexts_row<T, double>(att.data() + r * width, values.data() + r * width * hidden,
                                    f.order.data() + r * width, f.len[r], hidden, suffix.data(), want.data());
      for (int64_t i = 0; i < f.len[r] * hidden; ++i)
        EXPECT(same_bits(out.data()[offsets[r] * hidden + i], want[i]), "contexts row %lld item %lld",
               (long long)r, (long long)i);
    }
  }
}

// ---- dumps for the comparison with the CPU ops (tests/test_cuda_compile.py) ----------------

static FILE* manifest = nullptr;
static std::string dump_dir;
static int dump_count = 0;

static const char* type_name(const float*) { return "f32"; }
static const char* type_name(const double*) { return "f64"; }
static const char* type_name(const int64_t*) { return "i64"; }

// Appends " name=FILE:TYPE:D0xD1..." to the current manifest line and writes the array.
template <typename T>
static void dump(const char* name, const T* data, std::vector<int64_t> shape) {
  if (!manifest) return;
  int64_t n = 1;
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    n *= shape[i];
    dims += (i ? "x" : "") + std::to_string(shape[i]);
  }
  const std::string file = "a" + std::to_string(dump_count++) + ".bin";
  FILE* f = fopen((dump_dir + "/" + file).c_str(), "wb");
  EXPECT(f != nullptr, "cannot write %s", file.c_str());
  if (!f) return;
  if (n > 0) fwrite(data, sizeof(T), static_cast<size_t>(n), f);
  fclose(f);
  fprintf(manifest, " %s=%s:%s:%s", name, file.c_str(), type_name(data), dims.empty() ? "s" : dims.c_str());
}

static void line_begin(const char* op) {
  if (manifest) fprintf(manifest, "%s", op);
}
static void scalar(const char* name, long long v) {
  if (manifest) fprintf(manifest, " %s=%lld", name, v);
}
static void line_end() {
  if (manifest) fprintf(manifest, "\n");
}

// Random lengths in [lo, width], with lo and width among them when there are rows enough.
static std::vector<int64_t> random_lengths(std::mt19937_64& rng, int64_t rows, int64_t lo, int64_t width) {
  std::vector<int64_t> len(rows);
  for (int64_t r = 0; r < rows; ++r) len[r] = lo + static_cast<int64_t>(rng() % (width - lo + 1));
  if (rows > 2) {
    len[0] = lo;
    len[1] = width;
  }
  return len;
}

// ---- attention_permutations ------------------------------------------------------------------

static void check_permutations(std::mt19937_64& rng) {
  struct Case { int64_t rows, width, P; uint64_t seed, row_offset, perm_offset; };
  const Case cases[] = {{1, 1, 1, 0, 0, 0}, {5, 7, 3, 42, 0, 0}, {40, 33, 4, uint64_t(-5), 17, 3},
                        {3, 0, 2, 1, 0, 0}, {300, 12, 5, 0x123456789ULL, (uint64_t(1) << 63) - 2, 9},
                        {2, 200, 2, 7, 1, 0}};
  for (const Case& c : cases) {
    const std::vector<int64_t> len = random_lengths(rng, c.rows, 0, c.width);
    const int64_t items = c.rows * c.P, n = items * c.width;
    std::vector<int64_t> first;
    // the launcher's grid, then a small one (many items per thread)
    for (int64_t threads : {blocks_for(items, kRowBlock) * kRowBlock, int64_t(7)}) {
      Guarded<int64_t> out(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) out.data()[i] = -7;
      if (c.width > 0)  // attention_permutations launches nothing for width 0
        for (int64_t t = 0; t < threads; ++t)
          permutations_item(t, threads, len.data(), c.rows, c.width, c.P, c.seed, c.row_offset,
                            c.perm_offset, out.data());
      EXPECT(out.intact(), "permutations overrun");
      std::vector<int64_t> want(static_cast<size_t>(c.width));
      for (int64_t b = 0; b < c.rows; ++b) {
        const uint64_t key = permutation::row_key(c.seed, c.row_offset + uint64_t(b));
        for (int64_t p = 0; p < c.P; ++p) {
          permutation::permutation_row(key, c.perm_offset + uint64_t(p), len[b], want.data());
          const int64_t* got = out.data() + (b * c.P + p) * c.width;
          for (int64_t t = 0; t < c.width; ++t)
            EXPECT(got[t] == (t < len[b] ? want[t] : t), "permutation row %lld perm %lld item %lld",
                   (long long)b, (long long)p, (long long)t);
        }
      }
      if (first.empty()) first.assign(out.data(), out.data() + n);
    }
    line_begin("attention_permutations");
    dump("lengths", len.data(), {c.rows});
    scalar("width", c.width);
    scalar("permutations", c.P);
    scalar("seed", static_cast<long long>(c.seed));
    scalar("row_offset", static_cast<long long>(c.row_offset));
    scalar("permutation_offset", static_cast<long long>(c.perm_offset));
    dump("out", first.data(), {c.rows, c.P, c.width});
    line_end();
  }
}

// ---- permutation_tvd_linear ------------------------------------------------------------------

template <typename T>
static void check_permutation_tvd(std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  struct Case { int64_t rows, width, C, P, chunk_rows, slots; };
  // chunk_rows 0: the glue's choice; slots 0: the glue's choice for the chunk
  const Case cases[] = {{30, 9, 1, 5, 0, 0}, {30, 9, 2, 4, 7, 5}, {25, 6, 3, 5, 4, 3},
                        {20, 8, 17, 4, 0, 0}, {20, 8, 17, 3, 6, 2}, {12, 1, 2, 6, 0, 0},
                        {9, 40, 2, 101, 2, 50}};
  for (const Case& c : cases) {
    const std::vector<int64_t> len = random_lengths(rng, c.rows, 0, c.width);
    std::vector<T> att(c.rows * c.width, T(0)), proj(c.rows * c.width * c.C), bias(c.C);
    for (int64_t r = 0; r < c.rows; ++r) {
      double s = 0;
      for (int64_t i = 0; i < len[r]; ++i) s += (att[r * c.width + i] = static_cast<T>(exp(1.5 * normal(rng))));
      for (int64_t i = 0; i < len[r]; ++i) att[r * c.width + i] = static_cast<T>(att[r * c.width + i] / s);
    }
    for (auto& v : proj) v = static_cast<T>(normal(rng));
    for (auto& v : bias) v = static_cast<T>(0.3 * normal(rng));
    const uint64_t seed = rng(), row_offset = rng() % 1000;
    const int64_t chunk_rows = c.chunk_rows ? c.chunk_rows : permutation_chunk_rows(c.rows, c.P);
    const int64_t slot_bytes = permutation_slot_bytes(c.width, c.C);
    const int64_t slots = c.slots ? c.slots : slots_for(chunk_rows * c.P, slot_bytes, kScratchBudget / 2);
    EXPECT(slots >= 1 && slots <= chunk_rows * c.P, "permutation slots");
    Guarded<unsigned char> scratch(static_cast<size_t>(slots * slot_bytes));
    Guarded<double> chunk(static_cast<size_t>(chunk_rows * c.P));
    Guarded<T> median(c.rows), tvd(c.rows * c.P);
    for (int64_t i = 0; i < c.rows; ++i) median.data()[i] = T(-7);
    for (int64_t i = 0; i < c.rows * c.P; ++i) tvd.data()[i] = T(-7);
    // launch_tvd of permutation.cu: per chunk, tvd_kernel then median_kernel
    for (int64_t begin = 0; begin < c.rows; begin += chunk_rows) {
      const int64_t end = std::min(c.rows, begin + chunk_rows);
      const int64_t threads = blocks_for(slots, kRowBlock) * kRowBlock;
      for (int64_t t = 0; t < threads && t < slots; ++t) {
        if (c.C <= kLocalClasses)
          permutation_tvd_slot<T, kLocalClasses>(t, slots, att.data(), proj.data(), bias.data(), len.data(), begin,
                                                 end, c.width, c.C, c.P, seed, row_offset, scratch.data(),
                                                 chunk.data(), tvd.data());
        else
          permutation_tvd_slot<T, 0>(t, slots, att.data(), proj.data(), bias.data(), len.data(), begin, end,
                                     c.width, c.C, c.P, seed, row_offset, scratch.data(), chunk.data(), tvd.data());
      }
      const int64_t median_threads = blocks_for(end - begin, kRowBlock) * kRowBlock;
      for (int64_t t = 0; t < median_threads; ++t)
        permutation_median_row(t, median_threads, begin, end, c.P, chunk.data(), median.data());
    }
    EXPECT(scratch.intact() && chunk.intact() && median.intact() && tvd.intact(), "permutation tvd overrun");
    std::vector<uint32_t> perm(c.width + 1);
    std::vector<double> u(c.width + 1), z(c.C), base(c.C), tvds(c.P), sorted(c.P);
    int64_t nonzero = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
      const double m = permutation::linear_row<T, double>(
          att.data() + r * c.width, proj.data() + r * c.width * c.C, bias.data(), len[r], c.C, c.P, seed,
          row_offset + uint64_t(r), perm.data(), u.data(), z.data(), base.data(), tvds.data(), sorted.data());
      EXPECT(same_bits(median.data()[r], static_cast<T>(m)), "median row %lld (C = %lld)", (long long)r,
             (long long)c.C);
      for (int64_t p = 0; p < c.P; ++p) {
        EXPECT(same_bits(tvd.data()[r * c.P + p], static_cast<T>(tvds[p])), "tvd row %lld perm %lld", (long long)r,
               (long long)p);
        nonzero += tvds[p] > 0;
      }
    }
    EXPECT(nonzero > 0 || c.width <= 1, "a meaningful test: some permutations move the output");
    line_begin("permutation_tvd_linear");
    dump("attention", att.data(), {c.rows, c.width});
    dump("projected", proj.data(), {c.rows, c.width, c.C});
    dump("bias", bias.data(), {c.C});
    dump("lengths", len.data(), {c.rows});
    scalar("permutations", c.P);
    scalar("seed", static_cast<long long>(seed));
    scalar("row_offset", static_cast<long long>(row_offset));
    dump("median", median.data(), {c.rows});
    dump("tvd", tvd.data(), {c.rows, c.P});
    line_end();
  }
}

// ---- project_prefix ----------------------------------------------------------------------------

template <typename T>
static void check_projection(std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  const int64_t cases[][4] = {{1, 1, 1, 1}, {7, 5, 3, 2}, {20, 9, 33, 3}, {6, 4, 70, 17}, {3, 0, 4, 2}, {4, 3, 0, 2}};
  for (auto& c : cases) {
    const int64_t rows = c[0], width = c[1], H = c[2], C = c[3];
    const std::vector<int64_t> len = random_lengths(rng, rows, 0, width);
    std::vector<T> values(rows * width * H), weight(C * H);
    for (auto& v : values) v = static_cast<T>(normal(rng));
    for (auto& v : weight) v = static_cast<T>(normal(rng));
    const int64_t items = rows * width * C;
    std::vector<T> first;
    for (int64_t threads : {blocks_for(items, kBlock) * kBlock, int64_t(13)}) {
      Guarded<T> out(static_cast<size_t>(items));
      for (int64_t i = 0; i < items; ++i) out.data()[i] = T(-7);
      if (items > 0)
        for (int64_t t = 0; t < threads; ++t)
          project_item(t, threads, values.data(), weight.data(), len.data(), rows, width, H, C, out.data());
      EXPECT(out.intact(), "projection overrun");
      std::vector<T> want(width * C);
      for (int64_t r = 0; r < rows; ++r) {
        projection::project_row<T, projection::partial_sums<T>()>(values.data() + r * width * H, weight.data(),
                                                                  len[r], width, H, C, want.data());
        for (int64_t i = 0; i < width * C; ++i)
          EXPECT(same_bits(out.data()[r * width * C + i], want[i]), "projection row %lld item %lld", (long long)r,
                 (long long)i);
      }
      if (first.empty()) first.assign(out.data(), out.data() + items);
    }
    line_begin("project_prefix");
    dump("values", values.data(), {rows, width, H});
    dump("weight", weight.data(), {C, H});
    dump("lengths", len.data(), {rows});
    dump("out", first.data(), {rows, width, C});
    line_end();
  }
}

// ---- leave_one_out_batch -----------------------------------------------------------------------

static void check_loo(std::mt19937_64& rng) {
  struct Case { int64_t rows, T, lead, trail, mask_token, pad; };  // mask_token < 0: deletion
  const Case cases[] = {{1, 3, 1, 1, -1, 0}, {30, 12, 1, 1, -1, 0}, {30, 12, 1, 1, 5, 0}, {25, 40, 0, 0, -1, 9},
                        {25, 40, 0, 0, 1, 2}, {10, 70, 2, 1, 4, 0}, {5, 4, 2, 2, -1, 0}};
  for (const Case& c : cases) {
    const bool mask = c.mask_token >= 0;
    const std::vector<int64_t> len = random_lengths(rng, c.rows, c.lead + c.trail, c.T);
    std::vector<int64_t> tokens(c.rows * c.T);
    for (auto& v : tokens) v = 10 + static_cast<int64_t>(rng() % 1000);
    // the glue's offsets, total and width
    std::vector<int64_t> offsets(c.rows);
    int64_t total = 0, width = 0;
    for (int64_t b = 0; b < c.rows; ++b) {
      const int64_t n = loo::real_count(len[b], c.lead, c.trail);
      offsets[b] = total;
      total += n;
      if (n > 0) width = std::max(width, loo::sequence_length(len[b], mask));
    }
    std::vector<int64_t> first, first_len, first_src;
    for (int64_t warps : {warps_for(total), int64_t(3)}) {
      Guarded<int64_t> out(static_cast<size_t>(total * width)), out_len(total), out_src(total);
      for (int64_t i = 0; i < total * width; ++i) out.data()[i] = -7;
      for (int64_t i = 0; i < total; ++i) out_len.data()[i] = out_src.data()[i] = -7;
      if (total > 0)
        for (int64_t t = 0; t < warps * kWarp; ++t)
          loo_lane(t / kWarp, warps, t % kWarp, kWarp, tokens.data(), len.data(), offsets.data(), c.rows, c.T,
                   c.lead, mask, mask ? c.mask_token : 0, c.pad, total, width, out.data(), out_len.data(),
                   out_src.data());
      EXPECT(out.intact() && out_len.intact() && out_src.intact(), "loo overrun");
      std::vector<int64_t> want(static_cast<size_t>(total * width)), want_len(total), want_src(total);
      for (int64_t b = 0; b < c.rows; ++b)
        loo::build_row(tokens.data() + b * c.T, len[b], c.lead, c.trail, mask, mask ? c.mask_token : 0, c.pad,
                       width, b, want.data() + offsets[b] * width, want_len.data() + offsets[b],
                       want_src.data() + offsets[b]);
      for (int64_t i = 0; i < total * width; ++i) EXPECT(out.data()[i] == want[i], "loo id %lld", (long long)i);
      for (int64_t i = 0; i < total; ++i)
        EXPECT(out_len.data()[i] == want_len[i] && out_src.data()[i] == want_src[i], "loo sequence %lld",
               (long long)i);
      if (first.empty()) {
        first.assign(out.data(), out.data() + total * width);
        first_len.assign(out_len.data(), out_len.data() + total);
        first_src.assign(out_src.data(), out_src.data() + total);
      }
    }
    // build_sequence by lanes against a plain element-by-element definition
    for (int64_t L = 1; L <= 6; ++L)
      for (int64_t t = 0; t < L; ++t)
        for (int m = 0; m < 2; ++m)
          for (int64_t lanes : {1, 2, 3, 32}) {
            const int64_t row[6] = {11, 12, 13, 14, 15, 16}, w = 8;
            int64_t got[8];
            for (int64_t lane = 0; lane < lanes; ++lane) loo::build_sequence(row, L, t, m, 99, 0, w, got, lane, lanes);
            for (int64_t j = 0; j < w; ++j) {
              const int64_t want = m ? (j == t ? 99 : (j < L ? row[j] : 0)) : (j < t ? row[j] : (j < L - 1 ? row[j + 1] : 0));
              EXPECT(got[j] == want, "build_sequence L %lld t %lld mask %d lanes %lld j %lld", (long long)L,
                     (long long)t, m, (long long)lanes, (long long)j);
            }
          }
    line_begin("leave_one_out_batch");
    dump("tokens", tokens.data(), {c.rows, c.T});
    dump("lengths", len.data(), {c.rows});
    scalar("lead", c.lead);
    scalar("trail", c.trail);
    scalar("mask_token", c.mask_token);
    scalar("pad", c.pad);
    dump("out", first.data(), {total, width});
    dump("out_lengths", first_len.data(), {total});
    dump("out_source", first_src.data(), {total});
    line_end();
  }
}

int main(int argc, char** argv) {
  if (argc > 1) {
    dump_dir = argv[1];
    manifest = fopen((dump_dir + "/manifest.txt").c_str(), "w");
    if (!manifest) {
      fprintf(stderr, "cannot write %s/manifest.txt\n", argv[1]);
      return 2;
    }
  }

  std::mt19937_64 rng(12345);
  check_geometry();
  check_distances<float>(rng);
  check_distances<double>(rng);
  check_distance_flags<float>(rng);
  check_distance_flags<double>(rng);
  check_kendall<float>(rng);
  check_kendall<double>(rng);
  check_row_checks(rng);
  check_flip_linear<float>(rng);
  check_flip_linear<double>(rng);
  check_contexts<float>(rng);
  check_contexts<double>(rng);
  check_permutations(rng);
  check_permutation_tvd<float>(rng);
  check_permutation_tvd<double>(rng);
  check_projection<float>(rng);
  check_projection<double>(rng);
  check_loo(rng);
  if (manifest) fclose(manifest);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("host harness: all checks passed\n");
  return 0;
}
