// deg forward --model DIR --ids-file F --out X.npy: raw LM logits [T, V] float32 (or the
// final-norm hidden states [T, C] with --hidden) of one token sequence — the conformance door
// the golden tests and users compare against HF transformers.
#include "deg/forward.h"

#include "cli/commands.h"
#include "deg/error.h"

namespace deg::cli {

void add_forward_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "forward", "Raw LM logits [T, V] float32 (.npy) of one token sequence (a conformance door).");
  struct Opts {
    std::string model, ids, out, soft, gemm = "exact", device = "auto";
    bool hidden = false;
    int64_t fork_at = 0, read_chunk = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "HF snapshot directory (config.json + *.safetensors)")
      ->required();
  cmd->add_option("--ids-file", o->ids, ".npy of int32/int64 ids, or text of integers")->required();
  cmd->add_option("--out", o->out, "Output .npy (float32)")->required();
  cmd->add_flag("--hidden", o->hidden, "Write the final-norm hidden states [T, C] instead");
  cmd->add_option("--fork-at", o->fork_at,
                  "Read the first K ids as the trunk and the rest as one fork row over it");
  cmd->add_option("--soft", o->soft,
                  "Media embeddings f32 [n, hidden] (.npy) read as soft tokens where the ids hold "
                  "the model's image / audio placeholder ids, in order (Gemma 4)");
  cmd->add_option("--read-chunk", o->read_chunk,
                  "Prefill tokens per pass (a multiple of 64; 0: 512 on the CPU, 8192 on a GPU)")
      ->capture_default_str();
  cmd->add_option("--gemm", o->gemm,
                  "exact (f32 activations) or bf16 (bf16 dot products over bf16 weights)")
      ->capture_default_str();
  add_device_option(cmd, o->device);
  cmd->callback([o] {
    if (o->gemm != "exact" && o->gemm != "bf16") {
      throw Error(ErrorKind::invalid_argument, "--gemm must be exact or bf16, got " + o->gemm);
    }
    std::vector<int32_t> ids = token_ids_read(o->ids);
    if (ids.empty()) throw Error(ErrorKind::invalid_argument, "no token ids", {.path = o->ids});
    forward_write({.model = o->model,
                   .ids = std::move(ids),
                   .hidden = o->hidden,
                   .fork_at = o->fork_at,
                   .soft = o->soft,
                   .read_chunk = o->read_chunk,
                   .bf16_gemm = o->gemm == "bf16",
                   .device = o->device},
                  o->out);
  });
}

}  // namespace deg::cli
