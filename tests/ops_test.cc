// The cross-backend op table (DESIGN.md §4b; llama.cpp's test-backend-ops is the model): every
// op of kernels/ops.h, on random inputs, over batches of 7 units (ragged rows, a length-1 row, an
// empty row, a 300-token row crossing the 64-token delta-rule chunks, the 16-query attention
// blocks and, for conv, 512-channel blocks), run by each backend under test and
//   * scored against the reference backend (kernels/reference_ops.h) by max error relative to
//     the output's largest magnitude and by NMSE, with a tolerance per case (stated with it);
//   * checked for bitwise batch invariance: a unit computed alone == the same unit in the batch
//     of 7 == the batch reordered (padding lengths differ between those calls, and so does the
//     garbage in padded rows and stride gaps);
//   * checked for exact zeros where a contract zeroes padded outputs, and for untouched padded
//     inputs where an op must leave them (state outputs — K/V, conv tails, recurrent state — are
//     scored like the other outputs).
// A unit is one row of a row table (ops with a RowTable) or a block of token rows / values (the
// row-wise and elementwise ops). A new backend adds a column in backends_under_test().
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/tensor.h"
#include "kernels/reference_ops.h"

namespace deg {
namespace {

using Floats = std::vector<float>;

// ---- backends under test ----

struct Backend {
  const char* name;
  const Ops* ops;
};

void PrintTo(const Backend& b, std::ostream* os) {
  *os << b.name;
}

// Each is scored against reference_ops(). The table's buffers are host memory; a device backend
// (CUDA) joins here once the harness copies them to and from its memory.
std::vector<Backend> backends_under_test() {
  return {{"cpu", &cpu_ops()}};
}

// ---- units and layouts ----

constexpr int kUnits = 7;
const std::vector<int> kInOrder = {0, 1, 2, 3, 4, 5, 6};
const std::vector<int> kReordered = {3, 6, 0, 5, 1, 4, 2};

// Real tokens per row for row-table ops: ragged, length 1, empty, and a long row (300 crosses
// the 64-token chunks of the delta rule and the 16-query attention blocks; 64 / 65 sit on a chunk
// edge).
const std::vector<int64_t> kRowLengths = {3, 1, 0, 300, 17, 64, 65};
// Decode: one token per row (one row empty).
const std::vector<int64_t> kDecodeLengths = {1, 1, 0, 1, 1, 1, 1};
// Token rows per unit for row-wise ops (68 in all: crosses the gemm's 64-row blocks).
const std::vector<int64_t> kTokenRows = {3, 1, 0, 40, 17, 5, 2};

// Where the entries of one call sit in its token rows: entry j (unit order[j]) owns rows
// [begin[j], end[j]); the first real[j] hold its data, the rest are padding.
struct Layout {
  std::vector<int64_t> begin, real, end;
  int64_t rows = 0;
  // Row-table ops only.
  int64_t tokens = 0;
  std::vector<int64_t> lengths, positions;

  RowTable table() const {
    return {.rows = int64_t(lengths.size()),
            .tokens = tokens,
            .lengths = lengths.data(),
            .positions = positions.data()};
  }
};

// Units back to back, no padding (row-wise ops).
Layout packed(const std::vector<int64_t>& counts, const std::vector<int>& order) {
  Layout lay;
  for (int u : order) {
    lay.begin.push_back(lay.rows);
    lay.real.push_back(counts[size_t(u)]);
    lay.rows += counts[size_t(u)];
    lay.end.push_back(lay.rows);
  }
  return lay;
}

// A row table over the units in order: L = the longest row + 3 in a batch (every row padded), and
// the row's own length alone (at least 1), so the padding differs between the two.
Layout padded(const std::vector<int64_t>& lengths, const std::vector<int>& order,
              const std::vector<int64_t>& positions = {}) {
  Layout lay;
  int64_t longest = 0;
  for (int u : order) longest = std::max(longest, lengths[size_t(u)]);
  lay.tokens = order.size() > 1 ? longest + 3 : std::max<int64_t>(longest, 1);
  for (int u : order) {
    const int64_t b = int64_t(lay.lengths.size());
    lay.lengths.push_back(lengths[size_t(u)]);
    lay.positions.push_back(positions.empty() ? 0 : positions[size_t(u)]);
    lay.begin.push_back(b * lay.tokens);
    lay.real.push_back(lengths[size_t(u)]);
    lay.end.push_back((b + 1) * lay.tokens);
  }
  lay.rows = int64_t(order.size()) * lay.tokens;
  return lay;
}

Floats randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  Floats v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

Floats uniform(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> ud(lo, hi);
  Floats v(n);
  for (float& x : v) x = ud(rng);
  return v;
}

// Garbage for padded rows, stride gaps and output buffers: finite, large, and different in every
// call (seeded by the call's order), so reading it shows up as an error or a broken invariance.
std::mt19937 junk_rng(const std::vector<int>& order) {
  uint32_t seed = 12345;
  for (int u : order) seed = seed * 31 + uint32_t(u) + 1;
  return std::mt19937(seed + uint32_t(order.size()));
}
// Never empty: a call over no rows still gets real pointers, as an arena hands out.
Floats junk(size_t n, std::mt19937& rng) {
  return randn(std::max<size_t>(n, 1), rng, 40.0f);
}

std::vector<int64_t> span_cols(int64_t n) {
  std::vector<int64_t> c(static_cast<size_t>(n));
  std::iota(c.begin(), c.end(), 0);
  return c;
}
// `heads` vectors of `dim` at stride hs within a row.
std::vector<int64_t> head_cols(int64_t heads, int64_t hs, int64_t dim) {
  std::vector<int64_t> c;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < dim; ++i) c.push_back(h * hs + i);
  return c;
}

// A [rows, ld] buffer: entry j's real rows hold data[order[j]] (real x cols, row-major) at
// columns `cols`; everything else is garbage.
Floats place(const Layout& lay, const std::vector<int>& order, const std::vector<Floats>& data,
             int64_t ld, const std::vector<int64_t>& cols, std::mt19937& rng) {
  Floats buf = junk(size_t(lay.rows * ld), rng);
  const int64_t w = int64_t(cols.size());
  for (size_t j = 0; j < order.size(); ++j) {
    const Floats& d = data[size_t(order[j])];
    EXPECT_EQ(int64_t(d.size()), lay.real[j] * w);
    for (int64_t r = 0; r < lay.real[j]; ++r)
      for (int64_t c = 0; c < w; ++c)
        buf[size_t((lay.begin[j] + r) * ld + cols[size_t(c)])] = d[size_t(r * w + c)];
  }
  return buf;
}

// Columns `cols` of each entry's real rows (pad: false) or padded rows (pad: true).
std::vector<Floats> take(const Layout& lay, const Floats& buf, int64_t ld,
                         const std::vector<int64_t>& cols, bool pad = false) {
  std::vector<Floats> out(lay.begin.size());
  for (size_t j = 0; j < out.size(); ++j) {
    const int64_t r0 = pad ? lay.begin[j] + lay.real[j] : lay.begin[j];
    const int64_t r1 = pad ? lay.end[j] : lay.begin[j] + lay.real[j];
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c : cols) out[j].push_back(buf[size_t(r * ld + c)]);
  }
  return out;
}

