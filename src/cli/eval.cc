// deg eval: field-level metrics of a model on a labelled JSONL set ({"document", "expected"}).
#include "deg/eval.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/commands.h"
#include "deg/engine.h"
#include "deg/error.h"
#include "deg/input.h"
#include "deg/json.h"
#include "deg/plan.h"

namespace deg::cli {

namespace fs = std::filesystem;

namespace {

struct EvalArgs {
  std::string model, base, schema, data, device = "auto", gemm = "auto";
  int64_t limit = 0;
  int64_t every = 1;
  int64_t batch = 16;
  int64_t errors = 0;  // --errors N: the N records with the most errors
  bool json = false;
  std::string plot;  // --plot FILE: the reliability diagram (SVG)
};

// A scored record kept for --errors.
struct Worst {
  int64_t errors = 0, line = 0;
  std::string document;
  Json expected, predicted;
  std::vector<std::pair<int64_t, int64_t>> spans;  // deg's extracted spans, code points
};

void print_worst(const std::vector<Worst>& worst) {
  if (worst.empty()) return;
  const bool tty = isatty(STDOUT_FILENO) == 1;
  fmt::print("\nrecords with the most errors ({} shown{}):\n", worst.size(),
             tty ? "; deg's spans in reverse video" : "; deg's spans in [[ ]]");
  for (const Worst& w : worst) {
    fmt::print(
        "\nline {}: {} error{}\n  document  {}\n  expected  {}\n  deg       {}\n", w.line, w.errors,
        w.errors == 1 ? "" : "s",
        spans_marked(w.document, w.spans, tty ? "\x1b[7m" : "[[", tty ? "\x1b[0m" : "]]", 2000),
        w.expected.dump(), w.predicted.dump());
  }
}

void run_eval(const EvalArgs& a) {
  const OrderedJson schema_json = schema_load(a.schema);
  Scorer scorer(schema_json);
  const int fd = ::open(a.data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Error(ErrorKind::not_found,
                fmt::format("cannot open the data file: {}", std::strerror(errno)),
                {.path = a.data});
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    throw Error(ErrorKind::invalid_argument, "this is a directory; --data takes a JSONL file",
                {.path = a.data});
  }
  Engine engine =
      Engine::open({.model = a.model, .base = a.base, .device = a.device, .gemm = a.gemm});
  // Records are read and scored a batch at a time (memory holds one batch); a line that is not a
  // record is reported and skipped, the others still count.
  struct Record {
    std::string document;
    Json expected;
    int64_t line = 0;
  };
  std::vector<Worst> worst;
  std::vector<Record> batch;
  int64_t failed = 0, skipped = 0, scored = 0, records = 0;
  const bool tty = isatty(STDERR_FILENO) == 1;
  auto score = [&] {
    if (batch.empty()) return;
    std::vector<std::string> docs;
    for (const Record& r : batch) docs.push_back(r.document);
    std::vector<FillResult> results = engine.fill(schema_json, docs);
    for (size_t i = 0; i < results.size(); ++i) {
      if (!results[i].ok()) ++failed;
      const int64_t errors = scorer.add(batch[i].expected, results[i]);
      if (a.errors > 0 && errors > 0) {
        Worst w{.errors = errors,
                .line = batch[i].line,
                .document = batch[i].document,
                .expected = batch[i].expected,
                .predicted = Json::parse(results[i].value.dump())};
        for (const FieldReport& f : results[i].fields)
          if (f.span && !f.withheld) w.spans.push_back(*f.span);
        worst.push_back(std::move(w));
      }
    }
    // Keep the N worst (most errors, then the earliest line).
    std::stable_sort(worst.begin(), worst.end(),
                     [](const Worst& x, const Worst& y) { return x.errors > y.errors; });
    if (int64_t(worst.size()) > a.errors) worst.resize(size_t(a.errors));
    scored += int64_t(batch.size());
    batch.clear();
    if (tty) std::fprintf(stderr, "\rdeg eval: %lld records", (long long)scored);
  };
  LineReader reader(fd, InputLimits{}.line_bytes);
  while (a.limit <= 0 || scored + int64_t(batch.size()) < a.limit) {
    std::optional<LineReader::Line> line = reader.next();
    if (!line) break;
    const std::string where = fmt::format("{} line {}", a.data, line->number);
    if (line->error.empty() && line->text.find_first_not_of(" \t") == std::string::npos) continue;
    if (records++ % a.every != 0) continue;  // --every: the first record of each K
    try {
      if (!line->error.empty()) throw Error(ErrorKind::format, line->error, {.path = a.data});
      Json j = json_parse(line->text, where);
      if (!j.is_object() || !j.contains("document") || !j["document"].is_string() ||
          !j.contains("expected") || !j["expected"].is_object()) {
        throw Error(ErrorKind::format,
                    "each line needs {\"document\": string, \"expected\": {...}}", {.path = where});
      }
      batch.push_back({j["document"].get<std::string>(), j["expected"], line->number});
    } catch (const Error& e) {
      ++skipped;
      std::fprintf(stderr, "%sdeg: %s\n", tty ? "\n" : "", e.what());
    }
    if (int64_t(batch.size()) >= a.batch) score();
  }
  score();
  if (tty) std::fprintf(stderr, "\n");
  if (failed)
    std::fprintf(stderr, "deg eval: %lld documents failed and count as empty\n", (long long)failed);
  if (!a.plot.empty()) {
    const std::string name =
        a.model.empty() ? "the default model" : fs::path(a.model).filename().string();
    const std::string svg =
        scorer.reliability_svg(name + " on " + fs::path(a.data).filename().string());
    std::FILE* f = std::fopen(a.plot.c_str(), "wb");
    bool ok = f && std::fwrite(svg.data(), 1, svg.size(), f) == svg.size();
    if (f) ok = std::fclose(f) == 0 && ok;
    if (!ok) throw Error(ErrorKind::io, "cannot write the reliability diagram", {.path = a.plot});
  }
  if (a.json) {
    OrderedJson out = scorer.to_json();
    if (a.errors > 0) {
      out["worst"] = OrderedJson::array();
      for (const Worst& w : worst) {
        OrderedJson spans = OrderedJson::array();
        for (const auto& [s, e] : w.spans) spans.push_back({s, e});
        out["worst"].push_back({{"line", w.line},
                                {"errors", w.errors},
                                {"expected", OrderedJson::parse(w.expected.dump())},
                                {"predicted", OrderedJson::parse(w.predicted.dump())},
                                {"spans", spans}});
      }
    }
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("{}", scorer.to_text());
    print_worst(worst);
  }
  std::fflush(stdout);
  if (skipped) {
    throw Error(ErrorKind::format,
                fmt::format("{} lines of {} are not records and were skipped (the metrics above "
                            "count the other {})",
                            skipped, a.data, scored));
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval",
      "Score a model on labelled data: JSON Lines of {\"document\": ..., \"expected\": {...}}.\n"
      "Reports choice/score/bool accuracy, extract precision/recall/F1 (values equal to a gold\n"
      "value of the same field, with multiplicity), whole-record exact match, and the expected\n"
      "calibration error of the confidences (10 bins); then each field's figures and, for choice\n"
      "fields, the most frequent confusions (gold -> predicted).");
  auto a = std::make_shared<EvalArgs>();
  cmd->add_option("--model", a->model,
                  "deg checkpoint directory (default: $DEG_MODEL, else the default model)");
  cmd->add_option("--base", a->base, "Base HF snapshot, when the checkpoint's base moved");
  cmd->add_option("--schema", a->schema, "JSON Schema file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--data", a->data, "JSONL file of labelled records")->required();
  cmd->add_option("--every", a->every,
                  "Score every K-th record (1st, K+1-th, ...): a spread sample of a file sorted by "
                  "label")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  cmd->add_option("--limit", a->limit, "Score only the first N records (0: all)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  cmd->add_option("--batch", a->batch, "Documents per engine call (1 to 1024)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1024)));
  cmd->add_option("--errors", a->errors,
                  "Show the N records with the most errors: the document with deg's spans "
                  "marked, the expected and deg's values (--json: under \"worst\")")
      ->check(CLI::Range(int64_t(0), int64_t(1000)));
  cmd->add_flag("--json", a->json, "Print the metrics as JSON");
  cmd->add_option("--plot", a->plot,
                  "Write the reliability diagram (accuracy against confidence, 10 bins) as SVG");
  add_device_option(cmd, a->device);
  add_gemm_option(cmd, a->gemm);
  cmd->callback([a] { run_eval(*a); });
}

}  // namespace deg::cli
