// `deg train`'s pieces: records become the engine's own queries with their targets
// (train/tasks.h); the trainer's fork layout gives the heads the hidden states the inference
// engine gives them (train/features.h); calibration fits a known temperature; a run resumes
// exactly; and the Done-when figure: a tiny gpt pretrained on SNIPS text and fine-tuned on a
// SNIPS subset beats the majority class and fills slots, measured by `deg eval` on dev records.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "deg/train.h"
#include "engine/decode.h"
#include "engine/model.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "kernels/cuda_runtime.h"
#include "model/gpt_config.h"
#include "schema/plan.h"
#include "schema/render.h"
#include "schema/spans.h"
#include "test_util.h"
#include "tiny_model.h"
#include "train/calibrate.h"
#include "train/features.h"
#include "train/gpt_params.h"
#include "train/tasks.h"

namespace deg::train {
namespace {

namespace fs = std::filesystem;
using deg::testing::TempDir;

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "intent": {"enum": ["PlayMusic", "GetWeather", "BookRestaurant"]},
    "urgent": {"type": "boolean"},
    "city": {"type": "string"},
    "artists": {"type": "array", "items": {"type": "string"}},
    "stops": {"type": "array", "items": {"type": "object",
              "properties": {"name": {"type": "string"}, "time": {"type": "string"}}}}
  },
  "required": ["intent"]
})";

// A gpt trunk (tiny preset, byte tokenizer, windows wide enough for a query to see its
// document) as `deg pretrain` writes it, turned into a deg checkpoint with fresh heads.
fs::path write_gpt_checkpoint(const fs::path& dir, uint64_t seed) {
  deg::testing::write_tiny_gpt(dir / "base", seed);
  checkpoint_create({.base = dir / "base", .out = dir / "ckpt", .seed = seed});
  return dir / "ckpt";
}

schema::Plan plan_of(const char* schema) {
  return schema::plan_compile(schema::schema_parse(schema, "schema"));
}

// The text of context tokens [first, last] of an example's document.
std::string span_text(const std::string& doc, const engine::DegModel& m, int64_t first,
                      int64_t last) {
  const text::Encoding enc = m.tokenizer().encode(doc, {.special_tokens = false});
  return doc.substr(size_t(enc.offsets[size_t(first)].first),
                    size_t(enc.offsets[size_t(last)].second - enc.offsets[size_t(first)].first));
}