// a - b elementwise (what an op changed where it must change nothing).
std::vector<Floats> minus(std::vector<Floats> a, const std::vector<Floats>& b) {
  for (size_t j = 0; j < a.size(); ++j)
    for (size_t i = 0; i < a[j].size(); ++i) a[j][i] -= b[j][i];
  return a;
}

// ---- the table ----

// One unit's results: named arrays. Names starting "pad:" must be exactly zero: padded outputs
// an op's contract zeroes, or what an op changed in padded inputs it must leave alone.
struct Named {
  std::string name;
  Floats v;
};
using Results = std::vector<Named>;
using Batch = std::vector<Results>;  // per entry of the call's order

void add(Batch& batch, const std::string& name, std::vector<Floats> per_entry) {
  batch.resize(per_entry.size());
  for (size_t j = 0; j < per_entry.size(); ++j) batch[j].push_back({name, std::move(per_entry[j])});
}

// Runs the op once on `ops` over the units listed in `order` (one call; the units in that
// order) and returns each entry's results.
using RunFn = std::function<Batch(const Ops& ops, const std::vector<int>& order)>;

// How far a backend may be from the reference, per result of a case: max |got - ref| over
// max |ref| (the error relative to the output's scale), and NMSE = Σ (got - ref)² / Σ ref².
// Zero means bitwise equal: data movement, and single f32 operations (a double result rounded to
// f32 once is the correctly rounded f32 result).
struct Tolerance {
  double max_err = 0;
  double nmse = 0;
};

struct OpCase {
  std::string name;  // op_variant
  Tolerance tol;
  std::function<RunFn()> make;  // draws the units' inputs; the RunFn replays them
};

// ---- gemm ----

struct GemmOut {
  DType dtype;
  int64_t n;
  bool accumulate;
};

OpCase gemm_case(std::string name, std::vector<GemmOut> outs, GemmPrecision precision,
                 Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(101);
            const int64_t K = 300, ldx = K + 5;  // K: not a multiple of 8 or 16 lanes
            auto x = std::make_shared<std::vector<Floats>>();
            for (int64_t m : kTokenRows) x->push_back(randn(size_t(m * K), rng));
            auto w = std::make_shared<std::vector<Tensor>>();
            auto y0 = std::make_shared<std::vector<std::vector<Floats>>>();  // [out][unit]
            for (const GemmOut& o : outs) {
              Floats wf = randn(size_t(o.n * K), rng, 0.05f);
              if (o.dtype == DType::bf16) {
                std::vector<bf16> wb;
                for (float v : wf) wb.push_back(f32_to_bf16(v));
                w->push_back(Tensor::from_vector(wb, {o.n, K}));
              } else {
                w->push_back(Tensor::from_vector(wf, {o.n, K}));
              }
              y0->emplace_back();
              for (int64_t m : kTokenRows) y0->back().push_back(randn(size_t(m * o.n), rng));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              Floats xb = place(lay, order, *x, ldx, span_cols(K), jr);
              std::vector<Floats> ys;
              std::vector<GemmOutput> go;
              for (size_t o = 0; o < outs.size(); ++o) {
                const int64_t ldy = outs[o].n + 3;
                ys.push_back(place(lay, order, (*y0)[o], ldy, span_cols(outs[o].n), jr));
              }
              for (size_t o = 0; o < outs.size(); ++o)
                go.push_back({.w = &(*w)[o],
                              .y = ys[o].data(),
                              .ldy = outs[o].n + 3,
                              .accumulate = outs[o].accumulate});
              ops.gemm({.x = xb.data(),
                        .m = lay.rows,
                        .k = K,
                        .ldx = ldx,
                        .outputs = go,
                        .precision = precision});
              Batch res;
              for (size_t o = 0; o < outs.size(); ++o)
                add(res, fmt::format("y{}", o),
                    take(lay, ys[o], outs[o].n + 3, span_cols(outs[o].n)));
              return res;
            });
          }};
}

// ---- norms ----

struct NormShape {
  int64_t heads = 1, dim = 0;
  int64_t hx = 0, hy = 0, ldx = 0, ldy = 0;  // hx / hy 0: dim
  bool weight = true;
  NormScale scale = NormScale::w;
  bool gated = false;
  int64_t hg = 0, ldg = 0;
  bool in_place = false;  // y = x (ldy, hy as x)
};

OpCase norm_case(std::string name, NormShape s, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(202);
            const int64_t H = s.heads, D = s.dim;
            auto x = std::make_shared<std::vector<Floats>>();
            auto gate = std::make_shared<std::vector<Floats>>();
            for (int64_t m : kTokenRows) {
              x->push_back(randn(size_t(m * H * D), rng, 3.0f));
              gate->push_back(randn(size_t(m * H * D), rng, 2.0f));
            }
            auto w = std::make_shared<Floats>(randn(size_t(D), rng, 0.5f));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              const int64_t hx = s.hx ? s.hx : D, hg = s.hg ? s.hg : D;
              const int64_t ldy = s.in_place ? s.ldx : s.ldy;
              const int64_t hy = s.in_place ? hx : (s.hy ? s.hy : D);
              Floats xb = place(lay, order, *x, s.ldx, head_cols(H, hx, D), jr);
              Floats gb =
                  s.gated ? place(lay, order, *gate, s.ldg, head_cols(H, hg, D), jr) : Floats{};
              Floats yb = s.in_place ? Floats{} : junk(size_t(lay.rows * ldy), jr);
              float* y = s.in_place ? xb.data() : yb.data();
              ops.rms_norm({.x = xb.data(),
                            .ldx = s.ldx,
                            .hx = s.hx,
                            .y = y,
                            .ldy = ldy,
                            .hy = s.in_place ? s.hx : s.hy,
                            .rows = lay.rows,
                            .heads = H,
                            .dim = D,
                            .w = s.weight ? w->data() : nullptr,
                            .eps = 1e-6f,
                            .scale = s.scale,
                            .gate = s.gated ? gb.data() : nullptr,
                            .ldg = s.ldg,
                            .hg = s.hg});
              Batch res;
              add(res, "y", take(lay, s.in_place ? xb : yb, ldy, head_cols(H, hy, D)));
              return res;
            });
          }};
}

OpCase l2_norm_case(std::string name, int64_t heads, int64_t dim, int64_t ldx, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(303);
            auto x = std::make_shared<std::vector<Floats>>();
            for (int64_t m : kTokenRows) x->push_back(randn(size_t(m * heads * dim), rng, 2.0f));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              Floats xb = place(lay, order, *x, ldx, span_cols(heads * dim), jr);
              ops.l2_norm({.x = xb.data(),
                           .ldx = ldx,
                           .rows = lay.rows,
                           .heads = heads,
                           .dim = dim,
                           .eps = 1e-6f,
                           .post_scale = 0.25f});
              Batch res;
              add(res, "x", take(lay, xb, ldx, span_cols(heads * dim)));
              return res;
            });
          }};
}

