// Shared backbone machinery: state allocation and growth, chunked prefill, fork rows over
// prefixes by reference, and the per-row views every family layer reads its state through.
#include "model/backbone.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace deg {

namespace {

constexpr int64_t kLmHeadRows = 32768;  // vocabulary rows of the LM head per product

const float* row_ptr(const Tensor& t, int64_t row) {
  if (!t.defined() || t.numel() == 0) return nullptr;
  return t.data<float>() + row * (t.numel() / t.dim(0));
}
float* row_ptr_mut(const Tensor& t, int64_t row) {
  if (!t.defined() || t.numel() == 0) return nullptr;
  return t.mutable_data<float>() + row * (t.numel() / t.dim(0));
}

Shape row_shape(int64_t rows, const Shape& per_row) {
  Shape s{rows};
  s.insert(s.end(), per_row.begin(), per_row.end());
  return s;
}

// K/V [B, Hkv, cap, D] grown to `capacity`, keeping positions [0, keep[b]) of every row. The old
// buffer is released when the last view of it goes (consume: peak = K/V + one layer).
void grow_kv(const Ops& ops, Tensor& t, int64_t capacity, const std::vector<int64_t>& keep) {
  const int64_t B = t.dim(0), H = t.dim(1), old_cap = t.dim(2), D = t.dim(3);
  Tensor grown = ops.alloc({B, H, capacity, D}, DType::f32);
  if (old_cap > 0) {
    const float* src = t.data<float>();
    float* dst = grown.mutable_data<float>();
    for (int64_t b = 0; b < B; ++b) {
      ops.copy_rows(src + b * H * old_cap * D, old_cap * D, dst + b * H * capacity * D,
                    capacity * D, H, std::min(keep[size_t(b)], old_cap) * D);
    }
  }
  t = std::move(grown);
}

bool owns_kv(const LayerSpec& l) {
  return l.kind == LayerKind::attention && l.kv_source < 0;
}

// Earlier positions of a row with `length` tokens that a layer's trunk state keeps. A sliding
// layer keeps its last window - 1 positions and, before them, back to a position that is a
// multiple of kSkippedAlign (at most kSkippedAlign - 1 more): the kept keys then start at an
// absolute key index aligned to the 64-key blocks a backend may cut keys into (the CUDA
// attention), so a query's blocks are the same whether its keys come from one read or from a
// kept window.
int64_t kept(const LayerSpec& l, int64_t length) {
  if (l.window <= 0 || length <= l.window - 1) return length;
  return length - (length - (l.window - 1)) / kSkippedAlign * kSkippedAlign;
}

// A sliding layer's K/V after a call: row b has ext[b] keys at [0, ext[b]); only the last
// keep[b] stay, moved to the front.
void keep_window(const Ops& ops, const Tensor& t, const std::vector<int64_t>& ext,
                 const std::vector<int64_t>& keep) {
  const int64_t B = t.dim(0), H = t.dim(1), cap = t.dim(2), D = t.dim(3);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = ext[size_t(b)], k = std::min(n, keep[size_t(b)]);
    if (k == n) continue;
    float* p = t.mutable_data<float>() + b * H * cap * D;
    ops.copy_rows(p + (n - k) * D, cap * D, p, cap * D, H, k * D);
  }
}

// A deep copy of a state tensor on its own device.
Tensor clone_state(const Tensor& t) {
  if (t.device() == Device::cpu) return t.clone();
  const Ops& ops = ops_for(t.device());
  Tensor c = ops.alloc(t.shape(), t.dtype());
  DEG_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "state tensor {}", t.describe());
  ops.copy_rows(t.data<float>(), t.numel(), c.mutable_data<float>(), t.numel(), 1, t.numel());
  return c;
}

void check_soft(const TokenBatch& batch, const BackboneSpec& spec) {
  const SoftTokens& soft = batch.soft;
  if (soft.empty()) return;
  if (spec.soft_id < 0) {
    throw Error(ErrorKind::unsupported,
                "the " + spec.family +
                    " backbone reads no media (soft tokens); use a model whose family does "
                    "(gemma4)");
  }
  if (int64_t(soft.rows.size()) != batch.rows * batch.tokens) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("soft-token rows: {} entries for a [{}, {}] batch", soft.rows.size(),
                            batch.rows, batch.tokens));
  }
  const Tensor& e = soft.embeddings;
  const int64_t n = e.rank() == 2 ? e.dim(0) : 0;
  if (e.rank() != 2 || e.dtype() != DType::f32 || e.dim(1) != spec.hidden || !e.is_contiguous()) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("soft-token embeddings must be f32 [n, {}] (the model's hidden size)",
                            spec.hidden));
  }
  for (int32_t r : soft.rows) {
    if (r < -1 || r >= n) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("soft-token row {} outside the {} embeddings given", r, n));
    }
  }
}

