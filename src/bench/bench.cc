// deg bench: CPU throughput of a backbone family at a real model's dimensions (Qwen3.5-0.8B,
// LFM2.5-1.2B with --family lfm2, Gemma 4 E2B with --family gemma4) with random bf16 weights built
// in memory — trunk prefill at several lengths, a fork pass (many short rows over one long prefix),
// decode steps — next to this machine's peak dot-product FLOP/s measured in the same run, so
// figures read as ratios. Not a test: nothing here asserts on time.
#include "deg/bench.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/json.h"
#include "kernels/cuda_runtime.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "model/gemma4.h"
#include "model/lfm2.h"
#include "model/qwen35.h"

namespace deg {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double peak_rss_gib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is KiB on Linux
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int32_t(rng() % uint32_t(vocab));
  return ids;
}

// Multiply-accumulates per token in the projections (embedding lookup and LM head excluded).
double matmul_params(const std::vector<std::pair<std::string, Shape>>& table) {
  double n = 0;
  for (const auto& [name, shape] : table) {
    if (shape.size() == 2 && name.find("embed") == std::string::npos && name != "lm_head.weight")
      n += double(shape[0]) * double(shape[1]);
  }
  return n;
}

// The family's model at a real size (`layers` cycles its layer pattern), as random bf16 weights,
// and the weights of one state-carrying layer whose projections the GEMM figure times.
struct BenchModel {
  std::string title;
  int64_t vocab = 0;
  int64_t layers = 0;
  std::vector<std::pair<std::string, Shape>> table;
  std::function<std::unique_ptr<Family>()> make;
  std::function<std::unique_ptr<Family>(const Ops&)> make_on;  // on a given backend
  TensorMap one_layer;
  std::vector<std::string> one_layer_names;
};

BenchModel bench_model(const BenchOptions& o) {
  BenchModel m;
  auto cycle = [&](std::vector<LayerKind> pattern) {
    const int64_t n = o.layers > 0 ? o.layers : int64_t(pattern.size());
    std::vector<LayerKind> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(pattern[size_t(i) % pattern.size()]);
    m.layers = n;
    return out;
  };
  if (o.family == "qwen3_5") {
    Qwen35Config cfg = Qwen35Config::preset("0.8b");
    cfg.layers = cycle(cfg.layers);
    m.title = "Qwen3.5-0.8B";
    m.vocab = cfg.vocab;
    m.table = qwen35_tensor_table(cfg);
    m.make = [cfg] { return qwen35_family(cfg, qwen35_random_weights(cfg, DType::bf16, 1)); };
    m.make_on = [cfg](const Ops& ops) {
      return qwen35_family(cfg, qwen35_random_weights(cfg, DType::bf16, 1), ops);
    };
    Qwen35Config one = cfg;
    one.vocab = 16;
    one.layers = {LayerKind::recurrent};
    m.one_layer = qwen35_random_weights(one, DType::bf16, 2);
    m.one_layer_names = {"layers.0.linear_attn.in_proj_qkv.weight",
                         "layers.0.linear_attn.in_proj_z.weight",
                         "layers.0.linear_attn.out_proj.weight",
                         "layers.0.mlp.gate_proj.weight",
                         "layers.0.mlp.up_proj.weight",
                         "layers.0.mlp.down_proj.weight"};
  } else if (o.family == "gemma4") {
    Gemma4Config cfg = Gemma4Config::preset("e2b");
    if (o.layers > int64_t(cfg.layers.size())) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("--layers: Gemma 4 E2B has {} layers", cfg.layers.size()));
    }
    // The first `layers` layers (K/V-sharing layers read earlier ones, so any prefix is whole).
    if (o.layers > 0) cfg.layers.resize(size_t(o.layers));
    m.title = "Gemma 4 E2B";
    m.vocab = cfg.vocab;
    m.layers = int64_t(cfg.layers.size());
    m.table = gemma4_tensor_table(cfg);
    m.make = [cfg] { return gemma4_family(cfg, gemma4_random_weights(cfg, DType::bf16, 1)); };
    m.make_on = [cfg](const Ops& ops) {
      return gemma4_family(cfg, gemma4_random_weights(cfg, DType::bf16, 1), ops);
    };
    Gemma4Config one = cfg;
    one.vocab = one.ple_vocab = 16;
    one.layers = {cfg.layers[0]};
    m.one_layer = gemma4_random_weights(one, DType::bf16, 2);
    m.one_layer_names = {"layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
                         "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
                         "layers.0.mlp.gate_proj.weight",    "layers.0.mlp.up_proj.weight",
                         "layers.0.mlp.down_proj.weight"};
  } else {
    Lfm2Config cfg = Lfm2Config::preset("1.2b");
    cfg.layers = cycle(cfg.layers);
    m.title = "LFM2.5-1.2B";
    m.vocab = cfg.vocab;
    m.table = lfm2_tensor_table(cfg);
    m.make = [cfg] { return lfm2_family(cfg, lfm2_random_weights(cfg, DType::bf16, 1)); };
    m.make_on = [cfg](const Ops& ops) {
      return lfm2_family(cfg, lfm2_random_weights(cfg, DType::bf16, 1), ops);
    };
    Lfm2Config one = cfg;
    one.vocab = 16;
    one.layers = {LayerKind::recurrent};
    m.one_layer = lfm2_random_weights(one, DType::bf16, 2);
    m.one_layer_names = {"layers.0.conv.in_proj.weight", "layers.0.conv.out_proj.weight",
                         "layers.0.feed_forward.w1.weight", "layers.0.feed_forward.w3.weight",
                         "layers.0.feed_forward.w2.weight"};
  }
  return m;
}

