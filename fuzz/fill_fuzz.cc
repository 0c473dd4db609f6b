// Fuzz target: a document through Engine::fill with a tiny random Qwen3.5 checkpoint (written
// to a temp directory at start-up, as the engine tests make theirs) and a fixed schema that asks
// for every field kind. An input starting with '{', '[' or '"' is read as a fill request line
// (document_from_line, file parts refused), anything else as the document's text; inputs are cut
// at 160 bytes so an execution stays within milliseconds. Documents deg refuses fail alone in
// their result; fill itself must not throw, and a crash or a sanitizer report is a bug.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "deg/engine.h"
#include "deg/input.h"
#include "model/checkpoint.h"
#include "tiny_model.h"

namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxInput = 160;

// One field of each kind the plan compiles to (extract, number, choice, bool, levels, array).
const char* const kSchema = R"({
  "type": "object",
  "properties": {
    "invoice_no": {"type": "string"},
    "total": {"type": "number", "minimum": 0},
    "currency": {"enum": ["EUR", "USD"]},
    "paid": {"type": "boolean"},
    "urgency": {"type": "integer", "x-levels": ["low", "high"]},
    "items": {"type": "array", "maxItems": 2, "items": {"type": "string"}}
  },
  "required": ["invoice_no"]
})";

struct Setup {
  fs::path dir;
  std::unique_ptr<deg::Engine> engine;
  nlohmann::ordered_json schema;
  Setup() {
    ::setenv("DEG_THREADS", "1", 0);
    ::setenv("DEG_LOG_LEVEL", "error", 0);
    dir = fs::temp_directory_path() / ("deg_fill_fuzz_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    deg::testing::write_tiny_qwen35(dir / "base", 11);
    deg::checkpoint_init({.base = dir / "base", .out = dir / "ckpt", .seed = 3});
    engine = std::make_unique<deg::Engine>(
        deg::Engine::open({.model = dir / "ckpt", .fork_tokens = 256, .device = "cpu"}));
    schema = nlohmann::ordered_json::parse(kSchema);
  }
  ~Setup() {
    engine.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Setup setup;
  const std::string_view in(reinterpret_cast<const char*>(data), std::min(size, kMaxInput));
  const deg::InputLimits limits{.document_bytes = int64_t(kMaxInput), .parts = 8};
  deg::DocumentParts parts;
  if (!in.empty() && (in[0] == '{' || in[0] == '[' || in[0] == '"')) {
    try {
      parts = deg::document_from_line(in, deg::PartsAccess{}, limits, "fuzz");
    } catch (const deg::Error&) {
      return 0;
    }
  } else {
    parts = {deg::DocumentPart::of_text(std::string(in))};
  }
  const std::vector<deg::FillResult> results = setup.engine->fill(setup.schema, {parts});
  if (results.size() != 1) __builtin_trap();
  return 0;
}