void check_batch(const TokenBatch& batch, int64_t vocab) {
  if (int64_t(batch.ids.size()) != batch.rows * batch.tokens ||
      int64_t(batch.lengths.size()) != batch.rows) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("token batch of {} ids and {} lengths is not [{}, {}]",
                            batch.ids.size(), batch.lengths.size(), batch.rows, batch.tokens));
  }
  for (int64_t len : batch.lengths) {
    if (len < 0 || len > batch.tokens) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("row length {} outside [0, {}]", len, batch.tokens));
    }
  }
  for (int32_t id : batch.ids) {
    if (id < 0 || id >= vocab) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("token id {} outside the vocabulary [0, {})", id, vocab));
    }
  }
}

// A row's last `n_hist` ids [n_hist] after it reads ids [n] more.
void history_append(int32_t* hist, int64_t n_hist, const int32_t* ids, int64_t n) {
  if (n >= n_hist) {
    std::copy(ids + n - n_hist, ids + n, hist);
    return;
  }
  std::copy(hist + n, hist + n_hist, hist);
  std::copy(ids, ids + n, hist + n_hist - n);
}

}  // namespace

Exec Backbone::call_exec() const {
  // This thread's scratch for calls on the backbone's device, kept between calls so that its
  // memory is reused (a decode step allocates nothing once the first step has run).
  thread_local Arena host_arena(Device::cpu);
  thread_local Arena cuda_arena(Device::cuda);
  return {.ops = *ops_, .arena = ops_->device() == Device::cuda ? cuda_arena : host_arena};
}

Arena& Backbone::io_arena() const {
  thread_local Arena host_io(Device::cpu);
  thread_local Arena cuda_io(Device::cuda);
  return ops_->device() == Device::cuda ? cuda_io : host_io;
}

TokenBatch TokenBatch::single(const std::vector<int32_t>& ids) {
  return TokenBatch{
      .ids = ids, .rows = 1, .tokens = int64_t(ids.size()), .lengths = {int64_t(ids.size())}};
}

TokenBatch TokenBatch::padded(const std::vector<std::vector<int32_t>>& rows, int32_t pad_id) {
  TokenBatch b;
  b.rows = int64_t(rows.size());
  for (const auto& r : rows) b.tokens = std::max(b.tokens, int64_t(r.size()));
  b.ids.assign(size_t(b.rows * b.tokens), pad_id);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy(rows[i].begin(), rows[i].end(), b.ids.begin() + int64_t(i) * b.tokens);
    b.lengths.push_back(int64_t(rows[i].size()));
  }
  return b;
}

State State::clone() const {
  State s;
  s.lengths = lengths;
  s.capacity = capacity;
  s.history = history;
  for (const LayerState& l : layers) {
    LayerState c;
    if (l.rec.defined()) c.rec = clone_state(l.rec);
    if (l.tail.defined()) c.tail = clone_state(l.tail);
    if (l.k.defined()) c.k = clone_state(l.k);
    if (l.v.defined()) c.v = clone_state(l.v);
    s.layers.push_back(std::move(c));
  }
  return s;
}

State State::row(int64_t b) const {
  DEG_CHECK(b >= 0 && b < rows(), "state row {} of {}", b, rows());
  State s;
  s.lengths = {lengths[size_t(b)]};
  s.capacity = capacity;
  const size_t H = history.size() / lengths.size();
  s.history.assign(history.begin() + ptrdiff_t(size_t(b) * H),
                   history.begin() + ptrdiff_t(size_t(b + 1) * H));
  auto one = [&](const Tensor& t) { return t.defined() ? clone_state(t.slice(0, b, b + 1)) : t; };
  for (const LayerState& l : layers)
    s.layers.push_back({.rec = one(l.rec), .tail = one(l.tail), .k = one(l.k), .v = one(l.v)});
  return s;
}

int64_t Backbone::read_chunk() const {
  if (options_.read_chunk > 0) return options_.read_chunk;
  return ops_->device() == Device::cuda ? 8192 : 512;
}

Backbone::Backbone(std::unique_ptr<Family> family, BackboneOptions options)
    : family_(std::move(family)), options_(options), ops_(nullptr) {
  DEG_CHECK(family_ != nullptr, "backbone without a family");
  ops_ = &family_->ops();
  options_.device = ops_->device();
  if (options_.device == Device::cuda && options_.cuda_precision)
    options_.precision = *options_.cuda_precision;
  // Soft positions' ids are replaced for the embedding only; a history would keep the originals.
  DEG_CHECK(spec().soft_id < 0 || spec().history == 0,
            "a family reading soft tokens keeps no token history");
  const auto& layers = spec().layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int src = layers[i].kv_source;
    if (src < 0) continue;
    DEG_CHECK(layers[i].kind == LayerKind::attention && size_t(src) < i &&
                  owns_kv(layers[size_t(src)]) &&
                  layers[size_t(src)].kv_heads == layers[i].kv_heads &&
                  layers[size_t(src)].head_dim == layers[i].head_dim &&
                  layers[size_t(src)].window == layers[i].window,
              "layer {} cannot share the K/V of layer {}", i, src);
  }
}

