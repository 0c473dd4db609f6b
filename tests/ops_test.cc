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
#include <cstdlib>
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
#if DEG_HAVE_CUDA
#include "kernels/cuda/launch.h"
#endif
#include "kernels/cuda_runtime.h"
#include "kernels/ops_decorator.h"
#include "kernels/reference_ops.h"
#include "managed_alloc.h"

namespace deg {
namespace {

using Floats = testing::ManagedVector<float>;
using Ids = testing::ManagedVector<int32_t>;
using testing::randn;
using testing::Synchronized;

// ---- backends under test ----

struct Backend {
  const char* name;
  const Ops* ops;
};

void PrintTo(const Backend& b, std::ostream* os) {
  *os << b.name;
}

// Each is scored against reference_ops(). The CUDA column joins where a GPU is visible (the
// scripts/device-test run).
std::vector<Backend> backends_under_test() {
  std::vector<Backend> b = {{"cpu", &cpu_ops()}};
  if (cuda_available()) {
    static const Synchronized cuda(cuda_ops());
    b.push_back({"cuda", &cuda});
  }
  return b;
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

// stacked: the weights as adjacent row blocks of one tensor (one dtype) and the outputs side by
// side in one buffer, as weights_stacked_on lays them out (the CUDA backend runs each group of
// adjacent outputs with the same `accumulate` as one GEMM).
OpCase gemm_case(std::string name, std::vector<GemmOut> outs, GemmPrecision precision,
                 Tolerance tol, bool stacked = false) {
  return {
      name, tol, [=] {
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
            w->push_back(Tensor::from_vector(std::vector<float>(wf.begin(), wf.end()), {o.n, K}));
          }
          y0->emplace_back();
          for (int64_t m : kTokenRows) y0->back().push_back(randn(size_t(m * o.n), rng));
        }
        if (stacked) {
          return RunFn([=](const Ops& ops, const std::vector<int>& order) {
            std::mt19937 jr = junk_rng(order);
            const Layout lay = packed(kTokenRows, order);
            Floats xb = place(lay, order, *x, ldx, span_cols(K), jr);
            std::vector<int64_t> col0;
            int64_t total = 0;
            for (const GemmOut& o : outs) {
              col0.push_back(total);
              total += o.n;
            }
            const int64_t ldy = total + 3;
            std::vector<Floats> init(kTokenRows.size());  // per unit: [m, total]
            for (size_t u = 0; u < kTokenRows.size(); ++u)
              for (int64_t r = 0; r < kTokenRows[u]; ++r)
                for (size_t o = 0; o < outs.size(); ++o)
                  for (int64_t c = 0; c < outs[o].n; ++c)
                    init[u].push_back((*y0)[o][u][size_t(r * outs[o].n + c)]);
            Floats y = place(lay, order, init, ldy, span_cols(total), jr);
            Tensor all = Tensor::empty({total, K}, outs[0].dtype);
            for (size_t o = 0; o < outs.size(); ++o)
              std::memcpy(all.raw_mutable() + size_t(col0[o] * K) * dtype_size(outs[0].dtype),
                          (*w)[o].raw(), (*w)[o].nbytes());
            const Tensor on_all = ops.upload(all);
            std::vector<Tensor> on;
            std::vector<GemmOutput> go;
            for (size_t o = 0; o < outs.size(); ++o)
              on.push_back(on_all.slice(0, col0[o], col0[o] + outs[o].n));
            for (size_t o = 0; o < outs.size(); ++o)
              go.push_back({.w = &on[o],
                            .y = y.data() + col0[o],
                            .ldy = ldy,
                            .accumulate = outs[o].accumulate});
            ops.gemm({.x = xb.data(),
                      .m = lay.rows,
                      .k = K,
                      .ldx = ldx,
                      .outputs = go,
                      .precision = precision});
            Batch res;
            for (size_t o = 0; o < outs.size(); ++o) {
              std::vector<int64_t> cols = span_cols(outs[o].n);
              for (int64_t& c : cols) c += col0[o];
              add(res, fmt::format("y{}", o), take(lay, y, ldy, cols));
            }
            return res;
          });
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
          std::vector<Tensor> on;  // the weights where the backend reads them
          for (const Tensor& t : *w) on.push_back(ops.upload(t));
          for (size_t o = 0; o < outs.size(); ++o)
            go.push_back({.w = &on[o],
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
            add(res, fmt::format("y{}", o), take(lay, ys[o], outs[o].n + 3, span_cols(outs[o].n)));
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

// unscaled: the last heads that skip post_scale, as a delta rule's k after its q in one call.
OpCase l2_norm_case(std::string name, int64_t heads, int64_t dim, int64_t ldx, Tolerance tol,
                    int64_t unscaled = 0) {
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
                           .post_scale = 0.25f,
                           .unscaled_heads = unscaled});
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

// K and V of k_dim / v_dim floats per head (0: dim) at head strides hk / hv (0: their widths)
// into positions `dim` wide.
OpCase kv_write_case(std::string name, int64_t kv_heads, int64_t dim, Tolerance tol,
                     int64_t k_dim = 0, int64_t v_dim = 0, int64_t hk = 0, int64_t hv = 0) {
  return {name, tol, [=] {
            std::mt19937 rng(505);
            const std::vector<int64_t> own_before = {0, 4, 0, 2, 9, 0, 1};
            const int64_t dk = k_dim ? k_dim : dim, dv = v_dim ? v_dim : dim;
            const int64_t sk = hk ? hk : dk, sv = hv ? hv : dv;
            const int64_t width = kv_heads * (sk + sv);  // K heads then V heads, gaps included
            const int64_t ld = width + 8;
            auto kv = std::make_shared<std::vector<Floats>>();
            auto units = std::make_shared<std::vector<KvUnit>>();
            for (int u = 0; u < kUnits; ++u) {
              const int64_t n = kRowLengths[size_t(u)];
              kv->push_back(randn(size_t(n * width), rng));
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
              Floats kvb = place(lay, order, *kv, ld, span_cols(width), jr);
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
                            .v = kvb.data() + kv_heads * sk,
                            .ldv = ld,
                            .kv_heads = kv_heads,
                            .dim = dim,
                            .k_dim = k_dim,
                            .v_dim = v_dim,
                            .hk = hk,
                            .hv = hv});
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
  bool bf16 = false;  // AttendArgs::bf16: tensor-core products where the backend has them
  std::vector<int64_t> lengths = kRowLengths;
  std::vector<int64_t> prefix_len = {0, 0, 0, 0, 0, 0, 0};
  std::vector<int64_t> own_before = {0, 0, 0, 0, 0, 0, 0};
  // Rows with a prefix read the first such row's buffers (fork rows over one trunk; their
  // prefix_len must agree): the CUDA attention packs their queries into shared jobs.
  bool shared_prefix = false;
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
              const KvUnit* first_prefix = nullptr;
              for (const KvUnit& k : *units)
                if (!first_prefix && k.prefix_len > 0) first_prefix = &k;
              for (int u : order) {
                const KvUnit& k = (*units)[size_t(u)];
                const bool prefix = k.prefix_len > 0;
                const KvUnit& p = s.shared_prefix && prefix ? *first_prefix : k;
                views.push_back({.prefix_k = prefix ? p.prefix_k.data() : nullptr,
                                 .prefix_v = prefix ? p.prefix_v.data() : nullptr,
                                 .prefix_len = k.prefix_len,
                                 .prefix_stride = p.prefix_cap * D,
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
                             .window = s.window,
                             .bf16 = s.bf16});
              Batch res;
              add(res, "out", take(lay, out, ldo, span_cols(width)));
              add(res, "pad:out", take(lay, out, ldo, span_cols(width), true));
              return res;
            });
          }};
}

// ---- conv ----

enum class Tail { separate, in_place, none };  // tail_out: own buffer, = tail_in, null

// Rows of at most 16 tokens (CUDA: one tile a row, whose thread writes the new tail itself),
// among them an empty row and rows shorter than the kernel.
const std::vector<int64_t> kShortLengths = {3, 1, 0, 16, 2, 5, 1};

OpCase conv_case(std::string name, int64_t channels, int64_t kernel, bool silu, Tail tail,
                 Tolerance tol, const std::vector<int64_t>& lengths = kRowLengths) {
  return {name, tol, [=] {
            std::mt19937 rng(707);
            const int64_t C = channels, K = kernel, ldx = C + 20, ldy = C + 1, ldt = C + 3;
            auto x = std::make_shared<std::vector<Floats>>();
            auto tails = std::make_shared<std::vector<Floats>>();
            for (int64_t n : lengths) {
              x->push_back(randn(size_t(n * C), rng));
              tails->push_back(randn(size_t((K - 1) * ldt), rng));
            }
            auto w = std::make_shared<Floats>(randn(size_t(C * K), rng, 0.5f));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(lengths, order);
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
  // Per unit (when not empty): -1, or a history of that many tokens over rec_in
  // (DeltaRuleHistory), to which the unit's tokens are appended where `append` says so.
  std::vector<int64_t> hist = {};
  std::vector<int> append = {};
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
            // Histories: unit-norm k, d like a state's updates, g as above; the slots past a
            // history are garbage (read, it shows).
            struct Hist {
              int64_t len = -1, cap = 0;
              Floats k, d, g;
            };
            auto hists = std::make_shared<std::vector<Hist>>(size_t(kUnits));
            for (size_t u = 0; u < s.hist.size(); ++u) {
              Hist& h = (*hists)[u];
              h.len = s.hist[u];
              if (h.len < 0) continue;
              h.cap = h.len + s.lengths[u] + 2;
              h.k = junk(size_t(Hk * h.cap * Dk), rng);
              h.d = junk(size_t(Hv * h.cap * Dv), rng);
              h.g = junk(size_t(Hv * h.cap), rng);
              for (int64_t j = 0; j < h.len; ++j) {
                for (int64_t kh = 0; kh < Hk; ++kh) {
                  Floats k = randn(size_t(Dk), rng);
                  double ss = 0;
                  for (float x : k) ss += double(x) * x;
                  for (int64_t i = 0; i < Dk; ++i)
                    h.k[size_t((kh * h.cap + j) * Dk + i)] = float(k[size_t(i)] / std::sqrt(ss));
                }
                for (int64_t hv = 0; hv < Hv; ++hv) {
                  const Floats d = randn(size_t(Dv), rng, 0.3f);
                  std::copy(d.begin(), d.end(), h.d.begin() + (hv * h.cap + j) * Dv);
                  h.g[size_t(hv * h.cap + j)] = uniform(1, rng, -0.4f, 0.0f)[0];
                }
              }
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
              std::vector<Hist> hs;
              for (size_t j = 0; j < order.size(); ++j) {
                views.push_back({.rec_in = sin[j].data(),
                                 .rec_out = s.state_in_place ? sin[j].data() : sout[j].data()});
                hs.push_back((*hists)[size_t(order[j])]);
              }
              for (size_t j = 0; j < order.size(); ++j) {
                Hist& h = hs[j];
                if (h.len < 0) continue;
                const bool append = s.append[size_t(order[j])] != 0;
                views[j].hist = {.k = h.k.data(),
                                 .d = h.d.data(),
                                 .g = h.g.data(),
                                 .len = h.len,
                                 .cap = h.cap,
                                 .append = append};
                views[j].rec_scratch = append;
              }
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
              // A row that appended: the entries it wrote (its state is its history).
              std::vector<Floats> state = s.state_in_place ? sin : sout;
              for (size_t j = 0; j < order.size(); ++j) {
                const Hist& h = hs[j];
                if (h.len < 0 || !s.append[size_t(order[j])]) continue;
                const int64_t n = lay.real[j];
                Floats kept;
                auto entries = [&](const Floats& a, int64_t heads, int64_t width) {
                  for (int64_t hh = 0; hh < heads; ++hh)
                    kept.insert(kept.end(), a.begin() + (hh * h.cap + h.len) * width,
                                a.begin() + (hh * h.cap + h.len + n) * width);
                };
                entries(h.d, Hv, Dv);
                entries(h.k, Hk, Dk);
                entries(h.g, Hv, 1);
                state[j] = std::move(kept);
              }
              add(res, "state", std::move(state));
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
  bool negative = false;   // every 4th id -1: y left as it is
  bool lane = false;       // ids as floats in a lane (column 2 of 3)
  bool row_scale = false;  // per-position scales (column 1 of 2)
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
              t = Tensor::from_vector(std::vector<float>(tf.begin(), tf.end()), {V, C});
            }
            auto table = std::make_shared<Tensor>(t);
            auto ids = std::make_shared<std::vector<std::vector<int32_t>>>();
            auto soft_rows = std::make_shared<std::vector<std::vector<int32_t>>>();  // per unit
            auto soft = std::make_shared<std::vector<Floats>>();
            auto y = std::make_shared<std::vector<Floats>>();
            auto scales = std::make_shared<std::vector<Floats>>();
            std::uniform_int_distribution<int32_t> id(0, int32_t(V - 1));
            for (int64_t m : kTokenRows) {
              ids->emplace_back();
              soft_rows->emplace_back();
              int32_t used = 0;
              for (int64_t i = 0; i < m; ++i) {
                ids->back().push_back(s.negative && i % 4 == 2 ? -1 : id(rng));
                soft_rows->back().push_back(s.soft && i % 3 == 1 ? used++ : -1);
              }
              soft->push_back(randn(size_t(used * C), rng));
              y->push_back(randn(size_t(m * C), rng));
              scales->push_back(randn(size_t(m), rng, 3.0f));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              Ids idb, srb;
              Floats softb;
              for (int u : order) {
                idb.insert(idb.end(), (*ids)[size_t(u)].begin(), (*ids)[size_t(u)].end());
                const int32_t base = int32_t(softb.size() / size_t(C));
                for (int32_t r : (*soft_rows)[size_t(u)]) srb.push_back(r < 0 ? r : r + base);
                softb.insert(softb.end(), (*soft)[size_t(u)].begin(), (*soft)[size_t(u)].end());
              }
              Floats yb = place(lay, order, *y, ldy, span_cols(C), jr);
              std::vector<Floats> unit_lanes;  // the ids as floats, per unit
              for (const auto& u : *ids) unit_lanes.emplace_back(u.begin(), u.end());
              Floats lane = place(lay, order, unit_lanes, 3, {2}, jr);
              Floats sc = place(lay, order, *scales, 2, {1}, jr);
              if (s.lane) std::fill(idb.begin(), idb.end(), 1 << 30);  // must not be read
              const Tensor on = ops.upload(*table);
              ops.gather({.table = &on,
                          .ids = s.lane ? nullptr : idb.data(),
                          .n = lay.rows,
                          .y = yb.data(),
                          .ldy = ldy,
                          .scale = s.scale,
                          .keep = s.keep,
                          .mix = s.mix,
                          .soft_rows = s.soft ? srb.data() : nullptr,
                          .soft = s.soft ? softb.data() : nullptr,
                          .id_lane = s.lane ? lane.data() + 2 : nullptr,
                          .ld_id = 3,
                          .row_scale = s.row_scale ? sc.data() + 1 : nullptr,
                          .ld_scale = 2});
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

// n, ldx, ldy: 33, 50, 40 (CUDA: floats), or with `by4` 32, 48, 40 (float4s).
OpCase copy_rows_case(std::string name, bool in_place, Tolerance tol, bool by4 = false) {
  return {name, tol, [=] {
            std::mt19937 rng(1401);
            const int64_t n = by4 ? 32 : 33, ldx = by4 ? 48 : 50, ldy = in_place ? n : 40;
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

// ---- the gpt family's ops ----

OpCase activation_case(std::string name, Activation act, bool in_place, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(1501);
            const int64_t n = 50, ldx = 53, ldy = in_place ? ldx : 51;
            auto x = std::make_shared<std::vector<Floats>>();
            for (int64_t m : kTokenRows) x->push_back(randn(size_t(m * n), rng, 4.0f));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              Floats xb = place(lay, order, *x, ldx, span_cols(n), jr);
              Floats yb = in_place ? Floats{} : junk(size_t(lay.rows * ldy), jr);
              float* y = in_place ? xb.data() : yb.data();
              ops.activation({.x = xb.data(),
                              .ldx = ldx,
                              .y = y,
                              .ldy = ldy,
                              .rows = lay.rows,
                              .n = n,
                              .act = act,
                              .a = 30.0f,
                              .b = 5.0f,
                              .c = 7.5f});
              Batch res;
              add(res, "y", take(lay, in_place ? xb : yb, ldy, span_cols(n)));
              return res;
            });
          }};
}

OpCase bias_scale_case(std::string name, bool bias, bool in_place, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(1601);
            const int64_t n = 45, ldx = 47, ldy = in_place ? ldx : 46;
            auto x = std::make_shared<std::vector<Floats>>();
            for (int64_t m : kTokenRows) x->push_back(randn(size_t(m * n), rng));
            auto b = std::make_shared<Floats>(randn(size_t(n), rng));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              Floats xb = place(lay, order, *x, ldx, span_cols(n), jr);
              Floats yb = in_place ? Floats{} : junk(size_t(lay.rows * ldy), jr);
              ops.bias_scale({.x = xb.data(),
                              .ldx = ldx,
                              .y = in_place ? xb.data() : yb.data(),
                              .ldy = ldy,
                              .rows = lay.rows,
                              .n = n,
                              .bias = bias ? b->data() : nullptr,
                              .s = 0.37f});
              Batch res;
              add(res, "y", take(lay, in_place ? xb : yb, ldy, span_cols(n)));
              return res;
            });
          }};
}

// combine over rows of n = 40 in groups of 8 (5 groups). lanes: the self term (x null) plus
// three terms whose coefficients come from per-row lanes (group steps, an added lane, an
// offset); otherwise constant coefficients only.
OpCase combine_case(std::string name, bool lanes, int64_t group, Tolerance tol) {
  return {
      name, tol, [=] {
        std::mt19937 rng(1701);
        const int64_t n = 40, ldy = 43, ldu = 41, ldl = 12;  // lanes: 12 floats per row
        auto y = std::make_shared<std::vector<Floats>>();
        auto u = std::make_shared<std::vector<Floats>>();
        auto v = std::make_shared<std::vector<Floats>>();
        auto lane = std::make_shared<std::vector<Floats>>();
        for (int64_t m : kTokenRows) {
          y->push_back(randn(size_t(m * n), rng));
          u->push_back(randn(size_t(m * n), rng));
          v->push_back(randn(size_t(m * n), rng));
          lane->push_back(randn(size_t(m * ldl), rng));
        }
        return RunFn([=](const Ops& ops, const std::vector<int>& order) {
          std::mt19937 jr = junk_rng(order);
          const Layout lay = packed(kTokenRows, order);
          Floats yb = place(lay, order, *y, ldy, span_cols(n), jr);
          Floats ub = place(lay, order, *u, ldu, span_cols(n), jr);
          Floats vb = place(lay, order, *v, n, span_cols(n), jr);
          Floats lb = place(lay, order, *lane, ldl, span_cols(ldl), jr);
          std::vector<CombineTerm> t;
          if (lanes) {
            t = {{.s = 0.5f},  // the output row itself
                 {.x = ub.data(),
                  .ldx = ldu,
                  .s = 2.0f,
                  .lane = lb.data(),
                  .ldl = ldl,
                  .gl = 1,
                  .add = lb.data() + 6,
                  .lda = ldl,
                  .ga = 1},
                 {.x = vb.data(), .ldx = n, .lane = lb.data() + 11, .ldl = ldl, .offset = 1.0f},
                 {.x = ub.data(), .ldx = ldu, .s = -0.25f}};
          } else {
            t = {{.x = ub.data(), .ldx = ldu, .s = 0.75f},
                 {.s = -1.5f},
                 {.x = vb.data(), .ldx = n, .s = 3.0f}};
          }
          ops.combine(
              {.y = yb.data(), .ldy = ldy, .rows = lay.rows, .n = n, .group = group, .terms = t});
          Batch res;
          add(res, "y", take(lay, yb, ldy, span_cols(n)));
          return res;
        });
      }};
}

// Ids `back` tokens before each token, from the row, from its history (3 ids) or none (-1) at
// the start of a sequence; rows start at positions 0, 1, 2 and later.
OpCase shift_ids_case(std::string name, int64_t back) {
  return {name, {}, [=] {
            std::mt19937 rng(1801);
            const int64_t hl = 3, ld_lane = 3;
            const std::vector<int64_t> positions = {0, 1, 4, 7, 2, 0, 30};
            std::uniform_int_distribution<int32_t> id(0, 999);
            auto ids = std::make_shared<std::vector<std::vector<int32_t>>>();
            auto hist = std::make_shared<std::vector<std::vector<int32_t>>>();
            for (int64_t n : kRowLengths) {
              ids->emplace_back();
              for (int64_t i = 0; i < n; ++i) ids->back().push_back(id(rng));
              hist->emplace_back();
              for (int64_t i = 0; i < hl; ++i) hist->back().push_back(id(rng));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              std::uniform_int_distribution<int32_t> junk_id(-5, 5000);
              const Layout lay = padded(kRowLengths, order, positions);
              Ids idb(size_t(std::max<int64_t>(lay.rows, 1))), hb, out(idb.size());
              for (int32_t& x : idb) x = junk_id(jr);
              for (int32_t& x : out) x = junk_id(jr);
              for (size_t j = 0; j < order.size(); ++j) {
                const auto& u = (*ids)[size_t(order[j])];
                for (size_t i = 0; i < u.size(); ++i) idb[size_t(lay.begin[j]) + i] = u[i];
                const auto& h = (*hist)[size_t(order[j])];
                hb.insert(hb.end(), h.begin(), h.end());
              }
              Floats lane = junk(size_t(lay.rows * ld_lane), jr);
              ops.shift_ids({.rows = lay.table(),
                             .ids = idb.data(),
                             .history = hb.data(),
                             .history_len = hl,
                             .back = back,
                             .out = out.data(),
                             .lane = lane.data() + 1,
                             .ld_lane = ld_lane});
              Floats outf(out.begin(), out.end());
              Batch res;
              add(res, "out", take(lay, outf, 1, span_cols(1)));
              add(res, "lane", take(lay, lane, ld_lane, {1}));
              return res;
            });
          }};
}

// Hashed n-gram embedding over rows starting at positions 0, 1, 2 and later (the reserved rows
// and ids of positions 0 and 1), V = 203 table rows (odd: the trigram half is the larger), 8 sign
// rows; multipliers large enough to wrap int32.
OpCase ngram_embed_case(std::string name, DType dtype, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(1901);
            const int64_t V = 203, dim = 24, P = 8, ldy = dim + 5;
            const std::vector<int64_t> positions = {0, 1, 0, 2, 1, 0, 9};
            Floats tf = randn(size_t(V * dim), rng);
            Tensor t;
            if (dtype == DType::bf16) {
              std::vector<bf16> tb;
              for (float v : tf) tb.push_back(f32_to_bf16(v));
              t = Tensor::from_vector(tb, {V, dim});
            } else {
              t = Tensor::from_vector(std::vector<float>(tf.begin(), tf.end()), {V, dim});
            }
            auto table = std::make_shared<Tensor>(t);
            auto pool = std::make_shared<Floats>(randn(size_t(P * dim), rng));
            std::uniform_int_distribution<int32_t> id(0, 50000);
            auto ids = std::make_shared<std::vector<std::vector<int32_t>>>();  // x, p1, p2
            for (int64_t n : kRowLengths) {
              ids->emplace_back();
              for (int64_t i = 0; i < 3 * n; ++i) ids->back().push_back(id(rng));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(kRowLengths, order, positions);
              const size_t N = size_t(std::max<int64_t>(lay.rows, 1));
              Ids x(N), p1(N), p2(N);
              for (size_t i = 0; i < N; ++i) x[i] = p1[i] = p2[i] = int32_t(jr() % 40000);
              for (size_t j = 0; j < order.size(); ++j) {
                const auto& u = (*ids)[size_t(order[j])];
                for (int64_t i = 0; i < lay.real[j]; ++i) {
                  const size_t at = size_t(lay.begin[j] + i);
                  x[at] = u[size_t(3 * i)];
                  p1[at] = u[size_t(3 * i + 1)];
                  p2[at] = u[size_t(3 * i + 2)];
                }
              }
              Floats y = junk(size_t(lay.rows * ldy), jr);
              const Tensor on = ops.upload(*table);
              ops.ngram_embed({.rows = lay.table(),
                               .ids = x.data(),
                               .prev1 = p1.data(),
                               .prev2 = p2.data(),
                               .table = &on,
                               .sign_pool = pool->data(),
                               .sign_rows = P,
                               .bigram_rows = {1000003, 998244353},
                               .trigram_rows = {-7919, 2147483629, 65537},
                               .bigram_signs = {40503, 97},
                               .trigram_signs = {12289, 786433, 3},
                               .y = y.data(),
                               .ldy = ldy});
              Batch res;
              add(res, "y", take(lay, y, ldy, span_cols(dim)));
              return res;
            });
          }};
}

