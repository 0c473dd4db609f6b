// deg init --base HF_DIR --out DIR [--seed N]: a deg checkpoint with fresh heads on a base model.
#include <fmt/format.h>

#include "cli/commands.h"
#include "deg/checkpoint.h"

namespace deg::cli {

void add_init_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "init",
      "Write a deg checkpoint with freshly initialised heads on a base model (an HF snapshot):\n"
      "backbone.safetensors (the text model in bf16), heads.safetensors (fp32), deg.json, plus\n"
      "copies of the base's config.json and tokenizer files. The base is checked first as fully "
      "as\n"
      "`deg fill` reads it (config values, every tensor's shape and values, the tokenizer).\n"
      "Fresh heads answer at random: train them on labeled documents with `deg train --base DIR`.");
  auto opts = std::make_shared<CheckpointInitOptions>();
  auto base = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("--base", *base, "Base model: an HF snapshot directory")->required();
  cmd->add_option("--out", *out, "Checkpoint directory to create (absent or empty)")->required();
  cmd->add_option("--seed", opts->seed, "Seed of the head initialisation")->capture_default_str();
  cmd->callback([opts, base, out] {
    opts->base = *base;
    opts->out = *out;
    checkpoint_create(*opts);
    fmt::print(stderr, "deg: wrote checkpoint {} (base {})\n", *out, *base);
  });
}

}  // namespace deg::cli
