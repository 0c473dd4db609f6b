// deg train --base MODEL --out CKPT --task SCHEMA.json:TRAIN.jsonl[:DEV.jsonl] ...: fine-tune a
// model's heads (and a gpt trunk) on labeled documents (include/deg/train.h); a progress bar
// with the loss, the dev loss, tokens/s and the ETA goes to stderr, a JSON summary to stdout.
#include "deg/train.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/progress.h"
#include "deg/error.h"
#include "deg/json.h"

namespace deg::cli {

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "train",
      "Fine-tune a model on labeled documents so that `deg fill` answers your schema.\n"
      "Each record of TRAIN.jsonl is {\"document\": \"...\", \"expected\": {...}} (the values the\n"
      "document holds; an absent optional field is simply missing, every extracted string an\n"
      "exact substring of the document). Every field becomes exactly the query `deg fill` asks,\n"
      "its head is trained on the expected answer; a `gpt` trunk trains too (other backbones\n"
      "keep theirs frozen). Several --task flags train one model on several schemas.\n"
      "The best checkpoint by dev loss is kept in --out; at the end one calibration temperature\n"
      "per head kind is fit on half of the dev records and the calibration error reported on the\n"
      "other half. Writes metrics.jsonl and calibration.json beside the checkpoint.\n"
      "Examples:\n"
      "  deg train --base ckpt --out tuned \\\n"
      "      --task data/snips/schema.json:data/snips/train.jsonl:data/snips/dev.jsonl\n"
      "  deg eval --model tuned --schema data/snips/schema.json --data data/snips/dev.jsonl");
  auto o = std::make_shared<train::FineTuneOptions>();
  auto tasks = std::make_shared<std::vector<std::string>>();
  auto quiet = std::make_shared<bool>(false);
  auto no_calibrate = std::make_shared<bool>(false);
  cmd->add_option("--base", o->base,
                  "A deg checkpoint, or a model `deg init` accepts (then the heads start fresh)")
      ->required();
  cmd->add_option("--out", o->out, "Checkpoint directory to write (new or empty)")->required();
  cmd->add_option("--task", *tasks, "SCHEMA.json:TRAIN.jsonl[:DEV.jsonl]; repeat for multi-task")
      ->required();
  cmd->add_option("--steps", o->steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--max-seconds", o->max_seconds,
                  "Train for about this long: after 10, 40 and 160 steps the run becomes the steps "
                  "that fit at the pace so far (at most --steps); the schedule follows")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--device", o->device,
                  "cpu, cuda or auto (a GPU when one is visible): where a gpt trunk trains")
      ->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "f32, or bf16: a gpt trunk's matrix products (the optimizer's too) round their "
                  "operands to bf16 and sum in f32, and on a GPU its attention runs in bf16 too "
                  "(tensor cores); weights and optimizer state stay f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_flag("--shuffle-options", o->shuffle_options,
                "Each training record lists a choice field's options in its own order (from "
                "--seed), so the head learns the options' words rather than their places; dev "
                "records and deg fill keep the schema's order");
  cmd->add_option("--profile-step", o->profile_step,
                  "Write OUT/profile.txt: this step's phases and the device time of every CUDA op "
                  "in it (--device cuda; every step's phases are in metrics.jsonl's \"ms\")")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch-tokens", o->batch_tokens,
                  "Document and query tokens per step (at least one record)")
      ->capture_default_str();
  cmd->add_option("--max-train", o->max_train, "Training records per task (0: all)")
      ->capture_default_str();
  cmd->add_option("--max-dev", o->max_dev, "Dev records per task (0: all)")->capture_default_str();
  cmd->add_option("--empty-array-rate", o->empty_array_rate,
                  "Share of array queries with no expected item kept for training")
      ->capture_default_str();
  cmd->add_option("--anchor-pos-weight", o->anchor_pos_weight,
                  "Weight of an item start's term in the anchor loss")
      ->capture_default_str();
  cmd->add_option("--head-lr", o->head_lr, "AdamW learning rate of the heads")
      ->capture_default_str();
  cmd->add_option("--trunk-lr", o->trunk_lr,
                  "gpt trunk: multiplies the pretraining optimizer's learning rates")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", o->warmup_steps, "Linear warmup of the learning rates")
      ->capture_default_str();
  cmd->add_option("--cooldown", o->cooldown,
                  "Share of the steps at the end over which the rates decay linearly to 0")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--clip", o->clip, "Global gradient-norm clip (0: none)")->capture_default_str();
  cmd->add_option("--eval-every", o->eval_every, "Dev loss every N steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--patience", o->patience,
                  "Stop after N evaluations without a better dev loss (0: never)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of fresh heads, record order and sampling")
      ->capture_default_str();
  cmd->add_option("--stop-at", o->stop_at,
                  "Stop after N steps, saved for --resume (the schedule stays --steps')")
      ->capture_default_str();
  cmd->add_flag("--freeze-trunk", o->freeze_trunk, "gpt: train the heads only");
  cmd->add_flag("--no-calibrate", *no_calibrate, "Keep the temperatures as they are");
  cmd->add_flag("--resume", o->resume, "Continue the run in --out from its last evaluation");
  cmd->add_flag("--quiet", *quiet, "No progress bar");
  cmd->callback([o, tasks, quiet, no_calibrate] {
    for (const std::string& t : *tasks) o->tasks.push_back(train::parse_task(t));
    o->calibrate = !*no_calibrate;
    const train::FineTuneResult r = train::fine_tune(*o, [&](const train::FineTuneProgress& p) {
      if (*quiet) return;
      if (p.stage != "train") {
        std::fprintf(stderr, "\r%s %s %lld/%lld   ", p.stage.c_str(),
                     progress_bar(p.done, p.total).c_str(), (long long)p.done, (long long)p.total);
        if (p.done == p.total) std::fprintf(stderr, "\n");
        return;
      }
      std::string dev = p.dev_loss ? fmt::format(" dev {:.4f}", *p.dev_loss) : "";
      for (const auto& [kind, a] : p.dev_accuracy) dev += fmt::format(" {} {:.3f}", kind, a);
      std::fprintf(stderr, "\r%s %lld/%lld loss %.4f%s %.0f tok/s ETA %s   ",
                   progress_bar(p.done, p.total).c_str(), (long long)p.done, (long long)p.total,
                   p.loss, dev.c_str(), p.tokens_per_s, progress_clock(p.eta_s).c_str());
      if (p.dev_loss) std::fprintf(stderr, "\n");
    });
    if (r.rank != 0) return;  // rank 0 reports for a data-parallel run
    OrderedJson cal = OrderedJson::array();
    for (const auto& k : r.calibration)
      cal.push_back({{"kind", k.kind},
                     {"temperature", k.temperature},
                     {"ece_before", k.ece_before},
                     {"ece_after", k.ece_after},
                     {"report_queries", k.report_queries}});
    const OrderedJson out = {{"steps", r.steps_run},
                             {"train_examples", r.train_examples},
                             {"dev_examples", r.dev_examples},
                             {"unlocated_values", r.unlocated},
                             {"first_dev_loss", r.first_dev_loss},
                             {"best_dev_loss", r.best_dev_loss},
                             {"best_step", r.best_step},
                             {"stopped_early", r.stopped_early},
                             {"calibration", cal}};
    fmt::print("{}\n", out.dump());
  });
}

}  // namespace deg::cli
