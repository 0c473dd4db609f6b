// deg eval: field-level metrics of a model on a labelled JSONL set ({"document", "expected"}).
#include <fmt/format.h>

#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "core/buffer.h"
#include "core/error.h"
#include "deg/engine.h"
#include "schema/metrics.h"

namespace deg::cli {

namespace {

struct EvalArgs {
  std::string model, base, schema, data, device = "auto";
  int64_t limit = 0;
  int64_t batch = 16;
  bool json = false;
};

void print_table(const schema::Metrics& m) {
  fmt::print("records            {}\n", m.records);
  fmt::print("exact match        {:.4f}\n", m.exact_match());
  for (const auto& [kind, s] : m.decisions) {
    fmt::print("{:<18} {:.4f}  ({}/{})\n", kind + " accuracy", s.accuracy(), s.correct, s.total);
  }
  fmt::print("extract precision  {:.4f}\n", m.extract.precision());
  fmt::print("extract recall     {:.4f}\n", m.extract.recall());
  fmt::print("extract F1         {:.4f}  (tp {} fp {} fn {})\n", m.extract.f1(),
             m.extract.true_positives, m.extract.false_positives, m.extract.false_negatives);
  fmt::print("calibration ECE    {:.4f}  ({} values, 10 bins)\n", m.ece(), m.calibrated());
  if (!m.extract_by_field.empty()) {
    fmt::print("\n{:<40} {:>9} {:>9} {:>9}\n", "field", "precision", "recall", "F1");
    for (const auto& [field, s] : m.extract_by_field) {
      fmt::print("{:<40} {:>9.4f} {:>9.4f} {:>9.4f}\n", field, s.precision(), s.recall(), s.f1());
    }
  }
}

void run_eval(const EvalArgs& a) {
  OrderedJson schema_json = schema::schema_load(a.schema);
  schema::Plan plan = schema::plan_compile(schema_json);
  std::ifstream in(a.data);
  if (!in) throw Error(ErrorKind::not_found, "cannot open the data file", {.path = a.data});
  struct Record {
    std::string document;
    Json expected;
  };
  std::vector<Record> records;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line) && (a.limit <= 0 || int64_t(records.size()) < a.limit)) {
    ++n;
    if (line.empty()) continue;
    Json j = json_parse(line, fmt::format("{} line {}", a.data, n));
    if (!j.contains("document") || !j["document"].is_string() || !j.contains("expected")) {
      throw Error(ErrorKind::format, "each line needs {\"document\": string, \"expected\": {...}}",
                  {.path = fmt::format("{} line {}", a.data, n)});
    }
    records.push_back({j["document"].get<std::string>(), j["expected"]});
  }
  Engine engine = Engine::open({.model = a.model, .base = a.base, .device = a.device});
  schema::MetricsAccumulator acc(plan);
  int64_t failed = 0;
  for (size_t b = 0; b < records.size(); b += size_t(a.batch)) {
    std::vector<std::string> docs;
    for (size_t i = b; i < std::min(records.size(), b + size_t(a.batch)); ++i) {
      docs.push_back(records[i].document);
    }
    std::vector<FillResult> results = engine.fill(schema_json, docs);
    for (size_t i = 0; i < results.size(); ++i) {
      std::vector<schema::ScoredValue> scored;
      for (const FieldReport& f : results[i].fields) {
        scored.push_back({f.path, Json::parse(f.value.dump()), f.confidence});
      }
      if (!results[i].ok()) ++failed;
      acc.add(records[b + i].expected, Json::parse(results[i].value.dump()), scored);
    }
    std::fprintf(stderr, "\rdeg eval: %zu/%zu records", std::min(records.size(), b + docs.size()),
                 records.size());
  }
  std::fprintf(stderr, "\n");
  if (failed)
    std::fprintf(stderr, "deg eval: %lld documents failed and count as empty\n", (long long)failed);
  if (a.json) {
    fmt::print("{}\n", schema::metrics_to_json(acc.result()).dump(2));
  } else {
    print_table(acc.result());
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval",
      "Score a model on labelled data: JSON Lines of {\"document\": ..., \"expected\": {...}}.\n"
      "Reports choice/score/bool accuracy, extract precision/recall/F1 (values equal to a gold\n"
      "value of the same field, with multiplicity), whole-record exact match, and the expected\n"
      "calibration error of the confidences (10 bins).");
  auto a = std::make_shared<EvalArgs>();
  cmd->add_option("--model", a->model, "deg checkpoint directory")->required();
  cmd->add_option("--base", a->base, "Base HF snapshot, when the checkpoint's base moved");
  cmd->add_option("--schema", a->schema, "JSON Schema file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--data", a->data, "JSONL file of labelled records")->required();
  cmd->add_option("--limit", a->limit, "Score only the first N records (0: all)");
  cmd->add_option("--batch", a->batch, "Documents per engine call")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print the metrics as JSON");
  add_device_option(cmd, a->device);
  cmd->callback([a] { run_eval(*a); });
}

}  // namespace deg::cli
