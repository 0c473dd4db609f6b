// `deg train` (see include/deg/train.h): the training loop over the examples of train/dataset.h,
// for a gpt trunk with its heads or for heads on a frozen trunk, dev loss and early stopping,
// checkpoints and resume, calibration.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "deg/train.h"
#include "engine/model.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "kernels/cuda_runtime.h"
#include "model/checkpoint.h"
#include "model/gpt_config.h"
#include "schema/plan.h"
#include "train/calibrate.h"
#include "train/comm.h"
#include "train/dataset.h"
#include "train/distributed.h"
#include "train/features.h"
#include "train/ops.h"
#include "train/optim.h"

namespace deg::train {

namespace fs = std::filesystem;

namespace {

// ---- optimisation ----

// AdamW over the heads' trained tensors.
class HeadsAdam {
 public:
  explicit HeadsAdam(const Heads& h) : m_(h.zeros_like()), v_(h.zeros_like()) {}
  void step(Heads& w, Heads& g, float lr, float wd) {
    ++t_;
    const double c1 = 1 - std::pow(0.9, double(t_)), c2 = 1 - std::pow(0.999, double(t_));
    auto wt = w.tensors(true), gt = g.tensors(true), mt = m_.tensors(true), vt = v_.tensors(true);
    for (size_t k = 0; k < wt.size(); ++k) {
      float* p = wt[k].second->mutable_data<float>();
      float* d = gt[k].second->mutable_data<float>();
      float* m = mt[k].second->mutable_data<float>();
      float* v = vt[k].second->mutable_data<float>();
      const bool decay = wt[k].first.ends_with(".weight");
      for (int64_t i = 0; i < wt[k].second->numel(); ++i) {
        m[i] = 0.9f * m[i] + 0.1f * d[i];
        v[i] = 0.999f * v[i] + 0.001f * d[i] * d[i];
        const double upd = (m[i] / c1) / (std::sqrt(v[i] / c2) + 1e-8);
        p[i] -= float(lr * (upd + (decay ? wd * p[i] : 0.0)));
        d[i] = 0;
      }
    }
  }
  void save(const fs::path& path) {
    std::vector<NamedTensor> out;
    for (auto [prefix, h] : {std::pair{"m.", &m_}, std::pair{"v.", &v_}})
      for (auto& [name, t] : h->tensors(true)) out.push_back({prefix + name, *t});
    safetensors_write(path, out, {{"steps", std::to_string(t_)}});
  }
  void load(const fs::path& path) {
    SafetensorsFile f = SafetensorsFile::open(path);
    for (auto [prefix, h] : {std::pair{"m.", &m_}, std::pair{"v.", &v_}})
      for (auto& [name, t] : h->tensors(true)) *t = f.tensor(prefix + name).clone();
    t_ = std::stoll(f.metadata().at("steps"));
  }

 private:
  Heads m_, v_;
  int64_t t_ = 0;
};

double squared_norm(Heads& g) {
  double s = 0;
  for (auto& [name, t] : g.tensors(true)) {
    const float* d = t->data<float>();
    for (int64_t i = 0; i < t->numel(); ++i) s += double(d[i]) * d[i];
  }
  return s;
}

void scale(Heads& g, float f) {
  for (auto& [name, t] : g.tensors(true)) {
    float* d = t->mutable_data<float>();
    for (int64_t i = 0; i < t->numel(); ++i) d[i] *= f;
  }
}

// into += from (tensor by tensor, element by element).
void add(Heads& from, Heads& into) {
  auto f = from.tensors(true), t = into.tensors(true);
  for (size_t j = 0; j < t.size(); ++j)
    axpy(1.0f, f[j].second->data<float>(), t[j].second->mutable_data<float>(),
         t[j].second->numel());
}

// Linear warmup, constant, then a linear decay to zero over the last `cooldown` share.
float lr_scale(int64_t step, int64_t total, int64_t warmup, double cooldown) {
  if (step < warmup) return float(step + 1) / float(warmup);
  const double left = double(total - step) / std::max(1.0, cooldown * double(total));
  return float(std::clamp(left, 0.0, 1.0));
}

// Writes through a temporary file and a rename: the old file may be mapped by the open model.
template <class F>
void write_replacing(const fs::path& path, F&& write) {
  const fs::path tmp = path.string() + ".tmp";
  write(tmp);
  fs::rename(tmp, path);
}

// ---- the trunk being trained, or the cached features of a frozen one ----

// A trained gpt trunk lives on the training device for the whole run (GptResident: parameters,
// gradients and the optimizer's state in the backend's memory; host memory on the CPU), as in
// `deg pretrain`; the final hidden states come to the host, where the heads and their losses
// run, and their gradients go back for the trunk's backward. Checkpoints download the trunk.
class Trainer {
 public:
  Trainer(const FineTuneOptions& o, const engine::DegModel& model, Dataset& ds, bool train_trunk,
          Device device, const Comm& comm)
      : o_(o),
        comm_(comm),
        model_(model),
        ds_(ds),
        train_trunk_(train_trunk),
        device_(device),
        heads_(model.heads().clone()),
        hgrad_(heads_.zeros_like()),
        hadam_(heads_) {
    if (train_trunk_) {
      const GptConfig cfg = gpt_config_resolve((o.out / "config.json").string());
      params_ = GptParams::load(cfg, o.out / "backbone.safetensors", "model.");
      resident_.emplace(*params_, ops_for(device_));
      OptimizerHyper h;
      h.adam_lr *= o.trunk_lr;
      h.muon_lr *= o.trunk_lr;
      h.polar = train_precision(o.precision);
      topt_.emplace(*params_, h, ops_for(device_));
    }
  }