State Backbone::empty_state(int64_t rows) const {
  State s;
  s.lengths.assign(size_t(rows), 0);
  s.history.assign(size_t(rows * spec().history), 0);
  for (const LayerSpec& l : spec().layers) {
    LayerState ls;
    if (l.kind == LayerKind::recurrent) {
      ls.rec = ops_->alloc(row_shape(rows, l.rec_shape), DType::f32);
      ls.tail = ops_->alloc({rows, l.conv_kernel - 1, l.conv_channels}, DType::f32);
    } else if (owns_kv(l)) {
      ls.k = ops_->alloc({rows, l.kv_heads, 0, l.head_dim}, DType::f32);
      ls.v = ops_->alloc({rows, l.kv_heads, 0, l.head_dim}, DType::f32);
    }
    s.layers.push_back(std::move(ls));
  }
  return s;
}

void Backbone::run_layers(const Exec& x, const TokenBatch& batch, int64_t offset,
                          const RowTable& rows, const int32_t* history,
                          const std::vector<std::vector<RowView>>& views, float* hidden_out,
                          int64_t out_tokens, bool out_on_backend,
                          std::span<const int32_t> picks) const {
  const int64_t B = rows.rows, count = rows.tokens, C = spec().hidden, S = spec().stream_width();
  const bool host = ops_->device() == Device::cpu;
  Arena& io = io_arena();
  io.reset();
  float* h = io.floats(B * count * S);
  // Side streams start at zero on the CPU; a family with side streams writes every lane of
  // them in embed_rows (Gemma 4's per-layer inputs), so device memory needs no fill.
  if (host) std::fill(h, h + B * count * S, 0.0f);
  x.arena.reset();
  std::vector<int32_t> ids(size_t(B * count));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < count; ++t)
      ids[size_t(b * count + t)] = batch.ids[size_t(b * batch.tokens + offset + t)];
  // Soft tokens: their embedding rows, and the family's soft id in place of the placeholder.
  std::vector<int32_t> soft;
  if (!batch.soft.empty()) {
    soft.assign(size_t(B * count), -1);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < count; ++t) {
        const int32_t r = batch.soft.rows[size_t(b * batch.tokens + offset + t)];
        if (r < 0) continue;
        soft[size_t(b * count + t)] = r;
        ids[size_t(b * count + t)] = spec().soft_id;
      }
    }
  }
  // The call's ids, history and soft tokens where the backend reads them.
  auto place = [&](const std::vector<int32_t>& v) -> const int32_t* {
    if (host || v.empty()) return v.empty() ? nullptr : v.data();
    int32_t* d = io.ints(int64_t(v.size()));
    ops_->to_device(d, v.data(), v.size() * sizeof(int32_t));
    return d;
  };
  const int64_t Hn = spec().history;
  const std::vector<int32_t> hist =
      Hn > 0 ? std::vector<int32_t>(history, history + B * Hn) : std::vector<int32_t>{};
  Tensor soft_rows_on;
  if (!soft.empty() && !host) soft_rows_on = ops_->upload(batch.soft.embeddings);
  family_->embed_rows(
      x, {.ids = place(ids),
          .rows = rows,
          .history = Hn > 0 ? place(hist) : history,
          .h = h,
          .soft_rows = soft.empty() ? nullptr : place(soft),
          .soft = soft.empty() ? nullptr
                               : (host ? batch.soft.embeddings : soft_rows_on).data<float>()});
  for (size_t i = 0; i < spec().layers.size(); ++i) {
    x.arena.reset();  // a layer's scratch lives until the next layer starts
    family_->layer(
        x, int(i),
        {.h = h, .rows = rows, .views = views[i].data(), .precision = options_.precision});
  }
  x.arena.reset();
  if (S != C) x.ops.copy_rows(h, S, h, C, B * count, C);  // drop the side streams
  if (!picks.empty()) {
    // Only the picked token rows, gathered and normed, then copied out.
    const int64_t P = int64_t(picks.size());
    float* rows_of = x.arena.floats(P * C);
    const std::vector<int32_t> index(picks.begin(), picks.end());
    x.ops.gather_rows(h, C, place(index), rows_of, C, P, C);
    float* normed = host || out_on_backend ? hidden_out : x.arena.floats(P * C);
    family_->final_norm(x, rows_of, normed, P);
    if (normed != hidden_out) ops_->to_host(hidden_out, normed, size_t(P * C) * sizeof(float));
    return;
  }
  // Final norm straight into the result where the backend computes (the host on the CPU), or on
  // the device and then copied back.
  const bool direct = host || out_on_backend;
  float* normed = direct ? nullptr : x.arena.floats(B * count * C);
  if (!direct || count == out_tokens) {  // one call over every row
    family_->final_norm(x, h, direct ? hidden_out : normed, B * count);
  } else {
    for (int64_t b = 0; b < B; ++b)
      family_->final_norm(x, h + b * count * C, hidden_out + (b * out_tokens + offset) * C, count);
  }
  if (direct) return;
  if (count == out_tokens) {  // the whole result at once
    ops_->to_host(hidden_out, normed, size_t(B * count * C) * sizeof(float));
  } else {
    for (int64_t b = 0; b < B; ++b) {
      ops_->to_host(hidden_out + (b * out_tokens + offset) * C, normed + b * count * C,
                    size_t(count * C) * sizeof(float));
    }
  }
}