OpCase sigmoid_gates_case(std::string name, bool two_inputs, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(2001);
            const int64_t H = 5, n = 70, ldx = 73, ldx2 = 71, ldw = 2 * n + 3, ldo = H + 2;
            auto x = std::make_shared<std::vector<Floats>>();
            auto x2 = std::make_shared<std::vector<Floats>>();
            for (int64_t m : kTokenRows) {
              x->push_back(randn(size_t(m * n), rng));
              x2->push_back(randn(size_t(m * n), rng));
            }
            auto w = std::make_shared<Floats>(randn(size_t(H * ldw), rng, 0.2f));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = packed(kTokenRows, order);
              Floats xb = place(lay, order, *x, ldx, span_cols(n), jr);
              Floats x2b = place(lay, order, *x2, ldx2, span_cols(n), jr);
              Floats out = junk(size_t(lay.rows * ldo), jr);
              ops.sigmoid_gates({.x = xb.data(),
                                 .ldx = ldx,
                                 .x2 = two_inputs ? x2b.data() : nullptr,
                                 .ldx2 = ldx2,
                                 .w = w->data(),
                                 .ldw = ldw,
                                 .rows = lay.rows,
                                 .heads = H,
                                 .n = n,
                                 .s = 2.0f,
                                 .out = out.data(),
                                 .ldo = ldo});
              Batch res;
              add(res, "out", take(lay, out, ldo, span_cols(H)));
              return res;
            });
          }};
}