// ---- rope ----

OpCase rope_case(std::string name, int64_t heads, int64_t dim, int64_t hs, double partial,
                 double theta, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(404);
            const int64_t ldx = heads * hs + 3;
            auto x = std::make_shared<std::vector<Floats>>();
            for (int64_t n : kRowLengths) x->push_back(randn(size_t(n * heads * dim), rng));
            auto table = std::make_shared<RopeTable>(rope_table(dim, partial, theta));
            const std::vector<int64_t> positions = {0, 7, 1000, 3, 0, 33, 250};
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(kRowLengths, order, positions);
              const auto cols = head_cols(heads, hs, dim);
              Floats xb = place(lay, order, *x, ldx, cols, jr);
              const auto pad_before = take(lay, xb, ldx, cols, true);
              ops.rope({.rows = lay.table(),
                        .table = table.get(),
                        .x = xb.data(),
                        .ldx = ldx,
                        .heads = heads,
                        .hs = hs});
              Batch res;
              add(res, "x", take(lay, xb, ldx, cols));
              add(res, "pad:x", minus(take(lay, xb, ldx, cols, true), pad_before));
              return res;
            });
          }};
}

// ---- K/V writes and attention ----

// Per-unit K/V storage of one attention layer: [kv_heads, capacity, D] for prefix and own keys.
struct KvUnit {
  int64_t prefix_len = 0, prefix_cap = 0, own_before = 0, own_cap = 0;
  Floats prefix_k, prefix_v, own_k, own_v;
};

OpCase kv_write_case(std::string name, int64_t kv_heads, int64_t dim, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(505);
            const std::vector<int64_t> own_before = {0, 4, 0, 2, 9, 0, 1};
            const int64_t ld = 2 * kv_heads * dim + 8;  // K then V within a fused row
            auto kv = std::make_shared<std::vector<Floats>>();
            auto units = std::make_shared<std::vector<KvUnit>>();
            for (int u = 0; u < kUnits; ++u) {
              const int64_t n = kRowLengths[size_t(u)];
              kv->push_back(randn(size_t(n * 2 * kv_heads * dim), rng));
              KvUnit k;
              k.own_before = own_before[size_t(u)];
              k.own_cap = k.own_before + n + 4;
              k.own_k = randn(size_t(kv_heads * k.own_cap * dim), rng);  // earlier keys; spare
              k.own_v = randn(size_t(kv_heads * k.own_cap * dim), rng);
              units->push_back(std::move(k));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(kRowLengths, order);
              Floats kvb = place(lay, order, *kv, ld, span_cols(2 * kv_heads * dim), jr);
              std::vector<KvUnit> st;
              std::vector<RowView> views;
              for (int u : order) st.push_back((*units)[size_t(u)]);
              for (KvUnit& k : st)
                views.push_back({.own_k = k.own_k.data(),
                                 .own_v = k.own_v.data(),
                                 .own_before = k.own_before,
                                 .own_stride = k.own_cap * dim});
              ops.kv_write({.rows = lay.table(),
                            .views = views.data(),
                            .k = kvb.data(),
                            .ldk = ld,
                            .v = kvb.data() + kv_heads * dim,
                            .ldv = ld,
                            .kv_heads = kv_heads,
                            .dim = dim});
              std::vector<Floats> k, v;
              for (KvUnit& s : st) {
                k.push_back(s.own_k);
                v.push_back(s.own_v);
              }
              Batch res;
              add(res, "own_k", k);  // whole buffers: written keys, earlier keys, spare slots
              add(res, "own_v", v);
              return res;
            });
          }};
}

struct AttendShape {
  int64_t kv_heads = 1, group = 1, dim = 32, window = 0;
  std::vector<int64_t> lengths = kRowLengths;
  std::vector<int64_t> prefix_len = {0, 0, 0, 0, 0, 0, 0};
  std::vector<int64_t> own_before = {0, 0, 0, 0, 0, 0, 0};
};

OpCase attention_case(std::string name, AttendShape s, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(606);
            const int64_t H = s.kv_heads, G = s.group, D = s.dim, width = H * G * D;
            const int64_t ldq = width + 4, ldo = width + 2;
            const float nan = std::numeric_limits<float>::quiet_NaN();
            auto q = std::make_shared<std::vector<Floats>>();
            auto units = std::make_shared<std::vector<KvUnit>>();
            for (int u = 0; u < kUnits; ++u) {
              const int64_t n = s.lengths[size_t(u)];
              q->push_back(randn(size_t(n * width), rng, 1.5f));
              KvUnit k;
              k.prefix_len = s.prefix_len[size_t(u)];
              k.prefix_cap = k.prefix_len + 3;
              k.own_before = s.own_before[size_t(u)];
              k.own_cap = k.own_before + n + 2;
              // Keys nobody may read (spare capacity) are NaN: reading one poisons the output.
              auto fill = [&](int64_t used, int64_t cap) {
                Floats b(size_t(H * cap * D), nan);
                for (int64_t h = 0; h < H; ++h)
                  for (int64_t i = 0; i < used * D; ++i)
                    b[size_t(h * cap * D + i)] = randn(1, rng)[0];
                return b;
              };
              k.prefix_k = fill(k.prefix_len, k.prefix_cap);
              k.prefix_v = fill(k.prefix_len, k.prefix_cap);
              k.own_k = fill(k.own_before + n, k.own_cap);
              k.own_v = fill(k.own_before + n, k.own_cap);
              units->push_back(std::move(k));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(s.lengths, order);
              Floats qb = place(lay, order, *q, ldq, span_cols(width), jr);
              Floats out = junk(size_t(lay.rows * ldo), jr);
              std::vector<RowView> views;
              for (int u : order) {
                const KvUnit& k = (*units)[size_t(u)];
                const bool prefix = k.prefix_len > 0;
                views.push_back({.prefix_k = prefix ? k.prefix_k.data() : nullptr,
                                 .prefix_v = prefix ? k.prefix_v.data() : nullptr,
                                 .prefix_len = k.prefix_len,
                                 .prefix_stride = k.prefix_cap * D,
                                 .own_k = const_cast<float*>(k.own_k.data()),
                                 .own_v = const_cast<float*>(k.own_v.data()),
                                 .own_before = k.own_before,
                                 .own_stride = k.own_cap * D});
              }
              ops.attention({.rows = lay.table(),
                             .views = views.data(),
                             .q = qb.data(),
                             .ldq = ldq,
                             .out = out.data(),
                             .ldo = ldo,
                             .kv_heads = H,
                             .group = G,
                             .head_dim = D,
                             .scale = 1.0f / std::sqrt(float(D)),
                             .window = s.window});
              Batch res;
              add(res, "out", take(lay, out, ldo, span_cols(width)));
              add(res, "pad:out", take(lay, out, ldo, span_cols(width), true));
              return res;
            });
          }};
}

// ---- conv ----

enum class Tail { separate, in_place, none };  // tail_out: own buffer, = tail_in, null