TEST(TrainTasks, RecordsBecomeTheEngineQueriesWithTargets) {
  TempDir t;
  const auto model = engine::DegModel::open(write_gpt_checkpoint(t.path(), 1));
  const schema::Plan plan = plan_of(kSchema);
  const std::string doc = "play Muse then Queen and Muse in Paris, stop at Lyon 9am";
  const Json expected = Json::parse(R"({"intent": "PlayMusic", "city": "Paris",
      "artists": ["Muse", "Queen", "Muse"], "stops": [{"name": "Lyon", "time": "9am"}]})");
  const TaskExample ex = make_example(*model, plan, doc, expected);
  EXPECT_EQ(ex.unlocated, 0);
  EXPECT_EQ(ex.ctx_tokens, int64_t(doc.size()));  // bytes
  std::map<std::string, const TaskQuery*> by;
  for (const TaskQuery& q : ex.queries) by[q.pointer] = &q;
  // urgent is absent and a plain boolean: no query; city found; three artist items in order.
  EXPECT_FALSE(by.count("/urgent"));
  ASSERT_TRUE(by.count("/intent"));
  EXPECT_EQ(by["/intent"]->option, 0);
  EXPECT_EQ(by["/intent"]->option_positions.size(), 3u);
  ASSERT_TRUE(by.count("/city"));
  EXPECT_EQ(span_text(doc, *model, by["/city"]->span.start, by["/city"]->span.end), "Paris");
  ASSERT_TRUE(by.count("/artists"));
  const TaskQuery& arts = *by["/artists"];
  ASSERT_EQ(arts.starts.size(), 3u);
  EXPECT_EQ(arts.starts[0], int64_t(doc.find("Muse")));
  EXPECT_EQ(arts.starts[1], int64_t(doc.find("Queen")));
  EXPECT_EQ(arts.starts[2], int64_t(doc.rfind("Muse")));  // the second mention, not the first
  for (int k = 0; k < 3; ++k) {
    const std::string ptr = "/artists/" + std::to_string(k);
    ASSERT_TRUE(by.count(ptr)) << ptr;
    const TaskQuery& item = *by[ptr];
    EXPECT_EQ(item.span_query.anchor, arts.starts[size_t(k)]);
    EXPECT_EQ(item.span.start, arts.starts[size_t(k)]);
    EXPECT_EQ(span_text(doc, *model, item.span.start, item.span.end), k == 1 ? "Queen" : "Muse");
    // The item line is the one the engine renders from these anchors.
    const int64_t end = k < 2 ? arts.starts[size_t(k) + 1] : ex.ctx_tokens;
    EXPECT_EQ(item.span_query.region_end, end);
    const std::string rendered = model->tokenizer().decode(item.ids, false);
    EXPECT_NE(
        rendered.find(std::string("ITEM: \"") + doc.substr(size_t(arts.starts[size_t(k)]), 4)),
        std::string::npos)
        << rendered;
  }
  // An object item anchors at its earliest string; its fields are asked inside the item.
  ASSERT_TRUE(by.count("/stops"));
  EXPECT_EQ(by["/stops"]->starts, std::vector<int64_t>{int64_t(doc.find("Lyon"))});
  ASSERT_TRUE(by.count("/stops/0/time"));
  EXPECT_EQ(span_text(doc, *model, by["/stops/0/time"]->span.start, by["/stops/0/time"]->span.end),
            "9am");
  // Every query is what the engine encodes for that field and place.
  const schema::Field* city = schema::plan_find(plan, "/city");
  EXPECT_EQ(by["/city"]->ids, model->encode_query(*city, {}).ids);

  // Absent optional values: the extract's null outcome, an array with no items.
  const TaskExample none =
      make_example(*model, plan, "what is the weather", Json::parse(R"({"intent": "GetWeather"})"));
  for (const TaskQuery& q : none.queries) {
    if (q.pointer == "/city") {
      EXPECT_EQ(q.span.start, -1);
    }
    if (q.pointer == "/artists") {
      EXPECT_TRUE(q.starts.empty());
    }
    EXPECT_EQ(q.pointer.find("/artists/"), std::string::npos);
  }
  // A value the schema does not allow is named.
  EXPECT_THROW(make_example(*model, plan, "x", Json::parse(R"({"intent": "Dance"})")), Error);
}

// --shuffle-options: a choice query lists its options in an order drawn from the record's seed
// (the same seed, the same order), its target the expected option where it now stands; without
// a seed the schema's order, as deg fill asks.
TEST(TrainTasks, ShuffledOptionsKeepTheirTarget) {
  TempDir t;
  const auto model = engine::DegModel::open(write_gpt_checkpoint(t.path(), 1));
  const schema::Plan plan = plan_of(kSchema);
  const schema::Field* intent = schema::plan_find(plan, "/intent");
  const std::vector<int32_t> schema_order = model->encode_query(*intent, {}).ids;
  auto query = [](const TaskExample& ex) {
    for (const TaskQuery& q : ex.queries)
      if (q.pointer == "/intent") return q;
    return TaskQuery{};
  };
  int reordered = 0;
  for (const char* want : {"PlayMusic", "GetWeather", "BookRestaurant"}) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      const std::string doc = fmt::format("request number {} of the day", seed);
      const Json expected = {{"intent", want}};
      EXPECT_EQ(query(make_example(*model, plan, doc, expected)).ids, schema_order);
      const TaskQuery q = query(make_example(*model, plan, doc, expected, 0, seed));
      EXPECT_EQ(q.ids, query(make_example(*model, plan, doc, expected, 0, seed)).ids);
      reordered += q.ids != schema_order;
      // The target's option line (from the previous option's end to its own) names it.
      ASSERT_EQ(q.option_positions.size(), 3u);
      const int64_t from = q.option > 0 ? q.option_positions[size_t(q.option - 1)] + 1 : 0;
      const std::vector<int32_t> line(q.ids.begin() + from,
                                      q.ids.begin() + q.option_positions[size_t(q.option)] + 1);
      const std::string text = model->tokenizer().decode(line, true);
      EXPECT_TRUE(text.ends_with(std::string("- ") + want)) << text;
    }
  }
  EXPECT_GT(reordered, 0);
}