  void cache_features(const std::function<void(const FineTuneProgress&)>& progress) {
    if (train_trunk_) return;
    for (auto* set : {&ds_.train, &ds_.dev}) {
      auto& cache = set == &ds_.train ? train_feats_ : dev_feats_;
      for (size_t i = 0; i < set->size(); ++i) {
        cache.push_back(engine_features(model_, (*set)[i]));
        if (progress && ((i + 1) % 16 == 0 || i + 1 == set->size()))
          progress({.stage = "features", .done = int64_t(i + 1), .total = int64_t(set->size())});
      }
    }
  }

  // Where a step's wall time went (milliseconds; metrics.jsonl "ms"): choosing and packing the
  // records, the trunk's forward (its final states copied to the host), the heads' losses and
  // gradients on the host, the trunk's backward, and clipping with both optimizers. A device
  // trunk is waited for at the end of each phase, so its time lands in its own phase.
  struct StepTimes {
    int64_t records = 0;
    int64_t tokens = 0, calls = 0, padded = 0;  // the trunk's: real tokens, calls, padded tokens
    double pack = 0, forward = 0, heads = 0, backward = 0, optimizer = 0;
  };
  const StepTimes& last_times() const { return times_; }

  // One optimizer step over the next examples at `lr` (the schedule's scale of the base rates);
  // returns the balanced loss (LossStats).
  double step(int64_t step, float lr, int64_t* tokens, LossStats* stats) {
    auto mark = std::chrono::steady_clock::now();
    auto lap = [&mark] {
      const auto now = std::chrono::steady_clock::now();
      const double ms = std::chrono::duration<double, std::milli>(now - mark).count();
      mark = now;
      return ms;
    };
    times_ = {};
    const std::vector<size_t> whole = next_batch(tokens);
    LossStats st;
    // Each kind's queries share a weight of 1: the loss is the sum of the kinds' means.
    int64_t count[6] = {0, 0, 0, 0, 0, 0};
    for (size_t i : whole)
      for (const TaskQuery& q : ds_.train[i].queries) ++count[int(q.head)];
    float weight[6];
    for (int k = 0; k < 6; ++k) weight[k] = count[k] ? 1.0f / float(count[k]) : 0.0f;
    // A data-parallel rank takes every ranks()-th record of the batch (train/comm.h); the
    // weights above are the whole batch's, so the ranks' gradients add up to the batch's.
    std::vector<size_t> batch;
    for (size_t k = 0; k < whole.size(); ++k)
      if (int(k % size_t(comm_.size())) == comm_.rank()) batch.push_back(whole[k]);
    times_.records = int64_t(batch.size());
    if (batch.empty()) {
      times_.pack = lap();
    } else if (train_trunk_) {
      std::vector<const TaskExample*> exs;
      for (size_t i : batch) exs.push_back(&ds_.train[i]);
      const Packed p = pack_examples(exs);
      const GptStepOptions so = step_options();
      GptActs& acts = acts_;
      times_.pack = lap();
      gpt_forward(*params_, p.batch, so, acts);
      times_.forward = lap();
      times_.tokens = p.batch.size();
      times_.calls = acts.calls();
      times_.padded = acts.padded_tokens();
      const int64_t C = params_->config().model_dim;
      Buf dfinal = zeros(p.batch.size() * C);
      heads_of(exs, st, weight, [&](size_t k, Heads& g, LossStats& s, const float* w) {
        const Feats f = packed_features(p, exs, k, acts.final_xn.data(), C);
        Feats df = zeros_like(f);
        example_loss(heads_, g, *exs[k], f, df, &s, w, o_.anchor_pos_weight);
        scatter_features(p, exs, k, df, dfinal.data(), C);  // each example's own rows
      });
      times_.heads = lap();
      std::vector<ParamTensor> resident_grads;  // not read: the gradients are resident
      gpt_backward(*params_, p.batch, so, acts, dfinal.data(), resident_grads);
      resident_->ops->synchronize();
      times_.backward = lap();
    } else {
      times_.pack = lap();
      std::vector<const TaskExample*> exs;
      for (size_t i : batch) exs.push_back(&ds_.train[i]);
      heads_of(exs, st, weight, [&](size_t k, Heads& g, LossStats& s, const float* w) {
        const size_t i = batch[k];
        Feats df = zeros_like(train_feats_[i]);
        example_loss(heads_, g, ds_.train[i], train_feats_[i], df, &s, w, o_.anchor_pos_weight);
      });
      times_.heads = lap();
    }
    if (comm_.size() > 1) sum_over_ranks(st);
    if (stats) stats->add(st);
    const double loss = st.balanced();
    if (!std::isfinite(loss))
      throw Error(ErrorKind::internal, fmt::format("training diverged at step {}", step));
    // Global norm clipping over heads and trunk.
    double sq = squared_norm(hgrad_);
    const Ops* ops = train_trunk_ ? resident_->ops : nullptr;
    const Tensor* block = train_trunk_ ? &resident_->grad_block : nullptr;
    if (block) sq += ops->sum_squares(block->data<float>(), block->numel());
    const double norm = std::sqrt(sq);
    if (o_.clip > 0 && norm > o_.clip) {
      const float f = float(o_.clip / norm);
      scale(hgrad_, f);
      if (block)
        ops->scale({.y = block->mutable_data<float>(),
                    .ldy = block->numel(),
                    .rows = 1,
                    .n = block->numel(),
                    .s = f});
    }
    hadam_.step(heads_, hgrad_, o_.head_lr * lr, o_.head_wd);
    if (train_trunk_) {
      topt_->step(resident_->value_ptrs(), resident_->grad_ptrs(), lr, 0.95f, true, false);
      ops->synchronize();
    }
    times_.optimizer = lap();
    return loss;
  }

