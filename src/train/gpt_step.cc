// The gpt training step over the model's one definition (model/gpt.h): a GptBatch's packed
// stream as calls of the model (one row for the plain stream; documents and their fork queries
// as calls otherwise), the forward kept for the backward, the stream-ordered final hidden state
// for the loss, which runs on the same backend. The model runs over views of the parameters:
// the host GptParams' (on a GPU each step then copies them in and the gradients out), or a
// GptResident's in the backend's memory, where the gradients stay too.
#include "train/gpt_step.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/gpt.h"

namespace deg::train {

namespace {

// The model over the parameters (views, no copies but the family's own transposes) with the
// step's windows.
std::unique_ptr<Family> model_of(const GptParams& p, const GptStepOptions& o, const Ops& ops) {
  GptConfig cfg = p.config();
  cfg.window_short = o.window_short;
  cfg.window_long = o.window_long;
  TensorMap w;
  auto view = [&](const std::string& name, const float* data, const Shape& shape) {
    const size_t bytes = size_t(shape_numel(shape)) * sizeof(float);
    w[name] = Tensor(buffer_view(reinterpret_cast<std::byte*>(const_cast<float*>(data)), bytes), 0,
                     DType::f32, shape);
  };
  if (o.resident) {
    DEG_CHECK(o.resident->ops == &ops, "resident parameters on another backend");
    for (size_t k = 0; k < p.tensors().size(); ++k) w[p.tensors()[k].name] = o.resident->values[k];
  } else {
    for (const ParamTensor& t : p.tensors()) view(t.name, t.data.data(), t.shape);
  }
  if (o.resident) {
    w["ngram_sign_pool"] = o.resident->sign_pool;
  } else {
    view("ngram_sign_pool", p.sign_pool.data(), {cfg.ngram_sign_rows, cfg.ngram_dim});
  }
  for (const auto& [kind, r] : {std::pair{"narrow", &p.rotary_narrow}, {"wide", &p.rotary_wide}}) {
    const std::string pre = std::string("rotary.") + kind;
    view(pre + ".freq", r->freq.data(), {int64_t(r->freq.size())});
    view(pre + ".attn_scale", &r->attn_scale, {1});
  }
  return gpt_family(cfg, w, ops);
}

}  // namespace

// Where a segment of the stream lives in the calls.
struct Segment {
  int64_t start = 0, length = 0;
  int call = 0;
  int64_t row = 0;
};

struct GptPass {
  explicit GptPass(Device device) : ops(ops_for(device)), arena(device) {}
  const Ops& ops;
  std::unique_ptr<Family> model;
  Arena arena;
  std::vector<std::vector<int32_t>> ids, history, segment;  // per call
  std::vector<std::vector<int64_t>> lengths, positions;     // per call
  std::vector<GptTrainCall> calls;
  std::vector<Segment> segments;  // every segment of the stream, where it lives
  std::vector<float*> finals;     // per call [B L, C]
  Tensor dfinal;                  // [T, C] the loss's d(final) on the backend (!host_final)
  GptTapePtr tape;

