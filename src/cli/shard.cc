// deg shard --tokenizer DIR --out DIR [--val FILE] FILE...: tokenize text files into
// modded-nanogpt token shards for `deg pretrain` (see include/deg/train.h).
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "deg/train.h"

namespace deg::cli {

void add_shard_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "shard",
      "Tokenize text files into token shards (train_000000.bin ..., val_000000.bin; the "
      "modded-nanogpt format) plus data.json and tokenizer.json, for `deg pretrain`. Documents "
      "are separated by the end-of-text token's text; each starts with that token's id.");
  auto o = std::make_shared<train::ShardTextOptions>();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json or a directory holding one")
      ->required();
  cmd->add_option("--out", o->out_dir, "Output directory")->required();
  auto val = std::make_shared<std::string>();
  cmd->add_option("--val", *val, "Validation text file");
  cmd->add_option("--separator", o->separator, "End-of-text token (default: found in vocab)");
  cmd->add_option("--shard-tokens", o->shard_tokens, "Tokens per shard")->capture_default_str();
  cmd->add_option("FILE", o->train_files, "Training text files")->required();
  cmd->callback([o, val] {
    if (!val->empty()) o->val_files = {*val};
    const auto r = train::shard_text_files(*o);
    fmt::print(
        "{{\"documents\": {}, \"train_tokens\": {}, \"val_tokens\": {}, \"bos_id\": {}, "
        "\"separator\": \"{}\"}}\n",
        r.documents, r.train_tokens, r.val_tokens, r.bos_id, r.separator);
  });
}

}  // namespace deg::cli