  // The ranks' loss statistics and gradients (heads and, when it trains, trunk) summed.
  void sum_over_ranks(LossStats& st) {
    double v[12];
    for (int k = 0; k < 6; ++k) {
      v[k] = st.sum[k];
      v[6 + k] = double(st.queries[k]);
    }
    comm_.sum(v, 12);
    for (int k = 0; k < 6; ++k) {
      st.sum[k] = v[k];
      st.queries[k] = int64_t(v[6 + k]);
    }
    for (auto& [name, t] : hgrad_.tensors(true)) comm_.sum(t->mutable_data<float>(), t->numel());
    if (train_trunk_)
      comm_.sum(resident_->grad_block.mutable_data<float>(), resident_->grad_block.numel());
  }

  // The heads' losses and gradients of a step's examples (their cost: context tokens x queries)
  // : run(k, grads, stats, weights) for each, on the pool's threads, the costliest first, each
  // thread taking the next example left; each example into gradients of its own, added into
  // hgrad_ and `st` in example order, so no sum depends on the threads or who ran what.
  template <class Run>
  void heads_of(const std::vector<const TaskExample*>& exs, LossStats& st, const float* weight,
                Run&& run) {
    const size_t n = exs.size();
    while (example_grads_.size() < n) example_grads_.push_back(heads_.zeros_like());
    std::vector<LossStats> stats(n);
    std::vector<size_t> order(n);
    for (size_t k = 0; k < n; ++k) order[k] = k;
    auto cost = [&](size_t k) { return exs[k]->ctx_tokens * int64_t(1 + exs[k]->queries.size()); };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return cost(a) > cost(b); });
    std::atomic<size_t> next{0};
    const int64_t workers = std::min<int64_t>(int64_t(n), thread_pool().size());
    parallel_for(workers, [&](int64_t, int64_t) {
      for (size_t at = next++; at < n; at = next++) {
        const size_t k = order[at];
        Heads& g = example_grads_[k];
        scale(g, 0.0f);
        run(k, g, stats[k], weight);
      }
    });
    for (size_t k = 0; k < n; ++k) {
      add(example_grads_[k], hgrad_);
      st.add(stats[k]);
    }
  }

