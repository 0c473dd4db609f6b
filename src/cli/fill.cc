// deg fill: the main job — a JSON Schema and documents in, filled JSON out.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "cli/commands.h"
#include "core/buffer.h"
#include "core/error.h"
#include "deg/engine.h"
#include "io/json.h"
#include "io/npy.h"

namespace deg::cli {

namespace {

struct FillArgs {
  std::string schema;
  std::string model;
  std::string base;
  std::vector<std::string> docs;
  bool report = false;
  bool keep_nulls = false;
  bool jsonl = false;
  bool parts = false;
  int64_t fork_tokens = 16384;
  std::string device = "auto";
};

namespace fs = std::filesystem;

// A document in parts: {"parts": [{"text": "..."}, {"text_file": "p1.txt"}, {"image": "a.npy"},
// {"audio": "b.npy"}, ...]}; files are relative to `dir`; .npy files hold f32 [rows, hidden].
DocumentParts parts_of(const Json& j, const fs::path& dir, const std::string& where) {
  if (!j.is_object() || !j.contains("parts") || !j["parts"].is_array()) {
    throw Error(ErrorKind::format,
                "a document in parts is {\"parts\": [{\"text\": ...} | {\"text_file\": F} | "
                "{\"image\": F.npy} | {\"audio\": F.npy}, ...]}",
                {.path = where});
  }
  DocumentParts parts;
  for (const Json& p : j["parts"]) {
    const auto str = [&](const char* key) -> std::optional<std::string> {
      if (!p.is_object() || !p.contains(key)) return std::nullopt;
      if (!p[key].is_string()) {
        throw Error(ErrorKind::format,
                    fmt::format("part {}: \"{}\" must be a string", parts.size(), key),
                    {.path = where});
      }
      return p[key].get<std::string>();
    };
    std::string media;
    int kinds = 0;
    for (const char* kind : {"text", "text_file", "image", "audio"}) {
      if (!p.is_object() || !p.contains(kind)) continue;
      ++kinds;
      if (kind[0] == 'i' || kind[0] == 'a') media = kind;
    }
    if (kinds > 1) {
      throw Error(
          ErrorKind::format,
          fmt::format("part {} has more than one of text, text_file, image, audio", parts.size()),
          {.path = where});
    }
    if (auto t = str("text")) {
      parts.push_back(DocumentPart::of_text(*t));
    } else if (auto f = str("text_file")) {
      parts.push_back(DocumentPart::of_text(read_file(dir / *f)));
    } else if (!media.empty()) {
      const fs::path file = dir / *str(media.c_str());
      Tensor e = npy_read(file);
      if (e.rank() != 2 || e.dtype() != DType::f32) {
        throw Error(ErrorKind::format, "media embeddings must be a float32 [rows, hidden] .npy",
                    {.path = file.string()});
      }
      parts.push_back(DocumentPart::of_media(media, e.to_f32_vector(), e.dim(0)));
    } else {
      throw Error(ErrorKind::format,
                  fmt::format("part {} is none of text, text_file, image, audio", parts.size()),
                  {.path = where});
    }
  }
  return parts;
}

// One document to fill, or why it could not be read (it then fails alone).
struct InputDoc {
  std::string name;
  DocumentParts parts;
  std::string error;
};

// Documents from stdin, one per line: a JSON string, {"document": "..."} or {"parts": [...]}
// (files relative to the working directory).
std::vector<InputDoc> read_jsonl_documents() {
  std::vector<InputDoc> docs;
  std::string line;
  int64_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("stdin line {}", n);
    Json j = json_parse(line, where);
    InputDoc d{.name = fmt::format("stdin document {}", docs.size() + 1)};
    if (j.is_string()) {
      d.parts = {DocumentPart::of_text(j.get<std::string>())};
    } else if (j.is_object() && j.contains("document") && j["document"].is_string()) {
      d.parts = {DocumentPart::of_text(j["document"].get<std::string>())};
    } else if (j.is_object() && j.contains("parts")) {
      try {
        d.parts = parts_of(j, fs::current_path(), where);
      } catch (const Error& e) {
        d.error = e.what();
      }
    } else {
      throw Error(ErrorKind::format,
                  "expected a JSON string, {\"document\": \"...\"} or {\"parts\": [...]} on "
                  "each line",
                  {.path = where});
    }
    docs.push_back(std::move(d));
  }
  return docs;
}

OrderedJson report_json(const FillResult& r) {
  OrderedJson fields = OrderedJson::array();
  for (const FieldReport& f : r.fields) {
    OrderedJson span = nullptr;
    if (f.span) span = {f.span->first, f.span->second};
    fields.push_back({{"path", f.path},
                      {"kind", f.kind},
                      {"value", f.value},
                      {"confidence", f.confidence},
                      {"span", span}});
  }
  return {{"value", r.value}, {"fields", fields}};
}

void run_fill(const FillArgs& args) {
  OrderedJson schema = OrderedJson::parse(read_file(args.schema), nullptr, false);
  if (schema.is_discarded()) {
    throw Error(ErrorKind::format, "the schema is not valid JSON", {.path = args.schema});
  }
  std::vector<InputDoc> docs;
  if (args.jsonl) {
    docs = read_jsonl_documents();
  } else {
    for (const std::string& path : args.docs) {
      InputDoc d{.name = path};
      if (args.parts) {
        try {
          d.parts = parts_of(json_load(path), fs::path(path).parent_path(), path);
        } catch (const Error& e) {
          d.error = e.what();
        }
      } else {
        d.parts = {DocumentPart::of_text(read_file(path))};
      }
      docs.push_back(std::move(d));
    }
  }
  if (docs.empty()) {
    throw Error(ErrorKind::invalid_argument,
                "no documents: pass files (deg fill --schema S.json DOC...) or --jsonl on stdin");
  }
  if (args.model.empty()) {
    throw Error(ErrorKind::not_found,
                "this build has no embedded default model yet (deg trains its own; see README "
                "'Status'); pass --model DIR with a deg checkpoint (`deg init` makes one)");
  }
  Engine engine = Engine::open({.model = args.model,
                                .base = args.base,
                                .fork_tokens = args.fork_tokens,
                                .device = args.device});
  // Documents that could not be read fail alone; the rest are filled together.
  std::vector<DocumentParts> readable;
  for (InputDoc& d : docs)
    if (d.error.empty()) readable.push_back(std::move(d.parts));
  std::vector<FillResult> filled = engine.fill(schema, readable, {.keep_nulls = args.keep_nulls});
  std::vector<FillResult> results;
  for (size_t i = 0, k = 0; i < docs.size(); ++i) {
    if (docs[i].error.empty()) {
      results.push_back(std::move(filled[k++]));
    } else {
      results.push_back({.error = docs[i].error});
    }
  }
  const bool many = results.size() > 1 || args.jsonl;
  int failed = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const FillResult& r = results[i];
    OrderedJson out;
    if (!r.ok()) {
      ++failed;
      std::fprintf(stderr, "deg: %s: %s\n", docs[i].name.c_str(), r.error.c_str());
      out = {{"error", r.error}};
    } else {
      out = args.report ? report_json(r) : r.value;
    }
    std::string text = many ? out.dump() : out.dump(2);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);
  if (failed) {
    throw Error(ErrorKind::format,
                fmt::format("{} of {} documents failed", failed, results.size()));
  }
}

}  // namespace