// Interleaved rotary on the first 12 of 16 dims of 4 heads (stride 20), rows at later
// positions; padded tokens must be left as they are.
OpCase rope_pairs_case(std::string name, bool paired, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(2101);
            const int64_t H = 4, D = 16, hs = 20, dims = 12, ldx = H * hs + 3;
            const std::vector<int64_t> positions = {0, 1, 5, 200, 3, 0, 1000};
            auto x = std::make_shared<std::vector<Floats>>();
            for (int64_t n : kRowLengths) x->push_back(randn(size_t(n * H * D), rng));
            auto freq = std::make_shared<Floats>();
            for (int64_t i = 0; i < dims; ++i)  // only even entries are read
              freq->push_back(i % 2 ? 99.0f : float(std::pow(10000.0, -double(i) / dims)));
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(kRowLengths, order, positions);
              const auto cols = head_cols(H, hs, D);
              Floats xb = place(lay, order, *x, ldx, cols, jr);
              const auto pad_before = take(lay, xb, ldx, span_cols(ldx), true);
              ops.rope_pairs({.rows = lay.table(),
                              .freq = freq->data(),
                              .x = xb.data(),
                              .ldx = ldx,
                              .heads = H,
                              .hs = hs,
                              .dims = dims,
                              .paired_heads = paired});
              Batch res;
              add(res, "x", take(lay, xb, ldx, cols));
              add(res, "pad:x", minus(take(lay, xb, ldx, span_cols(ldx), true), pad_before));
              return res;
            });
          }};
}

struct AttendF64Shape {
  int64_t heads = 4, qk_dim = 16, v_dim = 16, kv_dim = 16;
  int64_t window = 100000;
  bool paired = false, key_offset = false;
  int64_t offset_from = 0;
  std::vector<int64_t> lengths = kRowLengths;
  std::vector<int64_t> prefix_len = {0, 0, 0, 0, 0, 0, 0};
  std::vector<int64_t> own_before = {0, 0, 0, 0, 0, 0, 0};
  bool bf16 = false;  // AttendF64Args::bf16
};

// attention_f64 over each row's prefix and own keys (the row's positions start at prefix_len +
// own_before); K/V heads of kv_dim floats per position, q / out heads at strides past their
// widths; keys nobody may read are NaN.
OpCase attention_f64_case(std::string name, AttendF64Shape s, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(2201);
            const int64_t H = s.heads, D = s.kv_dim, hq = s.qk_dim + 2, ho = s.v_dim + 1;
            const int64_t ldq = H * hq + 3, ldo = H * ho + 2;
            const float nan = std::numeric_limits<float>::quiet_NaN();
            auto q = std::make_shared<std::vector<Floats>>();
            auto units = std::make_shared<std::vector<KvUnit>>();
            std::vector<int64_t> positions;
            for (int u = 0; u < kUnits; ++u) {
              const int64_t n = s.lengths[size_t(u)];
              q->push_back(randn(size_t(n * H * s.qk_dim), rng, 0.5f));
              KvUnit k;
              k.prefix_len = s.prefix_len[size_t(u)];
              k.prefix_cap = k.prefix_len + 3;
              k.own_before = s.own_before[size_t(u)];
              k.own_cap = k.own_before + n + 2;
              positions.push_back(k.prefix_len + k.own_before);
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
              const Layout lay = padded(s.lengths, order, positions);
              Floats qb = place(lay, order, *q, ldq, head_cols(H, hq, s.qk_dim), jr);
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
              ops.attention_f64({.rows = lay.table(),
                                 .views = views.data(),
                                 .q = qb.data(),
                                 .ldq = ldq,
                                 .hq = hq,
                                 .out = out.data(),
                                 .ldo = ldo,
                                 .ho = ho,
                                 .heads = H,
                                 .qk_dim = s.qk_dim,
                                 .v_dim = s.v_dim,
                                 .kv_dim = D,
                                 .scale = 1.0f / std::sqrt(float(s.qk_dim)),
                                 .window = s.window,
                                 .paired_heads = s.paired,
                                 .key_offset = s.key_offset,
                                 .offset_from = s.offset_from,
                                 .bf16 = s.bf16});
              const auto cols = head_cols(H, ho, s.v_dim);
              Batch res;
              add(res, "out", take(lay, out, ldo, cols));
              add(res, "pad:out", take(lay, out, ldo, cols, true));
              return res;
            });
          }};
}

