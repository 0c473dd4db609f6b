// deg tokenizer: commands that make tokenizers. `deg tokenizer train --vocab N --out DIR FILE...`
// learns a GPT-2 style byte-level BPE from text files (include/deg/tokenizer_train.h) and writes
// DIR/tokenizer.json; a progress line goes to stderr, a JSON summary to stdout.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/progress.h"
#include "deg/json.h"
#include "deg/tokenizer_train.h"

namespace deg::cli {
namespace {

namespace fs = std::filesystem;

struct TrainArgs {
  TokenizerTrainOptions options;
  std::vector<std::string> specials;
  fs::path out_dir;
  std::vector<fs::path> files;
  bool quiet = false;
};

// At most ten updates a second; always the last one.
class Throttle {
 public:
  bool due(bool last) {
    const auto now = std::chrono::steady_clock::now();
    if (!last && now - shown_ < std::chrono::milliseconds(100)) return false;
    shown_ = now;
    return true;
  }

 private:
  std::chrono::steady_clock::time_point shown_{};
};

void train(TrainArgs& a) {
  if (!a.specials.empty()) a.options.special_tokens = a.specials;
  TokenizerTrainer trainer(a.options);  // checks the options before any file is read
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  int64_t bytes = 0;
  for (size_t i = 0; i < a.files.size(); ++i) {
    if (!a.quiet)
      std::fprintf(stderr, "\r\033[Kcounting words: file %zu of %zu, %s", i + 1, a.files.size(),
                   a.files[i].filename().string().c_str());
    bytes += trainer.add_file(a.files[i]);
  }
  const double count_s = seconds();
  Throttle throttle;
  double first_s = 0;  // when the first merge was done (setting up the pair counts comes before)
  const TrainedTokenizer v = trainer.train([&](const TokenizerTrainProgress& p) {
    if (p.merges == 1) first_s = seconds();
    if (a.quiet || !throttle.due(p.merges == p.max_merges)) return;
    const double s = seconds() - first_s;
    const double rate = s > 0 ? double(p.merges - 1) / s : 0;
    const std::string eta =
        rate > 0 ? progress_clock(double(p.max_merges - p.merges) / rate) : std::string("-");
    std::fprintf(stderr, "\r\033[Kmerges %s %lld/%lld %.0f/s ETA %s",
                 progress_bar(p.merges, p.max_merges).c_str(), (long long)p.merges,
                 (long long)p.max_merges, rate, eta.c_str());
  });
  if (!a.quiet) std::fprintf(stderr, "\r\033[K");
  if (v.vocab_size < a.options.vocab_size)
    std::fprintf(stderr,
                 "deg: stopped at %lld tokens of the %lld asked for: no pair of tokens is left "
                 "that occurs at least %lld times (--min-frequency); give more text or a smaller "
                 "--vocab\n",
                 (long long)v.vocab_size, (long long)a.options.vocab_size,
                 (long long)a.options.min_frequency);
  const double merge_s = seconds() - count_s;
  const fs::path path = tokenizer_json_write(a.out_dir, v.json);
  auto round3 = [](double x) { return std::round(x * 1000) / 1000; };
  const OrderedJson summary = {{"tokenizer", path.string()},
                               {"vocab_size", v.vocab_size},
                               {"merges", v.merges},
                               {"special_tokens", v.special_tokens},
                               {"bytes", bytes},
                               {"words", trainer.word_count()},
                               {"unique_words", trainer.unique_words()},
                               {"count_s", round3(count_s)},
                               {"merge_s", round3(merge_s)},
                               {"write_s", round3(seconds() - count_s - merge_s)}};
  fmt::print("{}\n", summary.dump());
}

void add_train_command(CLI::App* group) {
  auto* cmd = group->add_subcommand(
      "train",
      "Learn a byte-level BPE tokenizer (GPT-2 style) from text files; writes DIR/tokenizer.json, "
      "which deg and HF `tokenizers` load and encode alike");
  cmd->footer(
      "\n"
      "How: the text is cut into words as the tokenizer will cut it (special tokens out, then\n"
      "GPT-2's split regex: letters, digits or other symbols with their leading space, and\n"
      "runs of whitespace) and the words are counted. Every byte is a token from the start\n"
      "(256 of them), so any text encodes. Then, until the vocabulary holds --vocab tokens,\n"
      "the adjacent pair of tokens that occurs most often in the counted words becomes a new\n"
      "token (a merge); equal counts go to the pair with the smaller (first id, second id).\n"
      "\n"
      "Ids: the special tokens first (0, 1, ...), then the 256 byte tokens, then the merges\n"
      "in the order they were learned. For `deg shard` and `deg pretrain` keep --vocab at\n"
      "most 65536 (shards store 16-bit ids); the pretrain presets size their embedding from\n"
      "the data, rounded up to a multiple of 128. About 10 MB of text trains in a few\n"
      "seconds.\n"
      "\n"
      "Example:\n"
      "  deg tokenizer train --vocab 8192 --out tok/ corpus/*.txt\n"
      "  deg shard --tokenizer tok/ --out data/ corpus/*.txt\n"
      "  deg pretrain --config tiny --data data/ --steps 300 --out ckpt/");
  auto a = std::make_shared<TrainArgs>();
  cmd->add_option("--vocab", a->options.vocab_size,
                  "Tokens in the tokenizer: special tokens + 256 byte tokens + merges")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--out", a->out_dir, "Directory to write tokenizer.json into (made if needed)")
      ->required();
  cmd->add_option("--min-frequency", a->options.min_frequency,
                  "A pair seen fewer times is never merged (the vocabulary may then come out "
                  "smaller than --vocab)")
      ->capture_default_str();
  cmd->add_option("--special", a->specials,
                  "Special token, repeatable (default: <|endoftext|>, the document separator "
                  "`deg shard` and the gpt family use); the text never merges across one. Give "
                  "--special once per token")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--quiet", a->quiet, "No progress line");
  cmd->add_option("FILE", a->files, "Training text files (UTF-8; invalid bytes read as U+FFFD)")
      ->required();
  cmd->callback([a] { train(*a); });
}

}  // namespace

void add_tokenizer_command(CLI::App& app) {
  auto* group = app.add_subcommand(
      "tokenizer", "Make tokenizers: `deg tokenizer train` learns a byte-level BPE from text");
  group->require_subcommand(1);
  add_train_command(group);
}

}  // namespace deg::cli