void add_fill_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "fill",
      "Fill a JSON Schema from each document; JSON to stdout.\n"
      "One document prints one JSON value; several (or --jsonl) print one line each.\n"
      "Examples:\n"
      "  deg fill --model ckpt --schema invoice.schema.json invoice.txt\n"
      "  deg fill --model ckpt --schema s.json --report a.txt b.txt\n"
      "  cat docs.jsonl | deg fill --model ckpt --schema s.json --jsonl\n"
      "  deg fill --model gemma-ckpt --schema s.json --parts scan.parts.json\n"
      "Documents in parts (--parts, or {\"parts\": [...]} lines with --jsonl) mix text with\n"
      "media read as soft tokens: embeddings [rows, hidden] from the model's own vision or\n"
      "audio encoder, as float32 .npy files (Gemma 4 reads image and audio):\n"
      "  {\"parts\": [{\"text\": \"Receipt:\\n\"}, {\"image\": \"photo.npy\"},\n"
      "             {\"text_file\": \"ocr.txt\"}, {\"audio\": \"call.npy\"}]}\n"
      "Spans count the text parts' code points; media parts are zero-width.");
  auto a = std::make_shared<FillArgs>();
  cmd->add_option("--schema", a->schema, "JSON Schema file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--model", a->model, "deg checkpoint directory (default: the embedded model)");
  cmd->add_option("--base", a->base, "Base HF snapshot, when the checkpoint's deg.json base moved");
  cmd->add_option("DOC", a->docs, "Document files (UTF-8 text)");
  cmd->add_flag("--report", a->report,
                "Print {value, fields: [{path, kind, value, confidence, span}]} per document; "
                "spans are [start, end) in code points of the document");
  cmd->add_flag("--keep-nulls", a->keep_nulls, "Keep optional fields whose answer is null");
  auto* jsonl = cmd->add_flag(
      "--jsonl", a->jsonl,
      "Read documents from stdin, one per line: a JSON string, {\"document\": ...} or "
      "{\"parts\": [...]}");
  auto* parts = cmd->add_flag("--parts", a->parts,
                              "Each DOC is a JSON file {\"parts\": [...]} of text and media parts "
                              "(paths relative to it)");
  cmd->add_option("--fork-tokens", a->fork_tokens,
                  "Padded tokens per batched fork pass (memory only; results do not change)")
      ->capture_default_str();
  add_device_option(cmd, a->device);
  parts->excludes(jsonl);  // --jsonl lines say {"parts": ...} themselves
  cmd->callback([a] { run_fill(*a); });
}

}  // namespace deg::cli