OpCase conv_case(std::string name, int64_t channels, int64_t kernel, bool silu, Tail tail,
                 Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(707);
            const int64_t C = channels, K = kernel, ldx = C + 20, ldy = C + 1, ldt = C + 3;
            auto x = std::make_shared<std::vector<Floats>>();
            auto tails = std::make_shared<std::vector<Floats>>();
            for (int64_t n : kRowLengths) {
              x->push_back(randn(size_t(n * C), rng));
              tails->push_back(randn(size_t((K - 1) * ldt), rng));
            }
            auto w = std::make_shared<Floats>(randn(size_t(C * K), rng, 0.5f));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(kRowLengths, order);
              Floats xb = place(lay, order, *x, ldx, span_cols(C), jr);
              Floats y = junk(size_t(lay.rows * ldy), jr);
              std::vector<Floats> tin, tout;
              for (int u : order) {
                tin.push_back((*tails)[size_t(u)]);
                tout.push_back(junk(tin.back().size(), jr));
              }
              std::vector<RowView> views;
              for (size_t j = 0; j < order.size(); ++j)
                views.push_back({.tail_in = tin[j].data(),
                                 .tail_out = tail == Tail::none       ? nullptr
                                             : tail == Tail::in_place ? tin[j].data()
                                                                      : tout[j].data()});
              ops.causal_conv({.rows = lay.table(),
                               .views = views.data(),
                               .x = xb.data(),
                               .ldx = ldx,
                               .y = y.data(),
                               .ldy = ldy,
                               .channels = C,
                               .kernel = K,
                               .w = w->data(),
                               .ldt = ldt,
                               .silu = silu});
              Batch res;
              add(res, "y", take(lay, y, ldy, span_cols(C)));
              add(res, "pad:y", take(lay, y, ldy, span_cols(C), true));
              // Tails at their meaningful columns (the gaps past C are never written).
              auto tail_cols = [&](const std::vector<Floats>& t) {
                std::vector<Floats> r(t.size());
                for (size_t j = 0; j < t.size(); ++j)
                  for (int64_t e = 0; e < K - 1; ++e)
                    for (int64_t c = 0; c < C; ++c) r[j].push_back(t[j][size_t(e * ldt + c)]);
                return r;
              };
              add(res, "tail_in", tail_cols(tin));  // the new tail when in place, else unchanged
              if (tail == Tail::separate) add(res, "tail_out", tail_cols(tout));
              return res;
            });
          }};
}

// ---- the delta rule ----

OpCase delta_gates_case(std::string name, int64_t heads, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(808);
            const int64_t ld = heads + 2;
            auto b = std::make_shared<std::vector<Floats>>();
            auto a = std::make_shared<std::vector<Floats>>();
            for (int64_t n : kRowLengths) {
              b->push_back(randn(size_t(n * heads), rng, 3.0f));
              a->push_back(randn(size_t(n * heads), rng, 3.0f));
            }
            auto neg_decay = std::make_shared<Floats>(uniform(size_t(heads), rng, -8.0f, -0.01f));
            auto dt_bias = std::make_shared<Floats>(randn(size_t(heads), rng));
            (*dt_bias)[0] = 25.0f;  // softplus' linear branch
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(kRowLengths, order);
              Floats beta = place(lay, order, *b, ld, span_cols(heads), jr);
              Floats g = place(lay, order, *a, ld, span_cols(heads), jr);
              ops.delta_gates({.rows = lay.table(),
                               .beta = beta.data(),
                               .g = g.data(),
                               .ld = ld,
                               .heads = heads,
                               .neg_decay = neg_decay->data(),
                               .dt_bias = dt_bias->data()});
              Batch res;
              add(res, "beta", take(lay, beta, ld, span_cols(heads)));
              add(res, "g", take(lay, g, ld, span_cols(heads)));
              add(res, "pad:beta", take(lay, beta, ld, span_cols(heads), true));
              add(res, "pad:g", take(lay, g, ld, span_cols(heads), true));
              return res;
            });
          }};
}

struct DeltaShape {
  int64_t k_heads = 2, v_heads = 4, dk = 16, dv = 24;
  std::vector<int64_t> lengths = kRowLengths;
  bool state_in_place = false;  // rec_out = rec_in
};

OpCase delta_rule_case(std::string name, DeltaShape s, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(909);
            const int64_t Hk = s.k_heads, Hv = s.v_heads, Dk = s.dk, Dv = s.dv;
            const int64_t width = 2 * Hk * Dk + Hv * Dv;  // q, k, v of a token in one row
            auto qkv = std::make_shared<std::vector<Floats>>();
            auto gb = std::make_shared<std::vector<Floats>>();  // [n, 2 Hv]: g then beta
            auto state = std::make_shared<std::vector<Floats>>();
            for (int64_t n : s.lengths) {
              Floats t = randn(size_t(n * width), rng);
              for (int64_t i = 0; i < n; ++i)
                for (int64_t h = 0; h < 2 * Hk; ++h) {  // q heads (scaled by Dk^-1/2), k heads
                  float* v = t.data() + i * width + h * Dk;
                  double ss = 0;
                  for (int64_t d = 0; d < Dk; ++d) ss += double(v[d]) * v[d];
                  const double f = (h < Hk ? 1.0 / std::sqrt(double(Dk)) : 1.0) / std::sqrt(ss);
                  for (int64_t d = 0; d < Dk; ++d) v[d] = float(v[d] * f);
                }
              qkv->push_back(std::move(t));
              Floats g = uniform(size_t(n * Hv), rng, -0.4f, 0.0f);
              Floats beta = uniform(size_t(n * Hv), rng, 0.0f, 1.0f);
              Floats both;
              for (int64_t i = 0; i < n; ++i) {
                both.insert(both.end(), g.begin() + i * Hv, g.begin() + (i + 1) * Hv);
                both.insert(both.end(), beta.begin() + i * Hv, beta.begin() + (i + 1) * Hv);
              }
              gb->push_back(std::move(both));
              state->push_back(randn(size_t(Hv * Dk * Dv), rng, 0.3f));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(s.lengths, order);
              const int64_t ld = width + 5, ldg = Hv + 1, ldo = Hv * Dv + 3;
              Floats x = place(lay, order, *qkv, ld, span_cols(width), jr);
              std::vector<Floats> g_only(kUnits), beta_only(kUnits);
              for (int u : order) {
                const Floats& both = (*gb)[size_t(u)];
                for (size_t i = 0; i < both.size(); ++i)
                  (int64_t(i) % (2 * Hv) < Hv ? g_only : beta_only)[size_t(u)].push_back(both[i]);
              }
              // Garbage in padded g is large and positive: read into the state, it explodes.
              Floats g = place(lay, order, g_only, ldg, span_cols(Hv), jr);
              Floats beta = place(lay, order, beta_only, ldg, span_cols(Hv), jr);
              for (size_t j = 0; j < order.size(); ++j)
                for (int64_t r = lay.begin[j] + lay.real[j]; r < lay.end[j]; ++r)
                  for (int64_t h = 0; h < Hv; ++h)
                    g[size_t(r * ldg + h)] = std::fabs(g[size_t(r * ldg + h)]);
              Floats out = junk(size_t(lay.rows * ldo), jr);
              std::vector<Floats> sin, sout;
              for (int u : order) {
                sin.push_back((*state)[size_t(u)]);
                sout.push_back(junk(sin.back().size(), jr));
              }
              std::vector<RowView> views;
              for (size_t j = 0; j < order.size(); ++j)
                views.push_back({.rec_in = sin[j].data(),
                                 .rec_out = s.state_in_place ? sin[j].data() : sout[j].data()});
              ops.delta_rule({.rows = lay.table(),
                              .views = views.data(),
                              .q = x.data(),
                              .k = x.data() + Hk * Dk,
                              .v = x.data() + 2 * Hk * Dk,
                              .ld = ld,
                              .g = g.data(),
                              .beta = beta.data(),
                              .ldg = ldg,
                              .out = out.data(),
                              .ldo = ldo,
                              .k_heads = Hk,
                              .v_heads = Hv,
                              .dk = Dk,
                              .dv = Dv});
              Batch res;
              add(res, "out", take(lay, out, ldo, span_cols(Hv * Dv)));
              add(res, "pad:out", take(lay, out, ldo, span_cols(Hv * Dv), true));
              add(res, "state", s.state_in_place ? sin : sout);
              return res;
            });
          }};
}

