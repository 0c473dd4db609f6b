// `deg forward` (deg/forward.h): one token sequence through a backbone, to .npy.
#include "deg/forward.h"

#include <fmt/format.h>

#include <optional>
#include <sstream>

#include "core/buffer.h"
#include "core/error.h"
#include "io/npy.h"
#include "kernels/cuda_runtime.h"
#include "model/load.h"

namespace deg {

std::vector<int32_t> token_ids_read(const std::filesystem::path& path_in) {
  const std::string path = path_in.string();
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

void forward_write(const ForwardOptions& options, const std::filesystem::path& out) {
  if (options.read_chunk < 0) {
    throw Error(ErrorKind::invalid_argument, "--read-chunk must be positive (or 0: the default)");
  }
  if (options.ids.empty()) throw Error(ErrorKind::invalid_argument, "no token ids");
  auto backbone = backbone_open(
      options.model, {.precision = options.bf16_gemm ? GemmPrecision::bf16 : GemmPrecision::exact,
                      .device = pick_device(options.device),
                      .read_chunk = options.read_chunk});
  std::optional<SoftTokens> soft;
  if (!options.soft.empty()) {
    soft = soft_at_placeholders(backbone->spec(), options.ids, npy_read(options.soft));
  }
  npy_write(out, backbone_forward(*backbone, options.ids, !options.hidden, options.fork_at,
                                  soft ? &*soft : nullptr));
}

}  // namespace deg
