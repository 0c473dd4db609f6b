// deg fill: the main job — a JSON Schema and documents in, filled JSON out.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "core/buffer.h"
#include "core/error.h"
#include "deg/engine.h"
#include "io/json.h"

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
  int64_t fork_tokens = 16384;
};

// Documents from stdin, one per line: a JSON string or {"document": "..."}.
std::vector<std::string> read_jsonl_documents() {
  std::vector<std::string> docs;
  std::string line;
  int64_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j = json_parse(line, fmt::format("stdin line {}", n));
    if (j.is_string()) {
      docs.push_back(j.get<std::string>());
    } else if (j.is_object() && j.contains("document") && j["document"].is_string()) {
      docs.push_back(j["document"].get<std::string>());
    } else {
      throw Error(ErrorKind::format,
                  "expected a JSON string or {\"document\": \"...\"} on each line",
                  {.path = fmt::format("stdin line {}", n)});
    }
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
  std::vector<std::string> docs;
  std::vector<std::string> names;
  if (args.jsonl) {
    docs = read_jsonl_documents();
    for (size_t i = 0; i < docs.size(); ++i)
      names.push_back(fmt::format("stdin document {}", i + 1));
  } else {
    for (const std::string& path : args.docs) {
      docs.push_back(read_file(path));
      names.push_back(path);
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
  Engine engine =
      Engine::open({.model = args.model, .base = args.base, .fork_tokens = args.fork_tokens});
  std::vector<FillResult> results = engine.fill(schema, docs, {.keep_nulls = args.keep_nulls});
  const bool many = results.size() > 1 || args.jsonl;
  int failed = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const FillResult& r = results[i];
    OrderedJson out;
    if (!r.ok()) {
      ++failed;
      std::fprintf(stderr, "deg: %s: %s\n", names[i].c_str(), r.error.c_str());
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
      "  cat docs.jsonl | deg fill --model ckpt --schema s.json --jsonl");
  auto a = std::make_shared<FillArgs>();
  cmd->add_option("--schema", a->schema, "JSON Schema file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--model", a->model, "deg checkpoint directory (default: the embedded model)");
  cmd->add_option("--base", a->base, "Base HF snapshot, when the checkpoint's deg.json base moved");
  cmd->add_option("DOC", a->docs, "Document files (UTF-8 text)");
  cmd->add_flag("--report", a->report,
                "Print {value, fields: [{path, kind, value, confidence, span}]} per document; "
                "spans are [start, end) in code points of the document");
  cmd->add_flag("--keep-nulls", a->keep_nulls, "Keep optional fields whose answer is null");
  cmd->add_flag("--jsonl", a->jsonl,
                "Read documents from stdin, one per line: a JSON string or {\"document\": ...}");
  cmd->add_option("--fork-tokens", a->fork_tokens,
                  "Padded tokens per batched fork pass (memory only; results do not change)")
      ->capture_default_str();
  cmd->callback([a] { run_fill(*a); });
}

}  // namespace deg::cli