// ---- elementwise and row-wise ops ----

enum class GluLayout {
  packed,         // gate, up, out: separate [rows, n] buffers
  fused_into_up,  // gate | up in one row (ld 2n + 4), out = up (aliasing)
  fused,          // gate | up in one row, out its own strided buffer
};

OpCase glu_case(std::string name, Activation act, GluLayout layout, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(1001);
            const int64_t n = 96;
            auto gu = std::make_shared<std::vector<Floats>>();  // [m, 2n]: gate | up
            for (int64_t m : kTokenRows) gu->push_back(randn(size_t(m * 2 * n), rng, 3.0f));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              Batch res;
              if (layout == GluLayout::packed) {
                std::vector<Floats> g(kUnits), u(kUnits);
                for (int k : order)
                  for (size_t i = 0; i < (*gu)[size_t(k)].size(); ++i)
                    (int64_t(i) % (2 * n) < n ? g : u)[size_t(k)].push_back((*gu)[size_t(k)][i]);
                Floats gb = place(lay, order, g, n, span_cols(n), jr);
                Floats ub = place(lay, order, u, n, span_cols(n), jr);
                Floats out = junk(size_t(lay.rows * n), jr);
                ops.glu({.gate = gb.data(),
                         .ldg = n,
                         .up = ub.data(),
                         .ldu = n,
                         .out = out.data(),
                         .ldo = n,
                         .rows = lay.rows,
                         .n = n,
                         .act = act});
                add(res, "out", take(lay, out, n, span_cols(n)));
                return res;
              }
              const int64_t ld = 2 * n + 4, ldo = n + 3;
              Floats b = place(lay, order, *gu, ld, span_cols(2 * n), jr);
              if (layout == GluLayout::fused_into_up) {
                ops.glu({.gate = b.data(),
                         .ldg = ld,
                         .up = act == Activation::sigmoid ? nullptr : b.data() + n,
                         .ldu = ld,
                         .out = b.data() + n,
                         .ldo = ld,
                         .rows = lay.rows,
                         .n = n,
                         .act = act});
                auto cols = span_cols(n);
                for (int64_t& c : cols) c += n;
                add(res, "out", take(lay, b, ld, cols));
                return res;
              }
              Floats out = junk(size_t(lay.rows * ldo), jr);
              ops.glu({.gate = b.data(),
                       .ldg = ld,
                       .up = b.data() + n,
                       .ldu = ld,
                       .out = out.data(),
                       .ldo = ldo,
                       .rows = lay.rows,
                       .n = n,
                       .act = act});
              add(res, "out", take(lay, out, ldo, span_cols(n)));
              return res;
            });
          }};
}

enum class Elementwise { add, mul, scale };

OpCase elementwise_case(std::string name, Elementwise kind, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(1101);
            const int64_t n = 80, lda = n + 2, ldy = n + 7;
            auto a = std::make_shared<std::vector<Floats>>();
            auto y = std::make_shared<std::vector<Floats>>();
            for (int64_t m : kTokenRows) {
              a->push_back(randn(size_t(m * n), rng));
              y->push_back(randn(size_t(m * n), rng));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              Floats ab = place(lay, order, *a, lda, span_cols(n), jr);
              Floats yb = place(lay, order, *y, ldy, span_cols(n), jr);
              if (kind == Elementwise::scale) {
                ops.scale({.y = yb.data(), .ldy = ldy, .rows = lay.rows, .n = n, .s = 0.3f});
              } else {
                ops.binary({.a = ab.data(),
                            .lda = lda,
                            .y = yb.data(),
                            .ldy = ldy,
                            .rows = lay.rows,
                            .n = n,
                            .mul = kind == Elementwise::mul});
              }
              Batch res;
              add(res, "y", take(lay, yb, ldy, span_cols(n)));
              return res;
            });
          }};
}

struct GatherShape {
  DType dtype = DType::f32;
  float scale = 1.0f;
  bool keep = false;
  float mix = 1.0f;
  bool soft = false;
};

OpCase gather_case(std::string name, GatherShape s, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(1201);
            const int64_t V = 50, C = 72, ldy = C + 3;
            Floats tf = randn(size_t(V * C), rng);
            Tensor t;
            if (s.dtype == DType::bf16) {
              std::vector<bf16> tb;
              for (float v : tf) tb.push_back(f32_to_bf16(v));
              t = Tensor::from_vector(tb, {V, C});
            } else {
              t = Tensor::from_vector(tf, {V, C});
            }
            auto table = std::make_shared<Tensor>(t);
            auto ids = std::make_shared<std::vector<std::vector<int32_t>>>();
            auto soft_rows = std::make_shared<std::vector<std::vector<int32_t>>>();  // per unit
            auto soft = std::make_shared<std::vector<Floats>>();
            auto y = std::make_shared<std::vector<Floats>>();
            std::uniform_int_distribution<int32_t> id(0, int32_t(V - 1));
            for (int64_t m : kTokenRows) {
              ids->emplace_back();
              soft_rows->emplace_back();
              int32_t used = 0;
              for (int64_t i = 0; i < m; ++i) {
                ids->back().push_back(id(rng));
                soft_rows->back().push_back(s.soft && i % 3 == 1 ? used++ : -1);
              }
              soft->push_back(randn(size_t(used * C), rng));
              y->push_back(randn(size_t(m * C), rng));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              std::vector<int32_t> idb, srb;
              Floats softb;
              for (int u : order) {
                idb.insert(idb.end(), (*ids)[size_t(u)].begin(), (*ids)[size_t(u)].end());
                const int32_t base = int32_t(softb.size() / size_t(C));
                for (int32_t r : (*soft_rows)[size_t(u)]) srb.push_back(r < 0 ? r : r + base);
                softb.insert(softb.end(), (*soft)[size_t(u)].begin(), (*soft)[size_t(u)].end());
              }
              Floats yb = place(lay, order, *y, ldy, span_cols(C), jr);
              ops.gather({.table = table.get(),
                          .ids = idb.data(),
                          .n = lay.rows,
                          .y = yb.data(),
                          .ldy = ldy,
                          .scale = s.scale,
                          .keep = s.keep,
                          .mix = s.mix,
                          .soft_rows = s.soft ? srb.data() : nullptr,
                          .soft = s.soft ? softb.data() : nullptr});
              Batch res;
              add(res, "y", take(lay, yb, ldy, span_cols(C)));
              return res;
            });
          }};
}

