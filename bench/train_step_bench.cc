// One `gpt` training step's speed on a backend: the forward, the loss and the backward of a
// preset over a packed stream of random tokens (a document every --max-seq-len), split into
// those three parts, then the optimizer step, with the parameters, gradients and optimizer state
// resident on the backend (train::GptResident) — what `deg pretrain` does per step. On
// CUDA, one more step runs with every op's device time taken (CUDA events), so the table says
// which ops stand in the way, and under each op its costliest call sites (the op methods' return
// addresses, named by addr2line; a build with CXXFLAGS=-g1 gives their lines); the gap between
// the ops' sum and the wall time is host work and copies. Each figure the median of `--repeats`
// steps after a warm-up. Not a test.
//
// usage: train_step_bench [--device cpu|cuda] [--config tiny|small|...] [--tokens T]
//                         [--max-seq-len L] [--vocab V] [--repeats N] [--precision f32|bf16]
//                         [--sites N]  (the N costliest call sites under each op; 0: none)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"
#include "model/gpt_config.h"
#include "train/gpt_params.h"
#include "train/gpt_step.h"
#include "train/optim.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace deg;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "function (file:line)" for each "MODULE+0xOFFSET" call site, by addr2line when it is installed
// (the bare site otherwise; the line needs debug lines in the binary).
std::map<std::string, std::string> name_sites(const std::vector<std::string>& wheres) {
  std::map<std::string, std::vector<std::string>> by_module;  // module -> sites
  for (const std::string& w : wheres) {
    const size_t plus = w.rfind("+0x");
    if (plus != std::string::npos) by_module[w.substr(0, plus)].push_back(w);
  }
  std::map<std::string, std::string> out;
  for (const auto& [module, sites] : by_module) {
    std::string cmd = fmt::format("addr2line -f -C -e '{}'", module);
    for (const std::string& w : sites) cmd += fmt::format(" {}", w.substr(module.size() + 1));
    cmd += " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) continue;
    char line[4096];
    for (const std::string& w : sites) {
      std::string fn, at;
      if (!fgets(line, sizeof line, p)) break;
      fn = line;
      if (!fgets(line, sizeof line, p)) break;
      at = line;
      while (!fn.empty() && fn.back() == '\n') fn.pop_back();
      while (!at.empty() && at.back() == '\n') at.pop_back();
      if (fn.size() > 90) fn.resize(90);
      const size_t slash = at.rfind('/');
      out[w] = fmt::format("{} ({})", fn, slash == std::string::npos ? at : at.substr(slash + 1));
    }
    pclose(p);
  }
  return out;
}

struct Options {
  std::string device = "cuda";
  std::string config = "tiny";
  std::string precision = "f32";
  int64_t tokens = 4096, max_seq_len = 512, vocab = 8192;
  int repeats = 5;
  int sites = 3;  // call sites listed under each op of the profile
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw Error(ErrorKind::invalid_argument, "missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--device") {
      o.device = v;
    } else if (a == "--config") {
      o.config = v;
    } else if (a == "--precision") {
      o.precision = v;
    } else if (a == "--tokens") {
      o.tokens = std::stoll(v);
    } else if (a == "--max-seq-len") {
      o.max_seq_len = std::stoll(v);
    } else if (a == "--vocab") {
      o.vocab = std::stoll(v);
    } else if (a == "--repeats") {
      o.repeats = std::max(1, std::stoi(v));
    } else if (a == "--sites") {
      o.sites = std::max(0, std::stoi(v));
    } else {
      throw Error(ErrorKind::invalid_argument, "unknown option " + a);
    }
  }
  return o;
}

train::GptBatch random_batch(const Options& o, uint32_t seed) {
  std::mt19937 rng(seed);
  train::GptBatch b;
  for (int64_t t = 0; t < o.tokens; ++t) {
    b.inputs.push_back(int32_t(rng() % uint32_t(o.vocab)));
    b.seg_start.push_back(int32_t(t / o.max_seq_len * o.max_seq_len));
  }
  for (int64_t t = 0; t < o.tokens; ++t)
    b.targets.push_back(t + 1 < o.tokens ? b.inputs[size_t(t + 1)] : -1);
  return b;
}