// The median of `repeats` timed runs of fn (after one untimed warm-up run), in seconds; setup,
// untimed, before each run. The backbone's calls return host results, so each run has finished
// on the device when it returns.
double median_seconds(int64_t repeats, const std::function<void()>& fn,
                      const std::function<void()>& setup = {}) {
  if (setup) setup();
  fn();
  std::vector<double> t;
  for (int64_t i = 0; i < std::max<int64_t>(repeats, 1); ++i) {
    if (setup) setup();
    auto t0 = Clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The GPU figures: the backend's bf16 GEMM rate on a large square product (the ceiling the
// others are read against), trunk prefill, a fork pass and batched decode steps.
void run_cuda(const BenchOptions& o, const BenchModel& model, GemmPrecision prec) {
  const Ops& ops = cuda_ops();
  OrderedJson out;
  out["device"] = ops.name();
  out["family"] = o.family;
  out["model"] = model.title;
  out["layers"] = model.layers;
  out["gemm"] = o.gemm;
  fmt::print("deg bench — {} dims ({} layers), random bf16 weights, gemm {}, on {}\n", model.title,
             model.layers, o.gemm, ops.name());
  {  // the ceiling: y[8192, 8192] = x[8192, 8192] W^T in bf16 dot products, through ops.gemm
    const int64_t n = 8192;
    std::vector<bf16> wh(size_t(n * n));
    std::mt19937 rng(3);
    for (auto& v : wh) v = f32_to_bf16(float(int(rng() % 2001) - 1000) * 1e-5f);
    const Tensor w = ops.upload(Tensor::from_vector(wh, {n, n}));
    Tensor x = ops.alloc({n, n}, DType::f32), y = ops.alloc({n, n}, DType::f32);
    std::vector<float> xh(size_t(n * n));
    for (auto& v : xh) v = float(int(rng() % 2001) - 1000) * 1e-3f;
    ops.to_device(x.raw_mutable(), xh.data(), xh.size() * sizeof(float));
    GemmOutput go{.w = &w, .y = y.mutable_data<float>(), .ldy = n};
    const double dt = median_seconds(o.repeats, [&] {
      ops.gemm({.x = x.data<float>(),
                .m = n,
                .k = n,
                .ldx = n,
                .outputs = {&go, 1},
                .precision = GemmPrecision::bf16});
      ops.synchronize();
    });
    const double tflops = 2.0 * double(n) * double(n) * double(n) / dt / 1e12;
    fmt::print("gemm 8192^3 bf16 (pinned algorithm, x converted from f32): {:.0f} TFLOP/s\n",
               tflops);
    out["gemm_8192_tflops"] = tflops;
  }
  // --profile: one more run of a figure with every op's device time taken (CUDA events).
  auto profile = [&](const char* figure, const std::function<void()>& fn,
                     const std::function<void()>& setup = {}) {
    if (!o.profile) return;
    if (!o.profile_only.empty() &&
        std::find(o.profile_only.begin(), o.profile_only.end(), figure) == o.profile_only.end())
      return;
    if (setup) setup();
    cuda_profile_start();
    auto p0 = Clock::now();
    fn();
    const double wall = seconds_since(p0) * 1e3;
    double total = 0;
    const std::vector<OpTime> ops_time = cuda_profile_stop();
    for (const OpTime& t : ops_time) total += t.ms;
    fmt::print("  profile of {}: {:.2f} ms of device time in ops, {:.2f} ms wall\n", figure, total,
               wall);
    for (const OpTime& t : ops_time) {
      fmt::print("    {:<12} {:8.3f} ms {:5.1f}%  {:6} calls\n", t.op, t.ms, 100 * t.ms / total,
                 t.calls);
      out["profile"][figure][t.op] = {{"ms", t.ms}, {"calls", t.calls}};
    }
    out["profile"][figure]["wall_ms"] = wall;
  };
  // The same figure with cuBLASLt's per-shape GEMM choice (batch-variant): what the pinned
  // algorithms cost. `per`: how many of the figure one run of fn holds (decode: its steps).
  auto invariance_cost = [&](const char* figure, double pinned, const std::function<void()>& fn,
                             const std::function<void()>& setup = {}, double per = 1) {
    cuda_gemm_heuristic(true);
    const double h = median_seconds(o.repeats, fn, setup);
    cuda_gemm_heuristic(false);
    fmt::print("  {} with cuBLASLt's heuristic GEMMs: {:.3f} ms; batch invariance costs {:+.1f}%\n",
               figure, 1e3 * h / per, 100 * (pinned / h - 1));
    out["heuristic_gemm"][figure] = {{"ms", 1e3 * h / per}, {"pinned_over_heuristic", pinned / h}};
  };
  auto t0 = Clock::now();
  Backbone bb(model.make_on(ops), {.precision = prec});
  fmt::print("weights built and uploaded in {:.1f} s\n", seconds_since(t0));
  const int64_t vocab = model.vocab;
  for (int64_t L : o.prefill) {
    const std::vector<int32_t> ids = random_ids(L, vocab, uint32_t(L));
    // The hidden states stay on the device, as the engine's reads keep them (its heads' keys
    // are made there).
    auto once = [&] {
      State s = bb.empty_state(1);
      bb.prefill(TokenBatch::single(ids), s, {}, /*on_backend=*/true);
      ops.synchronize();
    };
    const double dt = median_seconds(o.repeats, once);
    fmt::print("prefill {:>6} tokens: {:10.0f} tok/s  ({:.2f} ms)\n", L, double(L) / dt, 1e3 * dt);
    out["prefill"].push_back({{"tokens", L}, {"tok_per_s", double(L) / dt}, {"ms", 1e3 * dt}});
    if (L == o.prefill.back()) {
      invariance_cost("prefill", dt, once);
      profile("prefill", once);
    }
  }
  State trunk = bb.empty_state(1);
  bb.prefill(TokenBatch::single(random_ids(o.fork_prefix, vocab, 7)), trunk);
  {
    std::vector<std::vector<int32_t>> rows;
    for (int64_t r = 0; r < o.forks; ++r)
      rows.push_back(random_ids(o.fork_tokens, vocab, uint32_t(100 + r)));
    const TokenBatch batch = TokenBatch::padded(rows);
    // Each row's last hidden state comes back, as the engine's heads read a field's answer.
    std::vector<int64_t> lasts;
    for (int64_t r = 0; r < o.forks; ++r) lasts.push_back((r + 1) * o.fork_tokens - 1);
    auto once = [&] {
      ForkState fs = bb.fork({{.state = &trunk, .row = 0}},
                             std::vector<int64_t>(size_t(o.forks), 0), o.fork_tokens);
      bb.fork_forward(batch, fs, false, false, lasts);
    };
    const double dt = median_seconds(o.repeats, once);
    fmt::print("fork pass {} x {} tokens over {}: {:.2f} ms\n", o.forks, o.fork_tokens,
               o.fork_prefix, 1e3 * dt);
    out["fork"] = {
        {"rows", o.forks}, {"tokens", o.fork_tokens}, {"prefix", o.fork_prefix}, {"ms", 1e3 * dt}};
    invariance_cost("fork pass", dt, once);
    profile("fork", once);
  }
  {
    // A decode step of `forks` rows, each kept after a short header: every timed run starts
    // from rows that hold the header alone (the cost of a step may grow with the rows' own
    // tokens: CUDA's fork rows carry their recurrent states as a history of them).
    const int64_t R = o.forks, steps = o.decode_steps;
    std::vector<std::vector<int32_t>> header;
    for (int64_t r = 0; r < R; ++r) header.push_back(random_ids(8, vocab, uint32_t(200 + r)));
    ForkState fs;
    auto fresh = [&] {
      fs =
          bb.fork({{.state = &trunk, .row = 0}}, std::vector<int64_t>(size_t(R), 0), 8 + steps + 1);
      bb.fork_forward(TokenBatch::padded(header), fs, true);
      ops.synchronize();
    };
    TokenBatch step{.ids = std::vector<int32_t>(size_t(R), 1),
                    .rows = R,
                    .tokens = 1,
                    .lengths = std::vector<int64_t>(size_t(R), 1)};
    auto steps_once = [&] {
      for (int64_t i = 0; i < steps; ++i) bb.fork_forward(step, fs, true, true);
    };
    const double dt = median_seconds(o.repeats, steps_once, fresh);
    fmt::print("decode step, {} rows over {} + 8 tokens: {:.3f} ms (backbone, no LM head)\n", R,
               o.fork_prefix, 1e3 * dt / double(steps));
    out["decode"] = {{"rows", R}, {"steps", steps}, {"step_ms", 1e3 * dt / double(steps)}};
    invariance_cost("decode step", dt, steps_once, fresh, double(steps));
    if (ops.prefers_delta_history()) {  // the same steps with rows that keep states of their own
      const BackboneOptions before = bb.options();
      BackboneOptions own = before;
      own.fork_history = ForkHistory::never;
      bb.set_options(own);
      const double st = median_seconds(o.repeats, steps_once, fresh);
      bb.set_options(before);
      fmt::print(
          "  decode steps with a state of each row's own: {:.3f} ms; the rows' histories "
          "save {:.1f}%\n",
          1e3 * st / double(steps), 100 * (1 - dt / st));
      out["decode"]["own_state_step_ms"] = 1e3 * st / double(steps);
    }
    profile("decode", steps_once, fresh);
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << out.dump(2) << "\n";
    if (!f) throw Error(ErrorKind::io, "cannot write", {.path = o.json});
  }
}

}  // namespace

void bench_run(const BenchOptions& o) {
  if (o.gemm != "bf16" && o.gemm != "exact") {
    throw Error(ErrorKind::invalid_argument, "--gemm must be bf16 or exact");
  }
  if (o.family != "qwen3_5" && o.family != "lfm2" && o.family != "gemma4") {
    throw Error(ErrorKind::invalid_argument, "--family must be qwen3_5, lfm2 or gemma4");
  }
  if (o.layers < 0 || o.layers > 240) {
    throw Error(ErrorKind::invalid_argument, "--layers must be in 1..240 (0: the real model's)");
  }
  const BenchModel model = bench_model(o);
  if (pick_device(o.device) == Device::cuda) {
    run_cuda(o, model, o.gemm == "bf16" ? GemmPrecision::bf16 : GemmPrecision::exact);
    return;
  }
  const GemmPrecision prec = o.gemm == "bf16" ? GemmPrecision::bf16 : GemmPrecision::exact;
  OrderedJson out;
  out["cpu"] = cpu_name();
  out["threads"] = thread_pool().size();
  out["isa"] = gemm_isa_name(gemm_isa());
  out["gemm"] = o.gemm;
  out["family"] = o.family;
  out["model"] = model.title;
  out["layers"] = model.layers;
  fmt::print("deg bench — {} dims ({} layers), random bf16 weights, gemm {}\n", model.title,
             model.layers, o.gemm);
  fmt::print("cpu {} | {} threads | isa {}\n", cpu_name(), thread_pool().size(),
             gemm_isa_name(gemm_isa()));

  PeakFlops peak = measure_peak_flops(o.peak_seconds);
  const double peak_ref = prec == GemmPrecision::bf16 && peak.bf16 > 0 ? peak.bf16 : peak.f32;
  fmt::print("peak (measured now): bf16 dot {:.1f} GFLOP/s, f32 FMA {:.1f} GFLOP/s\n",
             peak.bf16 / 1e9, peak.f32 / 1e9);
  out["peak_gflops_bf16"] = peak.bf16 / 1e9;
  out["peak_gflops_f32"] = peak.f32 / 1e9;

  auto t0 = Clock::now();
  Backbone bb(model.make(), {.precision = prec});
  fmt::print("weights built in {:.1f} s, peak RSS {:.2f} GiB\n", seconds_since(t0), peak_rss_gib());
  out["rss_after_weights_gib"] = peak_rss_gib();
  const double flops_per_token = 2 * matmul_params(model.table);
  const int64_t vocab = model.vocab;

  // Prefill GEMMs alone: one state-carrying layer's projections (mixer + MLP) at 512 rows.
  {
    const int64_t M = 512;
    const TensorMap& w = model.one_layer;
    int64_t widest_in = 0, widest_out = 0;
    for (const std::string& n : model.one_layer_names) {
      widest_in = std::max(widest_in, w.at(n).dim(1));
      widest_out = std::max(widest_out, w.at(n).dim(0));
    }
    std::vector<float> x(size_t(M * widest_in), 0.01f), y(size_t(M * widest_out));
    double flops = 0;
    auto once = [&] {
      for (const std::string& n : model.one_layer_names) {
        const Tensor& t = w.at(n);
        linear(x.data(), M, t.dim(1), t, y.data(), false, prec);
      }
    };
    for (const std::string& n : model.one_layer_names) flops += 2.0 * M * double(w.at(n).numel());
    once();
    int reps = 0;
    auto g0 = Clock::now();
    while (reps < 3 || seconds_since(g0) < 1.0) {
      once();
      ++reps;
    }
    const double rate = flops * reps / seconds_since(g0);
    fmt::print("prefill GEMMs (M=512, one layer's projections): {:.1f} GFLOP/s = {:.0f}% of peak\n",
               rate / 1e9, 100 * rate / peak_ref);
    out["gemm_m512_gflops"] = rate / 1e9;
    out["gemm_m512_of_peak"] = rate / peak_ref;
  }

  for (int64_t L : o.prefill) {
    State s = bb.empty_state(1);
    auto p0 = Clock::now();
    bb.prefill(TokenBatch::single(random_ids(L, vocab, uint32_t(L))), s);
    const double dt = seconds_since(p0);
    const double rate = flops_per_token * double(L) / dt;
    fmt::print(
        "prefill {:>6} tokens: {:8.1f} tok/s  ({:.1f} s; projections {:.1f} GFLOP/s = "
        "{:.0f}% of peak) peak RSS {:.2f} GiB\n",
        L, double(L) / dt, dt, rate / 1e9, 100 * rate / peak_ref, peak_rss_gib());
    out["prefill"].push_back({{"tokens", L},
                              {"tok_per_s", double(L) / dt},
                              {"seconds", dt},
                              {"projection_gflops", rate / 1e9},
                              {"of_peak", rate / peak_ref},
                              {"peak_rss_gib", peak_rss_gib()}});
  }

  State trunk = bb.empty_state(1);
  {
    auto p0 = Clock::now();
    bb.prefill(TokenBatch::single(random_ids(o.fork_prefix, vocab, 7)), trunk);
    fmt::print("fork prefix {} tokens prefilled in {:.1f} s\n", o.fork_prefix, seconds_since(p0));
  }
  {
    std::vector<std::vector<int32_t>> rows;
    for (int64_t r = 0; r < o.forks; ++r)
      rows.push_back(random_ids(o.fork_tokens, vocab, uint32_t(100 + r)));
    ForkState fs = bb.fork({{.state = &trunk, .row = 0}}, std::vector<int64_t>(size_t(o.forks), 0),
                           o.fork_tokens);
    auto f0 = Clock::now();
    bb.fork_forward(TokenBatch::padded(rows), fs, false);
    const double dt = seconds_since(f0);
    const double toks = double(o.forks * o.fork_tokens);
    fmt::print(
        "fork pass {} x {} tokens over {}: {:.2f} s, {:.1f} tok/s ({:.0f}% of peak in "
        "projections) peak RSS {:.2f} GiB\n",
        o.forks, o.fork_tokens, o.fork_prefix, dt, toks / dt,
        100 * flops_per_token * toks / dt / peak_ref, peak_rss_gib());
    out["fork"] = {{"rows", o.forks},         {"tokens", o.fork_tokens},
                   {"prefix", o.fork_prefix}, {"seconds", dt},
                   {"tok_per_s", toks / dt},  {"of_peak", flops_per_token * toks / dt / peak_ref}};
  }
  {
    ForkState fs = bb.fork({{.state = &trunk, .row = 0}}, {0}, o.decode_steps + 8);
    bb.fork_forward(TokenBatch::single(random_ids(8, vocab, 5)), fs, true);
    int32_t next = 1;
    double backbone_s = 0, head_s = 0;
    for (int64_t i = 0; i < o.decode_steps; ++i) {
      auto d0 = Clock::now();
      Tensor h = bb.fork_forward(TokenBatch::single({next}), fs, true, true);
      auto d1 = Clock::now();
      Tensor logits = bb.lm_logits(h);
      const float* l = logits.data<float>();
      next = int32_t(std::max_element(l, l + logits.numel()) - l);
      backbone_s += std::chrono::duration<double>(d1 - d0).count();
      head_s += seconds_since(d1);
    }
    const double n = double(o.decode_steps);
    fmt::print(
        "decode 1 row after {} + 8 tokens: {:.2f} tok/s with LM head ({:.1f} ms backbone + "
        "{:.1f} ms head per token)\n",
        o.fork_prefix, n / (backbone_s + head_s), 1e3 * backbone_s / n, 1e3 * head_s / n);
    out["decode"] = {{"steps", o.decode_steps},
                     {"tok_per_s", n / (backbone_s + head_s)},
                     {"backbone_ms", 1e3 * backbone_s / n},
                     {"head_ms", 1e3 * head_s / n}};
  }
  fmt::print("peak RSS {:.2f} GiB\n", peak_rss_gib());
  out["peak_rss_gib"] = peak_rss_gib();
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << out.dump(2) << "\n";
    if (!f) throw Error(ErrorKind::io, "cannot write", {.path = o.json});
  }
}

}  // namespace deg
