// deg fill: the main job — a JSON Schema and documents in, filled JSON out.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "deg/engine.h"
#include "deg/error.h"
#include "deg/input.h"
#include "deg/plan.h"
#include "deg/report.h"

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
  bool allow_missing = false;
  double min_confidence = 0;
  std::string parts_root;
  int64_t fork_tokens = 16384;
  int64_t batch = 16;
  int64_t max_document_bytes = InputLimits{}.document_bytes;
  std::string device = "auto", gemm = "auto";
};

namespace fs = std::filesystem;

// One document to fill, or why it could not be read (it then fails alone).
struct InputDoc {
  std::string name;
  DocumentParts parts;
  std::string error;
};

// A progress line on stderr while a fill runs long, only when stderr is a terminal (never in
// pipes, logs or tests); at most a few updates a second.
class ProgressLine {
 public:
  ProgressLine() : on_(isatty(STDERR_FILENO) == 1) {}
  ~ProgressLine() { clear(); }
  std::function<void(const FillProgress&)> callback() {
    if (!on_) return {};
    return [this](const FillProgress& p) { show(p); };
  }
  void clear() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  void show(const FillProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (now - start_ < std::chrono::seconds(1) || now - last_ < std::chrono::milliseconds(200))
      return;
    last_ = now;
    if (p.stage == "read") {
      std::fprintf(stderr, "\r\033[Kdeg: reading document %zu of %zu: %lld of %lld tokens",
                   p.document + 1, p.documents, (long long)p.done, (long long)p.total);
    } else {
      std::fprintf(stderr, "\r\033[Kdeg: answering: %lld of %lld queries", (long long)p.done,
                   (long long)p.total);
    }
    shown_ = true;
  }

  bool on_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_{};
};

// Fills and prints documents as they come, a batch at a time; counts what failed or misses
// required values.
class Printer {
 public:
  Printer(const FillArgs& args, const Engine& engine, const OrderedJson& schema, bool many)
      : args_(args), engine_(engine), schema_(schema), many_(many) {}

  void add(InputDoc d) {
    docs_.push_back(std::move(d));
    ++total_;
  }
  size_t pending() const { return docs_.size(); }
  size_t total() const { return total_; }

  void flush() {
    if (docs_.empty()) return;
    std::vector<DocumentParts> readable;
    for (InputDoc& d : docs_)
      if (d.error.empty()) readable.push_back(std::move(d.parts));
    std::vector<FillResult> filled;
    {
      ProgressLine progress;
      filled = engine_.fill(schema_, readable,
                            {.keep_nulls = args_.keep_nulls,
                             .min_confidence = args_.min_confidence,
                             .progress = progress.callback()});
    }
    for (size_t i = 0, k = 0; i < docs_.size(); ++i) {
      FillResult r =
          docs_[i].error.empty() ? std::move(filled[k++]) : FillResult{.error = docs_[i].error};
      print(docs_[i].name, r);
    }
    std::fflush(stdout);
    docs_.clear();
  }

  // Throws the error the exit code reports: failed documents, else missing required values.
  void finish() const {
    if (failed_) {
      throw Error(ErrorKind::format, fmt::format("{} of {} documents failed", failed_, total_));
    }
    if (missing_ && !args_.allow_missing) {
      throw Error(ErrorKind::format,
                  fmt::format("{} of {} documents lack a value for a required field, so their "
                              "JSON does not validate; pass --allow-missing to accept that",
                              missing_, total_));
    }
  }

 private:
  void print(const std::string& name, const FillResult& r) {
    OrderedJson out;
    if (!r.ok()) {
      ++failed_;
      // Errors from reading name their file or line already.
      const bool named = r.error.starts_with(name + ": ");
      std::fprintf(stderr, "deg: %s%s%s\n", named ? "" : name.c_str(), named ? "" : ": ",
                   r.error.c_str());
      out = args_.report ? report_to_json(r) : OrderedJson{{"error", r.error}};
    } else {
      if (!r.missing.empty()) {
        ++missing_;
        std::string list;
        for (const std::string& p : r.missing) list += (list.empty() ? "" : ", ") + p;
        std::fprintf(stderr,
                     "deg: %s: required %s: the document holds no valid value%s, so it is left "
                     "out%s\n",
                     name.c_str(), list.c_str(),
                     args_.min_confidence > 0 ? " (or none above --min-confidence)" : "",
                     args_.allow_missing ? "" : " (pass --allow-missing to accept that)");
      }
      out = args_.report ? report_to_json(r) : r.value;
    }
    std::string text = many_ ? out.dump() : out.dump(2);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  }

  const FillArgs& args_;
  const Engine& engine_;
  const OrderedJson& schema_;
  bool many_;
  std::vector<InputDoc> docs_;
  size_t total_ = 0, failed_ = 0, missing_ = 0;
};