OpCase subtract_projection_case(std::string name, Tolerance tol) {
  return {name, tol, [=] {
            std::mt19937 rng(2301);
            const int64_t H = 3, D = 20, hy = 22, hv = 21, ldy = H * hy + 1, ldv = H * hv + 4;
            const int64_t lds = H + 2;
            auto y = std::make_shared<std::vector<Floats>>();
            auto v = std::make_shared<std::vector<Floats>>();
            auto st = std::make_shared<std::vector<Floats>>();
            for (int64_t n : kRowLengths) {
              y->push_back(randn(size_t(n * H * D), rng));
              v->push_back(randn(size_t(n * H * D), rng));
              st->push_back(randn(size_t(n * H), rng));
            }
            return RunFn([=](const Ops& ops, const std::vector<int>& order) {
              std::mt19937 jr = junk_rng(order);
              const Layout lay = padded(kRowLengths, order);
              Floats yb = place(lay, order, *y, ldy, head_cols(H, hy, D), jr);
              Floats vb = place(lay, order, *v, ldv, head_cols(H, hv, D), jr);
              Floats sb = place(lay, order, *st, lds, span_cols(H), jr);
              const auto pad_before = take(lay, yb, ldy, span_cols(ldy), true);
              ops.subtract_projection({.rows = lay.table(),
                                       .y = yb.data(),
                                       .ldy = ldy,
                                       .hy = hy,
                                       .v = vb.data(),
                                       .ldv = ldv,
                                       .hv = hv,
                                       .strength = sb.data(),
                                       .lds = lds,
                                       .heads = H,
                                       .dim = D});
              Batch res;
              add(res, "y", take(lay, yb, ldy, head_cols(H, hy, D)));
              add(res, "pad:y", minus(take(lay, yb, ldy, span_cols(ldy), true), pad_before));
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
    // Stacked weights and side-by-side outputs (one GEMM per adjacent group on CUDA): bf16 dot
    // products; exact f32 with two groups (the accumulate flag splits them).
    c.push_back(
        gemm_case("gemm_stacked_bf16",
                  {{DType::bf16, 40, false}, {DType::bf16, 24, false}, {DType::bf16, 8, false}},
                  GemmPrecision::bf16, dot, true));
    c.push_back(gemm_case("gemm_stacked_f32_two_groups",
                          {{DType::f32, 32, false}, {DType::f32, 16, true}, {DType::f32, 8, true}},
                          GemmPrecision::exact, dot, true));
    // bf16_all (the bf16 training path): f32 weights rounded too, alone, beside a bf16 one, and
    // stacked (CUDA rounds each group's weight rows once).
    c.push_back(
        gemm_case("gemm_f32_bf16_all", {{DType::f32, 37, false}}, GemmPrecision::bf16_all, dot));
    c.push_back(gemm_case("gemm_mixed_bf16_all", {{DType::f32, 16, true}, {DType::bf16, 24, false}},
                          GemmPrecision::bf16_all, dot));
    c.push_back(gemm_case("gemm_stacked_f32_bf16_all",
                          {{DType::f32, 32, false}, {DType::f32, 16, false}, {DType::f32, 8, true}},
                          GemmPrecision::bf16_all, dot, true));

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
    c.push_back(l2_norm_case("l2_norm_q_then_k", 4, 128, 520, norm, 2));
    c.push_back(l2_norm_case("l2_norm_none_scaled", 3, 64, 192, norm, 3));

    // The same f32 angle; cos / sin and the rotation in f32 (cpu: 6e-8, 2e-15).
    const Tolerance rope{1e-6, 1e-13};
    c.push_back(rope_case("rope_full", 4, 32, 40, 1.0, 1e4, rope));
    c.push_back(rope_case("rope_partial", 3, 64, 64, 0.25, 1e6, rope));

    c.push_back(kv_write_case("kv_write", 2, 16, {}));
    // K narrower than a position, V at a head stride past its width; and V narrower.
    c.push_back(kv_write_case("kv_write_k12_v16_strided", 2, 16, {}, 12, 16, 20, 19));
    c.push_back(kv_write_case("kv_write_k16_v10", 3, 16, {}, 0, 10));

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
    // bf16 products (Q, K, probabilities and V rounded to bf16, f32 sums): on CUDA the tensor
    // cores, every query in attention_mma.cu's kernel (decode too; head dims past 256 excepted:
    // f32, the wide cases below); the CPU computes in f32 and meets the f32 tolerance. Relative
    // rounding of ~2^-9 per operand (cuda: see the device log).
    const Tolerance att_bf16{2e-2, 1e-4};
    c.push_back(attention_case("attention_bf16_gqa_prefix_own_before",
                               {.kv_heads = 2,
                                .group = 3,
                                .bf16 = true,
                                .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                .own_before = {0, 4, 3, 0, 9, 2, 30}},
                               att_bf16));
    // Fork rows over one 1024-key prefix with a 128-key window, some reaching back into the
    // prefix and some (own_before 500, 300) not: packed jobs whose first member's window starts
    // past the prefix, in whichever row order the batch has.
    for (const bool bf16 : {true, false}) {
      c.push_back(attention_case(
          bf16 ? "attention_bf16_shared_prefix_window" : "attention_shared_prefix_window",
          {.kv_heads = 2,
           .group = 4,
           .dim = 64,
           .window = 128,
           .bf16 = bf16,
           .lengths = {20, 9, 0, 40, 17, 6, 12},
           .prefix_len = {1024, 1024, 0, 1024, 1024, 1024, 1024},
           .own_before = {500, 0, 0, 3, 300, 60, 0},
           .shared_prefix = true},
          bf16 ? att_bf16 : att));
    }
    c.push_back(attention_case("attention_bf16_mqa_window_d40",
                               {.kv_heads = 1,
                                .group = 4,
                                .dim = 40,
                                .window = 24,
                                .bf16 = true,
                                .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                .own_before = {0, 4, 3, 10, 9, 2, 30}},
                               att_bf16));
    c.push_back(attention_case("attention_bf16_decode_gqa_d256",
                               {.kv_heads = 2,
                                .group = 4,
                                .dim = 256,
                                .bf16 = true,
                                .lengths = kDecodeLengths,
                                .prefix_len = {40, 3, 0, 0, 12, 100, 1},
                                .own_before = {0, 5, 2, 17, 0, 3, 60}},
                               att_bf16));
    c.push_back(attention_case("attention_bf16_prefill_d256",
                               {.kv_heads = 1,
                                .group = 2,
                                .dim = 256,
                                .bf16 = true,
                                .prefix_len = {0, 70, 0, 130, 1, 0, 64},
                                .own_before = {0, 0, 3, 0, 9, 2, 0}},
                               att_bf16));

    // Past 1024 keys at D = 256: splits of 16 blocks (the running sums rescale inside a split),
    // rows of a few queries whose key ranges are cut into chunks (partials and the merge), and a
    // 150-token row whose queries cross key 1024 in one CTA walk (the local fold).
    c.push_back(attention_case("attention_bf16_long_prefix_d256",
                               {.kv_heads = 2,
                                .group = 4,
                                .dim = 256,
                                .bf16 = true,
                                .lengths = {3, 4, 0, 1, 150, 4, 3},
                                .prefix_len = {1100, 1500, 0, 1030, 900, 1290, 64},
                                .own_before = {0, 2, 0, 5, 100, 1, 970}},
                               att_bf16));
    // A head dim that is no multiple of 4 or 16 (the tensor-core kernel pads it to 64 with zeros).
    c.push_back(attention_case("attention_bf16_gqa_d18",
                               {.kv_heads = 2,
                                .group = 3,
                                .dim = 18,
                                .bf16 = true,
                                .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                .own_before = {0, 4, 3, 0, 9, 2, 30}},
                               att_bf16));

    // Head dims past 256 (Gemma 4's global layers, D = 512): the few-query kernel's wide form
    // takes every job on CUDA, in f32 whether or not bf16 products were asked for.
    c.push_back(attention_case("attention_wide_d512_gqa_prefix_own_before",
                               {.kv_heads = 1,
                                .group = 2,
                                .dim = 512,
                                .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                .own_before = {0, 4, 3, 0, 9, 2, 30}},
                               att));
    c.push_back(attention_case("attention_wide_d300_decode_window",
                               {.kv_heads = 2,
                                .group = 3,
                                .dim = 300,
                                .window = 40,
                                .lengths = kDecodeLengths,
                                .prefix_len = {40, 3, 0, 0, 12, 100, 1},
                                .own_before = {0, 5, 2, 17, 0, 3, 60}},
                               att));
    // Past 1024 keys (splits of 16 blocks: the running sums rescale inside a split) with 12 and 16
    // query rows a CTA, softmax over up to ~1,500 keys (cpu: 2.0e-6, 7.1e-13); and a head dim
    // that is no multiple of 4 (4-byte copies).
    const Tolerance att_long{2e-5, 1e-11};
    c.push_back(attention_case("attention_wide_d512_long_prefix",
                               {.kv_heads = 1,
                                .group = 4,
                                .dim = 512,
                                .lengths = {3, 4, 0, 1, 2, 4, 3},
                                .prefix_len = {1100, 1500, 0, 1030, 1200, 1290, 64},
                                .own_before = {0, 2, 0, 5, 0, 1, 970}},
                               att_long));
    c.push_back(attention_case("attention_wide_d302",
                               {.kv_heads = 1,
                                .group = 2,
                                .dim = 302,
                                .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                .own_before = {0, 4, 3, 0, 9, 2, 30}},
                               att));
    c.push_back(attention_case("attention_bf16_wide_d512_decode",
                               {.kv_heads = 1,
                                .group = 8,
                                .dim = 512,
                                .bf16 = true,
                                .lengths = kDecodeLengths,
                                .prefix_len = {40, 3, 0, 0, 12, 100, 1},
                                .own_before = {0, 5, 2, 17, 0, 3, 60}},
                               att));

    // K <= 4 products per output, then SiLU; tails are copies (cpu: 1.2e-7, 4e-15; tails 0).
    const Tolerance conv{1e-6, 1e-13};
    c.push_back(conv_case("conv_silu_600_channels", 600, 4, true, Tail::separate, conv));
    c.push_back(conv_case("conv_tail_in_place", 48, 3, false, Tail::in_place, conv));
    c.push_back(conv_case("conv_no_tail_out", 40, 4, true, Tail::none, conv));
    c.push_back(conv_case("conv_short_rows_tail_in_place", 300, 4, true, Tail::in_place, conv,
                          kShortLengths));
    c.push_back(conv_case("conv_short_rows", 48, 3, false, Tail::separate, conv, kShortLengths));

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
    // Qwen3.5's head dims; Dk 160 (CUDA: one buffer of the next chunk's tiles), Dv 48.
    c.push_back(delta_rule_case("delta_rule_dims_128",
                                {.k_heads = 1, .v_heads = 2, .dk = 128, .dv = 128}, delta));
    c.push_back(delta_rule_case("delta_rule_dk160",
                                {.k_heads = 1, .v_heads = 2, .dk = 160, .dv = 48}, delta));
    // Rows carrying their state as a history (DeltaRuleHistory): none, appending (a decode
    // step, an idle row, short passes), read only (one step; 70 tokens, whose chunked form reads
    // the history folded first).
    auto history_case = [&](std::string name, int64_t k_heads, int64_t v_heads, int64_t dk,
                            int64_t dv) {
      return delta_rule_case(std::move(name),
                             {.k_heads = k_heads,
                              .v_heads = v_heads,
                              .dk = dk,
                              .dv = dv,
                              .lengths = {1, 1, 0, 5, 70, 1, 12},
                              .hist = {-1, 10, 7, 20, 9, 30, 40},
                              .append = {0, 1, 1, 1, 0, 0, 1}},
                             delta);
    };
    c.push_back(history_case("delta_rule_history", 1, 2, 32, 40));
    c.push_back(history_case("delta_rule_history_dims_128", 1, 2, 128, 128));
    c.push_back(history_case("delta_rule_history_unaligned", 2, 2, 18, 22));

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

    // Ids from a float lane, negative ids (y left as it is), per-position scales.
    c.push_back(gather_case("gather_lane_negative_ids", {.negative = true, .lane = true}, {}));
    c.push_back(gather_case(
        "gather_bf16_row_scale_keep",
        {.dtype = DType::bf16, .keep = true, .negative = true, .row_scale = true}, gather));
    c.push_back(gather_case("gather_lane_row_scale_soft",
                            {.soft = true, .lane = true, .row_scale = true}, gather));

    c.push_back(softcap_case("softcap", {1e-6, 1e-13}));  // tanh in f32 (cpu: 1.3e-7, 2e-15)

    c.push_back(copy_rows_case("copy_rows", false, {}));
    c.push_back(copy_rows_case("copy_rows_pack_in_place", true, {}));
    c.push_back(copy_rows_case("copy_rows_by4", false, {}, true));

    // The gpt family's ops: f32 expressions of a few roundings each against double (cpu figures
    // in each comment; the bounds about 10x them).
    const Tolerance activation{1.5e-6, 3e-14};  // cpu: 1.4e-7, 2.9e-15 (scaled_sigmoid)
    c.push_back(
        activation_case("activation_relu_squared", Activation::relu_squared, false, activation));
    c.push_back(
        activation_case("activation_gelu_erf_in_place", Activation::gelu_erf, true, activation));
    c.push_back(activation_case("activation_scaled_sigmoid", Activation::scaled_sigmoid, false,
                                activation));
    const Tolerance bias_scale{6e-7, 2e-14};  // cpu: 6.3e-8, 1.7e-15
    c.push_back(bias_scale_case("bias_scale", true, false, bias_scale));
    c.push_back(bias_scale_case("bias_scale_no_bias_in_place", false, true, bias_scale));
    // Up to 4 rounded products summed in f32 (cpu: 6.5e-8, 3.6e-15).
    const Tolerance combine{7e-7, 4e-14};
    c.push_back(combine_case("combine_self_lanes_groups", true, 8, combine));
    c.push_back(combine_case("combine_constant_terms", false, 0, combine));
    c.push_back(shift_ids_case("shift_ids_back1", 1));
    c.push_back(shift_ids_case("shift_ids_back3", 3));
    // Ids are exact: shift_ids bitwise. n-gram: two rounded products summed (cpu: 5.1e-8, 1.9e-15).
    const Tolerance ngram{5e-7, 2e-14};
    c.push_back(ngram_embed_case("ngram_embed_f32", DType::f32, ngram));
    c.push_back(ngram_embed_case("ngram_embed_bf16", DType::bf16, ngram));
    // f64 dots rounded, summed and squashed in f32 (cpu: 6e-8, 2.2e-15).
    const Tolerance gates{6e-7, 2e-14};
    c.push_back(sigmoid_gates_case("sigmoid_gates", false, gates));
    c.push_back(sigmoid_gates_case("sigmoid_gates_two_inputs", true, gates));
    // f32 cos / sin of a double angle, f32 rotation (cpu: 5.4e-8, 1.8e-15).
    const Tolerance rope_pairs{5e-7, 2e-14};
    c.push_back(rope_pairs_case("rope_pairs", false, rope_pairs));
    c.push_back(rope_pairs_case("rope_pairs_paired_heads", true, rope_pairs));
    // f32 scores from f64 dots, f32 exp and weights, f32 sums over up to ~370 keys against double
    // throughout (cpu: 3.6e-7, 1.5e-14).
    const Tolerance f64att{4e-6, 2e-13};
    c.push_back(attention_f64_case("attention_f64", {}, f64att));
    c.push_back(attention_f64_case("attention_f64_window_prefix",
                                   {.window = 24,
                                    .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                    .own_before = {0, 4, 3, 10, 9, 2, 30}},
                                   f64att));
    c.push_back(attention_f64_case("attention_f64_paired_heads_window",
                                   {.qk_dim = 12,
                                    .v_dim = 10,
                                    .window = 9,
                                    .paired = true,
                                    .prefix_len = {3, 0, 5, 0, 1, 10, 0},
                                    .own_before = {0, 2, 3, 4, 0, 2, 7}},
                                   f64att));
    c.push_back(attention_f64_case("attention_f64_key_offset",
                                   {.heads = 2,
                                    .qk_dim = 16,
                                    .v_dim = 12,
                                    .kv_dim = 16,
                                    .key_offset = true,
                                    .offset_from = 8,
                                    .prefix_len = {4, 0, 5, 0, 1, 6, 0},
                                    .own_before = {0, 2, 3, 4, 0, 2, 7}},
                                   f64att));
    c.push_back(attention_f64_case("attention_f64_decode_paired_key_offset",
                                   {.heads = 6,
                                    .qk_dim = 8,
                                    .v_dim = 8,
                                    .kv_dim = 8,
                                    .window = 40,
                                    .paired = true,
                                    .key_offset = true,
                                    .offset_from = 4,
                                    .lengths = kDecodeLengths,
                                    .prefix_len = {40, 3, 0, 0, 12, 100, 1},
                                    .own_before = {0, 5, 2, 17, 0, 3, 60}},
                                   f64att));
    // bf16: the CUDA tensor-core kernels (q, k, v and the probabilities rounded to bf16, f32
    // sums) against the f64 reference; the CPU computes the f64 form (H200: 4.2e-3, 6.4e-6).
    const Tolerance bf16att{1.5e-2, 3e-5};
    c.push_back(attention_f64_case("attention_f64_bf16_window_prefix",
                                   {.window = 24,
                                    .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                    .own_before = {0, 4, 3, 10, 9, 2, 30},
                                    .bf16 = true},
                                   bf16att));
    c.push_back(attention_f64_case("attention_f64_bf16_paired_heads_window",
                                   {.qk_dim = 12,
                                    .v_dim = 10,
                                    .window = 9,
                                    .paired = true,
                                    .prefix_len = {3, 0, 5, 0, 1, 10, 0},
                                    .own_before = {0, 2, 3, 4, 0, 2, 7},
                                    .bf16 = true},
                                   bf16att));
    c.push_back(attention_f64_case("attention_f64_bf16_decode_paired_key_offset",
                                   {.heads = 6,
                                    .qk_dim = 72,
                                    .v_dim = 64,
                                    .kv_dim = 72,
                                    .window = 40,
                                    .paired = true,
                                    .key_offset = true,
                                    .offset_from = 4,
                                    .lengths = kDecodeLengths,
                                    .prefix_len = {40, 3, 0, 0, 12, 100, 1},
                                    .own_before = {0, 5, 2, 17, 0, 3, 60},
                                    .bf16 = true},
                                   bf16att));
    c.push_back(attention_f64_case("attention_f64_bf16_key_offset",
                                   {.heads = 2,
                                    .qk_dim = 16,
                                    .v_dim = 12,
                                    .kv_dim = 16,
                                    .key_offset = true,
                                    .offset_from = 8,
                                    .prefix_len = {4, 0, 5, 0, 1, 6, 0},
                                    .own_before = {0, 2, 3, 4, 0, 2, 7},
                                    .bf16 = true},
                                   bf16att));
    c.push_back(attention_f64_case("attention_f64_wide_heads",
                                   {.heads = 2,
                                    .qk_dim = 160,
                                    .v_dim = 136,
                                    .kv_dim = 160,
                                    .window = 30,
                                    .prefix_len = {20, 0, 5, 37, 1, 64, 0},
                                    .own_before = {0, 4, 3, 10, 9, 2, 30}},
                                   f64att));
    // f64 dots rounded, one f32 update per element (cpu: 5.3e-8, 3.9e-16).
    c.push_back(subtract_projection_case("subtract_projection", {5e-7, 4e-15}));
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

// Every (backend, case).
std::vector<std::tuple<Backend, size_t>> table_params() {
  std::vector<std::tuple<Backend, size_t>> p;
  for (const Backend& b : backends_under_test())
    for (size_t c = 0; c < op_cases().size(); ++c) p.push_back({b, c});
  return p;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpsTable, ::testing::ValuesIn(table_params()), [](const auto& info) {
  return fmt::format("{}_{}", std::get<0>(info.param).name,
                     op_cases()[std::get<1>(info.param)].name);
});

// ---- the gpt ops against formulas written out here ----
// The gpt family is checked bitwise against a scalar trainer, so these pin the CPU kernels of
// kernels/cpu/scalar_ops.cc to the trainer's f32 expressions exactly (products rounded, sums
// left to right), and hold the reference (which computes in double) within 1e-6 of them:
// combinations with lane / group / offset / add coefficients, shifted ids across
// the history, interleaved rotary at paired-head positions, the n-gram hash at the reserved
// positions, sigmoid gates, activations, projection removal; f64 attention against a plain
// softmax on both backends. (The table above scores the same ops against the reference.)

std::vector<float> randn_seeded(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(OpsGptFormulas, CombineSumsTermsLeftToRight) {
  const int64_t R = 37, n = 12, ld = 16, group = 4;
  auto y0 = randn_seeded(size_t(R * ld), 1), u = randn_seeded(size_t(R * n), 2),
       v = randn_seeded(size_t(R * ld), 3);
  auto lane = randn_seeded(size_t(R * 3), 4), add = randn_seeded(size_t(R * 3), 5);
  const CombineTerm t[] = {
      {.s = 0.5f},
      {.x = u.data(),
       .ldx = n,
       .s = 2.0f,
       .lane = lane.data(),
       .ldl = 3,
       .gl = 1,
       .add = add.data(),
       .lda = 3,
       .ga = 1},
      {.x = v.data(), .ldx = ld, .lane = lane.data(), .ldl = 3, .offset = 1.0f}};
  for (const Ops* ops : {&cpu_ops(), &reference_ops()}) {
    const double tol = ops == &cpu_ops() ? 0.0 : 1e-6;  // the reference sums in double
    std::vector<float> y = y0;
    ops->combine({.y = y.data(), .ldy = ld, .rows = R, .n = n, .group = group, .terms = t});
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t j = 0; j < ld; ++j) {
        const size_t i = size_t(r * ld + j);
        if (j >= n) {
          EXPECT_EQ(y[i], y0[i]);  // past n: untouched
          continue;
        }
        const int64_t g = j / group;
        const float c1 = 2.0f * lane[size_t(r * 3 + g)] + add[size_t(r * 3 + g)];
        const float c2 = 1.0f + lane[size_t(r * 3)];
        float want = 0.5f * y0[i];
        want += c1 * u[size_t(r * n + j)];
        want += c2 * v[i];
        EXPECT_NEAR(y[i], want, tol) << ops->name() << " " << r << " " << j;
      }
    }
  }
}

TEST(OpsGptFormulas, ShiftIdsReadTheHistory) {
  // Two rows of 3 tokens: row 0 at position 0, row 1 at position 5 with history {7, 8}.
  const int64_t lengths[] = {3, 2}, positions[] = {0, 5};
  const int32_t ids[] = {1, 2, 3, 4, 5, 6}, history[] = {0, 0, 7, 8};
  const RowTable rows{.rows = 2, .tokens = 3, .lengths = lengths, .positions = positions};
  for (const Ops* ops : {&cpu_ops(), &reference_ops()}) {
    int32_t back1[6], back2[6];
    float lane[12];
    ops->shift_ids(
        {.rows = rows, .ids = ids, .history = history, .history_len = 2, .back = 1, .out = back1});
    ops->shift_ids({.rows = rows,
                    .ids = ids,
                    .history = history,
                    .history_len = 2,
                    .back = 2,
                    .out = back2,
                    .lane = lane,
                    .ld_lane = 2});
    const int32_t want1[] = {-1, 1, 2, 8, 4, 5}, want2[] = {-1, -1, 1, 7, 8, 4};
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(back1[i], want1[i]) << i;
      EXPECT_EQ(back2[i], want2[i]) << i;
      EXPECT_EQ(lane[2 * i], float(want2[i])) << i;
    }
  }
}

TEST(OpsGptFormulas, RopePairsRotatePairsAtPairedPositions) {
  const int64_t L = 4, H = 4, D = 6, dims = 4;
  const int64_t lengths[] = {3}, positions[] = {2};
  const RowTable rows{.rows = 1, .tokens = L, .lengths = lengths, .positions = positions};
  const std::vector<float> freq = {0.5f, 0.0f, 0.125f, 0.0f};
  const auto x0 = randn_seeded(size_t(L * H * D), 7);
  for (const Ops* ops : {&cpu_ops(), &reference_ops()}) {
    const double tol = ops == &cpu_ops() ? 0.0 : 1e-6;  // the reference rotates in double
    auto x = x0;
    const RopePairsArgs a{.rows = rows,
                          .freq = freq.data(),
                          .x = x.data(),
                          .ldx = H * D,
                          .heads = H,
                          .hs = D,
                          .dims = dims,
                          .paired_heads = true};
    ops->rope_pairs(a);
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const float* in = x0.data() + (t * H + h) * D;
        const float* out = x.data() + (t * H + h) * D;
        if (t >= 3) {  // padded: untouched
          EXPECT_EQ(std::memcmp(in, out, size_t(D) * sizeof(float)), 0);
          continue;
        }
        const double p = double(2 * (2 + t) + h % 2);
        for (int64_t d = 0; d < D; ++d) {
          float want = in[d];
          if (d < dims) {
            const int64_t e = d - d % 2;
            const double th = p * double(freq[size_t(e)]);
            const float c = float(std::cos(th)), s = float(std::sin(th));
            want = d % 2 == 0 ? c * in[d] + s * in[d + 1] : c * in[d] - s * in[d - 1];
          }
          EXPECT_NEAR(out[d], want, tol) << ops->name() << " " << t << " " << h << " " << d;
        }
      }
    }
  }
}

TEST(OpsGptFormulas, NgramEmbedUsesReservedRowsAtTheStart) {
  const int64_t V = 10, Dn = 3, P = 4;
  auto table_data = randn_seeded(size_t(V * Dn), 8);
  Tensor table = Tensor::from_vector(table_data, {V, Dn});
  auto pool = randn_seeded(size_t(P * Dn), 9);
  const int64_t lengths[] = {3}, positions[] = {0};
  const RowTable rows{.rows = 1, .tokens = 3, .lengths = lengths, .positions = positions};
  const int32_t ids[] = {3, 4, 5}, p1[] = {-1, 3, 4}, p2[] = {-1, -1, 3};
  for (const Ops* ops : {&cpu_ops(), &reference_ops()}) {
    const double tol = ops == &cpu_ops() ? 0.0 : 1e-6;
    std::vector<float> y(size_t(3 * Dn));
    ops->ngram_embed({.rows = rows,
                      .ids = ids,
                      .prev1 = p1,
                      .prev2 = p2,
                      .table = &table,
                      .sign_pool = pool.data(),
                      .sign_rows = P,
                      .bigram_rows = {3, 5},
                      .trigram_rows = {2, 7, 11},
                      .bigram_signs = {1, 2},
                      .trigram_signs = {3, 1, 2},
                      .y = y.data(),
                      .ldy = Dn});
    // Position 0: bigram row V/2 - 1 = 4, trigram row V - 1 = 9, both with sign row 0.
    // Position 1: bigram row (3*4 ^ 5*4) mod 4 = (12 ^ 20) mod 4 = 24 mod 4 = 0, sign (2*3 ^ 1*4)
    // & 3 = 2; trigram reserved.
    const int64_t bigram_row[] = {4, 0}, bigram_sign[] = {0, 2};
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t d = 0; d < Dn; ++d) {
        float want = 0.0f;
        want += table_data[size_t(bigram_row[t] * Dn + d)] * pool[size_t(bigram_sign[t] * Dn + d)];
        want += table_data[size_t(9 * Dn + d)] * pool[size_t(d)];
        EXPECT_NEAR(y[size_t(t * Dn + d)], want, tol) << ops->name() << " " << t << " " << d;
      }
  }
}