  // Everything but the arena's memory.
  void clear() {
    tape.reset();
    model.reset();
    arena.reset();
    ids.clear();
    history.clear();
    segment.clear();
    lengths.clear();
    positions.clear();
    calls.clear();
    segments.clear();
    finals.clear();
    dfinal = Tensor();
  }
};

GptResident::GptResident(const GptParams& params, const Ops& backend) : ops(&backend) {
  constexpr int64_t kAlignFloats = 64;  // 256 bytes
  std::vector<int64_t> at;
  int64_t floats = 0;
  for (const ParamTensor& t : params.tensors()) {
    values.push_back(backend.upload(Tensor::from_vector(t.data, t.shape)));  // a copy
    at.push_back(floats);
    floats += (int64_t(t.data.size()) + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  }
  grad_block = backend.alloc({std::max<int64_t>(floats, 1)}, DType::f32);
  const GptConfig& c = params.config();
  sign_pool =
      backend.upload(Tensor::from_vector(params.sign_pool, {c.ngram_sign_rows, c.ngram_dim}));
  for (size_t k = 0; k < at.size(); ++k)
    grads.emplace_back(grad_block.buffer(), grad_block.byte_offset() + size_t(at[k]) * 4,
                       DType::f32, params.tensors()[k].shape);
}

std::vector<float*> GptResident::value_ptrs() {
  std::vector<float*> v;
  for (Tensor& t : values) v.push_back(t.mutable_data<float>());
  return v;
}

std::vector<float*> GptResident::grad_ptrs() {
  std::vector<float*> v;
  for (Tensor& t : grads) v.push_back(t.mutable_data<float>());
  return v;
}

void GptResident::download(GptParams& params) const {
  auto& ts = params.tensors();
  DEG_CHECK(ts.size() == values.size(), "resident parameters of another model");
  for (size_t k = 0; k < ts.size(); ++k)
    ops->to_host(ts[k].data.data(), values[k].data<float>(), ts[k].data.size() * sizeof(float));
}

GptActs::GptActs() = default;
GptActs::~GptActs() = default;
GptActs::GptActs(GptActs&&) noexcept = default;
GptActs& GptActs::operator=(GptActs&&) noexcept = default;

int64_t GptActs::calls() const {
  return pass ? int64_t(pass->calls.size()) : 0;
}

int64_t GptActs::padded_tokens() const {
  int64_t n = 0;
  if (pass)
    for (const GptTrainCall& c : pass->calls) n += c.rows.n();
  return n;
}

namespace {

// Rows of the given lengths (ascending) cut into consecutive bands, one call each, so that the
// sum over the bands of (rows x longest + call_tokens) is least: the first row of each band.
std::vector<size_t> length_bands(const std::vector<int64_t>& sorted, int64_t call_tokens) {
  const size_t n = sorted.size();
  std::vector<int64_t> cost(n + 1, 0);  // of the first i rows
  std::vector<size_t> cut(n + 1, 0);    // where the last band of the first i rows starts
  for (size_t i = 1; i <= n; ++i) {
    cost[i] = INT64_MAX;
    for (size_t j = i; j-- > 0;) {  // band [j, i)
      const int64_t c = cost[j] + int64_t(i - j) * sorted[i - 1] + call_tokens;
      if (c <= cost[i]) cost[i] = c, cut[i] = j;  // ties: the longer band
    }
  }
  std::vector<size_t> starts;
  for (size_t i = n; i > 0; i = cut[i]) starts.push_back(cut[i]);
  std::reverse(starts.begin(), starts.end());
  return starts;
}

// Segments as rows of calls, one call per band of lengths (length_bands), rows in stream order
// within a length. Appends to pass's per-call tables; sets each segment's call and row.
void add_calls(std::vector<Segment>& segs, int64_t call_tokens, GptPass& pass) {
  std::stable_sort(segs.begin(), segs.end(),
                   [](const Segment& x, const Segment& y) { return x.length < y.length; });
  std::vector<int64_t> sorted;
  for (const Segment& s : segs) sorted.push_back(s.length);
  const std::vector<size_t> starts = length_bands(sorted, call_tokens);
  for (size_t f = 0, band = 0; f < segs.size(); ++f) {
    if (band < starts.size() && starts[band] == f) {
      ++band;
      pass.lengths.emplace_back();
      pass.positions.emplace_back();
      pass.history.emplace_back();
      pass.calls.emplace_back();
    }
    segs[f].call = int(pass.calls.size()) - 1;
    segs[f].row = int64_t(pass.lengths.back().size());
    pass.lengths.back().push_back(segs[f].length);
  }
}

// The batch's segments as rows of calls: the plain stream is one row (documents apart by
// attention segments); with the fork layout, segments without a context range (documents) are
// rows of the first calls and the others (queries) rows of later calls, each continuing the
// row of its context; both are split into calls by length so that padding stays small.
void lay_out(const GptBatch& b, int64_t call_tokens, GptPass& pass) {
  const int64_t T = b.size();
  const bool fork = !b.prev.empty();
  DEG_CHECK(int64_t(b.seg_start.size()) == T && int64_t(b.targets.size()) == T, "batch shapes");
  DEG_CHECK(!fork || (int64_t(b.prev.size()) == T && int64_t(b.pos.size()) == T &&
                      int64_t(b.ctx_lo.size()) == T && int64_t(b.ctx_hi.size()) == T),
            "fork layout shapes");
  if (!fork) {
    pass.ids = {b.inputs};
    pass.history = {{-1, -1}};
    pass.segment = {b.seg_start};
    pass.lengths = {{T}};
    pass.positions = {{0}};
    pass.segments = {{.start = 0, .length = T}};
  } else {
    std::vector<Segment> docs, forks;
    for (int64_t t = 0; t < T;) {
      int64_t e = t + 1;
      while (e < T && b.seg_start[size_t(e)] == b.seg_start[size_t(t)]) ++e;
      DEG_CHECK(b.seg_start[size_t(t)] == t, "segment at {} does not start at its seg_start", t);
      for (int64_t u = t + 1; u < e; ++u)
        DEG_CHECK(b.prev[size_t(u)] == u - 1 && b.pos[size_t(u)] == b.pos[size_t(u - 1)] + 1 &&
                      b.ctx_lo[size_t(u)] == b.ctx_lo[size_t(t)] &&
                      b.ctx_hi[size_t(u)] == b.ctx_hi[size_t(t)],
                  "segment at {}: tokens must follow each other", t);
      const Segment s{.start = t, .length = e - t};
      if (b.ctx_hi[size_t(t)] <= b.ctx_lo[size_t(t)]) {
        DEG_CHECK(b.pos[size_t(t)] == 0 && b.prev[size_t(t)] == -1,
                  "segment at {} without context must start a sequence", t);
        docs.push_back(s);
      } else {
        forks.push_back(s);
      }
      t = e;
    }
    add_calls(docs, call_tokens, pass);
    std::map<int64_t, const Segment*> doc_at;  // documents by stream start
    for (const Segment& d : docs) {
      doc_at[d.start] = &d;
      pass.positions[size_t(d.call)].push_back(0);
      for (int64_t k = 0; k < kGptHistory; ++k) pass.history[size_t(d.call)].push_back(-1);
    }
    add_calls(forks, call_tokens, pass);
    for (const Segment& s : forks) {
      const int64_t lo = b.ctx_lo[size_t(s.start)], hi = b.ctx_hi[size_t(s.start)];
      auto it = doc_at.find(lo);
      DEG_CHECK(it != doc_at.end() && it->second->length == hi - lo &&
                    b.pos[size_t(s.start)] == hi - lo && b.prev[size_t(s.start)] == hi - 1,
                "segment at {} must continue a whole earlier segment", s.start);
      GptTrainCall& c = pass.calls[size_t(s.call)];
      c.prefix_calls.push_back(it->second->call);
      c.prefix_rows.push_back(it->second->row);
      pass.positions[size_t(s.call)].push_back(hi - lo);
      for (int64_t k = kGptHistory; k > 0; --k)
        pass.history[size_t(s.call)].push_back(hi - k >= lo ? b.inputs[size_t(hi - k)] : -1);
    }
    pass.segments = std::move(docs);
    pass.segments.insert(pass.segments.end(), forks.begin(), forks.end());
    pass.ids.assign(pass.calls.size(), {});
    pass.segment.assign(pass.calls.size(), {});
  }
  pass.calls.resize(pass.lengths.size());
  // Rows right-padded to each call's longest (padding: id 0).
  for (size_t k = 0; k < pass.calls.size(); ++k) {
    int64_t L = 0;
    for (int64_t n : pass.lengths[k]) L = std::max(L, n);
    const int64_t B = int64_t(pass.lengths[k].size());
    if (fork) pass.ids[k].assign(size_t(B * L), 0);
    GptTrainCall& c = pass.calls[k];
    c.rows = {.rows = B,
              .tokens = L,
              .lengths = pass.lengths[k].data(),
              .positions = pass.positions[k].data()};
  }
  if (fork)
    for (const Segment& s : pass.segments)
      for (int64_t u = 0; u < s.length; ++u)
        pass.ids[size_t(s.call)][size_t(s.row * pass.calls[size_t(s.call)].rows.tokens + u)] =
            b.inputs[size_t(s.start + u)];
  for (size_t k = 0; k < pass.calls.size(); ++k) {
    GptTrainCall& c = pass.calls[k];
    c.ids = pass.ids[k].data();
    c.history = pass.history[k].data();
    c.segment = pass.segment[k].empty() ? nullptr : pass.segment[k].data();
  }
}

// Row r of call-order data [B L, C] <-> the stream's [T, C], for each segment: f(call, offset
// in the call's data, offset in the stream's, floats), segments that continue each other in both
// (full rows of one call in stream order) taken as one.
template <class F>
void each_segment_row(const GptPass& pass, int64_t C, F f) {
  int call = -1;
  int64_t from = 0, to = 0, n = 0;
  for (const Segment& s : pass.segments) {
    const int64_t L = pass.calls[size_t(s.call)].rows.tokens;
    const int64_t sf = (s.row * L) * C, st = s.start * C, sn = s.length * C;
    if (s.call == call && sf == from + n && st == to + n) {
      n += sn;
      continue;
    }
    if (n) f(call, from, to, n);
    call = s.call, from = sf, to = st, n = sn;
  }
  if (n) f(call, from, to, n);
}

SoftcapLoss loss_of(const GptConfig& c, const GptStepOptions& o) {
  return {.a = c.softcap_a,
          .b = c.softcap_b,
          .c = c.softcap_c,
          .mtp_weights = o.mtp_weights,
          .prefix_weight = o.prefix_weight};
}

// The mean loss of a forward, by the pass's backend (softcap_cross_entropy, where the final
// hidden state already is: on a GPU only the per-row losses, d(final) and lm_head's gradient come
// back): d(final) [T, C] in stream order into dfinal (or, keep_dfinal, into pass.dfinal on the
// backend) and lm_head's gradient added into dlm, when given. The rows' losses are summed in f64
// in stream order, as softcap_loss sums them.
double pass_loss(const GptParams& p, const GptBatch& b, const GptStepOptions& o, GptPass& pass,
                 float* dfinal, float* dlm, bool dlm_on_backend = false, bool keep_dfinal = false) {
  const GptConfig& c = p.config();
  const int64_t T = b.size(), C = c.model_dim, V = c.vocab_size;
  const Ops& ops = pass.ops;
  if (T == 0) return 0.0;
  // The final hidden state in stream order, and the targets, where the backend reads them.
  float* xn = pass.arena.floats(T * C);
  each_segment_row(pass, C, [&](int k, int64_t from, int64_t to, int64_t n) {
    ops.copy_rows(pass.finals[size_t(k)] + from, C, xn + to, C, n / C, C);
  });
  auto ids_on = [&](const std::vector<int32_t>& v) -> const int32_t* {
    if (v.empty()) return nullptr;
    if (ops.device() == Device::cpu) return v.data();
    int32_t* d = pass.arena.ints(int64_t(v.size()));
    ops.to_device(d, v.data(), v.size() * sizeof(int32_t));
    return d;
  };
  float* rows = pass.arena.floats(T);
  const bool want_dfinal = dfinal || keep_dfinal;
  Tensor dxn = want_dfinal ? ops.alloc({T, C}, DType::f32) : Tensor();  // zero-filled
  Tensor dw = dlm && !dlm_on_backend ? ops.alloc({V, C}, DType::f32) : Tensor();
  SoftcapCrossEntropyArgs args = softcap_op_args(loss_of(c, o), xn, &pass.model->lm_head(),
                                                 ids_on(b.targets), ids_on(b.prefix), T, C);
  args.loss = rows;
  args.bf16 = o.precision == GemmPrecision::bf16_all;
  args.dxn = want_dfinal ? dxn.mutable_data<float>() : nullptr;
  args.dw = dlm_on_backend ? dlm : dlm ? dw.mutable_data<float>() : nullptr;
  ops.softcap_cross_entropy(args);
  std::vector<float> row_loss(static_cast<size_t>(T));
  ops.to_host(row_loss.data(), rows, size_t(T) * sizeof(float));
  if (keep_dfinal) pass.dfinal = dxn;  // gpt_backward reads it there
  if (dfinal) ops.to_host(dfinal, dxn.data<float>(), size_t(T * C) * sizeof(float));
  if (dlm && !dlm_on_backend) {
    std::vector<float> g(size_t(V * C));
    ops.to_host(g.data(), dw.data<float>(), g.size() * sizeof(float));
    for (size_t i = 0; i < g.size(); ++i) dlm[i] += g[i];
  }
  double total = 0;
  for (float r : row_loss) total += r;
  return total / double(T);
}

}  // namespace

GemmPrecision train_precision(const std::string& name) {
  if (name == "f32") return GemmPrecision::exact;
  if (name == "bf16") return GemmPrecision::bf16_all;
  throw Error(ErrorKind::invalid_argument,
              fmt::format("precision \"{}\": expected f32 or bf16", name));
}

void gpt_forward(const GptParams& p, const GptBatch& b, const GptStepOptions& o, GptActs& a) {
  const GptConfig& c = p.config();
  const int64_t T = b.size(), C = c.model_dim;
  for (int64_t t = 0; t < T; ++t)
    if (b.inputs[size_t(t)] < 0 || b.inputs[size_t(t)] >= c.vocab_size)
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("token id {} at position {} is outside the vocabulary [0, {})",
                              b.inputs[size_t(t)], t, c.vocab_size));
  if (a.pass && a.pass->arena.device() == o.device) {
    a.pass->clear();  // the last pass's memory serves this one
  } else {
    a.pass = std::make_unique<GptPass>(o.device);
  }
  GptPass& pass = *a.pass;
  pass.model = model_of(p, o, pass.ops);
  lay_out(b, o.call_tokens, pass);
  const Exec x{pass.ops, pass.arena};
  std::vector<GptTrainCall> calls = pass.calls;
  for (GptTrainCall& c : calls) c.precision = o.precision;
  if (o.device != Device::cpu) {  // the calls' id tables where the GPU reads them
    auto upload = [&](const int32_t* host, int64_t n) -> const int32_t* {
      if (!host) return nullptr;
      int32_t* d = x.arena.ints(n);
      pass.ops.to_device(d, host, size_t(n) * sizeof(int32_t));
      return d;
    };
    for (GptTrainCall& c : calls) {
      c.ids = upload(c.ids, c.rows.n());
      c.history = upload(c.history, 2 * c.rows.rows);
      c.segment = upload(c.segment, c.rows.n());
    }
  }
  pass.finals = gpt_train_forward(*pass.model, x, calls, pass.tape);
  a.final_xn.clear();
  if (!o.host_final) return;
  a.final_xn = zeros(T * C);
  each_segment_row(pass, C, [&](int k, int64_t from, int64_t to, int64_t n) {
    pass.ops.to_host(a.final_xn.data() + to, pass.finals[size_t(k)] + from,
                     size_t(n) * sizeof(float));
  });
}

void gpt_backward(const GptParams& p, const GptBatch& b, const GptStepOptions& o, GptActs& a,
                  const float* dfinal, std::vector<ParamTensor>& grads) {
  (void)b;
  DEG_CHECK(a.pass && a.pass->tape, "gpt_backward needs the forward's GptActs");
  GptPass& pass = *a.pass;
  const int64_t C = p.config().model_dim;
  const bool host = pass.ops.device() == Device::cpu;
  const Exec x{pass.ops, pass.arena};
  auto on_device = [&](const Buf& v) -> float* {
    float* d = x.arena.floats(int64_t(v.size()));
    pass.ops.to_device(d, v.data(), v.size() * sizeof(float));
    return d;
  };
  // Each call's d(final) [B L, C], zero at padded positions: from the host's dfinal, or on the
  // backend from the loss's.
  std::vector<const float*> dptr;
  std::vector<Buf> dcall;
  std::vector<Tensor> dcall_backend;
  if (dfinal) {
    for (const GptTrainCall& c : pass.calls) dcall.push_back(zeros(c.rows.n() * C));
    each_segment_row(pass, C, [&](int k, int64_t from, int64_t to, int64_t n) {
      std::copy(dfinal + to, dfinal + to + n, dcall[size_t(k)].begin() + from);
    });
    for (const Buf& d : dcall) dptr.push_back(host ? d.data() : on_device(d));
  } else {
    DEG_CHECK(pass.dfinal.numel() > 0, "gpt_backward: no d(final) (gpt_loss_of_forward keeps it)");
    for (const GptTrainCall& c : pass.calls)
      dcall_backend.push_back(pass.ops.alloc({c.rows.n() * C}, DType::f32));  // zero-filled
    const float* d = pass.dfinal.data<float>();
    each_segment_row(pass, C, [&](int k, int64_t from, int64_t to, int64_t n) {
      pass.ops.copy_rows(d + to, C, dcall_backend[size_t(k)].mutable_data<float>() + from, C, n / C,
                         C);
    });
    for (const Tensor& t : dcall_backend) dptr.push_back(t.data<float>());
  }
  GptGrads g;
  if (o.resident) {
    for (size_t k = 0; k < p.tensors().size(); ++k)
      g[p.tensors()[k].name] = o.resident->grads[k].mutable_data<float>();
  } else {
    for (ParamTensor& t : grads) g[t.name] = host ? t.data.data() : on_device(t.data);
  }
  gpt_train_backward(*pass.model, x, *pass.tape, dptr, g);
  if (!host && !o.resident)
    for (ParamTensor& t : grads)
      pass.ops.to_host(t.data.data(), g[t.name], t.data.size() * sizeof(float));
  pass.tape.reset();
  pass.dfinal = Tensor();
}

double gpt_loss(const GptParams& p, const GptBatch& b, const GptStepOptions& o, GptActs* work) {
  GptActs own;
  GptActs& a = work ? *work : own;
  gpt_forward(p, b, o, a);
  return pass_loss(p, b, o, *a.pass, nullptr, nullptr);
}

double gpt_loss_of_forward(const GptParams& p, const GptBatch& b, const GptStepOptions& o,
                           GptActs& acts, Buf& dfinal, std::vector<ParamTensor>& grads) {
  DEG_CHECK(acts.pass && acts.pass->tape, "gpt_loss_of_forward needs the forward's GptActs");
  dfinal = o.host_final ? zeros(b.size() * p.config().model_dim) : Buf();
  // lm_head's gradient: the resident one (on the backend), or the host's.
  float* dlm = nullptr;
  for (size_t k = 0; k < p.tensors().size(); ++k)
    if (o.resident && p.tensors()[k].name == "lm_head")
      dlm = o.resident->grads[k].mutable_data<float>();
  for (auto& g : grads)
    if (!o.resident && g.name == "lm_head") dlm = g.data.data();
  return pass_loss(p, b, o, *acts.pass, o.host_final ? dfinal.data() : nullptr, dlm,
                   o.resident != nullptr, !o.host_final);
}

double gpt_loss_and_grad(const GptParams& p, const GptBatch& b, const GptStepOptions& o,
                         std::vector<ParamTensor>& grads, GptActs* work) {
  GptActs own;
  GptActs& a = work ? *work : own;
  gpt_forward(p, b, o, a);
  Buf dfinal;
  const double loss = gpt_loss_of_forward(p, b, o, a, dfinal, grads);
  gpt_backward(p, b, o, a, o.host_final ? dfinal.data() : nullptr, grads);
  return loss;
}

Buf gpt_logits(const GptParams& p, const GptBatch& b, const GptStepOptions& o) {
  GptActs a;
  gpt_forward(p, b, o, a);
  const GptConfig& c = p.config();
  Buf logits = zeros(b.size() * c.vocab_size);
  softcap_logits(loss_of(c, o), a.final_xn.data(), p.data("lm_head"), b.size(), c.model_dim,
                 c.vocab_size, logits.data());
  return logits;
}

}  // namespace deg::train