TEST(TrainFeatures, PackedForkLayoutEqualsTheEngine) {
  TempDir t;
  const fs::path ckpt = write_gpt_checkpoint(t.path(), 2);
  const auto model = engine::DegModel::open(ckpt);
  const GptParams p = GptParams::load(gpt_config_resolve((ckpt / "config.json").string()),
                                      ckpt / "backbone.safetensors", "model.");
  const schema::Plan plan = plan_of(kSchema);
  const TaskExample a =
      make_example(*model, plan, "play Muse in Paris please",
                   Json::parse(R"({"intent": "PlayMusic", "city": "Paris", "artists": ["Muse"]})"));
  const TaskExample b = make_example(*model, plan, "weather in Rome tomorrow, stop at Lyon",
                                     Json::parse(R"({"intent": "GetWeather", "city": "Rome",
                                                     "stops": [{"name": "Lyon"}]})"));
  const std::vector<const TaskExample*> exs = {&a, &b};
  const Packed packed = pack_examples(exs);
  GptActs acts;
  gpt_forward(p, packed.batch, {.window_short = 256, .window_long = 512}, acts);
  const int64_t C = p.config().model_dim;
  for (size_t k = 0; k < exs.size(); ++k) {
    const Feats want = engine_features(*model, *exs[k]);
    const Feats have = packed_features(packed, exs, k, acts.final_xn.data(), C);
    for (auto [w, h, what] : {std::tuple{&want.ctx, &have.ctx, "context"},
                              std::tuple{&want.answers, &have.answers, "answers"},
                              std::tuple{&want.options, &have.options, "options"}}) {
      ASSERT_EQ(w->size(), h->size()) << what;
      ASSERT_FALSE(w->empty()) << what;
      double err = 0, scale = 0;
      for (size_t i = 0; i < w->size(); ++i) {
        err = std::max(err, std::fabs(double((*w)[i]) - (*h)[i]));
        scale = std::max(scale, std::fabs(double((*w)[i])));
      }
      EXPECT_LT(err / scale, 1e-4) << what << " of example " << k;
    }
  }
}

TEST(TrainCalibrate, FitsTheTemperatureTheLabelsWereDrawnAt) {
  Rng rng(3);
  std::vector<CalibrationItem> items;
  const double t0 = 2.5;
  for (int n = 0; n < 4000; ++n) {
    CalibrationItem it;
    for (int o = 0; o < 4; ++o) it.a.push_back(float(rng.normal() * 4));
    std::vector<double> p = engine::softmax(it.a.data(), 4, t0);
    double u = rng.uniform(), c = 0;
    it.target = 3;
    for (int o = 0; o < 4; ++o)
      if ((c += p[size_t(o)]) > u) {
        it.target = o;
        break;
      }
    items.push_back(std::move(it));
  }
  const double t = fit_temperature(HeadKind::choice, items);
  EXPECT_NEAR(t, t0, 0.25);
  EXPECT_LT(calibration_nll(HeadKind::choice, items, t),
            calibration_nll(HeadKind::choice, items, 1.0));
  std::vector<Decision> before, after;
  for (const auto& it : items) {
    before.push_back(decide(HeadKind::choice, it, 1.0));
    after.push_back(decide(HeadKind::choice, it, t));
  }
  EXPECT_GT(expected_calibration_error(before), 0.1);  // overconfident at T = 1
  EXPECT_LT(expected_calibration_error(after), 0.04);
  // ECE by hand: two bins, |0.5 - 0.55| and |1 - 0.95| weighted by their counts.
  EXPECT_NEAR(expected_calibration_error({{0.55, true}, {0.55, false}, {0.95, true}}),
              (std::fabs(1 - 1.1) + std::fabs(1 - 0.95)) / 3, 1e-12);
}