  // The balanced loss over the dev examples (all, then by task) and, per head kind, the share
  // of the engine's decisions (at temperature 1) that are right; forward only.
  struct DevReport {
    std::vector<double> loss;                              // [all, task 0, task 1, ...]
    std::vector<std::pair<std::string, double>> accuracy;  // kinds that have queries
  };
  DevReport dev_report() {
    std::vector<LossStats> by_task(o_.tasks.size());
    Heads scratch = heads_.zeros_like();
    int64_t right[5] = {0, 0, 0, 0, 0}, total[5] = {0, 0, 0, 0, 0};
    for_each_dev([&](const TaskExample& ex, const Feats& f) {
      Feats df = zeros_like(f);
      example_loss(heads_, scratch, ex, f, df, &by_task[size_t(ex.task)]);
      std::vector<CalibrationItem> items[5];
      items_of(ex, f, items);
      for (int k = 0; k < 5; ++k)
        for (const CalibrationItem& it : items[k]) {
          right[k] += decide(HeadKind(k), it, 1.0).correct;
          ++total[k];
        }
    });
    DevReport r;
    LossStats all;
    for (const LossStats& st : by_task) {
      all.add(st);
      r.loss.push_back(st.balanced());
    }
    r.loss.insert(r.loss.begin(), all.balanced());
    for (int k = 0; k < 5; ++k)
      if (total[k])
        r.accuracy.emplace_back(kHeadKindNames[size_t(k)], double(right[k]) / double(total[k]));
    return r;
  }

  // Per head kind, the calibration items of the dev examples (halves: even / odd examples).
  void calibration_items(std::vector<CalibrationItem> (&fit)[5],
                         std::vector<CalibrationItem> (&report)[5]) {
    size_t index = 0;
    for_each_dev([&](const TaskExample& ex, const Feats& f) {
      items_of(ex, f, index++ % 2 == 0 ? fit : report);
    });
  }

  // The head kinds' logits and expected answers of one example (calibration and accuracy).
  void items_of(const TaskExample& ex, const Feats& f, std::vector<CalibrationItem> (&out)[5]) {
    const int64_t C = heads_.hidden, T = ex.ctx_tokens;
    for (size_t i = 0; i < ex.queries.size(); ++i) {
      const TaskQuery& q = ex.queries[i];
      const float* a = f.answers.data() + int64_t(i) * C;
      switch (q.head) {
        case QueryHead::choice:
        case QueryHead::score: {
          const bool choice = q.head == QueryHead::choice;
          out[int(choice ? HeadKind::choice : HeadKind::score)].push_back(
              {.a = pointer_logits(choice ? heads_.choice : heads_.score, a,
                                   f.options.data() + f.option_at[i] * C,
                                   int64_t(q.option_positions.size())),
               .target = q.option});
          break;
        }
        case QueryHead::noul:
          out[int(HeadKind::noul)].push_back(
              {.a = {noul_logits(heads_, a, 1)[0], 0.0f}, .target = q.yes ? 0 : 1});
          break;
        case QueryHead::count: {
          std::vector<float> l = count_logits(heads_, a, 1);
          for (int64_t n = 0; n <= kMaxCount; ++n)
            if (n < q.count_lo || n > q.count_hi) l[size_t(n)] = -INFINITY;
          out[int(HeadKind::count)].push_back({.a = std::move(l), .target = q.count});
          break;
        }
        case QueryHead::extract: {
          const SpanLogits s = span_logits(heads_, a, 1, {q.span_query}, f.ctx.data(), T);
          const bool null = q.span.start < 0;
          out[int(HeadKind::extract)].push_back({.a = s.start,
                                                 .b = s.end,
                                                 .target = null ? T : q.span.start,
                                                 .target_end = null ? T : q.span.end});
          break;
        }
        case QueryHead::anchor: break;  // no temperature: a threshold at 0.5
      }
    }
  }

  Heads& heads() { return heads_; }

