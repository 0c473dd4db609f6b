// Fuzz target: a document through Engine::fill with a tiny random Qwen3.5 checkpoint (written
// to a temp directory at start-up, as the engine tests make theirs) and a fixed schema with a
// field of each kind but x-generate. An input starting with '{', '[' or '"' is read as a fill
// request line (document_from_line, file parts refused), anything else as the document's text;
// inputs are cut at 160 bytes. Documents deg refuses fail alone in their result; fill itself must
// not throw, and a crash or a sanitizer report is a bug.
//
// An execution is the model's work over the prompt and the document, so the start-up keeps it
// small (docs/reliability.md): a tokenizer whose merges are learned from the prompt the engine
// renders for this schema (about a token per word instead of one per byte), hidden size 16, one
// thread; the model, the checkpoint and the engine are made once per process.
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
#include "deg/runtime.h"
#include "engine/model.h"
#include "model/checkpoint.h"
#include "schema/plan.h"
#include "schema/render.h"
#include "text/bpe_train.h"
#include "tiny_model.h"

namespace {

namespace fs = std::filesystem;

using deg::schema::Field;
using deg::schema::FieldKind;

constexpr size_t kMaxInput = 160;

// A field of each kind the plan compiles to but x-generate: extract (a string and a number),
// choice, boolean, score (x-levels), an anchored array (items with an extract), a counted array
// (items without one) and a multi-select (array of enum). An x-generate field would add the
// KNOWN VALUES block and a decode to every execution (about a third more time), and `minItems`
// the item queries (a third more again): the random heads anchor and count no item alone.
const char* const kSchema = R"({
  "type": "object",
  "properties": {
    "invoice_no": {"type": "string"},
    "total": {"type": "number", "minimum": 0},
    "currency": {"enum": ["EUR", "USD"]},
    "paid": {"type": "boolean"},
    "urgency": {"type": "integer", "x-levels": ["low", "high"]},
    "items": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
    "checks": {"type": "array", "maxItems": 2, "items": {"type": "boolean"}},
    "tags": {"type": "array", "items": {"enum": ["new", "repeat"]}}
  },
  "required": ["invoice_no"]
})";

// The text the engine renders around a document for this schema: the chat prefix and every
// field's query (item fields at item 0, with an ITEM line).
std::string prompt_text(const nlohmann::ordered_json& schema) {
  std::string text = deg::engine::chat_layout("qwen3_5").prefix + "\n";
  const deg::schema::Plan plan = deg::schema::plan_compile(schema);
  deg::schema::plan_visit(plan.root, [&](const Field& f) {
    if (f.kind == FieldKind::object || f.kind == FieldKind::multi_select) return;
    deg::schema::QueryPlace place;
    for (const deg::schema::PathToken& t : f.path) {
      if (!t.item) continue;
      place.indices.push_back(0);
      place.item = deg::schema::ItemLine{.text = "item"};
    }
    text += deg::schema::query_text(deg::schema::render_query(f, place)) + "\n";
  });
  return text;
}

// A byte-level BPE vocabulary whose merges are learned from the prompt text, so the prefix and
// the queries take a token per word or so instead of one per byte: the prompt is most of an
// execution's tokens, and the model's work is most of its time. Documents are encoded by the same
// byte-level BPE (merges included). The special tokens are the ChatML ones of the qwen3_5 layout.
deg::text::BpeVocabulary prompt_vocabulary(const nlohmann::ordered_json& schema) {
  deg::text::BpeTrainer trainer(
      {.vocab_size = 4096,
       .min_frequency = 1,
       .special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}});
  trainer.add_text(prompt_text(schema));
  return trainer.train();
}

struct Setup {
  fs::path dir;
  std::unique_ptr<deg::Engine> engine;
  nlohmann::ordered_json schema;
  Setup() {
    ::setenv("DEG_THREADS", "1", 0);
    ::setenv("DEG_LOG_LEVEL", "error", 0);
    deg::runtime_setup({});
    dir = fs::temp_directory_path() / ("deg_fill_fuzz_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    schema = nlohmann::ordered_json::parse(kSchema);
    const deg::text::BpeVocabulary vocabulary = prompt_vocabulary(schema);
    const std::string tokenizer = deg::text::bpe_tokenizer_json(vocabulary);
    // Half the width of the engine tests' model (hidden 32, MLP 48, head 16); both layer kinds
    // and grouped query heads stay.
    const nlohmann::json shape = {{"vocab_size", int64_t(vocabulary.tokens.size())},
                                  {"hidden_size", 16},
                                  {"intermediate_size", 32},
                                  {"head_dim", 8}};
    deg::testing::write_tiny_qwen35(dir / "base", 11, shape.dump(), tokenizer);
    deg::checkpoint_init({.base = dir / "base", .out = dir / "ckpt", .seed = 3});
    engine = std::make_unique<deg::Engine>(
        deg::Engine::open({.model = dir / "ckpt", .fork_tokens = 256, .device = "cpu"}));
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
