// deg tokenize / deg detokenize: a tokenizer.json run from the command line, for checking
// ids and character spans against HF and for scripting.
#include "deg/tokenize.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "deg/error.h"
#include "deg/input.h"
#include "deg/json.h"

namespace deg::cli {

namespace {

std::string encoding_json(const TokenEncoding& enc, bool bytes) {
  std::string out = "{\"ids\":[";
  for (size_t i = 0; i < enc.ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(enc.ids[i]);
  }
  out += "],\"offsets\":[";
  for (size_t i = 0; i < enc.offsets.size(); ++i) {
    if (i) out += ',';
    out += fmt::format("[{},{}]", enc.offsets[i].first, enc.offsets[i].second);
  }
  out += ']';
  if (bytes) {
    out += ",\"byte_offsets\":[";
    for (size_t i = 0; i < enc.byte_offsets.size(); ++i) {
      if (i) out += ',';
      out += fmt::format("[{},{}]", enc.byte_offsets[i].first, enc.byte_offsets[i].second);
    }
    out += ']';
  }
  out += '}';
  return out;
}

// The text of one JSON Lines input: a JSON string or an object with a string "text".
std::string jsonl_text(const std::string& line, size_t line_no) {
  const std::string what = fmt::format("stdin line {}", line_no);
  Json j = json_parse(line, what);
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("text") && j["text"].is_string()) {
    return j["text"].get<std::string>();
  }
  throw Error(ErrorKind::invalid_argument,
              fmt::format("{}: expected a JSON string or an object with a string \"text\"", what));
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto model = std::make_shared<std::string>();
  auto jsonl = std::make_shared<bool>(false);
  auto bytes = std::make_shared<bool>(false);
  auto* tok = app.add_subcommand(
      "tokenize",
      "Tokenize text read from stdin with a model's tokenizer.json, exactly as HF tokenizers "
      "does (no special tokens added). Prints one JSON object per input:\n"
      "  {\"ids\": [...], \"offsets\": [[start, end], ...]}\n"
      "Offsets are Unicode code points into the input text (HF's Python offsets), end "
      "exclusive.\nWithout --jsonl all of stdin is one text; special-token strings in it "
      "(e.g. <|im_start|>) become their ids.\nInvalid UTF-8 is read as U+FFFD.\n"
      "Examples:\n"
      "  echo -n 'Hello world' | deg tokenize --model ~/models/Qwen3-0.6B\n"
      "  printf '\"a\"\\n{\"text\": \"b\"}\\n' | deg tokenize --model tokenizer.json --jsonl");
  tok->add_option("--model", *model,
                  "HF snapshot directory with tokenizer.json, the tokenizer.json file itself, or "
                  "a deg checkpoint whose deg.json names its base snapshot")
      ->required();
  tok->add_flag("--jsonl", *jsonl,
                "Read JSON Lines: each line a JSON string or {\"text\": ...}; one output line "
                "per input line");
  tok->add_flag("--byte-offsets", *bytes, "Also print \"byte_offsets\" (bytes of the input)");
  tok->callback([model, jsonl, bytes] {
    const Tokenizer tokenizer = Tokenizer::load(*model);
    if (!*jsonl) {
      const std::string input = document_read("/dev/stdin");  // within the document limit
      fmt::print("{}\n", encoding_json(tokenizer.encode(input), *bytes));
      return;
    }
    LineReader lines(STDIN_FILENO, InputLimits{}.line_bytes);
    while (std::optional<LineReader::Line> line = lines.next()) {
      if (!line->error.empty()) throw Error(ErrorKind::invalid_argument, line->error);
      if (line->text.empty()) continue;
      fmt::print(
          "{}\n",
          encoding_json(tokenizer.encode(jsonl_text(line->text, size_t(line->number))), *bytes));
    }
  });

  auto dmodel = std::make_shared<std::string>();
  auto keep_special = std::make_shared<bool>(false);
  auto* detok = app.add_subcommand(
      "detokenize",
      "Turn token ids back into text with a model's tokenizer.json decoder, as HF's "
      "decode(ids, skip_special_tokens=True) does. Reads one JSON array of ids per line on "
      "stdin and prints each text as a JSON string on its own line.\n"
      "Example:\n"
      "  echo '[9707, 1879]' | deg detokenize --model ~/models/Qwen3-0.6B");
  detok
      ->add_option("--model", *dmodel,
                   "HF snapshot directory with tokenizer.json, or the tokenizer.json file")
      ->required();
  detok->add_flag("--keep-special", *keep_special,
                  "Keep special tokens such as <|im_end|> in the text (skip_special_tokens=False)");
  detok->callback([dmodel, keep_special] {
    const Tokenizer tokenizer = Tokenizer::load(*dmodel);
    LineReader lines(STDIN_FILENO, InputLimits{}.line_bytes);
    while (std::optional<LineReader::Line> line = lines.next()) {
      if (!line->error.empty()) throw Error(ErrorKind::invalid_argument, line->error);
      if (line->text.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string what = fmt::format("stdin line {}", line->number);
      Json j = json_parse(line->text, what);
      std::vector<int32_t> ids;
      if (j.is_array()) {
        for (const Json& v : j) {
          if (!v.is_number_integer()) {
            ids.clear();
            j = nullptr;
            break;
          }
          ids.push_back(v.get<int32_t>());
        }
      }
      if (!j.is_array()) {
        throw Error(ErrorKind::invalid_argument,
                    fmt::format("{}: expected a JSON array of integer token ids", what));
      }
      const std::string text = tokenizer.decode(ids, !*keep_special);
      fmt::print("{}\n", Json(text).dump(-1, ' ', false, Json::error_handler_t::replace));
    }
  });
}

}  // namespace deg::cli