  void save_weights(const fs::path& dir) {
    write_replacing(dir / "heads.safetensors", [&](const fs::path& p) { heads_.save(p); });
    if (train_trunk_) {
      resident_->download(*params_);
      write_replacing(dir / "backbone.safetensors",
                      [&](const fs::path& p) { params_->save(p, "model."); });
    }
  }
  void save_state(const fs::path& dir) {
    fs::create_directories(dir);
    save_weights(dir);
    hadam_.save(dir / "heads_adam.safetensors");
    if (train_trunk_) topt_->save(dir / "trunk_optimizer.safetensors");
  }
  void load_weights(const fs::path& dir) {
    heads_ = Heads::load(dir / "heads.safetensors").clone();
    if (train_trunk_) {
      params_ = GptParams::load(params_->config(), dir / "backbone.safetensors", "model.");
      resident_.emplace(*params_, ops_for(device_));  // gradients zero, as between steps
    }
  }
  void load_state(const fs::path& dir) {
    load_weights(dir);
    hadam_.load(dir / "heads_adam.safetensors");
    if (train_trunk_) topt_->load(dir / "trunk_optimizer.safetensors");
  }

  int64_t cursor = 0;  // examples consumed since the start

 private:
  StepTimes times_;
  GptStepOptions step_options() {
    return {.window_short = params_->config().window_short,
            .window_long = params_->config().window_long,
            .device = device_,
            .resident = &*resident_,
            .precision = train_precision(o_.precision)};
  }

  // The next examples of the shuffled stream (each epoch its own order) under the token budget.
  std::vector<size_t> next_batch(int64_t* tokens) {
    std::vector<size_t> out;
    int64_t used = 0;
    const int64_t n = int64_t(ds_.train.size());
    while (true) {
      const int64_t epoch = cursor / n, at = cursor % n;
      if (epoch != order_epoch_) {
        order_.resize(size_t(n));
        for (int64_t i = 0; i < n; ++i) order_[size_t(i)] = size_t(i);
        Rng rng(mix(o_.seed ^ mix(uint64_t(epoch))));
        for (int64_t i = n - 1; i > 0; --i)
          std::swap(order_[size_t(i)], order_[rng.next_u64() % uint64_t(i + 1)]);
        order_epoch_ = epoch;
      }
      const size_t e = order_[size_t(at)];
      const int64_t t = ds_.train[e].tokens();
      if (!out.empty() && used + t > o_.batch_tokens) break;
      out.push_back(e);
      used += t;
      ++cursor;
    }
    *tokens += used;
    return out;
  }

  // f(example, features) over the dev examples: cached, or a forward of the trunk as it is.
  template <class F>
  void for_each_dev(F&& f) {
    if (!train_trunk_) {
      for (size_t i = 0; i < ds_.dev.size(); ++i) f(ds_.dev[i], dev_feats_[i]);
      return;
    }
    for_each_dev_pack([&](const Packed& p, const std::vector<const TaskExample*>& exs,
                          const float* hidden, int64_t C) {
      for (size_t k = 0; k < exs.size(); ++k) f(*exs[k], packed_features(p, exs, k, hidden, C));
    });
  }

  template <class F>
  void for_each_dev_pack(F&& f) {
    const int64_t C = params_->config().model_dim;
    size_t i = 0;
    while (i < ds_.dev.size()) {
      std::vector<const TaskExample*> exs;
      int64_t used = 0;
      while (i < ds_.dev.size() && (exs.empty() || used + ds_.dev[i].tokens() <= o_.batch_tokens)) {
        used += ds_.dev[i].tokens();
        exs.push_back(&ds_.dev[i++]);
      }
      const Packed p = pack_examples(exs);
      GptActs& acts = acts_;
      gpt_forward(*params_, p.batch, step_options(), acts);
      f(p, exs, acts.final_xn.data(), C);
    }
  }

  GptActs acts_;  // the trunk passes' memory, step after step
  const FineTuneOptions& o_;
  const Comm& comm_;
  const engine::DegModel& model_;
  Dataset& ds_;
  bool train_trunk_;
  Device device_;
  Heads heads_, hgrad_;
  std::vector<Heads> example_grads_;  // heads_of's, one per example of a step
  HeadsAdam hadam_;
  std::optional<GptParams> params_;      // a trunk that trains: the host copy (checkpoints)
  std::optional<GptResident> resident_;  // ... and the one that trains, on device_
  std::optional<GptOptimizer> topt_;
  std::vector<Feats> train_feats_, dev_feats_;
  std::vector<size_t> order_;
  int64_t order_epoch_ = -1;
};

constexpr const char* kProfileNeeds =
    "--profile-step times the CUDA ops of a gpt trunk that trains on a GPU (--device cuda); on "
    "the CPU, metrics.jsonl's \"ms\" has each step's phases";