OpCase softcap_case(std::string name, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(1301);
            // Values per unit: around the CPU backend's 4096-value pieces.
            const std::vector<int64_t> counts = {5000, 1, 0, 300, 4097, 17, 2};
            auto y = std::make_shared<std::vector<Floats>>();
            for (int64_t c : counts) y->push_back(randn(size_t(c), rng, 40.0f));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(counts, order);
              Floats yb = place(lay, order, *y, 1, span_cols(1), jr);
              ops.softcap({.y = yb.data(), .n = lay.rows, .cap = 30.0f});
              Batch res;
              add(res, "y", take(lay, yb, 1, span_cols(1)));
              return res;
            });
          }};
}

OpCase copy_rows_case(std::string name, bool in_place, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(1401);
            const int64_t n = 33, ldx = 50, ldy = in_place ? n : 40;
            auto x = std::make_shared<std::vector<Floats>>();
            for (int64_t m : kTokenRows) x->push_back(randn(size_t(m * n), rng));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              Floats xb = place(lay, order, *x, ldx, span_cols(n), jr);
              Floats yb = in_place ? Floats{} : junk(size_t(lay.rows * ldy), jr);
              float* y = in_place ? xb.data() : yb.data();  // packing rows to the front
              ops.copy_rows(xb.data(), ldx, y, ldy, lay.rows, n);
              Batch res;
              add(res, "y", take(lay, in_place ? xb : yb, ldy, span_cols(n)));
              return res;
            });
          }};
}

// ---- the cases ----
// Tolerances: the reference sums in double, so each bound is the backend's own f32 rounding:
// about 10x the worst error the CPU backend shows on this table (noted as "cpu:"), so a wrong
// term, a wrong index or a lost padding rule (errors of 1e-3 and up) cannot hide under them,
// while another ISA's summation order still fits.

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> c;
    // f32 dot products of 300 terms (cpu: 1.6e-7, 1.5e-14).
    const Tolerance dot{2e-6, 1e-12};
    c.push_back(gemm_case("gemm_f32", {{DType::f32, 37, false}}, GemmPrecision::exact, dot));
    c.push_back(
        gemm_case("gemm_bf16_exact", {{DType::bf16, 37, false}}, GemmPrecision::exact, dot));
    c.push_back(
        gemm_case("gemm_bf16_precision", {{DType::bf16, 37, false}}, GemmPrecision::bf16, dot));
    c.push_back(gemm_case("gemm_two_outputs_accumulate",
                          {{DType::f32, 16, true}, {DType::bf16, 24, false}}, GemmPrecision::bf16,
                          dot));

    // One f32 sum of squares per vector, then elementwise products (cpu: 1.6e-7, 5e-15).
    const Tolerance norm{1e-6, 1e-13};
    c.push_back(norm_case("rms_norm_w", {.dim = 96, .ldx = 100, .ldy = 98}, norm));
    c.push_back(norm_case("rms_norm_one_plus_w_in_place",
                          {.dim = 96, .ldx = 101, .scale = NormScale::one_plus_w, .in_place = true},
                          norm));
    c.push_back(norm_case("rms_norm_unit_weight",
                          {.dim = 40, .ldx = 40, .ldy = 40, .weight = false}, norm));
    c.push_back(norm_case(
        "rms_norm_heads",
        {.heads = 4, .dim = 24, .hx = 48, .ldx = 200, .ldy = 96, .scale = NormScale::one_plus_w},
        norm));
    c.push_back(norm_case("rms_norm_heads_in_place",
                          {.heads = 3, .dim = 16, .ldx = 48, .in_place = true}, norm));
    c.push_back(norm_case("rms_norm_gated",
                          {.dim = 64, .ldx = 64, .ldy = 70, .gated = true, .ldg = 66}, norm));
    c.push_back(norm_case(
        "rms_norm_gated_heads",
        {.heads = 3, .dim = 16, .ldx = 50, .ldy = 48, .gated = true, .hg = 32, .ldg = 100}, norm));
    c.push_back(l2_norm_case("l2_norm_heads", 4, 16, 70, norm));
    c.push_back(l2_norm_case("l2_norm_wide", 1, 128, 128, norm));

    // The same f32 angle; cos / sin and the rotation in f32 (cpu: 6e-8, 2e-15).
    const Tolerance rope{1e-6, 1e-13};
    c.push_back(rope_case("rope_full", 4, 32, 40, 1.0, 1e4, rope));
    c.push_back(rope_case("rope_partial", 3, 64, 64, 0.25, 1e6, rope));

    c.push_back(kv_write_case("kv_write", 2, 16, {}));

    // Softmax over up to ~370 keys, f32 dots and sums (cpu: 5.8e-7, 6.6e-14).
    const Tolerance att{5e-6, 1e-12};
    c.push_back(attention_case("attention_mha", {.kv_heads = 2, .group = 1}, att));
    c.push_back(attention_case("attention_gqa_prefix_own_before",
                               {.kv_heads = 2,
                                .group = 3,
                                .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                .own_before = {0, 4, 3, 0, 9, 2, 30}},
                               att));
    c.push_back(attention_case("attention_mqa_window",
                               {.kv_heads = 1,
                                .group = 4,
                                .window = 24,
                                .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                .own_before = {0, 4, 3, 10, 9, 2, 30}},
                               att));
    c.push_back(attention_case("attention_window_own_only",
                               {.kv_heads = 2, .group = 2, .dim = 16, .window = 7}, att));
    c.push_back(attention_case("attention_decode_gqa",
                               {.kv_heads = 2,
                                .group = 4,
                                .lengths = kDecodeLengths,
                                .prefix_len = {40, 3, 0, 0, 12, 100, 1},
                                .own_before = {0, 5, 2, 17, 0, 3, 60}},
                               att));
    c.push_back(attention_case("attention_decode_mqa_window",
                               {.kv_heads = 1,
                                .group = 6,
                                .window = 16,
                                .lengths = kDecodeLengths,
                                .prefix_len = {40, 3, 0, 0, 12, 100, 1},
                                .own_before = {0, 5, 2, 17, 0, 3, 60}},
                               att));

    // K <= 4 products per output, then SiLU; tails are copies (cpu: 1.2e-7, 4e-15; tails 0).
    const Tolerance conv{1e-6, 1e-13};
    c.push_back(conv_case("conv_silu_600_channels", 600, 4, true, Tail::separate, conv));
    c.push_back(conv_case("conv_tail_in_place", 48, 3, false, Tail::in_place, conv));
    c.push_back(conv_case("conv_no_tail_out", 40, 4, true, Tail::none, conv));

    // sigmoid / softplus in f32 (cpu: 6e-8, 2e-15).
    c.push_back(delta_gates_case("delta_gates", 6, {1e-6, 1e-13}));

    // The chunked f32 form (64-token chunks, UT transform) against the double recurrence over
    // 300 tokens (cpu: 5.1e-7, 5.3e-14).
    const Tolerance delta{5e-6, 1e-12};
    c.push_back(delta_rule_case("delta_rule", {}, delta));
    c.push_back(delta_rule_case(
        "delta_rule_state_in_place",
        {.k_heads = 2, .v_heads = 2, .dk = 32, .dv = 32, .state_in_place = true}, delta));
    c.push_back(delta_rule_case(
        "delta_rule_decode",
        {.k_heads = 1, .v_heads = 3, .dk = 8, .dv = 16, .lengths = kDecodeLengths}, delta));

    // One f32 activation and product per element (cpu: 9e-8, 3e-15).
    const Tolerance act{1e-6, 1e-13};
    c.push_back(glu_case("glu_silu_packed", Activation::silu, GluLayout::packed, act));
    c.push_back(glu_case("glu_silu_out_is_up", Activation::silu, GluLayout::fused_into_up, act));
    c.push_back(glu_case("glu_gelu_tanh_packed", Activation::gelu_tanh, GluLayout::packed, act));
    c.push_back(glu_case("glu_gelu_tanh_strided", Activation::gelu_tanh, GluLayout::fused, act));
    c.push_back(
        glu_case("glu_sigmoid_gate_in_place", Activation::sigmoid, GluLayout::fused_into_up, act));

    c.push_back(elementwise_case("binary_add", Elementwise::add, {}));
    c.push_back(elementwise_case("binary_mul", Elementwise::mul, {}));
    c.push_back(elementwise_case("scale", Elementwise::scale, {}));

    c.push_back(gather_case("gather_f32_copy", {}, {}));
    c.push_back(gather_case("gather_bf16_copy", {.dtype = DType::bf16}, {}));
    // (y keep + row scale) mix: up to three f32 roundings (cpu: 8e-8, 2e-15).
    const Tolerance gather{1e-6, 1e-13};
    c.push_back(gather_case("gather_f32_scaled", {.scale = 8.5f}, gather));
    c.push_back(gather_case("gather_bf16_keep_mix",
                            {.dtype = DType::bf16, .scale = 4.0f, .keep = true, .mix = 0.70710678f},
                            gather));
    c.push_back(gather_case("gather_soft_rows", {.scale = 1.0f, .soft = true}, {}));
    c.push_back(gather_case("gather_soft_rows_scaled", {.scale = 3.0f, .soft = true}, gather));

    c.push_back(softcap_case("softcap", {1e-6, 1e-13}));  // tanh in f32 (cpu: 1.3e-7, 2e-15)

    c.push_back(copy_rows_case("copy_rows", false, {}));
    c.push_back(copy_rows_case("copy_rows_pack_in_place", true, {}));
    return c;
  }();
  return cases;
}