TEST(OpsGptFormulas, SigmoidGatesAndActivations) {
  const int64_t R = 5, H = 3, n = 7;
  auto x = randn_seeded(size_t(R * n), 10), x2 = randn_seeded(size_t(R * n), 11),
       w = randn_seeded(size_t(H * 2 * n), 12);
  for (const Ops* ops : {&cpu_ops(), &reference_ops()}) {
    // The reference in double: within a few f32 roundings, relative to the value.
    const float tol = ops == &cpu_ops() ? 0.0f : 1e-6f;
    std::vector<float> g(size_t(R * H));
    ops->sigmoid_gates({.x = x.data(),
                        .ldx = n,
                        .x2 = x2.data(),
                        .ldx2 = n,
                        .w = w.data(),
                        .ldw = 2 * n,
                        .rows = R,
                        .heads = H,
                        .n = n,
                        .s = 2.0f,
                        .out = g.data(),
                        .ldo = H});
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H; ++h) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < n; ++i) {
          a += double(w[size_t(h * 2 * n + i)]) * x[size_t(r * n + i)];
          b += double(w[size_t(h * 2 * n + n + i)]) * x2[size_t(r * n + i)];
        }
        const float z = float(a) + float(b);
        EXPECT_NEAR(g[size_t(r * H + h)], 2.0f * (1.0f / (1.0f + std::exp(-z))), tol)
            << ops->name();
      }
    auto v = randn_seeded(100, 13, 3.0f);
    for (Activation act :
         {Activation::relu_squared, Activation::gelu_erf, Activation::scaled_sigmoid}) {
      std::vector<float> y(v.size());
      ops->activation({.x = v.data(),
                       .ldx = 10,
                       .y = y.data(),
                       .ldy = 10,
                       .rows = 10,
                       .n = 10,
                       .act = act,
                       .a = 30.0f,
                       .b = 5.0f,
                       .c = 7.5f});
      for (size_t i = 0; i < v.size(); ++i) {
        const float u = v[i];
        float want = 0;
        if (act == Activation::relu_squared) want = u > 0 ? u * u : 0.0f;
        if (act == Activation::gelu_erf)
          want = 0.5f * u * (1.0f + std::erf(u * 0.70710678118654752f));
        if (act == Activation::scaled_sigmoid)
          want = 30.0f * (1.0f / (1.0f + std::exp(-((u + 5.0f) / 7.5f))));
        EXPECT_NEAR(y[i], want, tol * std::max(1.0f, std::abs(want)))
            << ops->name() << " " << int(act) << " " << i;
      }
    }
  }
}