Tensor Backbone::prefill(const TokenBatch& batch, State& state, const PrefillProgress& progress,
                         bool on_backend) const {
  check_batch(batch, spec().vocab);
  check_soft(batch, spec());
  if (state.rows() != batch.rows) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("state has {} rows, the batch {}", state.rows(), batch.rows));
  }
  const int64_t B = batch.rows, L = batch.tokens, C = spec().hidden;
  const auto& layers = spec().layers;
  DEG_CHECK(int64_t(state.history.size()) == B * spec().history,
            "prefill: state without token history (make states with empty_state)");
  // Room for every row's whole input now, so chunks append in place; sliding layers: room for
  // their kept tail plus one chunk.
  const int64_t R = read_chunk();
  int64_t needed = 0;
  for (int64_t b = 0; b < B; ++b)
    needed = std::max(needed, state.lengths[size_t(b)] + batch.lengths[size_t(b)]);
  std::vector<int64_t> tails(static_cast<size_t>(B));
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!owns_kv(layers[i])) continue;
    int64_t room = needed;
    if (layers[i].window > 0) {
      room = 0;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t before = state.lengths[size_t(b)], n = batch.lengths[size_t(b)];
        tails[size_t(b)] = kept(layers[i], before);
        // A chunk reads next to at most window - 1 + kSkippedAlign - 1 kept keys.
        room = std::max(
            room, std::min(before + n, layers[i].window + kSkippedAlign - 2 + std::min(R, n)));
      }
    }
    if (room <= state.layers[i].k.dim(2)) continue;
    grow_kv(*ops_, state.layers[i].k, room, layers[i].window > 0 ? tails : state.lengths);
    grow_kv(*ops_, state.layers[i].v, room, layers[i].window > 0 ? tails : state.lengths);
  }
  state.capacity = std::max(state.capacity, needed);
  Tensor hidden =
      on_backend ? ops_->alloc({B, L, C}, DType::f32) : Tensor::empty({B, L, C}, DType::f32);
  const Exec exec = call_exec();
  std::vector<int64_t> lens(static_cast<size_t>(B)), pos(static_cast<size_t>(B));
  std::vector<std::vector<RowView>> views(layers.size(), std::vector<RowView>(size_t(B)));
  for (int64_t s = 0; s < std::max<int64_t>(L, 1); s += R) {
    const int64_t c = std::min(R, L - s);
    if (c <= 0) break;
    for (int64_t b = 0; b < B; ++b) {
      lens[size_t(b)] = std::clamp<int64_t>(batch.lengths[size_t(b)] - s, 0, c);
      pos[size_t(b)] = state.lengths[size_t(b)];
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerState& ls = state.layers[i];
      for (int64_t b = 0; b < B; ++b) {
        RowView& v = views[i][size_t(b)];
        if (layers[i].kind == LayerKind::recurrent) {
          v.rec_out = row_ptr_mut(ls.rec, b);
          v.rec_in = v.rec_out;
          v.tail_out = row_ptr_mut(ls.tail, b);
          v.tail_in = v.tail_out;
        } else if (owns_kv(layers[i])) {
          v.own_k = row_ptr_mut(ls.k, b);
          v.own_v = row_ptr_mut(ls.v, b);
          v.own_before = kept(layers[i], state.lengths[size_t(b)]);
          v.skipped = state.lengths[size_t(b)] - v.own_before;
          v.own_stride = ls.k.dim(2) * layers[i].head_dim;
        } else {
          v = views[size_t(layers[i].kv_source)][size_t(b)];
        }
      }
    }
    run_layers(exec, batch, s,
               {.rows = B, .tokens = c, .lengths = lens.data(), .positions = pos.data()},
               state.history.data(), views, hidden.mutable_data<float>(), L, on_backend);
    for (size_t i = 0; i < layers.size(); ++i) {
      if (!owns_kv(layers[i]) || layers[i].window == 0) continue;
      std::vector<int64_t> keep(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) {
        const int64_t before = state.lengths[size_t(b)];
        tails[size_t(b)] = kept(layers[i], before) + lens[size_t(b)];
        keep[size_t(b)] = kept(layers[i], before + lens[size_t(b)]);
      }
      keep_window(*ops_, state.layers[i].k, tails, keep);
      keep_window(*ops_, state.layers[i].v, tails, keep);
    }
    const int64_t Hn = spec().history;
    for (int64_t b = 0; b < B; ++b) {
      state.lengths[size_t(b)] += lens[size_t(b)];
      if (Hn > 0) {
        history_append(state.history.data() + b * Hn, Hn, batch.ids.data() + b * L + s,
                       lens[size_t(b)]);
      }
    }
    if (progress) progress(s + c, L);
  }
  // Sliding layers end with room for their tails only: a trunk's sliding state is bounded.
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!owns_kv(layers[i]) || layers[i].window == 0) continue;
    int64_t room = 0;
    for (int64_t b = 0; b < B; ++b) {
      tails[size_t(b)] = kept(layers[i], state.lengths[size_t(b)]);
      room = std::max(room, tails[size_t(b)]);
    }
    if (room >= state.layers[i].k.dim(2)) continue;
    grow_kv(*ops_, state.layers[i].k, room, tails);
    grow_kv(*ops_, state.layers[i].v, room, tails);
  }
  return hidden;
}