void run_fill(const FillArgs& args) {
  const OrderedJson schema = schema_load(args.schema);
  if (!args.jsonl && args.docs.empty()) {
    throw Error(ErrorKind::invalid_argument,
                "no documents: pass files (deg fill --schema S.json DOC...) or --jsonl on stdin");
  }
  if (args.jsonl && !args.docs.empty()) {
    throw Error(ErrorKind::invalid_argument,
                "--jsonl reads documents from stdin; pass no DOC files with it");
  }
  InputLimits limits;
  limits.document_bytes = args.max_document_bytes;
  limits.line_bytes = std::max(limits.line_bytes, 4 * args.max_document_bytes);
  const Engine engine = Engine::open({.model = args.model,
                                      .base = args.base,
                                      .fork_tokens = args.fork_tokens,
                                      .device = args.device,
                                      .gemm = args.gemm,
                                      .limits = limits});
  Printer printer(args, engine, schema, args.jsonl || args.docs.size() > 1);
  if (args.jsonl) {
    // Lines are answered as they arrive: a batch is filled when it is full or when no further
    // line is waiting, so an interactive writer gets each answer at once.
    const PartsAccess access{.base = fs::current_path(), .root = args.parts_root};
    LineReader reader(STDIN_FILENO, limits.line_bytes);
    while (std::optional<LineReader::Line> line = reader.next()) {
      if (line->error.empty() && line->text.find_first_not_of(" \t") == std::string::npos) continue;
      const std::string where = fmt::format("stdin line {}", line->number);
      InputDoc d{.name = where, .error = line->error};
      if (d.error.empty()) {
        try {
          d.parts = document_from_line(line->text, access, limits, where);
        } catch (const Error& e) {
          d.error = e.what();
        }
      }
      printer.add(std::move(d));
      if (int64_t(printer.pending()) >= args.batch || !reader.ready()) printer.flush();
    }
  } else {
    for (const std::string& path : args.docs) {
      InputDoc d{.name = path};
      try {
        if (args.parts) {
          // A parts file names its files relative to itself, under --parts-root or its own
          // directory.
          const fs::path dir = fs::path(path).parent_path();
          const PartsAccess access{.base = dir,
                                   .root = args.parts_root.empty() ? (dir.empty() ? "." : dir)
                                                                   : fs::path(args.parts_root)};
          d.parts = document_from_line(document_read(path, limits), access, limits, path);
        } else {
          d.parts = {DocumentPart::of_text(document_read(path, limits))};
        }
      } catch (const Error& e) {
        d.error = e.what();
      }
      printer.add(std::move(d));
      if (int64_t(printer.pending()) >= args.batch) printer.flush();
    }
  }
  printer.flush();
  if (printer.total() == 0) {
    throw Error(ErrorKind::invalid_argument, "no documents: stdin held no lines (--jsonl)");
  }
  printer.finish();
}

}  // namespace

void add_fill_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "fill",
      "Fill a JSON Schema from each document; JSON to stdout.\n"
      "One document prints one JSON value; several (or --jsonl) print one line each, in order;\n"
      "a document that fails prints {\"error\": ...} in its place and the rest are answered.\n"
      "Exit status 1 when a document failed, or lacks a value for a required field (a required\n"
      "number in a text without one) unless --allow-missing; 2 for bad usage.\n"
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
      "Spans count the text parts' code points; media parts are zero-width.\n"
      "File parts on stdin (--jsonl) are refused unless --parts-root DIR names where they may\n"
      "come from; a --parts file's parts must lie under its own directory (or --parts-root).\n"
      "Limits (docs/hardening.md): a document's text 8 MiB (--max-document-bytes), a --jsonl\n"
      "line 32 MiB (or 4x the document limit), 4096 parts per document.");
  auto a = std::make_shared<FillArgs>();
  cmd->add_option("--schema", a->schema, "JSON Schema file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--model", a->model,
                  "deg checkpoint directory (default: $DEG_MODEL, else the default model: "
                  "models/default, installed as <prefix>/share/deg/models/default)");
  cmd->add_option("--base", a->base, "Base HF snapshot, when the checkpoint's deg.json base moved");
  cmd->add_option("DOC", a->docs, "Document files (UTF-8 text)");
  cmd->add_flag(
      "--report", a->report,
      "Print {version, value, fields: [{path, kind, value, confidence, span, withheld}], "
      "missing} per document (docs/report.md; its JSON Schema is docs/report.schema.json); "
      "spans are [start, end) in code points of the document; missing lists required fields "
      "the document holds no value for (only when there are any)");
  cmd->add_flag("--keep-nulls", a->keep_nulls, "Keep optional fields whose answer is null");
  cmd->add_option("--min-confidence", a->min_confidence,
                  "Withhold answers whose confidence is below P: the field is left out (null "
                  "where allowed, or with --keep-nulls; a required one is reported missing) and "
                  "--report marks it \"withheld\": true")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--allow-missing", a->allow_missing,
                "Exit 0 even when a required field has no value in a document (it is still "
                "reported on stderr and in --report)");
  auto* jsonl = cmd->add_flag(
      "--jsonl", a->jsonl,
      "Read documents from stdin, one per line: a JSON string, {\"document\": ...} or "
      "{\"parts\": [...]}; answers stream out as lines arrive");
  auto* parts = cmd->add_flag("--parts", a->parts,
                              "Each DOC is a JSON file {\"parts\": [...]} of text and media parts "
                              "(paths relative to it)");
  cmd->add_option("--parts-root", a->parts_root,
                  "Directory that file parts (text_file, image, audio) must lie under; without "
                  "it, --jsonl refuses file parts")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--fork-tokens", a->fork_tokens,
                  "Padded tokens per batched fork pass (memory only; results do not change)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), kMaxForkTokens));
  cmd->add_option("--batch", a->batch, "Documents filled together (results do not change)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1024)));
  cmd->add_option("--max-document-bytes", a->max_document_bytes,
                  "Longest document text accepted, in bytes (a longer one fails alone, unread)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 32));
  add_device_option(cmd, a->device);
  add_gemm_option(cmd, a->gemm);
  parts->excludes(jsonl);  // --jsonl lines say {"parts": ...} themselves
  cmd->callback([a] { run_fill(*a); });
}

}  // namespace deg::cli