// Records of kSchema in shared/data's format.
void write_records(const fs::path& path, int n, uint64_t seed) {
  const char* artists[] = {"Muse", "Queen", "Abba", "Blur"};
  const char* cities[] = {"Paris", "Rome", "Lyon", "Oslo"};
  Rng rng(seed);
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const std::string a = artists[rng.next_u64() % 4], c = cities[rng.next_u64() % 4];
    Json r;
    if (i % 3 == 0) {
      r = {{"document", "play " + a + " in " + c},
           {"expected", {{"intent", "PlayMusic"}, {"city", c}, {"artists", {a}}}}};
    } else if (i % 3 == 1) {
      r = {{"document", "weather in " + c + " today?"},
           {"expected", {{"intent", "GetWeather"}, {"city", c}}}};
    } else {
      r = {{"document", "book a table, urgent, stop at " + c},
           {"expected",
            {{"intent", "BookRestaurant"}, {"urgent", true}, {"stops", {{{"name", c}}}}}}};
    }
    out << r.dump() << "\n";
  }
}

// kSchema with 12 training and 4 dev records under `dir`: the --task argument.
std::string write_task(const fs::path& dir) {
  deg::testing::write_text(dir / "schema.json", kSchema);
  write_records(dir / "train.jsonl", 12, 1);
  write_records(dir / "dev.jsonl", 4, 2);
  return (dir / "schema.json").string() + ":" + (dir / "train.jsonl").string() + ":" +
         (dir / "dev.jsonl").string();
}