ForkState Backbone::fork(const std::vector<PrefixRef>& prefixes, const std::vector<int64_t>& prow,
                         int64_t capacity) const {
  ForkState fs;
  for (const PrefixRef& p : prefixes) {
    DEG_CHECK(p.state && p.row >= 0 && p.row < p.state->rows(), "fork: bad prefix row {}", p.row);
    const int64_t Hn = spec().history;
    DEG_CHECK(int64_t(p.state->history.size()) == p.state->rows() * Hn,
              "fork: prefix state without token history (make states with empty_state)");
    const auto hist = p.state->history.begin() + p.row * Hn;
    fs.prefixes.push_back({.layers = p.state->layers,
                           .row = p.row,
                           .length = p.state->lengths[size_t(p.row)],
                           .history = std::vector<int32_t>(hist, hist + Hn)});
  }
  for (int64_t r : prow) {
    if (r < 0 || r >= int64_t(prefixes.size())) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("fork row names prefix {} of {}", r, prefixes.size()));
    }
  }
  const int64_t B = int64_t(prow.size());
  fs.prow = prow;
  fs.own_len.assign(size_t(B), 0);
  fs.capacity = std::max<int64_t>(capacity, 1);
  const ForkHistory h = options_.fork_history;
  if (h == ForkHistory::always || (h == ForkHistory::preferred && ops_->prefers_delta_history())) {
    fs.hist_cap = std::min(fs.capacity, kDeltaHistoryMax);
  }
  for (const LayerSpec& l : spec().layers) {
    LayerState own;
    if (owns_kv(l)) {
      own.k = ops_->alloc({B, l.kv_heads, fs.capacity, l.head_dim}, DType::f32);
      own.v = ops_->alloc({B, l.kv_heads, fs.capacity, l.head_dim}, DType::f32);
    }
    fs.own.push_back(std::move(own));
  }
  return fs;
}

