// Records -> examples for `deg train` (train/dataset.h), and --task specs.
#include "train/dataset.h"

#include <algorithm>
#include <exception>
#include <fstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/json.h"
#include "schema/plan.h"

namespace deg::train {

namespace fs = std::filesystem;

TaskFiles parse_task(const std::string& spec) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t c; (c = spec.find(':', at)) != std::string::npos; at = c + 1)
    parts.push_back(spec.substr(at, c - at));
  parts.push_back(spec.substr(at));
  if (parts.size() < 2 || parts.size() > 3 ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); })) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("--task '{}' is not SCHEMA.json:TRAIN.jsonl[:DEV.jsonl]", spec));
  }
  TaskFiles t{.schema = parts[0], .train = parts[1], .dev = parts.size() == 3 ? parts[2] : ""};
  // shared/data's layout names a task by its directory (snips/schema.json: "snips").
  const fs::path dir = t.schema.parent_path();
  t.name = t.schema.filename() == "schema.json" && !dir.empty() && dir != "."
               ? dir.filename().string()
               : t.schema.stem().string();
  return t;
}

namespace {

struct Record {
  std::string document;
  Json expected;
};

// The records of a JSONL file; `limit` > 0 keeps that many, evenly spaced.
std::vector<Record> read_records(const fs::path& path, int64_t limit) {
  std::ifstream in(path);
  if (!in)
    throw Error(ErrorKind::not_found, "cannot open the records file", {.path = path.string()});
  std::vector<Record> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path.string(), n);
    const Json j = json_parse(line, where);
    if (!j.is_object() || !j.contains("document") || !j["document"].is_string() ||
        !j.contains("expected") || !j["expected"].is_object()) {
      throw Error(ErrorKind::format,
                  where + ": a record must be {\"document\": string, \"expected\": object}");
    }
    out.push_back({j["document"].get<std::string>(), j["expected"]});
  }
  if (out.empty()) throw Error(ErrorKind::format, "no records", {.path = path.string()});
  // An evenly spaced subset: files are often sorted by label.
  if (limit > 0 && limit < int64_t(out.size())) {
    std::vector<Record> some;
    for (int64_t i = 0; i < limit; ++i)
      some.push_back(std::move(out[size_t(i * int64_t(out.size()) / limit)]));
    out = std::move(some);
  }
  return out;
}

}  // namespace

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Dataset build_dataset(const engine::DegModel& model, const FineTuneOptions& o,
                      const std::function<void(const FineTuneProgress&)>& progress) {
  Dataset ds;
  schema::PlanOptions po;
  po.array_mode = model.array_mode();
  for (size_t k = 0; k < o.tasks.size(); ++k) {
    const TaskFiles& t = o.tasks[k];
    const schema::Plan plan = schema::plan_compile(schema::schema_load(t.schema.string()), po);
    for (int split = 0; split < 2; ++split) {
      const fs::path& file = split == 0 ? t.train : t.dev;
      if (file.empty()) continue;
      const std::vector<Record> records = read_records(file, split == 0 ? o.max_train : o.max_dev);
      auto& out = split == 0 ? ds.train : ds.dev;
      // Records become examples over the thread pool, a block at a time (progress between
      // blocks); each record's example depends on the record alone, and the rest is in order.
      const int64_t n = int64_t(records.size()), block = 1024;
      std::vector<TaskExample> made(size_t(std::min(n, block)));
      std::vector<std::exception_ptr> failed(made.size());
      for (int64_t b0 = 0; b0 < n; b0 += block) {
        const int64_t m = std::min(block, n - b0);
        parallel_for(m, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            const Record& rec = records[size_t(b0 + i)];
            try {
              // --shuffle-options: a seed of the run's and the record's own (never 0).
              const uint64_t shuffle = split == 0 && o.shuffle_options
                                           ? mix(o.seed ^ mix(k << 40 ^ uint64_t(b0 + i))) | 1
                                           : 0;
              made[size_t(i)] =
                  make_example(model, plan, rec.document, rec.expected, int(k), shuffle);
            } catch (...) {
              failed[size_t(i)] = std::current_exception();
            }
          }
        });
        for (int64_t i = 0; i < m; ++i) {
          if (failed[size_t(i)]) {
            try {
              std::rethrow_exception(failed[size_t(i)]);
            } catch (const Error& e) {
              throw Error(e.kind(),
                          fmt::format("{}: record {}: {}", file.string(), b0 + i + 1, e.what()));
            }
          }
          TaskExample& ex = made[size_t(i)];
          ds.unlocated += ex.unlocated;
          if (split == 0 && o.empty_array_rate < 1.0) {
            std::erase_if(ex.queries, [&, q_index = uint64_t(0)](const TaskQuery& q) mutable {
              const uint64_t h = mix(o.seed ^ mix(out.size() * 1000003ull + q_index++));
              return q.head == QueryHead::anchor && q.starts.empty() &&
                     double(h >> 11) * 0x1.0p-53 >= o.empty_array_rate;
            });
          }
          out.push_back(std::move(ex));
        }
        if (progress) progress({.stage = "prepare", .done = b0 + m, .total = n});
      }
    }
  }
  if (ds.train.empty()) throw Error(ErrorKind::invalid_argument, "no training records");
  return ds;
}

}  // namespace deg::train