int run(const Options& o) {
  GptConfig config = gpt_preset(o.config);
  config.vocab_size = o.vocab;
  const Device device = o.device == "cpu" ? Device::cpu : Device::cuda;
  if (device == Device::cuda && !cuda_available())
    throw Error(ErrorKind::unsupported, "no CUDA device here (--device cpu)");
  train::GptParams params = train::GptParams::create(config);
  params.init(1);
  // As `deg pretrain` runs: parameters, gradients and optimizer state resident on the device.
  const Ops& ops = ops_for(device);
  train::GptOptimizer opt(params, {.polar = train::train_precision(o.precision)}, ops);
  train::GptResident resident(params, ops);
  std::vector<train::ParamTensor> grads;  // none on the host: the gradients are the resident ones
  const train::GptStepOptions so{.mtp_weights = {1.0f, 0.5f, 0.25f},
                                 .window_short = config.window_short,
                                 .window_long = config.window_long,
                                 .device = device,
                                 .resident = &resident,
                                 .precision = train::train_precision(o.precision),
                                 .host_final = false};
  fmt::print(
      "train_step_bench: {} preset ({} parameters, vocab {}), {} tokens a step ({} a "
      "document), {} products, {}\n",
      o.config, config.parameter_count(), o.vocab, o.tokens, o.max_seq_len, o.precision,
      device == Device::cuda ? cuda_devices().at(0).name : std::string("the CPU"));
  train::GptActs work;
  std::vector<double> fwd, loss, bwd, step_ms, total;
  for (int r = 0; r <= o.repeats; ++r) {  // r == 0: warm-up
    const train::GptBatch b = random_batch(o, uint32_t(r));
    const auto t0 = Clock::now();
    train::gpt_forward(params, b, so, work);
    ops.synchronize();  // the split's forward is its device time, not only its launches
    const double f = ms_since(t0);
    const auto t1 = Clock::now();
    train::Buf dfinal;
    const double l = train::gpt_loss_of_forward(params, b, so, work, dfinal, grads);
    const double lm = ms_since(t1);
    const auto t2 = Clock::now();
    train::gpt_backward(params, b, so, work, nullptr, grads);  // d(final) stays on the device
    ops.synchronize();  // the gradients stay on the device: wait for them
    const double bw = ms_since(t2);
    const auto t3 = Clock::now();
    opt.step(resident.value_ptrs(), resident.grad_ptrs(), 1.0, 0.9, r % 2 == 1, true);
    ops.synchronize();
    const double st = ms_since(t3);
    if (r == 0) {
      fmt::print("  warm-up step: loss {:.4f}, {:.1f} ms\n", l, ms_since(t0));
      continue;
    }
    fwd.push_back(f), loss.push_back(lm), bwd.push_back(bw), step_ms.push_back(st);
    total.push_back(f + lm + bw + st);
  }
  const double t = median(total);
  const train::GptBatch mb = random_batch(o, 7);
  const double flops = 6 * double(params.config().matmul_parameter_count()) * double(mb.size()) +
                       double(gpt_attention_flops(params.config(), mb.seg_start));
  const double peak = device == Device::cuda ? cuda_bf16_peak_flops() : 0;
  fmt::print("  median of {} steps: {:.1f} ms a step, {:.0f} tokens/s{}\n", o.repeats, t,
             1e3 * double(o.tokens) / t,
             peak > 0 ? fmt::format(", MFU {:.1f}%", 100 * flops / (t * 1e-3) / peak) : "");
  fmt::print("    forward {:.1f} ms, loss {:.1f} ms, backward {:.1f} ms, optimizer {:.1f} ms\n",
             median(fwd), median(loss), median(bwd), median(step_ms));
  if (device != Device::cuda) return 0;
  const train::GptBatch b = random_batch(o, 99);
  cuda_profile_start();
  const auto t0 = Clock::now();
  train::gpt_forward(params, b, so, work);
  train::Buf dfinal;
  train::gpt_loss_of_forward(params, b, so, work, dfinal, grads);
  train::gpt_backward(params, b, so, work, nullptr, grads);  // d(final) stays on the device
  opt.step(resident.value_ptrs(), resident.grad_ptrs(), 1.0, 0.9, true, true);
  ops.synchronize();
  const double wall = ms_since(t0);
  const std::vector<OpTime> times = cuda_profile_stop();
  double sum = 0;
  for (const OpTime& x : times) sum += x.ms;
  fmt::print(
      "  profile of forward + loss + backward + optimizer: {:.1f} ms in ops of {:.1f} ms wall\n",
      sum, wall);
  std::vector<std::string> wheres;
  for (const OpTime& x : times)
    for (size_t k = 0; k < x.sites.size() && int(k) < o.sites; ++k)
      wheres.push_back(x.sites[k].where);
  const std::map<std::string, std::string> names = name_sites(wheres);
  for (const OpTime& x : times) {
    fmt::print("    {:<28} {:9.2f} ms {:6.1f}%  {:6d} calls\n", x.op, x.ms, 100 * x.ms / wall,
               x.calls);
    for (size_t k = 0; k < x.sites.size() && int(k) < o.sites; ++k) {
      const OpSite& c = x.sites[k];
      const auto it = names.find(c.where);
      fmt::print("      {:9.2f} ms {:6d} calls  {}\n", c.ms, c.calls,
                 it != names.end() ? it->second : c.where);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_step_bench: {}\n", e.what());
    return 1;
  }
}