Tensor Backbone::fork_forward(const TokenBatch& batch, ForkState& fs, bool keep, bool /*decode*/,
                              std::span<const int64_t> picks) const {
  check_batch(batch, spec().vocab);
  check_soft(batch, spec());
  std::vector<int32_t> pick_rows;
  for (int64_t p : picks) {
    if (p < 0 || p >= batch.rows * batch.tokens) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("fork_forward: picked token {} is outside the batch's {} x {}", p,
                              batch.rows, batch.tokens));
    }
    pick_rows.push_back(int32_t(p));
  }
  if (batch.rows != fs.rows()) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("fork state has {} rows, the batch {}", fs.rows(), batch.rows));
  }
  const int64_t B = batch.rows, L = batch.tokens, C = spec().hidden;
  const auto& layers = spec().layers;
  // Fork state is static (DESIGN.md §4b): its K/V never move, so a decode step can be replayed
  // over the same buffers.
  for (int64_t b = 0; b < B; ++b) {
    if (fs.own_len[size_t(b)] + batch.lengths[size_t(b)] > fs.capacity) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("fork row {} would hold {} own tokens, more than the {} its forks "
                              "were made for (Backbone::fork capacity)",
                              b, fs.own_len[size_t(b)] + batch.lengths[size_t(b)], fs.capacity));
    }
  }
  // Recurrent state after this pass: the rows' own (kept) buffers, histories (history_layer),
  // or the fork state's scratch when nothing reads it back.
  auto history_layer = [&](size_t i) { return fs.hist_cap > 0 && layers[i].delta_k_heads > 0; };
  auto appends = [&](int64_t b) {  // a history row's kept pass that fits its history
    return keep && fs.own_len[size_t(b)] + batch.lengths[size_t(b)] <= fs.hist_cap;
  };
  bool folds = false;  // some history row's kept pass does not fit: its state goes to own rec
  for (int64_t b = 0; b < B && fs.hist_cap > 0; ++b)
    folds |= keep && !fs.owns_rec(b) && !appends(b);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    if (l.kind != LayerKind::recurrent) continue;
    LayerState& own = fs.own[i];
    if (keep && fs.fresh) {
      own.tail = ops_->alloc({B, l.conv_kernel - 1, l.conv_channels}, DType::f32);
      if (!history_layer(i)) own.rec = ops_->alloc(row_shape(B, l.rec_shape), DType::f32);
    }
    if (history_layer(i) && keep && !own.hist_k.defined()) {
      const int64_t Hv = l.rec_shape[0], Dk = l.rec_shape[1], Dv = l.rec_shape[2];
      own.hist_k = ops_->alloc({B, l.delta_k_heads, fs.hist_cap, Dk}, DType::f32);
      own.hist_d = ops_->alloc({B, Hv, fs.hist_cap, Dv}, DType::f32);
      own.hist_g = ops_->alloc({B, Hv, fs.hist_cap}, DType::f32);
    }
    if (history_layer(i) && folds && !own.rec.defined())
      own.rec = ops_->alloc(row_shape(B, l.rec_shape), DType::f32);
    if ((!keep || history_layer(i)) && !fs.scratch.defined()) {
      int64_t most = 0;
      for (const LayerSpec& m : layers)
        if (m.kind == LayerKind::recurrent) most = std::max(most, shape_numel(m.rec_shape));
      fs.scratch = ops_->alloc({B, std::max<int64_t>(most, 1)}, DType::f32);
    }
  }
  std::vector<int64_t> pos(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    pos[size_t(b)] = fs.prefixes[size_t(fs.prow[size_t(b)])].length + fs.own_len[size_t(b)];
  }
  std::vector<std::vector<RowView>> views(layers.size(), std::vector<RowView>(size_t(B)));
  for (size_t i = 0; i < layers.size(); ++i) {
    for (int64_t b = 0; b < B; ++b) {
      const ForkState::Prefix& p = fs.prefixes[size_t(fs.prow[size_t(b)])];
      const LayerState& pl = p.layers[i];
      RowView& v = views[i][size_t(b)];
      if (layers[i].kind == LayerKind::recurrent) {
        v.tail_in = fs.fresh ? row_ptr(pl.tail, p.row) : row_ptr(fs.own[i].tail, b);
        v.tail_out = keep ? row_ptr_mut(fs.own[i].tail, b) : nullptr;
        if (history_layer(i) && !fs.owns_rec(b)) {
          // The prefix's state and the row's history: appended to, read, or folded into own rec.
          const LayerState& own = fs.own[i];
          v.rec_in = row_ptr(pl.rec, p.row);
          if (own.hist_k.defined()) {
            v.hist = {.k = row_ptr_mut(own.hist_k, b),
                      .d = row_ptr_mut(own.hist_d, b),
                      .g = row_ptr_mut(own.hist_g, b),
                      .len = fs.own_len[size_t(b)],
                      .cap = fs.hist_cap,
                      .append = appends(b)};
          }
          const bool fold = keep && !appends(b);
          v.rec_out = fold ? row_ptr_mut(own.rec, b) : row_ptr_mut(fs.scratch, b);
          v.rec_scratch = !fold;
        } else {
          const bool from_own = history_layer(i) || !fs.fresh;
          v.rec_in = from_own ? row_ptr(fs.own[i].rec, b) : row_ptr(pl.rec, p.row);
          v.rec_out = keep ? row_ptr_mut(fs.own[i].rec, b) : row_ptr_mut(fs.scratch, b);
          v.rec_scratch = !keep;
        }
      } else if (!owns_kv(layers[i])) {
        v = views[size_t(layers[i].kv_source)][size_t(b)];
      } else {
        v.prefix_k = row_ptr(pl.k, p.row);
        v.prefix_v = row_ptr(pl.v, p.row);
        v.prefix_len = kept(layers[i], p.length);
        v.skipped = p.length - v.prefix_len;
        v.prefix_stride = pl.k.dim(2) * layers[i].head_dim;
        v.own_k = row_ptr_mut(fs.own[i].k, b);
        v.own_v = row_ptr_mut(fs.own[i].v, b);
        v.own_before = fs.own_len[size_t(b)];
        v.own_stride = fs.capacity * layers[i].head_dim;
      }
    }
  }
  // Each row's last ids: the prefix's, or its own once kept.
  const int64_t Hn = spec().history;
  std::vector<int32_t> hist(size_t(B * Hn));
  for (int64_t b = 0; b < B && Hn > 0; ++b) {
    const int32_t* from = fs.fresh ? fs.prefixes[size_t(fs.prow[size_t(b)])].history.data()
                                   : fs.own_history.data() + b * Hn;
    std::copy(from, from + Hn, hist.begin() + b * Hn);
  }
  Tensor hidden = picks.empty() ? Tensor::empty({B, L, C}, DType::f32)
                                : Tensor::empty({int64_t(picks.size()), C}, DType::f32);
  const Exec exec = call_exec();
  if (L > 0) {
    run_layers(exec, batch, 0,
               {.rows = B, .tokens = L, .lengths = batch.lengths.data(), .positions = pos.data()},
               hist.data(), views, hidden.mutable_data<float>(), L, false, pick_rows);
  }
  if (keep) {
    for (int64_t b = 0; b < B; ++b) {
      fs.own_len[size_t(b)] += batch.lengths[size_t(b)];
      if (Hn > 0) {
        history_append(hist.data() + b * Hn, Hn, batch.ids.data() + b * L,
                       batch.lengths[size_t(b)]);
      }
    }
    fs.own_history = std::move(hist);
    fs.fresh = false;
  }
  return hidden;
}