// ---- scoring ----

// Every "pad:" result of every entry is exactly zero.
void expect_padding_zero(const Batch& batch, const std::string& who) {
  for (size_t j = 0; j < batch.size(); ++j)
    for (const Named& r : batch[j]) {
      if (r.name.rfind("pad:", 0) != 0) continue;
      for (size_t i = 0; i < r.v.size(); ++i)
        if (r.v[i] != 0.0f) {
          ADD_FAILURE() << who << ": " << r.name << " of entry " << j << " is " << r.v[i] << " at "
                        << i << " (" << r.v.size() << " values must be 0)";
          break;
        }
    }
}

struct Score {
  double max_err = 0, nmse = 0;
  size_t bad = 0;  // non-finite values where the reference is finite
};

Score score(const Floats& got, const Floats& ref) {
  double max_ref = 0, max_diff = 0, se = 0, sr = 0;
  Score s;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++s.bad;
      continue;
    }
    const double d = double(got[i]) - double(ref[i]);
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
    max_diff = std::max(max_diff, std::fabs(d));
    se += d * d;
    sr += double(ref[i]) * ref[i];
  }
  s.max_err = max_diff == 0 ? 0 : max_diff / std::max(max_ref, 1e-30);
  s.nmse = se == 0 ? 0 : se / std::max(sr, 1e-300);
  return s;
}