// --profile-step: the step's phases and every CUDA op's device time in it.
void write_profile(const fs::path& path, int64_t step, const Trainer::StepTimes& t,
                   const std::vector<OpTime>& ops) {
  const double wall = t.pack + t.forward + t.heads + t.backward + t.optimizer;
  double device = 0;
  for (const OpTime& x : ops) device += x.ms;
  std::string text = fmt::format(
      "deg train --profile-step {}: {} records, {:.1f} ms wall\n"
      "  trunk: {} tokens in {} calls, {} with padding\n"
      "  pack {:.1f} ms, forward {:.1f}, heads {:.1f} (host), backward {:.1f}, optimizer {:.1f}\n"
      "  device time in ops {:.1f} ms:\n",
      step, t.records, wall, t.tokens, t.calls, t.padded, t.pack, t.forward, t.heads, t.backward,
      t.optimizer, device);
  for (const OpTime& x : ops)
    text += fmt::format("    {:<28} {:9.2f} ms {:6.1f}%  {:6d} calls\n", x.op, x.ms,
                        wall > 0 ? 100 * x.ms / wall : 0.0, x.calls);
  write_replacing(path, [&](const fs::path& p) {
    std::ofstream f(p);
    f << text;
    if (!f.flush()) throw Error(ErrorKind::io, "cannot write the profile", {.path = p.string()});
  });
}

// out/ as a deg checkpoint of the base: a copy of a deg checkpoint, or `deg init` of a model.
void prepare_out(const FineTuneOptions& o) {
  if (o.resume) {
    if (!fs::exists(o.out / "train_state" / "trainer.json"))
      throw Error(ErrorKind::not_found, "no train_state/trainer.json to resume from",
                  {.path = o.out.string()});
    return;
  }
  if (fs::exists(o.out) && !fs::is_empty(o.out))
    throw Error(ErrorKind::invalid_argument,
                "output directory exists and is not empty; choose a new --out (or --resume)",
                {.path = o.out.string()});
  if (!fs::exists(o.base / "deg.json")) {
    checkpoint_create({.base = o.base, .out = o.out, .seed = o.seed});
    return;
  }
  if (!fs::exists(o.base / "config.json"))
    throw Error(ErrorKind::not_found,
                "this deg checkpoint has no config.json of its own; train from its base instead",
                {.path = o.base.string()});
  const std::vector<fs::path> backbone = checkpoint_backbone_files(o.base);
  fs::create_directories(o.out);
  for (const auto& entry : fs::directory_iterator(o.base)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && !is_backbone_file(name) &&
        (name.ends_with(".json") || name.ends_with(".safetensors")))
      fs::copy_file(entry.path(), o.out / name);
  }
  // The backbone as one file (a packed checkpoint's parts joined; bf16 tensors stay bf16 and a
  // trained trunk reads them as f32), so the run writes its trunk over it.
  if (backbone.size() == 1) {
    fs::copy_file(backbone[0], o.out / "backbone.safetensors");
  } else {
    const WeightStore parts = WeightStore::open_files(backbone);
    std::vector<NamedTensor> all;
    for (const std::string& name : parts.names()) all.push_back({name, parts.get(name)});
    safetensors_write(o.out / "backbone.safetensors", all);
  }
}

void write_json(const fs::path& path, const OrderedJson& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out.flush()) throw Error(ErrorKind::io, "cannot write", {.path = path.string()});
}

}  // namespace

FineTuneResult fine_tune(const FineTuneOptions& o,
                         const std::function<void(const FineTuneProgress&)>& on_progress) {
  return fine_tune_ranked(o, *launch_comm("deg train", o.device), on_progress);
}

