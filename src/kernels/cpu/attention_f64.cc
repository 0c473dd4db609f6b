// attention_f64 and its backward on the CPU (kernels/ops.h gives the arithmetic). A block of
// queries packs the keys it reads once: each key's dims in f64 and transposed (the key offset's
// dims already taken from the previous token), so a query's scores are dims-outer loops across
// its keys that vectorise, and values as rows. Every score, exponent, sum and output element
// still takes the same operations in the same order as a walk over one query's keys at a time:
// the product of two f32 is exact in f64 (a fused multiply-add gives the same sum), and this file
// is compiled with -ffp-contract=off, so f32 sums are never fused. Hence the same bits on every
// ISA version (DEG_CPU_CLONES) and however a call is split.
#include "kernels/cpu/attention_f64.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/vec.h"

namespace deg {

namespace {

// Output columns accumulated together in registers; packed value rows are padded to a multiple.
constexpr int64_t kCols = 8;
// Backward queries per block: a block's shares go into each key's gradient rows key by key.
constexpr int64_t kBackwardBlock = 32;

int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

// Attention positions of one row as seen by query head `head`: position j is token token(j) of
// the row, read from K/V head kv_head(j) (paired heads: token j / 2 holds positions 2 t and
// 2 t + 1, read from K/V heads slot and slot + H/2).
struct Positions {
  const AttendF64Args& a;
  const RowView& rv;
  int64_t slot = 0, half = 0;