Tensor Backbone::lm_logits(const Tensor& hidden) const {
  const int64_t M = hidden.numel() / spec().hidden, V = family_->lm_head().dim(0);
  Tensor logits = Tensor::empty({M, V}, DType::f32);
  const Exec exec = call_exec();
  exec.arena.reset();
  const float* y = logits_on_backend(exec, hidden, logits.mutable_data<float>());
  if (ops_->device() != Device::cpu)
    ops_->to_host(logits.mutable_data<float>(), y, logits.nbytes());
  return logits;
}

std::vector<Backbone::LogitPick> Backbone::lm_picks(const Tensor& hidden,
                                                    std::optional<int64_t> id_limit) const {
  const int64_t M = hidden.numel() / spec().hidden, V = family_->lm_head().dim(0);
  const int64_t n = id_limit ? std::clamp<int64_t>(*id_limit, 1, V) : V;
  const Exec exec = call_exec();
  exec.arena.reset();
  const bool host = ops_->device() == Device::cpu;
  std::vector<float> host_logits(host ? size_t(M * V) : 0);
  const float* y = logits_on_backend(exec, hidden, host_logits.data());
  // The figures in the backend's memory, [M] each in 9 M floats: best, second, their logits,
  // max and sum (doubles: two floats each), bad; then all of them back at once.
  std::vector<float> out(static_cast<size_t>(9 * M));
  float* o = host ? out.data() : exec.arena.floats(9 * M);
  exec.ops.logit_picks({.logits = y,
                        .ld = V,
                        .rows = M,
                        .n = n,
                        .best = reinterpret_cast<int32_t*>(o),
                        .second = reinterpret_cast<int32_t*>(o + M),
                        .best_logit = o + 2 * M,
                        .second_logit = o + 3 * M,
                        .max = reinterpret_cast<double*>(o + 4 * M),
                        .sum = reinterpret_cast<double*>(o + 6 * M),
                        .bad = reinterpret_cast<int32_t*>(o + 8 * M)});
  if (!host) ops_->to_host(out.data(), o, out.size() * sizeof(float));
  std::vector<LogitPick> picks(static_cast<size_t>(M));
  for (int64_t r = 0; r < M; ++r) {
    LogitPick& p = picks[size_t(r)];
    int32_t bad = 0;
    std::memcpy(&p.best, out.data() + r, 4);
    std::memcpy(&p.second, out.data() + M + r, 4);
    p.best_logit = out[size_t(2 * M + r)];
    p.second_logit = out[size_t(3 * M + r)];
    std::memcpy(&p.max, out.data() + 4 * M + 2 * r, 8);
    std::memcpy(&p.sum, out.data() + 6 * M + 2 * r, 8);
    std::memcpy(&bad, out.data() + 8 * M + r, 4);
    p.bad = bad != 0;
  }
  return picks;
}

