// Hidden states for the heads and the heads' loss of an example (see features.h).
#include "train/features.h"

#include <cstring>

#include "core/error.h"

namespace deg::train {

Feats zeros_like(const Feats& f) {
  return {zeros(int64_t(f.ctx.size())), zeros(int64_t(f.answers.size())),
          zeros(int64_t(f.options.size())), f.option_at};
}

void LossStats::add(const LossStats& o) {
  for (int k = 0; k < 6; ++k) {
    sum[k] += o.sum[k];
    queries[k] += o.queries[k];
  }
}

double LossStats::total() const {
  double s = 0;
  for (double v : sum) s += v;
  return s;
}

double LossStats::balanced() const {
  double s = 0;
  for (int k = 0; k < 6; ++k)
    if (queries[k]) s += sum[k] / double(queries[k]);
  return s;
}

double example_loss(const Heads& heads, Heads& grad, const TaskExample& ex, const Feats& f,
                    Feats& df, LossStats* stats, const float* kind_weight,
                    float anchor_pos_weight) {
  const int64_t C = heads.hidden, T = ex.ctx_tokens;
  auto weight = [&](QueryHead h) { return kind_weight ? kind_weight[int(h)] : 1.0f; };
  LossStats st;
  std::vector<size_t> extracts, anchors;
  for (size_t i = 0; i < ex.queries.size(); ++i) {
    const TaskQuery& q = ex.queries[i];
    const float* a = f.answers.data() + int64_t(i) * C;
    float* da = df.answers.data() + int64_t(i) * C;
    double l = 0;
    switch (q.head) {
      case QueryHead::choice:
      case QueryHead::score: {
        const bool choice = q.head == QueryHead::choice;
        const int64_t at = f.option_at[i] * C;
        l = pointer_loss(choice ? heads.choice : heads.score, choice ? grad.choice : grad.score, a,
                         f.options.data() + at, int64_t(q.option_positions.size()), q.option, da,
                         df.options.data() + at, weight(q.head));
        break;
      }
      case QueryHead::noul: l = noul_loss(heads, grad, a, q.yes, da, weight(q.head)); break;
      case QueryHead::count:
        l = count_loss(heads, grad, a, q.count_lo, q.count_hi, q.count, da, weight(q.head));
        break;
      case QueryHead::extract: extracts.push_back(i); continue;
      case QueryHead::anchor: anchors.push_back(i); continue;
    }
    st.sum[int(q.head)] += l;
    ++st.queries[int(q.head)];
  }
  // Extracts and anchors over the context, all of a kind in one call (keys computed once).
  auto stacked = [&](const std::vector<size_t>& idx, auto&& loss) {
    if (idx.empty()) return;
    Buf a = zeros(int64_t(idx.size()) * C), da = zeros(int64_t(idx.size()) * C);
    for (size_t j = 0; j < idx.size(); ++j)
      std::memcpy(&a[j * size_t(C)], f.answers.data() + int64_t(idx[j]) * C,
                  sizeof(float) * size_t(C));
    const QueryHead kind = ex.queries[idx[0]].head;
    st.sum[int(kind)] += loss(a.data(), da.data());
    st.queries[int(kind)] += int64_t(idx.size());
    for (size_t j = 0; j < idx.size(); ++j)
      axpy(1.0f, &da[j * size_t(C)], df.answers.data() + int64_t(idx[j]) * C, C);
  };
  stacked(extracts, [&](const float* a, float* da) {
    std::vector<SpanQuery> sq;
    std::vector<SpanTarget> tg;
    for (size_t i : extracts) {
      sq.push_back(ex.queries[i].span_query);
      tg.push_back(ex.queries[i].span);
    }
    return span_loss(heads, grad, a, int64_t(extracts.size()), sq, tg, f.ctx.data(), T, da,
                     df.ctx.data(), weight(QueryHead::extract));
  });
  stacked(anchors, [&](const float* a, float* da) {
    std::vector<Region> regions;
    std::vector<std::vector<int64_t>> starts;
    for (size_t i : anchors) {
      regions.push_back(ex.queries[i].region);
      starts.push_back(ex.queries[i].starts);
    }
    return anchor_loss(heads, grad, a, int64_t(anchors.size()), regions, starts, f.ctx.data(), T,
                       da, df.ctx.data(), weight(QueryHead::anchor), anchor_pos_weight);
  });
  if (stats) stats->add(st);
  return st.total();
}

namespace {

// Appends query q's answer row and option rows from its rows of hidden states ([tokens, C]).
void gather_query(const TaskQuery& q, const float* rows, int64_t C, Feats& f) {
  const int64_t last = int64_t(q.ids.size()) - 1;
  f.answers.insert(f.answers.end(), rows + last * C, rows + (last + 1) * C);
  f.option_at.push_back(int64_t(f.options.size()) / C);
  for (int64_t p : q.option_positions)
    f.options.insert(f.options.end(), rows + p * C, rows + (p + 1) * C);
}

}  // namespace

Feats engine_features(const engine::DegModel& model, const TaskExample& ex) {
  const Backbone& bb = model.backbone();
  const int64_t C = bb.spec().hidden, T = ex.ctx_tokens;
  Feats f;
  State state = bb.empty_state(1);
  const Tensor trunk = bb.prefill(TokenBatch::single(ex.trunk), state);  // [1, L, C]
  f.ctx = trunk.select(0, 0).slice(0, ex.ctx_start, ex.ctx_start + T).contiguous().to_f32_vector();
  if (ex.queries.empty()) return f;
  std::vector<std::vector<int32_t>> rows;
  for (const TaskQuery& q : ex.queries) rows.push_back(q.ids);
  const TokenBatch batch = TokenBatch::padded(rows, model.pad_id());
  ForkState fs =
      bb.fork({{.state = &state, .row = 0}}, std::vector<int64_t>(rows.size(), 0), batch.tokens);
  const Tensor hidden = bb.fork_forward(batch, fs, /*keep=*/false).contiguous();  // [B, L, C]
  const float* h = hidden.data<float>();
  for (size_t i = 0; i < ex.queries.size(); ++i)
    gather_query(ex.queries[i], h + int64_t(i) * batch.tokens * C, C, f);
  return f;
}

Packed pack_examples(const std::vector<const TaskExample*>& examples) {
  Packed p;
  GptBatch& b = p.batch;
  auto push = [&](int32_t id, int32_t seg, int32_t prev, int32_t pos, int32_t lo, int32_t hi) {
    b.inputs.push_back(id);
    b.targets.push_back(-1);
    b.seg_start.push_back(seg);
    b.prev.push_back(prev);
    b.pos.push_back(pos);
    b.ctx_lo.push_back(lo);
    b.ctx_hi.push_back(hi);
  };
  for (const TaskExample* ex : examples) {
    const auto base = int32_t(b.inputs.size()), len = int32_t(ex->trunk.size());
    p.trunk_at.push_back(base);
    for (int32_t t = 0; t < len; ++t)
      push(ex->trunk[size_t(t)], base, t == 0 ? -1 : base + t - 1, t, 0, 0);
    p.query_at.emplace_back();
    for (const TaskQuery& q : ex->queries) {
      const auto q0 = int32_t(b.inputs.size());
      p.query_at.back().push_back(q0);
      for (int32_t i = 0; i < int32_t(q.ids.size()); ++i)
        push(q.ids[size_t(i)], q0, i == 0 ? base + len - 1 : q0 + i - 1, len + i, base, base + len);
    }
  }
  return p;
}

Feats packed_features(const Packed& p, const std::vector<const TaskExample*>& examples, size_t k,
                      const float* hidden, int64_t C) {
  const TaskExample& ex = *examples[k];
  Feats f;
  const float* ctx = hidden + (p.trunk_at[k] + ex.ctx_start) * C;
  f.ctx.assign(ctx, ctx + ex.ctx_tokens * C);
  for (size_t i = 0; i < ex.queries.size(); ++i)
    gather_query(ex.queries[i], hidden + p.query_at[k][i] * C, C, f);
  return f;
}

void scatter_features(const Packed& p, const std::vector<const TaskExample*>& examples, size_t k,
                      const Feats& df, float* dhidden, int64_t C) {
  const TaskExample& ex = *examples[k];
  axpy(1.0f, df.ctx.data(), dhidden + (p.trunk_at[k] + ex.ctx_start) * C, ex.ctx_tokens * C);
  for (size_t i = 0; i < ex.queries.size(); ++i) {
    const TaskQuery& q = ex.queries[i];
    float* row = dhidden + p.query_at[k][i] * C;
    const int64_t last = int64_t(q.ids.size()) - 1;
    axpy(1.0f, df.answers.data() + int64_t(i) * C, row + last * C, C);
    for (size_t o = 0; o < q.option_positions.size(); ++o)
      axpy(1.0f, df.options.data() + (df.option_at[i] + int64_t(o)) * C,
           row + q.option_positions[o] * C, C);
  }
}

}  // namespace deg::train
