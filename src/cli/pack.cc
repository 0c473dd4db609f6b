// deg pack --model CKPT --out DIR [--dtype bf16|f32] [--max-file-mib 16]: a deg checkpoint made
// small enough to ship (include/deg/checkpoint.h).
#include <fmt/format.h>

#include "cli/commands.h"
#include "deg/checkpoint.h"

namespace deg::cli {

void add_pack_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "pack",
      "Write a copy of a deg checkpoint made small enough to ship: the backbone's larger tensors\n"
      "(at least 4096 values: matrices, embeddings, tables) in bf16, the small ones (gates,\n"
      "lambdas, norms, rotary frequencies) and the heads as they are, the backbone split into\n"
      "parts of at most --max-file-mib each (backbone-00001-of-N.safetensors; one file when it\n"
      "fits), the JSON files copied, training state left out. deg reads the result like any\n"
      "checkpoint. bf16 halves an f32 trunk (deg pretrain / deg train write f32); answers can\n"
      "change where two outcomes were close: check with `deg eval` on both.\n"
      "Example:\n"
      "  deg pack --model tuned --out models/default");
  auto o = std::make_shared<CheckpointPackOptions>();
  auto model = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto mib = std::make_shared<double>(16.0);
  cmd->add_option("--model", *model, "The deg checkpoint to pack")->required();
  cmd->add_option("--out", *out, "Directory to create (absent or empty)")->required();
  cmd->add_option("--dtype", o->dtype, "bf16, or f32 (only split the backbone)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32"}));
  cmd->add_option("--max-file-mib", *mib, "Largest file written, in MiB")
      ->capture_default_str()
      ->check(CLI::Range(0.0625, 1048576.0));
  cmd->callback([o, model, out, mib] {
    o->model = *model;
    o->out = *out;
    o->max_file_bytes = int64_t(*mib * 1048576.0);
    const CheckpointPackResult r = checkpoint_pack(*o);
    fmt::print(stderr,
               "deg: wrote {} ({:.2f} MiB in all, the largest file {:.2f} MiB; the backbone in {} "
               "file{}, {} tensors in bf16)\n",
               *out, double(r.bytes) / 1048576.0, double(r.largest_file) / 1048576.0, r.files,
               r.files == 1 ? "" : "s", r.converted);
  });
}

}  // namespace deg::cli
