// `deg pretrain` (see include/deg/train.h): the pretraining loop over the training core
// (gpt_step). Multi-token-prediction weights follow the seed's stage table over thirds of the run
// ([1, .5, .25 -> 0], [1, .5 -> 0], [1]); Adam steps on odd steps; embed is tied to lm_head for
// the first two thirds (split at the extension stage in the seed). A step's micro-batches are
// shared out over the run's ranks (train/comm.h); their summed gradients are averaged where the
// optimizer reads them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>

#include "core/error.h"
#include "deg/train.h"
#include "io/json.h"
#include "kernels/cuda_runtime.h"
#include "model/gpt_config.h"
#include "train/comm.h"
#include "train/data.h"
#include "train/distributed.h"
#include "train/gpt_params.h"
#include "train/gpt_step.h"
#include "train/optim.h"

namespace deg::train {
namespace fs = std::filesystem;
namespace {

// Preset vocabularies are padded to a multiple of this (GPT-2's 50257 -> 50304).
constexpr int64_t kVocabMultiple = 128;

std::vector<float> mtp_weights(int64_t step, int64_t steps) {
  const double f = steps > 0 ? double(step) / double(steps) : 1.0;
  if (f < 1.0 / 3) {
    const float t = float(f * 3);
    return {1.0f, 0.5f, 0.25f * (1 - t)};
  }
  if (f < 2.0 / 3) {
    const float t = float((f - 1.0 / 3) * 3);
    return {1.0f, 0.5f * (1 - t)};
  }
  return {1.0f};
}

double validate(const GptParams& p, GptResident& resident, const PretrainOptions& o,
                const DataInfo& info, const std::vector<fs::path>& val_files) {
  ShardLoader val(val_files, info.bos_id);
  const GptStepOptions so{.mtp_weights = {1.0f},
                          .window_short = p.config().window_short,
                          .window_long = p.config().window_long,
                          .device = resident.ops->device(),
                          .resident = &resident,
                          .precision = train_precision(o.precision),
                          .host_final = false};
  const int64_t chunk = std::min(o.val_tokens, o.batch_tokens);
  double sum = 0;
  int64_t n = 0;
  GptActs work;
  for (int64_t done = 0; done < o.val_tokens; done += chunk) {
    GptBatch b = val.next(chunk, o.max_seq_len);
    sum += gpt_loss(p, b, so, &work) * double(b.size());
    n += b.size();
    if (val.position().epoch > 0) break;  // the validation set is smaller than val_tokens
  }
  return n ? sum / double(n) : 0.0;
}

double unigram_entropy(const std::vector<fs::path>& files, int32_t bos) {
  std::map<int, int64_t> counts;
  int64_t total = 0;
  for (const auto& f : files)
    for (uint16_t t : shard_read(f))
      if (t != bos) ++counts[t], ++total;
  double h = 0;
  for (auto [t, c] : counts) {
    const double q = double(c) / double(total);
    h -= q * std::log(q);
  }
  return h;
}

// The gradients the coming optimizer step reads: summed over the ranks, then divided by the
// step's micro-batches (each micro-batch's gradients are of its mean loss). The gradients it
// does not read yet (Adam's between Adam steps) keep accumulating this rank's own.
void sum_gradients(const GptOptimizer& opt, GptResident& resident, const Comm& comm, bool do_adam,
                   int64_t micro) {
  const std::vector<float*> g = resident.grad_ptrs();
  for (size_t k = 0; k < g.size(); ++k) {
    if (!opt.reads_gradient(k, do_adam)) continue;
    const int64_t n = resident.grads[k].numel();
    comm.sum(g[k], n);
    if (micro > 1)
      resident.ops->scale({.y = g[k], .ldy = n, .rows = 1, .n = n, .s = 1.0f / float(micro)});
  }
}

void save_checkpoint(const GptParams& p, const GptOptimizer& opt, const PretrainOptions& o,
                     int64_t step, int64_t steps, const ShardLoader& loader) {
  fs::create_directories(o.out_dir);
  gpt_config_save(p.config(), o.out_dir / "config.json");
  p.save(o.out_dir / "model.safetensors");
  opt.save(o.out_dir / "optimizer.safetensors");
  const auto pos = loader.position();
  std::ofstream(o.out_dir / "trainer.json")
      << Json{{"step", step},
              {"seed", o.seed},
              {"steps", steps},
              {"loader", {{"shard", pos.shard}, {"doc", pos.doc}, {"epoch", pos.epoch}}}}
             .dump(2)
      << "\n";
  if (fs::exists(o.data_dir / "tokenizer.json"))
    fs::copy_file(o.data_dir / "tokenizer.json", o.out_dir / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
}

// The loop on o.config resolved, as rank comm.rank(); a preset's vocabulary (vocab_from_data)
// becomes the data's.
PretrainResult pretrain_gpt(GptConfig config, bool vocab_from_data, const PretrainOptions& o,
                            const Comm& comm,
                            const std::function<void(const PretrainProgress&)>& on_progress) {
  if (o.steps <= 0) throw Error(ErrorKind::invalid_argument, "--steps must be positive");
  const int64_t micro = o.micro_batches;
  if (micro < 1 || micro % comm.size())
    throw Error(
        ErrorKind::invalid_argument,
        fmt::format("--micro-batches must be a positive multiple of the ranks ({})", comm.size()));
  const bool lead = comm.rank() == 0;  // validates, writes and reports
  // Checkpoints sit right after an Adam step (odd step index), so no Adam gradient is pending
  // and a resume continues exactly.
  if (o.stop_at % 2 || o.save_every % 2)
    throw Error(ErrorKind::invalid_argument, "--stop-at and --save-every must be even");
  if (o.max_seconds < 0 || (o.max_seconds > 0 && (o.resume || o.stop_at > 0)))
    throw Error(ErrorKind::invalid_argument,
                "--max-seconds must be positive and goes without --resume and --stop-at");
  // The schedules' length: --steps, or (--max-seconds) the steps that fit, re-estimated after
  // a few steps (time_budget_steps).
  int64_t steps = o.steps;
  int64_t stop = o.stop_at > 0 ? std::min(o.stop_at, o.steps) : o.steps;
  if (o.batch_tokens < 2 * micro || o.max_seq_len < 2)
    throw Error(ErrorKind::invalid_argument,
                "batch tokens (per micro-batch) and max_seq_len must be >= 2");
  const int64_t micro_tokens = o.batch_tokens / micro;
  const DataInfo info = data_info_read(o.data_dir);
  if (vocab_from_data) {
    if (info.vocab_size <= 0)
      throw Error(ErrorKind::invalid_argument,
                  "data.json gives no vocab_size, so the preset cannot size its vocabulary; "
                  "remake the data with `deg shard` or add \"vocab_size\": V to data.json",
                  {o.data_dir.string()});
    config.vocab_size = (info.vocab_size + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
  }
  if (info.vocab_size > config.vocab_size)
    throw Error(ErrorKind::invalid_argument,
                fmt::format("the data's vocabulary ({}) exceeds the config's vocab_size ({}); "
                            "use a config with a vocab_size of at least {}, or a preset (which "
                            "takes its vocabulary from the data)",
                            info.vocab_size, config.vocab_size, info.vocab_size),
                {o.data_dir.string()});
  const auto train_files = shard_files(o.data_dir, "train");
  auto val_files = shard_files(o.data_dir, "val");
  if (train_files.empty())
    throw Error(ErrorKind::not_found, "no train_*.bin shards", {o.data_dir.string()});
  if (val_files.empty()) val_files = train_files;

  GptParams params = GptParams::create(config);
  params.init(o.seed);
  // The parameters, gradients and optimizer state live on the training device for the whole run
  // (host memory on the CPU); checkpoints download them.
  const Device device = pick_device(o.device);
  const GemmPrecision precision = train_precision(o.precision);
  const Ops& ops = ops_for(device);
  GptOptimizer opt(params, {.polar = precision}, ops);
  ShardLoader loader(train_files, info.bos_id);
  int64_t start = 0;
  if (o.resume) {
    const Json st = json_load(o.out_dir / "trainer.json");
    params = GptParams::load(gpt_config_resolve((o.out_dir / "config.json").string()),
                             o.out_dir / "model.safetensors");
    opt.load(o.out_dir / "optimizer.safetensors");
    start = st.at("step").get<int64_t>();
    const Json& lp = st.at("loader");
    loader.seek({lp.at("shard").get<int64_t>(), lp.at("doc").get<int64_t>(),
                 lp.at("epoch").get<int64_t>()});
  }
  auto schedule = [&](int64_t total) {
    return TrainSchedule{
        .total_steps = total,
        .warmup_steps = o.warmup_steps,
        .momentum_warmup = std::min<int64_t>(300, std::max<int64_t>(1, total / 3)),
        .momentum_cooldown = std::min<int64_t>(50, std::max<int64_t>(1, total / 10))};
  };
  TrainSchedule sched = schedule(steps);
  PretrainResult result;
  result.rank = comm.rank();
  bool have_first = false;
  std::ofstream metrics;
  if (lead) {
    result.unigram_entropy = unigram_entropy(val_files, info.bos_id);
    fs::create_directories(o.out_dir);
    metrics.open(o.out_dir / "metrics.jsonl", o.resume ? std::ios::app : std::ios::trunc);
    if (!metrics) throw Error(ErrorKind::io, "cannot write metrics.jsonl", {o.out_dir.string()});
  }
  std::vector<ParamTensor> no_host_grads;  // the gradients are the resident ones
  GptResident resident(params, ops);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  // Model FLOPs (6 N a token plus the attention's over each batch's mask) against the GPUs'
  // dense bf16 peak, where it is known.
  const double peak = device == Device::cuda ? cuda_bf16_peak_flops() * comm.size() : 0;
  const double matmul_n = double(params.config().matmul_parameter_count());
  double flops = 0;
  GptActs work;  // the steps' memory
  for (int64_t step = start; step < stop; ++step) {
    const GptStepOptions so{.mtp_weights = mtp_weights(step, steps),
                            .window_short = params.config().window_short,
                            .window_long = params.config().window_long,
                            .device = device,
                            .resident = &resident,
                            .precision = precision,
                            .host_final = false};
    // Every rank reads every micro-batch (the loaders stay in step) and trains on its own.
    double loss = 0;
    for (int64_t m = 0; m < micro; ++m) {
      GptBatch b = loader.next(micro_tokens, o.max_seq_len);
      tokens += b.size();
      if (peak > 0)
        flops += 6 * matmul_n * double(b.size()) +
                 double(gpt_attention_flops(params.config(), b.seg_start));
      if (m % comm.size() == comm.rank())
        loss += gpt_loss_and_grad(params, b, so, no_host_grads, &work);
    }
    loss = comm.sum(loss) / double(micro);
    if (!std::isfinite(loss))
      throw Error(ErrorKind::internal, fmt::format("training diverged at step {}", step));
    const bool do_adam = step % 2 == 1;
    sum_gradients(opt, resident, comm, do_adam, micro);
    const int64_t split_step = (2 * steps / 3) | 1;  // embed and lm_head tied until here
    opt.step(resident.value_ptrs(), resident.grad_ptrs(), sched.lr_scale(step),
             sched.momentum(step), do_adam, step < split_step);
    if (o.max_seconds > 0) {  // rank 0's pace sizes every rank's run
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const int64_t lead_fit =
          lead ? time_budget_steps(step + 1, secs, o.max_seconds, o.steps, steps) : 0;
      const int64_t fit = int64_t(comm.sum(double(lead_fit)));
      if (fit != steps) {
        steps = stop = fit;
        sched = schedule(steps);
      }
    }
    const bool last = step + 1 == stop;
    ++result.steps_run;
    if (!lead) continue;
    PretrainProgress pr{.step = step + 1, .steps = steps, .train_loss = loss};
    if (last || (o.val_every > 0 && (step + 1) % o.val_every == 0)) {
      pr.val_loss = validate(params, resident, o, info, val_files);
      if (!have_first) result.first_val_loss = *pr.val_loss;
      have_first = true;
      result.last_val_loss = *pr.val_loss;
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    pr.tokens_per_s = secs > 0 ? double(tokens) / secs : 0;
    if (peak > 0 && secs > 0) pr.mfu = flops / secs / peak;
    pr.eta_s = secs / double(step + 1 - start) * double(stop - step - 1);
    Json line = {{"step", pr.step}, {"train_loss", loss}, {"tokens_per_s", pr.tokens_per_s}};
    line["val_loss"] = pr.val_loss ? Json(*pr.val_loss) : Json(nullptr);
    line["mfu"] = pr.mfu ? Json(*pr.mfu) : Json(nullptr);
    metrics << line.dump() << "\n" << std::flush;
    if (on_progress) on_progress(pr);
    if (last || (o.save_every > 0 && (step + 1) % o.save_every == 0)) {
      resident.download(params);
      save_checkpoint(params, opt, o, step + 1, steps, loader);
    }
  }
  return result;
}

}  // namespace

PretrainResult pretrain_ranked(const PretrainOptions& options, const Comm& comm,
                               const std::function<void(const PretrainProgress&)>& on_progress) {
  const auto presets = gpt_preset_names();
  const bool preset = std::find(presets.begin(), presets.end(), options.config) != presets.end();
  return pretrain_gpt(gpt_config_resolve(options.config), preset, options, comm, on_progress);
}

PretrainResult pretrain(const PretrainOptions& options,
                        const std::function<void(const PretrainProgress&)>& on_progress) {
  return pretrain_ranked(options, *launch_comm("deg pretrain", options.device), on_progress);
}

}  // namespace deg::train