  Positions(const AttendF64Args& args, const RowView& view, int64_t head)
      : a(args), rv(view), half(args.heads / 2) {
    slot = a.paired_heads ? head % half : head;
  }
  int64_t token(int64_t j) const { return a.paired_heads ? j / 2 : j; }
  int64_t kv_head(int64_t j) const { return a.paired_heads ? slot + (j % 2) * half : slot; }
  // K/V head g of token p: its offset in the prefix or the own buffers.
  int64_t at(int64_t g, int64_t p) const {
    return p < rv.prefix_len ? g * rv.prefix_stride + p * a.kv_dim
                             : g * rv.own_stride + (p - rv.prefix_len) * a.kv_dim;
  }
  const float* key(int64_t g, int64_t p) const {
    return (p < rv.prefix_len ? rv.prefix_k : rv.own_k) + at(g, p);
  }
  const float* value(int64_t g, int64_t p) const {
    return (p < rv.prefix_len ? rv.prefix_v : rv.own_v) + at(g, p);
  }
};

// A query: token t of row b under head h sits at attention position `last` and sees [first,
// last].
struct Query {
  int64_t n = 0;  // token index in the call
  int64_t first = 0, last = 0;
  int64_t keys() const { return last - first + 1; }
};

Query query_of(const AttendF64Args& a, int64_t b, int64_t h, int64_t t) {
  const int64_t n = b * a.rows.tokens + t, pos = a.rows.positions[b] + t;
  const int64_t last = a.paired_heads ? 2 * pos + h / (a.heads / 2) : pos;
  const int64_t seg =
      a.segment ? (a.paired_heads ? 2 * int64_t(a.segment[n]) : int64_t(a.segment[n])) : 0;
  return {.n = n, .first = std::max<int64_t>({0, last - a.window, seg}), .last = last};
}

// The keys and values of positions [lo, lo + n), packed.
struct Packed {
  int64_t lo = 0, n = 0;
  std::vector<double> kt;  // [qk_dim][n]: the dims a query meets, transposed
  std::vector<float> k;    // [n][qk_dim padded to kCols]: the same rows in f32 (backward)
  std::vector<double> vt;  // [v_dim][n] (backward)
  std::vector<float> v;    // [n][v_dim padded to kCols] (forward)
};

// Dims [offset_from, qk_dim) of a key come from the previous token's with the key offset.
[[gnu::always_inline]] inline void pack(const Positions& ps, int64_t lo, int64_t hi, bool backward,
                                        Packed& p) {
  const AttendF64Args& a = ps.a;
  const int64_t dq = a.qk_dim, dv = a.v_dim, n = hi - lo + 1;
  const int64_t dqp = round_up(dq, kCols), dvp = round_up(dv, kCols);
  p.lo = lo;
  p.n = n;
  p.kt.resize(size_t(dq * n));
  if (backward) {
    p.k.assign(size_t(n * dqp), 0.0f);
    p.vt.resize(size_t(dv * n));
  } else {
    p.v.assign(size_t(n * dvp), 0.0f);
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t tok = ps.token(lo + j), g = ps.kv_head(lo + j);
    const float* key = ps.key(g, tok);
    const float* shifted = a.key_offset && tok > 0 ? ps.key(g, tok - 1) : key;
    const int64_t own = a.key_offset ? a.offset_from : dq;
    for (int64_t d = 0; d < dq; ++d) p.kt[size_t(d * n + j)] = d < own ? key[d] : shifted[d];
    const float* val = ps.value(g, tok);
    if (backward) {
      for (int64_t d = 0; d < dq; ++d) p.k[size_t(j * dqp + d)] = d < own ? key[d] : shifted[d];
      for (int64_t d = 0; d < dv; ++d) p.vt[size_t(d * n + j)] = val[d];
    } else {
      std::copy(val, val + dv, p.v.begin() + j * dvp);
    }
  }
}

// out[j] = scale * float(sum_d q[d] k_j[d]) for the query's keys, each sum in f64 in dim order.
[[gnu::always_inline]] inline void scores(const Packed& p, const float* q, int64_t dq,
                                          const Query& qr, float scale, double* s, float* out) {
  const int64_t off = qr.first - p.lo, nk = qr.keys();
  std::fill(s, s + nk, 0.0);
  for (int64_t d = 0; d < dq; ++d) {
    const double qd = q[d];
    const double* kd = p.kt.data() + d * p.n + off;
    for (int64_t j = 0; j < nk; ++j) s[j] += qd * kd[j];
  }
  for (int64_t j = 0; j < nk; ++j) out[j] = scale * float(s[j]);
}

// Eight f32 columns, as one vector (GCC's vector extension: one AVX register, or two SSE).
typedef float F8 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The first n (<= kCols) columns at p, the rest zero.
[[gnu::always_inline]] inline F8 load8(const float* p, int64_t n) {
  float t[kCols] = {};
  std::copy(p, p + n, t);
  return load8(t);
}

[[gnu::always_inline]] inline void store8(float* p, F8 v, int64_t n) {
  float t[kCols];
  std::memcpy(t, &v, sizeof t);
  std::copy(t, t + n, p);
}

// acc += w[j] rows[j] over j in order, for the kCols columns at `rows` (rows at stride ld).
[[gnu::always_inline]] inline F8 weighted_rows(const float* w, const float* rows, int64_t ld,
                                               int64_t nk, F8 acc) {
  for (int64_t j = 0; j < nk; ++j) acc += w[j] * load8(rows + j * ld);
  return acc;
}

// The largest of e[0, nk) (NaNs skipped as std::max skips them): sixteen partial maxima, as a
// maximum does not depend on order.
[[gnu::always_inline]] inline float max_of(const float* e, int64_t nk) {
  float m[16];
  std::fill(m, m + 16, -INFINITY);
  int64_t j = 0;
  for (; j + 16 <= nk; j += 16)
    for (int l = 0; l < 16; ++l) m[l] = std::max(m[l], e[j + l]);
  float mx = -INFINITY;
  for (; j < nk; ++j) mx = std::max(mx, e[j]);
  for (int l = 0; l < 16; ++l) mx = std::max(mx, m[l]);
  return mx;
}

// e[j] = exp(e[j] - max) in f32; returns 1 / their sum, summed in f64 in key order.
[[gnu::always_inline]] inline float exponentiate(float* e, int64_t nk) {
  const float mx = max_of(e, nk);
  double sum = 0;
  for (int64_t j = 0; j < nk; ++j) {
    e[j] = std::exp(e[j] - mx);
    sum += e[j];
  }
  return float(1.0 / sum);
}

struct Scratch {
  Packed packed;
  std::vector<double> sums;
  std::vector<float> e, w, dp;
  std::vector<float> probs, shares;  // a backward block's, query after query
  std::vector<float> qpad, gopad;    // a backward block's queries and output gradients, padded
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

void attention_f64_zero_padded(const AttendF64Args& a) {
  const RowTable& r = a.rows;
  for (int64_t b = 0; b < r.rows; ++b)
    for (int64_t t = r.lengths[b]; t < r.tokens; ++t)
      for (int64_t h = 0; h < a.heads; ++h) {
        float* y = a.out + (b * r.tokens + t) * a.ldo + h * a.ho;
        std::fill(y, y + a.v_dim, 0.0f);
      }
}

DEG_CPU_CLONES void attention_f64_range(const AttendF64Args& a, int64_t b, int64_t h, int64_t t0,
                                        int64_t t1) {
  Scratch& sc = scratch();
  const Positions ps(a, a.views[b], h);
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const Query qr = query_of(a, b, h, t);
    lo = std::min(lo, qr.first);
    hi = std::max(hi, qr.last);
  }
  if (lo > hi) return;
  Packed& p = sc.packed;
  pack(ps, lo, hi, false, p);
  const int64_t dv = a.v_dim, dvp = round_up(dv, kCols);
  sc.sums.resize(size_t(p.n));
  sc.e.resize(size_t(p.n));
  sc.w.resize(size_t(p.n));
  for (int64_t t = t0; t < t1; ++t) {
    const Query qr = query_of(a, b, h, t);
    const int64_t nk = qr.keys();
    scores(p, a.q + qr.n * a.ldq + h * a.hq, a.qk_dim, qr, a.scale, sc.sums.data(), sc.e.data());
    const float inv = exponentiate(sc.e.data(), nk);
    for (int64_t j = 0; j < nk; ++j) sc.w[size_t(j)] = sc.e[size_t(j)] * inv;
    float* y = a.out + qr.n * a.ldo + h * a.ho;
    const float* rows = p.v.data() + (qr.first - p.lo) * dvp;
    for (int64_t c0 = 0; c0 < dv; c0 += kCols)
      store8(y + c0, weighted_rows(sc.w.data(), rows + c0, dvp, nk, F8{}),
             std::min(kCols, dv - c0));
  }
}

// Queries in blocks of kBackwardBlock: each query's probabilities, dq and its keys' shares (ds)
// in query order; then the block's shares go into the dK / dV rows key by key, each row's
// additions still in query order (and, for one query, its own key's share before the next key's
// key-offset share), so every element sums the same terms in the same order as a query-by-query
// walk, while a key's gradient rows stay in registers across the block.
DEG_CPU_CLONES void attention_f64_backward_task(const AttendF64BackwardArgs& a, int64_t slot) {
  const AttendF64Args& f = a.forward;
  const RowTable& r = f.rows;
  const int64_t dq = f.qk_dim, dv = f.v_dim, rot = f.offset_from;
  const int64_t dqp = round_up(dq, kCols);
  const int64_t half = f.heads / 2;
  const int64_t heads_of_task[2] = {slot, slot + half};
  const int nh = f.paired_heads ? 2 : 1;
  Scratch& sc = scratch();
  Packed& p = sc.packed;
  struct BlockQuery {
    Query qr;
    const float *q = nullptr, *go = nullptr;
    size_t at = 0;  // its probabilities and shares in the block's buffers
  };
  std::vector<BlockQuery> block;
  for (int64_t b = 0; b < r.rows; ++b) {
    const RowView& gv = a.dviews[b];
    for (int hi = 0; hi < nh; ++hi) {
      const int64_t h = heads_of_task[hi];
      const Positions ps(f, f.views[b], h);
      for (int64_t t0 = 0; t0 < r.lengths[b]; t0 += kBackwardBlock) {
        const int64_t t1 = std::min(r.lengths[b], t0 + kBackwardBlock);
        block.clear();
        int64_t jmin = INT64_MAX, jmax = 0;
        size_t total = 0;
        for (int64_t t = t0; t < t1; ++t) {
          const Query qr = query_of(f, b, h, t);
          block.push_back({.qr = qr,
                           .q = f.q + qr.n * f.ldq + h * f.hq,
                           .go = a.dout + qr.n * a.lddo + h * a.hdo,
                           .at = total});
          total += size_t(qr.keys());
          jmin = std::min(jmin, qr.first);
          jmax = std::max(jmax, qr.last);
        }
        pack(ps, jmin, jmax, true, p);
        sc.sums.resize(size_t(p.n));
        sc.e.resize(size_t(p.n));
        sc.dp.resize(size_t(p.n));
        sc.probs.resize(total);
        sc.shares.resize(total);
        for (const BlockQuery& bq : block) {
          const Query& qr = bq.qr;
          const int64_t nk = qr.keys(), off = qr.first - p.lo;
          float* e = sc.e.data();
          scores(p, bq.q, dq, qr, f.scale, sc.sums.data(), e);
          const float inv = exponentiate(e, nk);
          // dp_j = go . v_j in f64, dims in order.
          double* s = sc.sums.data();
          std::fill(s, s + nk, 0.0);
          for (int64_t d = 0; d < dv; ++d) {
            const double gd = bq.go[d];
            const double* vd = p.vt.data() + d * p.n + off;
            for (int64_t j = 0; j < nk; ++j) s[j] += gd * vd[j];
          }
          float* dp = sc.dp.data();
          for (int64_t j = 0; j < nk; ++j) dp[j] = float(s[j]);
          float* pr = sc.probs.data() + bq.at;
          float* sh = sc.shares.data() + bq.at;
          double dsum = 0;
          for (int64_t j = 0; j < nk; ++j) {
            pr[j] = e[j] * inv;
            dsum += double(pr[j]) * dp[j];
          }
          const float dsf = float(dsum);
          for (int64_t j = 0; j < nk; ++j) sh[j] = pr[j] * (dp[j] - dsf) * f.scale;
          if (!a.dq) continue;
          float* gq = a.dq + qr.n * a.lddq + h * a.hdq;
          const float* krows = p.k.data() + off * dqp;
          for (int64_t c0 = 0; c0 < dq; c0 += kCols) {
            const int64_t cn = std::min(kCols, dq - c0);
            store8(gq + c0, weighted_rows(sh, krows + c0, dqp, nk, load8(gq + c0, cn)), cn);
          }
        }
        // The block's shares into each key's rows: key j's own dims from its share, and with the
        // key offset the dims past `rot` of key j's row also from key j + 1's share.
        if (f.key_offset && jmin > 0) --jmin;  // the row before the first key: its share
        const int64_t dvp = round_up(dv, kCols), nb = int64_t(block.size());
        sc.qpad.assign(size_t(nb * dqp), 0.0f);
        sc.gopad.assign(size_t(nb * dvp), 0.0f);
        for (int64_t i = 0; i < nb; ++i) {
          std::copy(block[size_t(i)].q, block[size_t(i)].q + dq, sc.qpad.begin() + i * dqp);
          std::copy(block[size_t(i)].go, block[size_t(i)].go + dv, sc.gopad.begin() + i * dvp);
        }
        // row[c0, c0 + kCols) += weight(query) x rows[query] over the block's queries that see j.
        auto add_shares = [&](int64_t j, const std::vector<float>& weight, const float* rows,
                              int64_t ld, float* row, int64_t n) {
          for (int64_t c0 = 0; c0 < n; c0 += kCols) {
            const int64_t cn = std::min(kCols, n - c0);
            F8 acc = load8(row + c0, cn);
            for (int64_t i = 0; i < nb; ++i) {
              const Query& qr = block[size_t(i)].qr;
              if (j >= qr.first && j <= qr.last)
                acc +=
                    weight[block[size_t(i)].at + size_t(j - qr.first)] * load8(rows + i * ld + c0);
            }
            store8(row + c0, acc, cn);
          }
        };
        for (int64_t j = jmin; j <= jmax; ++j) {
          const int64_t kp = ps.token(j), g = ps.kv_head(j);
          const bool in_prefix = kp < f.views[b].prefix_len;
          float* dk = const_cast<float*>(in_prefix ? gv.prefix_k : gv.own_k);
          float* dvj = const_cast<float*>(in_prefix ? gv.prefix_v : gv.own_v);
          if (dvj) add_shares(j, sc.probs, sc.gopad.data(), dvp, dvj + ps.at(g, kp), dv);
          if (!dk) continue;
          dk += ps.at(g, kp);
          if (!f.key_offset) {
            add_shares(j, sc.shares, sc.qpad.data(), dqp, dk, dq);
            continue;
          }
          const int64_t own = kp > 0 ? rot : dq;
          for (const BlockQuery& bq : block) {
            const Query& qr = bq.qr;
            if (j >= qr.first && j <= qr.last) {
              const float ds = sc.shares[bq.at + size_t(j - qr.first)];
              for (int64_t d = 0; d < own; ++d) dk[d] += ds * bq.q[d];
            }
            if (j + 1 >= qr.first && j + 1 <= qr.last) {
              const float ds = sc.shares[bq.at + size_t(j + 1 - qr.first)];
              for (int64_t d = rot; d < dq; ++d) dk[d] += ds * bq.q[d];
            }
          }
        }
      }
    }
  }
}

}  // namespace deg