TEST(OpsGptFormulas, SubtractProjectionLeavesYOrthogonal) {
  const int64_t L = 3, H = 2, D = 8;
  const int64_t lengths[] = {2}, positions[] = {0};
  const RowTable rows{.rows = 1, .tokens = L, .lengths = lengths, .positions = positions};
  const auto y0 = randn_seeded(size_t(L * H * D), 14), v = randn_seeded(size_t(L * H * D), 15);
  const std::vector<float> strength(size_t(L * H), 20.0f);  // tanh = 1: all of the projection
  for (const Ops* ops : {&cpu_ops(), &reference_ops()}) {
    auto y = y0;
    ops->subtract_projection({.rows = rows,
                              .y = y.data(),
                              .ldy = H * D,
                              .hy = D,
                              .v = v.data(),
                              .ldv = H * D,
                              .hv = D,
                              .strength = strength.data(),
                              .lds = H,
                              .heads = H,
                              .dim = D});
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const size_t at = size_t((t * H + h) * D);
        double yv = 0, vv = 0;
        for (int64_t d = 0; d < D; ++d) {
          yv += double(y[at + size_t(d)]) * v[at + size_t(d)];
          vv += double(v[at + size_t(d)]) * v[at + size_t(d)];
        }
        if (t < 2) {
          EXPECT_LT(std::abs(yv) / vv, 1e-6) << ops->name() << " " << t << " " << h;
        } else {
          EXPECT_EQ(std::memcmp(y.data() + at, y0.data() + at, size_t(D) * sizeof(float)), 0);
        }
      }
  }
}

// f64 attention of one row (prefix of 5 keys + 7 own tokens, 3 of them this call's) against a
// plain softmax written out here, on both backends, with and without paired heads and key
// offsets.
TEST(OpsGptFormulas, AttentionF64MatchesSoftmax) {
  const int64_t H = 4, dq = 6, dv = 5, D = 6, P = 5, cap = 16, L = 4, before = 4, rot = 2;
  const auto pk = randn_seeded(size_t(H * P * D), 16), pvv = randn_seeded(size_t(H * P * D), 17);
  auto ok = randn_seeded(size_t(H * cap * D), 18), ov = randn_seeded(size_t(H * cap * D), 19);
  const auto q = randn_seeded(size_t(L * H * dq), 20);
  const int64_t lengths[] = {3}, positions[] = {P + before};
  const RowTable rows{.rows = 1, .tokens = L, .lengths = lengths, .positions = positions};
  const RowView view{.prefix_k = pk.data(),
                     .prefix_v = pvv.data(),
                     .prefix_len = P,
                     .prefix_stride = P * D,
                     .own_k = ok.data(),
                     .own_v = ov.data(),
                     .own_before = before,
                     .own_stride = cap * D};
  for (bool paired : {false, true}) {
    for (bool offset : {false, true}) {
      if (paired && offset) continue;
      const int64_t window = paired ? 9 : 6;
      for (const Ops* ops : {&cpu_ops(), &reference_ops()}) {
        std::vector<float> out(size_t(L * H * dv), 1.0f);
        AttendF64Args a{.rows = rows,
                        .views = &view,
                        .q = q.data(),
                        .ldq = H * dq,
                        .hq = dq,
                        .out = out.data(),
                        .ldo = H * dv,
                        .ho = dv,
                        .heads = H,
                        .qk_dim = dq,
                        .v_dim = dv,
                        .kv_dim = D,
                        .scale = 0.4f,
                        .window = window,
                        .paired_heads = paired,
                        .key_offset = offset,
                        .offset_from = rot};
        ops->attention_f64(a);
        auto kv = [&](bool value, int64_t head, int64_t p) {
          const std::vector<float>& pre = value ? pvv : pk;
          const std::vector<float>& own = value ? ov : ok;
          return p < P ? pre.data() + head * P * D + p * D
                       : own.data() + head * cap * D + (p - P) * D;
        };
        for (int64_t t = 0; t < L; ++t)
          for (int64_t h = 0; h < H; ++h) {
            const float* y = out.data() + (t * H + h) * dv;
            if (t >= 3) {
              for (int64_t d = 0; d < dv; ++d) EXPECT_EQ(y[d], 0.0f);
              continue;
            }
            const int64_t pos = P + before + t, half = H / 2;
            const int64_t qpos = paired ? 2 * pos + h / half : pos;
            std::vector<double> s;
            std::vector<const float*> vs;
            for (int64_t j = std::max<int64_t>(0, qpos - window); j <= qpos; ++j) {
              const int64_t p = paired ? j / 2 : j;
              const int64_t g = paired ? h % half + (j % 2) * half : h;
              const float* k = kv(false, g, p);
              const float* kp = offset && p > 0 ? kv(false, g, p - 1) : k;
              double dot = 0;
              for (int64_t d = 0; d < dq; ++d)
                dot += double(q[size_t((t * H + h) * dq + d)]) * (d < rot ? k[d] : kp[d]);
              s.push_back(0.4 * dot);
              vs.push_back(kv(true, g, p));
            }
            double mx = -1e300, sum = 0;
            for (double x : s) mx = std::max(mx, x);
            for (double& x : s) sum += (x = std::exp(x - mx));
            for (int64_t d = 0; d < dv; ++d) {
              double want = 0;
              for (size_t j = 0; j < s.size(); ++j) want += s[j] / sum * vs[j][d];
              EXPECT_NEAR(y[d], want, 1e-5)
                  << ops->name() << " " << paired << offset << " " << t << " " << h;
            }
          }
      }
    }
  }
}

// Packing many rows to the front of their own buffer (Backbone drops the residual stream's side
// lanes this way before the final norm: 359 lanes to 48): every row keeps its values on every
// backend. A CUDA launch runs its rows in no particular order, so a later row's write must not
// land on an earlier row before that row is read (it did when x == y, 1 run in 3 of the gpt
// fork tests: row 0's hidden states came back partly overwritten).
TEST(OpsCopyRows, PackingManyRowsInPlaceKeepsEveryRow) {
  const int64_t rows = 2048, ldx = 359, n = 48;
  const std::vector<float> x = randn_seeded(size_t(rows * ldx), 31);
  for (const Backend& b : backends_under_test()) {
    for (int rep = 0; rep < 20; ++rep) {
      Floats buf(x.begin(), x.end());
      b.ops->copy_rows(buf.data(), ldx, buf.data(), n, rows, n);
      int64_t wrong = 0, first = -1;
      for (int64_t i = 0; i < rows * n; ++i) {
        if (buf[size_t(i)] == x[size_t(i / n * ldx + i % n)]) continue;
        if (first < 0) first = i / n;
        ++wrong;
      }
      ASSERT_EQ(wrong, 0) << b.name << ", launch " << rep << ": first wrong row " << first;
    }
  }
}

// gather_rows: each output row is its indexed input row, bit for bit (indices repeated and out of
// order), and the columns past n of y are left as they were.
TEST(OpsGatherRows, EveryRowIsItsIndexedRow) {
  const int64_t rows = 300, ldx = 133, n = 120, picked = 77, ldy = 125;
  const std::vector<float> x = randn_seeded(size_t(rows * ldx), 41);
  std::vector<int32_t> index;
  for (int64_t i = 0; i < picked; ++i) index.push_back(int32_t((i * 37 + 11) % rows));
  index[5] = index[60];
  std::vector<Backend> all = backends_under_test();
  all.push_back({"reference", &reference_ops()});
  for (const Backend& b : all) {
    Floats xs(x.begin(), x.end()), y(size_t(picked * ldy), -1.0f);
    Ids idx(index.begin(), index.end());
    b.ops->gather_rows(xs.data(), ldx, idx.data(), y.data(), ldy, picked, n);
    b.ops->synchronize();
    for (int64_t i = 0; i < picked; ++i) {
      for (int64_t j = 0; j < ldy; ++j) {
        const float want = j < n ? x[size_t(index[size_t(i)] * ldx + j)] : -1.0f;
        ASSERT_EQ(y[size_t(i * ldy + j)], want) << b.name << ": row " << i << ", column " << j;
      }
    }
  }
}

// A projection row's bits do not depend on how many rows share the GEMM, across every class of
// row counts the CUDA backend may give its own cuBLASLt algorithm (CudaOps::tune: up to 64, up to
// 512, more): rows computed in calls of 1, 64, 65, 512, 513 and 1700 rows == the same rows of
// one call of 2100, for plain and accumulating outputs, bf16 and exact products.
TEST(OpsGemmRows, RowBitsDoNotDependOnTheRowCount) {
  const int64_t K = 512, N = 384, rows = 2100, ldx = K, ldy = N;
  const std::vector<float> xv = randn_seeded(size_t(rows * K), 51);
  const std::vector<float> y0 = randn_seeded(size_t(rows * N), 52);
  std::vector<float> wf = randn_seeded(size_t(N * K), 53, 0.05f);
  std::vector<bf16> wb;
  for (float v : wf) wb.push_back(f32_to_bf16(v));
  const Tensor w = Tensor::from_vector(wb, {N, K});
  const int64_t calls[][2] = {{37, 1}, {100, 64}, {200, 65}, {900, 512}, {1, 513}, {0, 1700}};
  for (const Backend& b : backends_under_test()) {
    const Tensor on = b.ops->upload(w);
    for (GemmPrecision prec : {GemmPrecision::bf16, GemmPrecision::exact}) {
      for (bool acc : {false, true}) {
        Floats x(xv.begin(), xv.end());
        auto run = [&](int64_t first, int64_t m) {
          Floats y(y0.begin() + first * N, y0.begin() + (first + m) * N);
          const GemmOutput go{.w = &on, .y = y.data(), .ldy = ldy, .accumulate = acc};
          b.ops->gemm({.x = x.data() + first * ldx,
                       .m = m,
                       .k = K,
                       .ldx = ldx,
                       .outputs = {&go, 1},
                       .precision = prec});
          b.ops->synchronize();
          return y;
        };
        const Floats all = run(0, rows);
        for (const auto& [first, m] : calls) {
          const Floats part = run(first, m);
          EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + first * N))
              << b.name << (prec == GemmPrecision::bf16 ? " bf16" : " exact")
              << (acc ? " accumulating" : "") << ": rows " << first << " .. " << first + m - 1
              << " in a call of " << m << " != in a call of " << rows;
        }
      }
    }
  }
}