const float* Backbone::logits_on_backend(const Exec& exec, const Tensor& hidden,
                                         float* host_out) const {
  const int64_t C = spec().hidden;
  DEG_CHECK(hidden.dtype() == DType::f32 && hidden.dim(-1) == C && hidden.is_contiguous(),
            "lm_logits: hidden {} is not f32 [.., {}]", hidden.describe(), C);
  const int64_t M = hidden.numel() / C;
  const Tensor& head = family_->lm_head();
  const int64_t V = head.dim(0);
  const bool host = ops_->device() == Device::cpu;
  const float* x = hidden.data<float>();
  float* y = host_out;
  if (!host) {  // the hidden states to the device; the logits stay there
    float* xd = exec.arena.floats(M * C);
    ops_->to_device(xd, x, hidden.nbytes());
    x = xd;
    y = exec.arena.floats(M * V);
  }
  // The vocabulary in blocks of kLmHeadRows rows of the head: cuBLASLt pins no bf16 algorithm
  // for every M on Qwen3.5's whole [248320, 1024] head (on an H200), and one for each of the
  // (at most two) block shapes. A logit is the same one dot product either way.
  for (int64_t v0 = 0; v0 < V; v0 += kLmHeadRows) {
    const int64_t v1 = std::min(V, v0 + kLmHeadRows);
    const Tensor block = v0 == 0 && v1 == V ? head : head.slice(0, v0, v1);
    GemmOutput out{.w = &block, .y = y + v0, .ldy = V};
    exec.ops.gemm(
        {.x = x, .m = M, .k = C, .ldx = C, .outputs = {&out, 1}, .precision = options_.precision});
  }
  if (const float cap = spec().logit_softcap; cap > 0) {
    exec.ops.softcap({.y = y, .n = M * V, .cap = cap});
  }
  family_->finish_logits(exec, y, M * V);
  return y;
}

SoftTokens soft_at_placeholders(const BackboneSpec& spec, const std::vector<int32_t>& ids,
                                Tensor embeddings) {
  if (spec.media.empty()) {
    throw Error(ErrorKind::unsupported, "the " + spec.family + " backbone reads no media");
  }
  SoftTokens soft{.rows = std::vector<int32_t>(ids.size(), -1),
                  .embeddings = std::move(embeddings)};
  int32_t next = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    for (const BackboneSpec::Media& m : spec.media)
      if (ids[t] == m.placeholder) soft.rows[t] = next++;
  }
  const Tensor& e = soft.embeddings;
  if (e.rank() != 2 || e.dim(1) != spec.hidden) {
    throw Error(
        ErrorKind::invalid_argument,
        fmt::format("media embeddings must be [n, {}] (the model's hidden size)", spec.hidden));
  }
  if (next != e.dim(0)) {
    std::string kinds;
    for (const BackboneSpec::Media& m : spec.media)
      kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", m.kind, m.placeholder);
    throw Error(
        ErrorKind::invalid_argument,
        fmt::format("{} media placeholder ids ({}) but {} embedding rows", next, kinds, e.dim(0)));
  }
  return soft;
}

Tensor backbone_forward(const Backbone& backbone, const std::vector<int32_t>& ids, bool logits,
                        int64_t fork_at, const SoftTokens* soft) {
  const int64_t T = int64_t(ids.size()), C = backbone.spec().hidden;
  if (fork_at < 0 || fork_at >= std::max<int64_t>(T, 1)) {
    if (fork_at != 0) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("--fork-at {} must leave at least one token on each side of {} ids",
                              fork_at, T));
    }
  }
  State state = backbone.empty_state(1);
  Tensor hidden;
  // ids [from, to) as one row, with their soft tokens.
  auto piece = [&](int64_t from, int64_t to) {
    TokenBatch b = TokenBatch::single({ids.begin() + from, ids.begin() + to});
    if (soft && !soft->empty()) {
      if (int64_t(soft->rows.size()) != T) {
        throw Error(ErrorKind::invalid_argument,
                    fmt::format("{} soft-token rows for {} ids", soft->rows.size(), T));
      }
      b.soft = {.rows = {soft->rows.begin() + from, soft->rows.begin() + to},
                .embeddings = soft->embeddings};
    }
    return b;
  };
  if (fork_at == 0) {
    hidden = backbone.prefill(piece(0, T), state).view({T, C});
  } else {
    const TokenBatch rest = piece(fork_at, T);
    Tensor head = backbone.prefill(piece(0, fork_at), state);
    ForkState fs = backbone.fork({{.state = &state, .row = 0}}, {0}, T - fork_at);
    Tensor tail = backbone.fork_forward(rest, fs, /*keep=*/false);
    hidden = Tensor::empty({T, C}, DType::f32);
    std::memcpy(hidden.mutable_data<float>(), head.data<float>(), head.nbytes());
    std::memcpy(hidden.mutable_data<float>() + fork_at * C, tail.data<float>(), tail.nbytes());
  }
  return logits ? backbone.lm_logits(hidden) : hidden;
}

}  // namespace deg