TEST(TrainFineTune, ResumeContinuesExactly) {
  TempDir t;
  const fs::path ckpt = write_gpt_checkpoint(t.path(), 4);
  const std::string task = write_task(t.path());
  auto run = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "train",   "--base", ckpt.string(),    "--out", (t / out).string(), "--task", task,
        "--steps", "6",      "--batch-tokens", "600",   "--eval-every",     "2",      "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    return deg::testing::run_deg(args);
  };
  auto r = run("straight", {});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json summary = Json::parse(r.out);
  EXPECT_EQ(summary["steps"], 6);
  EXPECT_EQ(summary["train_examples"], 12);
  EXPECT_EQ(summary["unlocated_values"], 0);
  EXPECT_FALSE(summary["calibration"].empty());
  ASSERT_EQ(run("half", {"--stop-at", "4"}).exit_code, 0);
  EXPECT_FALSE(fs::exists(t / "half" / "calibration.json"));  // calibration comes at the end
  r = run("half", {"--resume"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f : {"heads.safetensors", "backbone.safetensors"}) {
    EXPECT_EQ(deg::testing::read_text(t / "half" / "train_state" / f),
              deg::testing::read_text(t / "straight" / "train_state" / f))
        << f;
  }
  EXPECT_NE(deg::testing::read_text(t / "straight" / "train_state" / "backbone.safetensors"),
            deg::testing::read_text(ckpt / "backbone.safetensors"));  // the trunk trained
  // One worker thread: the same bits (each example's head gradients are its own, added in
  // example order whatever thread ran them).
  r = deg::testing::run_deg({"--threads", "1", "train", "--base", ckpt.string(), "--out",
                             (t / "one").string(), "--task", task, "--steps", "6", "--batch-tokens",
                             "600", "--eval-every", "2", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f : {"heads.safetensors", "backbone.safetensors"}) {
    EXPECT_EQ(deg::testing::read_text(t / "one" / "train_state" / f),
              deg::testing::read_text(t / "straight" / "train_state" / f))
        << f;
  }
  int lines = 0;
  std::ifstream m(t / "half" / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) lines += !line.empty();
  EXPECT_EQ(lines, 6);
  // The checkpoint fills (the engine reads what the trainer wrote) and refuses a second run
  // into the same directory.
  deg::testing::write_text(t / "doc.txt", "play Abba in Rome");
  r = deg::testing::run_deg({"fill", "--model", (t / "straight").string(), "--schema",
                             (t / "schema.json").string(), "--allow-missing",
                             (t / "doc.txt").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(run("straight", {}).exit_code, 0);
}

// Two `deg train` processes started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) train data-parallel over TCP on the CPU, each taking every other record of a
// batch: rank 0 alone writes and reports, and every step's loss and the dev losses are one
// process's up to the order of the gradients' sums.
TEST(TrainFineTune, RanksTrainDataParallelOverTcp) {
  TempDir t;
  const fs::path ckpt = write_gpt_checkpoint(t.path(), 4);
  const std::string task = write_task(t.path());
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{
        "train",   "--base", ckpt.string(),    "--out", (t / out).string(), "--task", task,
        "--steps", "6",      "--batch-tokens", "600",   "--eval-every",     "2",      "--device",
        "cpu",     "--quiet"};
  };
  const deg::testing::CommandResult one = deg::testing::run_deg(args("one"));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::vector<deg::testing::CommandResult> ranks =
      deg::testing::run_deg_ranks(2, args("ranks"));
  ASSERT_EQ(ranks[0].exit_code, 0) << ranks[0].err;
  ASSERT_EQ(ranks[1].exit_code, 0) << ranks[1].err;
  EXPECT_EQ(ranks[1].out, "");  // rank 0 reports
  const Json a = Json::parse(one.out), b = Json::parse(ranks[0].out);
  EXPECT_EQ(b["steps"], 6);
  EXPECT_NEAR(b["best_dev_loss"].get<double>(), a["best_dev_loss"].get<double>(),
              1e-4 * a["best_dev_loss"].get<double>());
  const std::vector<double> want = deg::testing::jsonl_numbers(t / "one" / "metrics.jsonl", "loss");
  const std::vector<double> got =
      deg::testing::jsonl_numbers(t / "ranks" / "metrics.jsonl", "loss");
  ASSERT_EQ(got.size(), 6u);
  ASSERT_EQ(want.size(), 6u);
  EXPECT_NEAR(got[0], want[0], 1e-6 * want[0]);  // the same weights: the sums' order only
  for (size_t i = 1; i < 6; ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * want[i]) << "step " << i + 1;
}

// `--device auto` against `--device cpu`: the loss of every step and the dev loss. Where auto
// is the CPU (no GPU visible) the runs are the same bits; on a GPU the trunk's forward, backward
// and optimizer run there (the heads on the host), and the first step's loss (the same weights)
// agrees within float rounding, the later ones (after updates that differ by rounding) within
// 1e-3, relative.
TEST(TrainFineTune, DevicesAgree) {
  TempDir t;
  const fs::path ckpt = write_gpt_checkpoint(t.path(), 8);
  deg::testing::write_text(t / "schema.json", kSchema);
  write_records(t / "train.jsonl", 12, 3);
  write_records(t / "dev.jsonl", 4, 4);
  const std::string task = (t / "schema.json").string() + ":" + (t / "train.jsonl").string() + ":" +
                           (t / "dev.jsonl").string();
  auto run = [&](const std::string& device) {
    const auto r = deg::testing::run_deg({"train", "--base", ckpt.string(), "--out",
                                          (t / device).string(), "--task", task, "--steps", "4",
                                          "--batch-tokens", "600", "--eval-every", "2", "--device",
                                          device, "--no-calibrate", "--quiet"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<Json> lines;
    std::ifstream m(t / device / "metrics.jsonl");
    for (std::string line; std::getline(m, line);)
      if (!line.empty()) lines.push_back(Json::parse(line));
    return lines;
  };
  const std::vector<Json> cpu = run("cpu"), any = run("auto");
  ASSERT_EQ(cpu.size(), 4u);
  ASSERT_EQ(any.size(), 4u);
  const bool gpu = cuda_available();
  for (size_t s = 0; s < 4; ++s) {
    for (const char* key : {"loss", "dev_loss"}) {
      if (!cpu[s].contains(key)) continue;
      const double want = cpu[s][key].get<double>(), got = any[s][key].get<double>();
      if (!gpu) {
        EXPECT_EQ(got, want) << key << " at step " << s + 1;
      } else {
        EXPECT_NEAR(got, want, (s == 0 ? 1e-4 : 1e-3) * want) << key << " at step " << s + 1;
      }
    }
  }
  EXPECT_TRUE(cpu[1].contains("dev_loss"));
  if (!gpu) {
    EXPECT_EQ(deg::testing::read_text(t / "auto" / "backbone.safetensors"),
              deg::testing::read_text(t / "cpu" / "backbone.safetensors"));
  }
}

// A user fine-tunes a shipped (packed) checkpoint: bf16 tensors in backbone parts become one
// backbone file the trunk trains from, and the run writes its f32 trunk over it.
TEST(TrainFineTune, ContinuesFromAPackedCheckpoint) {
  TempDir t;
  const fs::path ckpt = write_gpt_checkpoint(t.path(), 9);
  auto r = deg::testing::run_deg({"pack", "--model", ckpt.string(), "--out",
                                  (t / "packed").string(), "--max-file-mib", "0.6"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(t / "packed" / "backbone-00001-of-00002.safetensors"));
  deg::testing::write_text(t / "schema.json", kSchema);
  write_records(t / "train.jsonl", 6, 7);
  r = deg::testing::run_deg({"train", "--base", (t / "packed").string(), "--out",
                             (t / "tuned").string(), "--task",
                             (t / "schema.json").string() + ":" + (t / "train.jsonl").string(),
                             "--steps", "2", "--batch-tokens", "600", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(t / "tuned" / "backbone.safetensors"));
  EXPECT_FALSE(fs::exists(t / "tuned" / "backbone-00001-of-00002.safetensors"));
  const SafetensorsFile trained = SafetensorsFile::open(t / "tuned" / "backbone.safetensors");
  EXPECT_EQ(trained.tensor("model.embed").dtype(), DType::f32);  // the trained trunk, in f32
  deg::testing::write_text(t / "doc.txt", "play Abba in Rome");
  r = deg::testing::run_deg({"fill", "--model", (t / "tuned").string(), "--schema",
                             (t / "schema.json").string(), (t / "doc.txt").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Two tasks train one model: records of both schemas share the steps, the dev loss is
// reported per task, and a bad --task leaves nothing behind.
TEST(TrainFineTune, TwoTasksTrainOneModel) {
  TempDir t;
  const fs::path ckpt = write_gpt_checkpoint(t.path(), 6);
  deg::testing::write_text(t / "a.json", kSchema);
  write_records(t / "a.jsonl", 6, 5);
  fs::create_directories(t / "b");
  deg::testing::write_text(
      t / "b" / "schema.json",
      R"({"type": "object", "properties": {"spam": {"type": "boolean"}}, "required": ["spam"]})");
  {
    std::ofstream b(t / "b" / "train.jsonl");
    for (int i = 0; i < 6; ++i)
      b << Json({{"document", i % 2 ? "win money now!!!" : "see you at lunch"},
                 {"expected", {{"spam", i % 2 == 1}}}})
               .dump()
        << "\n";
  }
  const std::string a =
      (t / "a.json").string() + ":" + (t / "a.jsonl").string() + ":" + (t / "a.jsonl").string();
  const std::string b = (t / "b" / "schema.json").string() + ":" +
                        (t / "b" / "train.jsonl").string() + ":" +
                        (t / "b" / "train.jsonl").string();
  auto r = deg::testing::run_deg({"train", "--base", ckpt.string(), "--out", (t / "out").string(),
                                  "--task", a, "--task", b, "--steps", "3", "--batch-tokens", "400",
                                  "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["train_examples"], 12);
  std::string last;
  std::ifstream m(t / "out" / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    last = line;
    // Each step's records and where its time went.
    const Json j = Json::parse(line);
    EXPECT_GE(j["records"].get<int64_t>(), 1) << line;
    for (const char* phase : {"pack", "forward", "heads", "backward", "optimizer"})
      EXPECT_GE(j["ms"][phase].get<double>(), 0.0) << phase << ": " << line;
    EXPECT_GT(j["ms"]["forward"].get<double>() + j["ms"]["heads"].get<double>(), 0.0) << line;
  }
  const Json by_task = Json::parse(last)["dev_loss_by_task"];
  EXPECT_TRUE(by_task.contains("b")) << last;  // b/schema.json: its directory
  EXPECT_TRUE(by_task.contains("a")) << last;  // a.json: its file name
  EXPECT_GT(by_task["b"].get<double>(), 0.0);
  r = deg::testing::run_deg({"train", "--base", ckpt.string(), "--out", (t / "bad").string(),
                             "--task", (t / "a.json").string() + ":" + (t / "nope.jsonl").string(),
                             "--quiet"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nope.jsonl"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(t / "bad"));
  // The op profile is CUDA's: on the CPU it is refused before anything is written.
  r = deg::testing::run_deg({"train", "--base", ckpt.string(), "--out", (t / "prof").string(),
                             "--task", a, "--device", "cpu", "--profile-step", "2", "--quiet"});
  EXPECT_EQ(r.exit_code, 2) << r.err;  // bad usage
  EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(t / "prof"));
}

// Another family keeps its trunk: the engine's hidden states are computed once, the heads learn
// on them (they fit the training records and the dev loss improves, on a random trunk), and the
// backbone weights are the base's, byte for byte.
TEST(TrainFineTune, HeadsLearnOnAFrozenQwen35Trunk) {
  TempDir t;
  deg::testing::write_tiny_qwen35(t / "base", 5);
  deg::testing::write_text(t / "schema.json", kSchema);
  write_records(t / "train.jsonl", 24, 3);
  write_records(t / "dev.jsonl", 6, 4);
  const auto r = deg::testing::run_deg(
      {"train", "--base", (t / "base").string(), "--out", (t / "out").string(), "--task",
       (t / "schema.json").string() + ":" + (t / "train.jsonl").string() + ":" +
           (t / "dev.jsonl").string(),
       "--steps", "40", "--batch-tokens", "2000", "--eval-every", "10", "--head-lr", "0.01",
       "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json summary = Json::parse(r.out);
  EXPECT_LT(summary["best_dev_loss"].get<double>(), summary["first_dev_loss"].get<double>())
      << r.out;
  std::vector<double> loss;
  std::ifstream m(t / "out" / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) loss.push_back(Json::parse(line)["loss"]);
  ASSERT_EQ(loss.size(), 40u);
  EXPECT_LT(loss.back(), 0.5 * loss.front());  // the heads fit the training records
  // The base's bf16 text weights as deg init writes them: untouched by training.
  checkpoint_create({.base = t / "base", .out = t / "init", .seed = 0});
  EXPECT_EQ(deg::testing::read_text(t / "out" / "backbone.safetensors"),
            deg::testing::read_text(t / "init" / "backbone.safetensors"));
  EXPECT_NE(deg::testing::read_text(t / "out" / "heads.safetensors"),
            deg::testing::read_text(t / "init" / "heads.safetensors"));
}

// #15's CPU figure, as a user gets it from the command line: a byte-level BPE tokenizer trained
// on SNIPS request texts and the schema's rendered queries, a tiny gpt trunk pretrained on the
// request texts, then fine-tuned (trunk and heads) on a subset of the SNIPS training records.
// `deg eval` on every tenth dev record must beat the majority intent by 30 points and find
// slot values with F1 >= 0.25 (the test computes the baseline from the same records).
TEST(TrainFineTune, SnipsSubsetBeatsTheMajorityIntentAndFillsSlots) {
  const fs::path snips = deg::testing::source_path("../shared/data/snips");
  ASSERT_TRUE(fs::exists(snips / "train.jsonl")) << "shared/data/snips is missing";
  TempDir t;
  // Texts: every training request (no labels) and the queries the schema renders.
  {
    std::ifstream in(snips / "train.jsonl");
    std::ofstream train(t / "requests.txt"), val(t / "val.txt");
    int n = 0;
    for (std::string line; std::getline(in, line); ++n) {
      const std::string doc = Json::parse(line)["document"].get<std::string>();
      (n % 50 == 0 ? val : train) << doc << "<|endoftext|>";
    }
    const schema::Plan plan =
        schema::plan_compile(schema::schema_load((snips / "schema.json").string()));
    std::ofstream queries(t / "queries.txt");
    for (int rep = 0; rep < 30; ++rep)
      schema::plan_visit(plan.root, [&](const schema::Field& f) {
        if (f.kind == schema::FieldKind::object) return;
        schema::QueryPlace place;
        for (const schema::PathToken& p : f.path)
          if (p.item) place.indices.push_back(0);
        if (!place.indices.empty()) place.item = schema::ItemLine{.text = "an item"};
        queries << schema::query_text(schema::render_query(f, place)) << "\n";
      });
  }
  auto deg = [&](std::vector<std::string> args) {
    const auto r = deg::testing::run_deg(args);
    EXPECT_EQ(r.exit_code, 0) << args[0] << ": " << r.err;
    return r;
  };
  deg({"tokenizer", "train", "--vocab", "1024", "--out", (t / "tok").string(), "--quiet",
       (t / "requests.txt").string(), (t / "queries.txt").string()});
  deg({"shard", "--tokenizer", (t / "tok").string(), "--out", (t / "data").string(), "--val",
       (t / "val.txt").string(), (t / "requests.txt").string()});
  // The tiny preset with windows that let a query see its whole document.
  GptConfig c = gpt_preset("tiny");
  c.vocab_size =
      (json_load(t / "data" / "data.json")["vocab_size"].get<int64_t>() + 127) / 128 * 128;
  c.window_short = 256;
  c.window_long = 512;
  deg::testing::write_text(t / "tiny.json", gpt_config_to_json(c).dump());
  deg({"pretrain", "--config", (t / "tiny.json").string(), "--data", (t / "data").string(),
       "--steps", "150", "--batch-tokens", "1024", "--max-seq-len", "64", "--val-tokens", "2048",
       "--seed", "1", "--out", (t / "pre").string(), "--quiet"});
  const std::string task = (snips / "schema.json").string() + ":" +
                           (snips / "train.jsonl").string() + ":" + (snips / "dev.jsonl").string();
  deg({"train",
       "--base",
       (t / "pre").string(),
       "--out",
       (t / "tuned").string(),
       "--task",
       task,
       "--max-train",
       "4000",
       "--max-dev",
       "28",
       "--steps",
       "150",
       "--batch-tokens",
       "4096",
       "--empty-array-rate",
       "0.1",
       "--head-lr",
       "0.01",
       "--trunk-lr",
       "1.0",
       "--cooldown",
       "0.3",
       "--seed",
       "1",
       "--quiet"});
  // Every tenth dev record: 10 of each intent.
  std::map<std::string, int> intents;
  {
    std::ifstream in(snips / "dev.jsonl");
    std::ofstream out(t / "dev.jsonl");
    int n = 0;
    for (std::string line; std::getline(in, line); ++n) {
      if (n % 10) continue;
      out << line << "\n";
      ++intents[Json::parse(line)["expected"]["intent"].get<std::string>()];
    }
  }
  int records = 0, majority = 0;
  for (const auto& [name, count] : intents) {
    records += count;
    majority = std::max(majority, count);
  }
  const auto r =
      deg({"eval", "--model", (t / "tuned").string(), "--schema", (snips / "schema.json").string(),
           "--data", (t / "dev.jsonl").string(), "--json"});
  const Json m = Json::parse(r.out);
  const double accuracy = m["decisions"]["choice"]["accuracy"].get<double>();
  const double f1 = m["extract"]["f1"].get<double>();
  const double baseline = double(majority) / double(records);
  std::printf("snips dev (%d records): intent accuracy %.4f (majority %.4f), slot F1 %.4f\n",
              records, accuracy, baseline, f1);
  EXPECT_EQ(m["records"], records);
  EXPECT_GE(accuracy, baseline + 0.30);
  EXPECT_GE(f1, 0.25);
}

}  // namespace
}  // namespace deg::train
