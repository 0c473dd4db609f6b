// deg forward --model DIR --ids-file F --out X.npy: raw LM logits [T, V] float32 (or the
// final-norm hidden states [T, C] with --hidden) of one token sequence — the conformance door
// the golden tests and users compare against HF transformers.
#include <fmt/format.h>

#include <cctype>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "core/buffer.h"
#include "core/error.h"
#include "io/npy.h"
#include "kernels/cuda_runtime.h"
#include "model/load.h"

namespace deg::cli {

namespace {

// ids from .npy (int32/int64, any shape with one non-unit dim) or text of integers.
std::vector<int32_t> read_ids(const std::string& path) {
  std::vector<int32_t> ids;
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0) {
    Tensor t = npy_read(path);
    if (t.dtype() != DType::i32 && t.dtype() != DType::i64) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("ids must be int32 or int64, got {}", dtype_name(t.dtype())),
                  {.path = path});
    }
    Tensor c = t.to(DType::i64);
    for (int64_t i = 0; i < c.numel(); ++i) {
      int64_t v = c.data<int64_t>()[i];
      if (v < 0 || v > INT32_MAX) {
        throw Error(ErrorKind::invalid_argument, fmt::format("token id {} is negative or huge", v),
                    {.path = path});
      }
      ids.push_back(int32_t(v));
    }
    return ids;
  }
  std::string text = read_file(path);
  for (char& ch : text)
    if (ch == ',' || ch == '[' || ch == ']') ch = ' ';
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 0 || v > INT32_MAX) {
      throw Error(ErrorKind::invalid_argument,
                  "\"" + word +
                      "\" is not a token id; the ids file holds integers separated by "
                      "spaces, commas or newlines (or is a .npy of int32/int64)",
                  {.path = path});
    }
    ids.push_back(int32_t(v));
  }
  return ids;
}

}  // namespace

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
    if (o->read_chunk < 0) {
      throw Error(ErrorKind::invalid_argument, "--read-chunk must be positive (or 0: the default)");
    }
    std::vector<int32_t> ids = read_ids(o->ids);
    if (ids.empty()) throw Error(ErrorKind::invalid_argument, "no token ids", {.path = o->ids});
    const DeviceChoice device = pick_device(o->device);
    auto backbone = backbone_open(
        o->model, {.precision = o->gemm == "bf16" ? GemmPrecision::bf16 : GemmPrecision::exact,
                   .device = device.device,
                   .cpu_fallback = device.automatic,
                   .read_chunk = o->read_chunk});
    std::optional<SoftTokens> soft;
    if (!o->soft.empty()) soft = soft_at_placeholders(backbone->spec(), ids, npy_read(o->soft));
    Tensor out = backbone_forward(*backbone, ids, !o->hidden, o->fork_at, soft ? &*soft : nullptr);
    npy_write(o->out, out);
  });
}

}  // namespace deg::cli