#if DEG_HAVE_CUDA
// Our small-M product (kernels/cuda/gemm_small.cu), in every configuration, gives the rows of a
// 2100-row product by the CUDA backend (cuBLASLt's pinned algorithm) bit for bit, written and
// accumulated: launched alone with strides wider than the rows, and through the op (the path a
// decode step takes when the tuning picks it; cuda_gemm_small_config forces it here). Shapes:
// decode's out_proj (K = 2048) and down (3584), a column count that leaves a CTA's columns partly
// empty, a K that ends in a partial stage and one K of a single partial stage. The backend picks
// among the configurations by speed, so each must hold.
TEST(OpsGemmRows, SmallRowKernelGivesThePinnedBits) {
  struct Shape {
    int64_t n, k;
  };
  struct SmallConfig {  // the tuning's choice again, whatever way the test ends
    ~SmallConfig() { cuda_gemm_small_config(-1); }
  };
  const int64_t rows = 2100;
  const int64_t calls[][2] = {{0, 1}, {37, 64}, {100, 37}, {2099, 1}, {500, 17}};
  for (const Backend& b : backends_under_test()) {
    if (std::string(b.name) != "cuda") continue;
    for (const Shape& s :
         {Shape{1024, 2048}, Shape{96, 3584}, Shape{520, 1024}, Shape{264, 272}, Shape{64, 48}}) {
      const std::vector<float> xv = randn_seeded(size_t(rows * s.k), 61);
      const std::vector<float> y0 = randn_seeded(size_t(rows * s.n), 62);
      std::vector<bf16> wb;
      for (float v : randn_seeded(size_t(s.n * s.k), 63, 0.05f)) wb.push_back(f32_to_bf16(v));
      const Tensor w = b.ops->upload(Tensor::from_vector(wb, {s.n, s.k}));
      // x as bf16 rows 8 elements wider than K; y rows 3 floats wider than N.
      const int64_t ldx = s.k + 8, ldy = s.n + 3;
      testing::ManagedVector<uint16_t> xb(size_t(rows * ldx), 0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < s.k; ++i)
          xb[size_t(r * ldx + i)] = f32_to_bf16(xv[size_t(r * s.k + i)]).bits;
      for (bool acc : {false, true}) {
        Floats x(xv.begin(), xv.end()), all(y0.begin(), y0.end());
        auto product = [&](int64_t first, int64_t m, float* y) {
          const GemmOutput go{.w = &w, .y = y, .ldy = s.n, .accumulate = acc};
          b.ops->gemm({.x = x.data() + first * s.k,
                       .m = m,
                       .k = s.k,
                       .ldx = s.k,
                       .outputs = {&go, 1},
                       .precision = GemmPrecision::bf16});
          b.ops->synchronize();
        };
        product(0, rows, all.data());
        for (int config = 0; config < cuda::kSmallGemmConfigs; ++config) {
          const std::string what =
              fmt::format("{}{}: [{}, {}]", cuda::small_gemm_config_name(config),
                          acc ? ", accumulating" : "", s.n, s.k);
          for (const auto& [first, m] : calls) {
            Floats y(size_t(m * ldy), 0.0f);
            for (int64_t r = 0; r < m; ++r)
              std::copy_n(y0.begin() + (first + r) * s.n, s.n, y.begin() + r * ldy);
            const cuda::SmallGemmLaunch l{.x = xb.data() + first * ldx,
                                          .ldx = ldx,
                                          .w = reinterpret_cast<const uint16_t*>(w.raw()),
                                          .y = y.data(),
                                          .ldy = ldy,
                                          .m = m,
                                          .n = s.n,
                                          .k = s.k,
                                          .accumulate = acc};
            ASSERT_TRUE(cuda::small_gemm_fits(l));
            ASSERT_EQ(cuda::launch_small_gemm(l, config, nullptr), cudaSuccess);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            for (int64_t r = 0; r < m; ++r)
              EXPECT_TRUE(std::equal(y.begin() + r * ldy, y.begin() + r * ldy + s.n,
                                     all.begin() + (first + r) * s.n))
                  << what << ": row " << first + r << " alone differs from the pinned product's";
          }
          const SmallConfig restore;
          cuda_gemm_small_config(config);
          for (const auto& [first, m] : calls) {
            Floats y(y0.begin() + first * s.n, y0.begin() + (first + m) * s.n);
            product(first, m, y.data());
            EXPECT_TRUE(std::equal(y.begin(), y.end(), all.begin() + first * s.n))
                << what << ": rows " << first << " .. " << first + m - 1
                << " through the op differ from the pinned product's";
          }
        }
      }
    }
    // What it does not take: the backend's cuBLASLt products run those.
    testing::ManagedVector<uint16_t> xs(size_t(70 * 64 + 8), 0);
    Floats ys(size_t(70 * 64), 0.0f);
    const cuda::SmallGemmLaunch ok{.x = xs.data(),
                                   .ldx = 64,
                                   .w = xs.data(),
                                   .y = ys.data(),
                                   .ldy = 64,
                                   .m = 64,
                                   .n = 64,
                                   .k = 64,
                                   .accumulate = false};
    EXPECT_TRUE(cuda::small_gemm_fits(ok));
    struct Bad {
      const char* why;
      int64_t m, n, k, ldx, ldy, x_offset;
    };
    for (const Bad& bad :
         {Bad{"no rows", 0, 64, 64, 64, 64, 0}, Bad{"65 rows", 65, 64, 64, 64, 64, 0},
          Bad{"n not a multiple of 8", 64, 60, 64, 64, 64, 0},
          Bad{"k not a multiple of 16", 64, 64, 56, 56, 64, 0},
          Bad{"ldx below k", 64, 64, 64, 48, 64, 0}, Bad{"ldy below n", 64, 64, 64, 64, 32, 0},
          Bad{"x misaligned", 64, 64, 64, 64, 64, 1}}) {
      cuda::SmallGemmLaunch l = ok;
      l.m = bad.m;
      l.n = bad.n;
      l.k = bad.k;
      l.ldx = bad.ldx;
      l.ldy = bad.ldy;
      l.x = xs.data() + bad.x_offset;
      EXPECT_FALSE(cuda::small_gemm_fits(l)) << bad.why;
      EXPECT_EQ(cuda::launch_small_gemm(l, 0, nullptr), cudaErrorInvalidValue) << bad.why;
    }
  }
}
#endif

// A norm's vector has the same bits whatever the call's row count (CUDA takes a warp per vector
// for many rows and a block per vector for few) and the rows' alignment (CUDA reads by float4
// where it can): rows normed in calls of 700, 3 and 1 rows, and from a copy one float off the
// aligned base (scalar reads), plain, gated and l2, at dims that are and are not multiples of 4.
TEST(OpsNormRows, VectorBitsDoNotDependOnTheRowCount) {
  struct Form {
    int64_t dim, ld;
    bool gated;
  };
  for (const Backend& b : backends_under_test()) {
    for (const Form& f : {Form{1024, 1024, false}, Form{2048, 2048, true}, Form{1000, 1003, false},
                          Form{512, 516, true}, Form{1022, 1022, true}}) {
      const int64_t rows = 700;
      const std::vector<float> xv = randn_seeded(size_t(rows * f.ld), 71, 2.0f);
      const std::vector<float> gv = randn_seeded(size_t(rows * f.ld), 72, 2.0f);
      const std::vector<float> wv = randn_seeded(size_t(f.dim), 73, 0.5f);
      Floats x(xv.begin(), xv.end()), g(gv.begin(), gv.end()), w(wv.begin(), wv.end());
      // The same rows one float past the aligned base.
      Floats shifted(size_t(rows * f.ld + 1), 0.0f), gshifted(size_t(rows * f.ld + 1), 0.0f);
      std::copy(xv.begin(), xv.end(), shifted.begin() + 1);
      std::copy(gv.begin(), gv.end(), gshifted.begin() + 1);
      bool off = false;  // read x (and the gate) from the shifted copies
      auto norm = [&](int64_t first, int64_t n) {
        Floats y(size_t(n * f.ld), 0.0f);
        const float* xs = off ? shifted.data() + 1 : x.data();
        const float* gs = off ? gshifted.data() + 1 : g.data();
        b.ops->rms_norm({.x = xs + first * f.ld,
                         .ldx = f.ld,
                         .y = y.data(),
                         .ldy = f.ld,
                         .rows = n,
                         .dim = f.dim,
                         .w = w.data(),
                         .eps = 1e-6f,
                         .scale = f.gated ? NormScale::w : NormScale::one_plus_w,
                         .gate = f.gated ? gs + first * f.ld : nullptr,
                         .ldg = f.ld});
        b.ops->synchronize();
        return y;
      };
      auto l2 = [&](int64_t first, int64_t n) {
        Floats y(size_t(n * f.ld + 1), 0.0f);  // from y.data() + 1 when off
        const int64_t o = off ? 1 : 0;
        std::copy(x.begin() + first * f.ld, x.begin() + (first + n) * f.ld, y.begin() + o);
        b.ops->l2_norm({.x = y.data() + o,
                        .ldx = f.ld,
                        .rows = n,
                        .heads = f.dim / 128,
                        .dim = 128,
                        .eps = 1e-6f,
                        .post_scale = 0.25f});
        b.ops->synchronize();
        return Floats(y.begin() + o, y.begin() + o + n * f.ld);
      };
      for (const auto& op : {std::function<Floats(int64_t, int64_t)>(norm),
                             std::function<Floats(int64_t, int64_t)>(l2)}) {
        off = false;
        const Floats all = op(0, rows);
        for (bool shift : {false, true}) {
          off = shift;
          for (const auto& [first, n] : {std::pair<int64_t, int64_t>{5, 3}, {411, 1}, {699, 1}}) {
            const Floats part = op(first, n);
            EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + first * f.ld))
                << b.name << ": dim " << f.dim << (f.gated ? " gated" : "") << ", rows " << first
                << " .. " << first + n - 1 << (shift ? " (unaligned)" : "")
                << " alone != in a call of " << rows;
          }
        }
      }
    }
  }
}