bool bitwise_equal(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class OpsTable : public ::testing::TestWithParam<std::tuple<Backend, size_t>> {
 protected:
  const Ops& backend() const { return *std::get<0>(GetParam()).ops; }
  const OpCase& op() const { return op_cases()[std::get<1>(GetParam())]; }
};

TEST_P(OpsTable, MatchesReference) {
  const OpCase& c = op();
  const RunFn run = c.make();
  const Batch ref = run(reference_ops(), kInOrder);
  const Batch got = run(backend(), kInOrder);
  expect_padding_zero(ref, "reference");
  expect_padding_zero(got, backend().name());
  ASSERT_EQ(ref.size(), size_t(kUnits));
  ASSERT_EQ(got.size(), size_t(kUnits));
  for (size_t r = 0; r < ref[0].size(); ++r) {
    const std::string& name = ref[0][r].name;
    if (name.rfind("pad:", 0) == 0) continue;
    Floats all_ref, all_got;
    for (int u = 0; u < kUnits; ++u) {
      ASSERT_EQ(got[size_t(u)][r].name, name);
      ASSERT_EQ(got[size_t(u)][r].v.size(), ref[size_t(u)][r].v.size()) << name << " unit " << u;
      all_ref.insert(all_ref.end(), ref[size_t(u)][r].v.begin(), ref[size_t(u)][r].v.end());
      all_got.insert(all_got.end(), got[size_t(u)][r].v.begin(), got[size_t(u)][r].v.end());
    }
    ASSERT_FALSE(all_ref.empty()) << name;
    for (float v : all_ref) ASSERT_TRUE(std::isfinite(v)) << "reference " << name;
    const Score s = score(all_got, all_ref);
    std::printf("  %-34s %-9s max err %.2e (tol %.0e)  nmse %.2e (tol %.0e)\n", c.name.c_str(),
                name.c_str(), s.max_err, c.tol.max_err, s.nmse, c.tol.nmse);
    EXPECT_EQ(s.bad, 0u) << name << ": non-finite values";
    EXPECT_LE(s.max_err, c.tol.max_err) << c.name << " " << name << ": max error";
    EXPECT_LE(s.nmse, c.tol.nmse) << c.name << " " << name << ": NMSE";
  }
}

TEST_P(OpsTable, BatchInvariant) {
  const RunFn run = op().make();
  const Batch batch = run(backend(), kInOrder);
  const Batch reordered = run(backend(), kReordered);
  expect_padding_zero(batch, "batch");
  expect_padding_zero(reordered, "reordered batch");
  for (int u = 0; u < kUnits; ++u) {
    const Batch alone = run(backend(), {u});
    expect_padding_zero(alone, fmt::format("unit {} alone", u));
    const size_t at =
        size_t(std::find(kReordered.begin(), kReordered.end(), u) - kReordered.begin());
    for (size_t r = 0; r < alone[0].size(); ++r) {
      const Named& a = alone[0][r];
      if (a.name.rfind("pad:", 0) == 0) continue;  // padding lengths differ between calls
      EXPECT_TRUE(bitwise_equal(a.v, batch[size_t(u)][r].v))
          << a.name << " of unit " << u << ": alone != in the batch";
      EXPECT_TRUE(bitwise_equal(a.v, reordered[at][r].v))
          << a.name << " of unit " << u << ": alone != in the reordered batch";
    }
  }
}

// The oracle itself, on values worked out by hand from each contract in kernels/ops.h.
TEST(OpsReference, HandComputedValues) {
  const Ops& ref = reference_ops();
  {  // rms_norm: [3, 4] has mean square 12.5; weight [1, 2]; gated by silu(0) = 0 and silu(1)
    Floats x = {3, 4}, y(2), w = {1, 2}, gate = {0, 1};
    ref.rms_norm({.x = x.data(), .y = y.data(), .rows = 1, .dim = 2, .w = w.data(), .eps = 0});
    EXPECT_NEAR(y[0], 3 / std::sqrt(12.5), 1e-6);
    EXPECT_NEAR(y[1], 8 / std::sqrt(12.5), 1e-6);
    ref.rms_norm({.x = x.data(),
                  .y = y.data(),
                  .rows = 1,
                  .dim = 2,
                  .w = w.data(),
                  .eps = 0,
                  .scale = NormScale::one_plus_w,
                  .gate = gate.data()});
    EXPECT_EQ(y[0], 0.0f);
    EXPECT_NEAR(y[1], 12 / std::sqrt(12.5) / (1 + std::exp(-1.0)), 1e-6);
  }
  {  // attention: one query, keys [1, 0] and [0, 1] with values 10 and 20 (D = 2)
    const std::vector<int64_t> len = {1}, pos = {0};
    Floats q = {std::log(3.0f), 0}, k = {1, 0, 0, 1}, v = {10, 0, 20, 0}, out(2);
    RowView view{.own_k = k.data(), .own_v = v.data(), .own_before = 1, .own_stride = 4};
    AttendArgs a{.rows = {.rows = 1, .tokens = 1, .lengths = len.data(), .positions = pos.data()},
                 .views = &view,
                 .q = q.data(),
                 .ldq = 2,
                 .out = out.data(),
                 .ldo = 2,
                 .kv_heads = 1,
                 .head_dim = 2};
    ref.attention(a);  // weights 3/4 and 1/4
    EXPECT_NEAR(out[0], 12.5, 1e-5);
    a.window = 1;  // only the query's own key
    ref.attention(a);
    EXPECT_NEAR(out[0], 20, 1e-5);
  }
  {  // causal conv, K = 2: tail [1], x [2, 3], w [0.5, 1]
    const std::vector<int64_t> len = {2}, pos = {0};
    Floats x = {2, 3}, y(2), tail = {1}, w = {0.5f, 1};
    RowView view{.tail_in = tail.data(), .tail_out = tail.data()};
    ref.causal_conv(
        {.rows = {.rows = 1, .tokens = 2, .lengths = len.data(), .positions = pos.data()},
         .views = &view,
         .x = x.data(),
         .ldx = 1,
         .y = y.data(),
         .ldy = 1,
         .channels = 1,
         .kernel = 2,
         .w = w.data()});
    EXPECT_EQ(y, (Floats{2.5f, 4.0f}));
    EXPECT_EQ(tail[0], 3.0f);
  }
  {  // gates: sigmoid(0) = 1/2, -1 * softplus(0) = -log 2; a padded position gets zeros
    const std::vector<int64_t> len = {1}, pos = {0};
    Floats beta = {0, 5}, g = {0, 5}, neg_decay = {-1}, bias = {0};
    ref.delta_gates(
        {.rows = {.rows = 1, .tokens = 2, .lengths = len.data(), .positions = pos.data()},
         .beta = beta.data(),
         .g = g.data(),
         .ld = 1,
         .heads = 1,
         .neg_decay = neg_decay.data(),
         .dt_bias = bias.data()});
    EXPECT_EQ(beta, (Floats{0.5f, 0.0f}));
    EXPECT_NEAR(g[0], -std::log(2.0), 1e-7);
    EXPECT_EQ(g[1], 0.0f);
  }
  {  // delta rule, one token from S = I/2 (Dk = Dv = 2): decay e^g = 1/2 gives S = I/4; k = e1,
     // v = [1, 2], beta = 1/2: S += e1 ⊗ ([1, 2] - [1/4, 0]) / 2; o = Sᵀ e1 = [5/8, 1]
    const std::vector<int64_t> len = {1}, pos = {0};
    Floats qkv = {1, 0, 1, 0, 1, 2}, g = {float(std::log(0.5))}, beta = {0.5f}, out(2);
    Floats state = {0.5f, 0, 0, 0.5f};
    RowView view{.rec_in = state.data(), .rec_out = state.data()};
    ref.delta_rule(
        {.rows = {.rows = 1, .tokens = 1, .lengths = len.data(), .positions = pos.data()},
         .views = &view,
         .q = qkv.data(),
         .k = qkv.data() + 2,
         .v = qkv.data() + 4,
         .ld = 6,
         .g = g.data(),
         .beta = beta.data(),
         .ldg = 1,
         .out = out.data(),
         .ldo = 2,
         .k_heads = 1,
         .v_heads = 1,
         .dk = 2,
         .dv = 2});
    EXPECT_NEAR(out[0], 0.625, 1e-6);
    EXPECT_NEAR(out[1], 1.0, 1e-6);
    EXPECT_NEAR(state[3], 0.25, 1e-6);
  }
  {  // gelu_tanh(1) (PyTorch: 0.8411920), softcap 2 tanh(2 / 2)
    Floats gate = {1}, up = {2}, out(1), y = {2};
    ref.glu({.gate = gate.data(),
             .ldg = 1,
             .up = up.data(),
             .ldu = 1,
             .out = out.data(),
             .ldo = 1,
             .rows = 1,
             .n = 1,
             .act = Activation::gelu_tanh});
    EXPECT_NEAR(out[0], 2 * 0.8411920, 1e-6);
    ref.softcap({.y = y.data(), .n = 1, .cap = 2});
    EXPECT_NEAR(y[0], 2 * std::tanh(1.0), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpsTable,
                         ::testing::Combine(::testing::ValuesIn(backends_under_test()),
                                            ::testing::Range(size_t(0), op_cases().size())),
                         [](const auto& info) {
                           return fmt::format("{}_{}", std::get<0>(info.param).name,
                                              op_cases()[std::get<1>(info.param)].name);
                         });

}  // namespace
}  // namespace deg