FineTuneResult fine_tune_ranked(const FineTuneOptions& o, const Comm& comm,
                                const std::function<void(const FineTuneProgress&)>& progress) {
  const bool lead = comm.rank() == 0;  // writes, evaluates, calibrates and reports
  const std::function<void(const FineTuneProgress&)> on_progress =
      lead ? progress : std::function<void(const FineTuneProgress&)>();
  if (o.tasks.empty()) throw Error(ErrorKind::invalid_argument, "give at least one --task");
  if (o.steps <= 0) throw Error(ErrorKind::invalid_argument, "--steps must be positive");
  if (o.max_seconds < 0 || (o.max_seconds > 0 && (o.resume || o.stop_at > 0)))
    throw Error(ErrorKind::invalid_argument,
                "--max-seconds must be positive and goes without --resume and --stop-at");
  if (!(o.empty_array_rate > 0 && o.empty_array_rate <= 1))
    throw Error(ErrorKind::invalid_argument, "--empty-array-rate must be in (0, 1]");
  // Inputs are checked before anything is written, so a typo leaves no half-made --out.
  for (const TaskFiles& t : o.tasks) {
    for (const fs::path& f : {t.schema, t.train, t.dev})
      if (!f.empty() && !fs::is_regular_file(f))
        throw Error(ErrorKind::not_found, "no such file (--task)", {.path = f.string()});
    schema::plan_compile(schema::schema_load(t.schema.string()));
  }
  const Device device = pick_device(o.device);
  train_precision(o.precision);  // an unknown name stops here, before any work
  if (o.profile_step > 0 && device != Device::cuda)
    throw Error(ErrorKind::invalid_argument, kProfileNeeds);
  if (lead) prepare_out(o);
  comm.sum(0.0);  // the others open --out once rank 0 has made it
  const std::unique_ptr<engine::DegModel> model = engine::DegModel::open(o.out);
  const bool gpt = model->backbone().spec().family == "gpt";
  const bool train_trunk = gpt && !o.freeze_trunk;
  if (!gpt && !o.freeze_trunk)
    log::info("{} trunk stays frozen: only the heads train (trunk training is for gpt)",
              model->backbone().spec().family);

  if (o.profile_step > 0 && !train_trunk) throw Error(ErrorKind::invalid_argument, kProfileNeeds);
  Dataset ds = build_dataset(*model, o, on_progress);
  FineTuneResult result{.rank = comm.rank(),
                        .train_examples = int64_t(ds.train.size()),
                        .dev_examples = int64_t(ds.dev.size()),
                        .unlocated = ds.unlocated};
  log::info("{} training and {} dev examples; {} expected values not found in their documents",
            ds.train.size(), ds.dev.size(), ds.unlocated);
  if (device != Device::cpu && !train_trunk)
    log::info("the heads train on the CPU: --device {} runs a gpt trunk that trains", o.device);
  Trainer tr(o, *model, ds, train_trunk, device, comm);
  tr.cache_features(on_progress);

  const fs::path state = o.out / "train_state";
  int64_t start = 0, evals_since_best = 0;
  result.best_dev_loss = INFINITY;
  if (o.resume) {
    const Json st = json_load(state / "trainer.json");
    start = st.at("step").get<int64_t>();
    tr.cursor = st.at("cursor").get<int64_t>();
    result.first_dev_loss = st.at("first_dev_loss").get<double>();
    result.best_dev_loss = st.at("best_dev_loss").get<double>();
    result.best_step = st.at("best_step").get<int64_t>();
    evals_since_best = st.at("evals_since_best").get<int64_t>();
    tr.load_state(state);
  }
  std::ofstream metrics;
  if (lead) {
    metrics.open(o.out / "metrics.jsonl", o.resume ? std::ios::app : std::ios::trunc);
    if (!metrics)
      throw Error(ErrorKind::io, "cannot write metrics.jsonl", {.path = o.out.string()});
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  const bool have_dev = !ds.dev.empty();
  int64_t steps = o.steps;  // or (--max-seconds) the steps that fit
  for (int64_t step = start; step < steps; ++step) {
    LossStats stats;
    const float lr = lr_scale(step, steps, o.warmup_steps, o.cooldown);
    const bool profile = o.profile_step == step + 1;
    if (profile) cuda_profile_start();
    const double loss = tr.step(step, lr, &tokens, &stats);
    if (profile)
      write_profile(o.out / "profile.txt", step + 1, tr.last_times(), cuda_profile_stop());
    if (o.max_seconds > 0) {  // rank 0's pace sizes every rank's run
      const int64_t fit =
          lead ? time_budget_steps(
                     step + 1,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                     o.max_seconds, o.steps, steps)
               : 0;
      steps = int64_t(comm.sum(double(fit)));
    }
    const bool pause = o.stop_at > 0 && step + 1 == o.stop_at && !(step + 1 == steps);
    const bool last = step + 1 == steps || pause;
    if (!lead) {  // rank 0 evaluates and decides whether to stop early
      ++result.steps_run;
      if (comm.sum(0.0) > 0) break;
      if (pause) return result;
      continue;
    }
    OrderedJson line = {{"step", step + 1}, {"loss", loss}};
    OrderedJson kinds = OrderedJson::object();
    for (int k = 0; k < 6; ++k)
      if (stats.queries[k])
        kinds[query_head_name(QueryHead(k))] = stats.sum[k] / double(stats.queries[k]);
    line["loss_by_head"] = kinds;
    line["lr_scale"] = lr;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    FineTuneProgress pr{.stage = "train",
                        .done = step + 1,
                        .total = steps,
                        .loss = loss,
                        .tokens_per_s = secs > 0 ? double(tokens) / secs : 0,
                        .eta_s = secs / double(step + 1 - start) * double(steps - step - 1)};
    line["tokens_per_s"] = pr.tokens_per_s;
    const Trainer::StepTimes& tm = tr.last_times();
    line["records"] = tm.records;
    if (tm.calls > 0) line["trunk"] = {{"calls", tm.calls}, {"padded_tokens", tm.padded}};
    line["ms"] = {{"pack", tm.pack},
                  {"forward", tm.forward},
                  {"heads", tm.heads},
                  {"backward", tm.backward},
                  {"optimizer", tm.optimizer}};
    bool stop = false;
    if (last || (o.eval_every > 0 && (step + 1) % o.eval_every == 0)) {
      const auto report = have_dev ? tr.dev_report() : decltype(tr.dev_report()){{loss}, {}};
      const std::vector<double>& dev = report.loss;
      pr.dev_loss = dev[0];
      pr.dev_accuracy = report.accuracy;
      line["dev_loss"] = dev[0];
      if (!report.accuracy.empty()) {
        OrderedJson acc = OrderedJson::object();
        for (const auto& [kind, a] : report.accuracy) acc[kind] = a;
        line["dev_accuracy_by_head"] = acc;
      }
      if (have_dev) {
        OrderedJson by_task = OrderedJson::object();
        for (size_t k = 0; k < o.tasks.size(); ++k) {
          std::string name = o.tasks[k].name;
          for (int n = 2; by_task.contains(name); ++n)
            name = o.tasks[k].name + "-" + std::to_string(n);
          by_task[name] = dev[k + 1];
        }
        line["dev_loss_by_task"] = by_task;
      }
      if (result.first_dev_loss == 0) result.first_dev_loss = dev[0];
      if (dev[0] < result.best_dev_loss) {
        result.best_dev_loss = dev[0];
        result.best_step = step + 1;
        evals_since_best = 0;
        tr.save_weights(o.out);
      } else if (o.patience > 0 && ++evals_since_best >= o.patience) {
        stop = true;
        result.stopped_early = true;
      }
      tr.save_state(state);
      write_json(state / "trainer.json", {{"step", step + 1},
                                          {"cursor", tr.cursor},
                                          {"first_dev_loss", result.first_dev_loss},
                                          {"best_dev_loss", result.best_dev_loss},
                                          {"best_step", result.best_step},
                                          {"evals_since_best", evals_since_best}});
    }
    metrics << line.dump() << "\n" << std::flush;
    if (on_progress) on_progress(pr);
    ++result.steps_run;
    comm.sum(stop ? 1.0 : 0.0);  // tell the other ranks
    if (stop) break;
    if (pause) return result;  // --resume continues; calibration comes at the real end
  }

  // Calibration of the best weights on the dev halves.
  if (lead && o.calibrate && have_dev) {
    if (on_progress) on_progress({.stage = "calibrate"});
    tr.load_weights(o.out);  // the best
    std::vector<CalibrationItem> fit[5], report[5];
    tr.calibration_items(fit, report);
    float* temps = tr.heads().temperature.mutable_data<float>();
    OrderedJson cal = OrderedJson::array();
    for (int k = 0; k < 5; ++k) {
      if (fit[k].empty()) continue;
      const HeadKind kind = HeadKind(k);
      KindCalibration kc{.kind = kHeadKindNames[size_t(k)],
                         .temperature = fit_temperature(kind, fit[k]),
                         .fit_queries = int64_t(fit[k].size()),
                         .report_queries = int64_t(report[k].size())};
      std::vector<Decision> before, after;
      for (const CalibrationItem& it : report[k]) {
        before.push_back(decide(kind, it, 1.0));
        after.push_back(decide(kind, it, kc.temperature));
      }
      kc.ece_before = expected_calibration_error(before);
      kc.ece_after = expected_calibration_error(after);
      temps[k] = float(kc.temperature);
      cal.push_back({{"kind", kc.kind},
                     {"temperature", kc.temperature},
                     {"fit_queries", kc.fit_queries},
                     {"report_queries", kc.report_queries},
                     {"ece_before", kc.ece_before},
                     {"ece_after", kc.ece_after}});
      result.calibration.push_back(kc);
    }
    write_replacing(o.out / "heads.safetensors", [&](const fs::path& p) { tr.heads().save(p); });
    write_json(o.out / "calibration.json", {{"kinds", cal}});
  }
  return result;
}

}  // namespace deg::train