// bf16 rows for a projection (NormArgs::yb, GluArgs::outb, GemmArgs::xb), on every backend and
// the reference: a norm's or glu's bf16 results are its f32 results rounded once (nearest even),
// bit for bit, and a GEMM reading the rounded rows gives the bits of the same GEMM rounding f32
// rows itself. Shapes take each kernel form: norms a warp (dim <= 256) and a block per vector,
// heads and the gated form; glu four columns at a time and one, with up and as a gate; GEMMs of
// stacked bf16 weights, accumulating and not, at 1 and 70 rows.
TEST(OpsBf16Rows, SameBitsAsRoundingAfterTheOp) {
  std::vector<Backend> all = backends_under_test();
  all.push_back({"reference", &reference_ops()});
  auto rounded = [](const Floats& y) {
    std::vector<uint16_t> r;
    for (float v : y) r.push_back(f32_to_bf16(v).bits);
    return r;
  };
  // The first n bf16 values of buf (slots an op does not write stay 0).
  auto bits_of = [](const Floats& buf, size_t n) {
    const auto* p = reinterpret_cast<const uint16_t*>(buf.data());
    return std::vector<uint16_t>(p, p + n);
  };
  for (const Backend& b : all) {
    const Ops& ops = *b.ops;
    struct NormForm {
      int64_t heads, dim, hs;
      bool gated;
    };
    for (const NormForm& f : {NormForm{1, 96, 96, false}, NormForm{1, 1024, 1024, false},
                              NormForm{4, 24, 32, true}, NormForm{2, 300, 300, true}}) {
      const int64_t rows = 9, ld = f.heads * f.hs + 3;
      const std::vector<float> xv = randn_seeded(size_t(rows * ld), 61, 3.0f);
      const std::vector<float> gv = randn_seeded(size_t(rows * ld), 62, 2.0f);
      const std::vector<float> wv = randn_seeded(size_t(f.dim), 63, 0.5f);
      Floats x(xv.begin(), xv.end()), g(gv.begin(), gv.end()), w(wv.begin(), wv.end());
      Floats y(size_t(rows * ld), 0.0f);
      Floats yb(size_t(rows * ld), 0.0f);  // twice what the bf16 rows need
      std::vector<uint16_t> want = bits_of(yb, size_t(rows * ld));
      NormArgs a{.x = x.data(),
                 .ldx = ld,
                 .hx = f.hs,
                 .y = y.data(),
                 .ldy = ld,
                 .hy = f.hs,
                 .rows = rows,
                 .heads = f.heads,
                 .dim = f.dim,
                 .w = w.data(),
                 .eps = 1e-6f,
                 .scale = f.gated ? NormScale::w : NormScale::one_plus_w,
                 .gate = f.gated ? g.data() : nullptr,
                 .ldg = ld,
                 .hg = f.hs};
      ops.rms_norm(a);
      a.y = nullptr;
      a.yb = reinterpret_cast<bf16*>(yb.data());
      ops.rms_norm(a);
      ops.synchronize();
      const std::vector<uint16_t> r = rounded(y);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t h = 0; h < f.heads; ++h)
          for (int64_t j = 0; j < f.dim; ++j) {
            const size_t o = size_t(i * ld + h * f.hs + j);
            want[o] = r[o];
          }
      EXPECT_EQ(bits_of(yb, size_t(rows * ld)), want)
          << b.name << ": rms_norm, " << f.heads << " heads of " << f.dim
          << (f.gated ? ", gated" : "");
    }
    for (int64_t n : {int64_t(96), int64_t(37)}) {
      for (bool gate_only : {false, true}) {
        const int64_t rows = 11, ld = 2 * n + 4, ldo = n + 4;
        const std::vector<float> gu = randn_seeded(size_t(rows * ld), 64, 3.0f);
        const std::vector<float> ov = randn_seeded(size_t(rows * ldo), 65, 2.0f);
        Floats in(gu.begin(), gu.end()), out(ov.begin(), ov.end());
        Floats outb(size_t(rows * ldo), 0.0f);
        GluArgs a{.gate = in.data(),
                  .ldg = ld,
                  .up = gate_only ? nullptr : in.data() + n,
                  .ldu = ld,
                  .out = out.data(),
                  .ldo = ldo,
                  .rows = rows,
                  .n = n,
                  .act = gate_only ? Activation::sigmoid : Activation::silu,
                  .outb = reinterpret_cast<bf16*>(outb.data())};
        ops.glu(a);  // first: out is still the gate-only form's input
        ops.synchronize();
        a.outb = nullptr;
        ops.glu(a);
        ops.synchronize();
        std::vector<uint16_t> want = bits_of(outb, size_t(rows * ldo));
        const std::vector<uint16_t> r = rounded(out);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < n; ++j) want[size_t(i * ldo + j)] = r[size_t(i * ldo + j)];
        std::vector<uint16_t> got = bits_of(outb, size_t(rows * ldo));
        for (int64_t i = 0; i < rows; ++i)  // slots past n: not written (zero)
          for (int64_t j = n; j < ldo; ++j) EXPECT_EQ(got[size_t(i * ldo + j)], 0);
        EXPECT_EQ(got, want) << b.name << ": glu, n " << n << (gate_only ? ", gate only" : "");
      }
    }
    const int64_t K = 300, N0 = 40, N1 = 24;
    std::vector<bf16> wb;
    for (float v : randn_seeded(size_t((N0 + N1) * K), 66, 0.05f)) wb.push_back(f32_to_bf16(v));
    const Tensor wt = ops.upload(Tensor::from_vector(wb, {N0 + N1, K}));
    const Tensor w0 = wt.slice(0, 0, N0), w1 = wt.slice(0, N0, N0 + N1);
    for (int64_t m : {int64_t(1), int64_t(70)}) {
      for (bool acc : {false, true}) {
        const int64_t ldx = K + 6, ldy = N0 + N1 + 2;
        const std::vector<float> xv = randn_seeded(size_t(m * ldx), 67);
        const std::vector<float> y0 = randn_seeded(size_t(m * ldy), 68);
        Floats x(xv.begin(), xv.end());
        Floats xh(size_t(m * ldx), 0.0f);
        auto* xb = reinterpret_cast<bf16*>(xh.data());
        for (size_t i = 0; i < xv.size(); ++i) xb[i] = f32_to_bf16(xv[i]);
        auto run = [&](bool rows_bf16) {
          Floats y(y0.begin(), y0.end());
          const GemmOutput go[] = {{.w = &w0, .y = y.data(), .ldy = ldy, .accumulate = acc},
                                   {.w = &w1, .y = y.data() + N0, .ldy = ldy, .accumulate = acc}};
          ops.gemm({.x = rows_bf16 ? nullptr : x.data(),
                    .xb = rows_bf16 ? xb : nullptr,
                    .m = m,
                    .k = K,
                    .ldx = ldx,
                    .outputs = go,
                    .precision = GemmPrecision::bf16});
          ops.synchronize();
          return y;
        };
        EXPECT_TRUE(bitwise_equal(run(true), run(false)))
            << b.name << ": gemm of bf16 rows, m " << m << (acc ? ", accumulating" : "");
      }
    }
  }
}

// The CUDA delta rule's chunked form runs a launch's chunks in segments that fit its workspace
// (DEG_CUDA_DELTA_RULE_WORKSPACE shrinks it to one chunk of every row a segment): every backend
// gives the same bits either way (the CPU ignores the variable).
TEST(OpsDeltaRule, SegmentsChangeNoBit) {
  const OpCase c =
      delta_rule_case("delta_rule_segments", {.k_heads = 1, .v_heads = 2, .dk = 32, .dv = 40}, {});
  const RunFn run = c.make();
  for (const Backend& b : backends_under_test()) {
    const Batch whole = run(*b.ops, kInOrder);
    ::setenv("DEG_CUDA_DELTA_RULE_WORKSPACE", "1", 1);
    const Batch segments = run(*b.ops, kInOrder);
    ::unsetenv("DEG_CUDA_DELTA_RULE_WORKSPACE");
    ASSERT_EQ(whole.size(), segments.size());
    for (size_t u = 0; u < whole.size(); ++u)
      for (size_t r = 0; r < whole[u].size(); ++r)
        EXPECT_TRUE(bitwise_equal(whole[u][r].v, segments[u][r].v))
            << b.name << ": " << whole[u][r].name << " of unit " << u;
  }
}

// logit_picks (greedy decoding's reading of LM logits): on every backend and the reference, each
// row's best and second indices (ties: the first index), their logits, max and bad equal a plain
// scan, and sum = Σ exp(l - max) within 1e-12 (the CPU's in index order: exactly); a row's
// figures are the same bits alone as among 7 rows. Rows with ties, -inf, NaN, +inf and no finite
// logit; n = 70001 (several strides of a block) and n = 3.
TEST(OpsLogitPicks, EveryRowIsAScanAndAloneAsInABatch) {
  for (int64_t n : {int64_t(70001), int64_t(3)}) {
    const int64_t rows = 7, ld = n + 5;
    const std::vector<float> values = randn_seeded(size_t(rows * ld), 61, 3.0f);
    Floats logits(values.begin(), values.end());
    auto at = [&](int64_t r, int64_t i) -> float& { return logits[size_t(r * ld + i)]; };
    for (int64_t i = 0; i < n; ++i) at(1, i) = std::round(at(1, i));  // ties everywhere
    at(2, n / 2) = -INFINITY;
    at(3, n - 1) = NAN;
    at(4, 0) = INFINITY;
    for (int64_t i = 0; i < n; ++i) at(5, i) = -INFINITY;
    at(6, n - 1) = at(6, 0) = 1e3f;  // the same largest twice
    std::vector<Backend> all_backends = backends_under_test();
    all_backends.push_back({"reference", &reference_ops()});
    for (const Backend& b : all_backends) {
      {
        const Ops& o = *b.ops;
        const std::string& name = b.name;
        auto run = [&](int64_t first, int64_t m) {
          const size_t k = static_cast<size_t>(m);
          testing::ManagedVector<int32_t> best(k), second(k), bad(k);
          Floats bl(k), sl(k);
          testing::ManagedVector<double> mx(k), sum(k);
          o.logit_picks({.logits = logits.data() + first * ld,
                         .ld = ld,
                         .rows = m,
                         .n = n,
                         .best = best.data(),
                         .second = second.data(),
                         .best_logit = bl.data(),
                         .second_logit = sl.data(),
                         .max = mx.data(),
                         .sum = sum.data(),
                         .bad = bad.data()});
          o.synchronize();
          std::vector<std::vector<double>> out;
          for (int64_t r = 0; r < m; ++r)
            out.push_back({double(best[size_t(r)]), double(second[size_t(r)]),
                           double(bl[size_t(r)]), double(sl[size_t(r)]), mx[size_t(r)],
                           sum[size_t(r)], double(bad[size_t(r)])});
          return out;
        };
        const auto all = run(0, rows);
        for (int64_t r = 0; r < rows; ++r) {
          SCOPED_TRACE(name + " n " + std::to_string(n) + " row " + std::to_string(r));
          int64_t b1 = -1, b2 = -1;
          bool bad = false;
          for (int64_t i = 0; i < n; ++i) {
            const float v = at(r, i);
            if (!std::isfinite(v)) {
              bad = bad || !(v < 0);
              continue;
            }
            if (b1 < 0 || v > at(r, b1)) {
              b2 = b1;
              b1 = i;
            } else if (b2 < 0 || v > at(r, b2)) {
              b2 = i;
            }
          }
          const std::vector<double>& got = all[size_t(r)];
          EXPECT_EQ(got[0], double(b1));
          EXPECT_EQ(got[1], double(b2));
          if (b1 >= 0) {
            EXPECT_EQ(got[2], double(at(r, b1)));
            EXPECT_EQ(got[4], double(at(r, b1)));
            double sum = 0;
            for (int64_t i = 0; i < n; ++i)
              if (std::isfinite(at(r, i))) sum += std::exp(double(at(r, i)) - double(at(r, b1)));
            EXPECT_NEAR(got[5], sum, 1e-12 * sum);
            if (name != "cuda") {
              EXPECT_EQ(got[5], sum);  // the CPU sums in index order
            }
          }
          if (b2 >= 0) {
            EXPECT_EQ(got[3], double(at(r, b2)));
          }
          EXPECT_EQ(got[6], bad ? 1.0 : 0.0);
          const auto alone = run(r, 1);
          EXPECT_EQ(alone[0], got) << "alone != in the batch";
        }
      }
    }
  }
}

// transpose is a copy: every backend's equals the loop, bit for bit, over shapes that are and
// are not multiples of the 32 x 32 tiles, with row strides wider than the rows.
TEST(OpsTranspose, EveryBackendEqualsTheLoop) {
  const int64_t shapes[][4] = {{1, 1, 1, 1},     {7, 5, 9, 8},           {32, 32, 32, 32},
                               {33, 65, 70, 40}, {1792, 512, 512, 1792}, {3, 100, 100, 5}};
  for (const auto& [rows, cols, ldx, ldy] : shapes) {
    const std::vector<float> x = randn_seeded(size_t(rows * ldx), 7);
    std::vector<float> want(size_t(cols * ldy), -1.0f);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) want[size_t(j * ldy + i)] = x[size_t(i * ldx + j)];
    for (const Backend& b : backends_under_test()) {
      Floats xs(x.begin(), x.end());
      Floats y(want.size(), -1.0f);
      b.ops->transpose(xs.data(), ldx, y.data(), ldy, rows, cols);
      b.ops->synchronize();
      EXPECT_TRUE(std::equal(y.begin(), y.end(), want.begin()))
          << b.name << ": " << rows << " x " << cols;
    }
  }
}

}  // namespace
}  // namespace deg
