// The fill engine end to end on a tiny random Qwen3.5 with fresh heads (`deg init`): outputs
// validate against their schemas (valijson), fields are bitwise independent of each other, a
// document's report is the same alone and in a batch (of its schema or of several: fill_batch),
// spans hold their values, bad documents fail alone. The answers of random heads are
// meaningless; these are properties of the machinery.
#include "deg/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "core/error.h"
#include "deg/report.h"
#include "engine/decode.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "model/checkpoint.h"
#include "schema/plan.h"
#include "schema/spans.h"
#include "schema/validate.h"
#include "test_util.h"
#include "tiny_model.h"

namespace deg {
namespace {

namespace fs = std::filesystem;

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::write_tiny_qwen35(*dir_ / "base", 11);
    checkpoint_init({.base = *dir_ / "base", .out = *dir_ / "ckpt", .seed = 3});
    engine_ = new Engine(Engine::open({.model = *dir_ / "ckpt"}));
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete dir_;
  }
  static OrderedJson load_schema(const std::string& rel) {
    return schema::schema_load(testing::source_path(rel).string());
  }

  static testing::TempDir* dir_;
  static Engine* engine_;
};

testing::TempDir* EngineTest::dir_ = nullptr;
Engine* EngineTest::engine_ = nullptr;

const std::vector<std::string>& documents() {
  static const std::vector<std::string> docs = {
      testing::read_text(testing::source_path("examples/invoice.txt")),
      testing::read_text(testing::source_path("examples/support.txt")),
      "Meeting on 2026-03-04 with Ana Lima (ana@example.com). Budget: 1,250.50 EUR. "
      "Items: 3 chairs, 2 desks.",
  };
  return docs;
}

void expect_valid(const OrderedJson& schema, const OrderedJson& value) {
  const auto why = schema::schema_violations(schema, value);
  EXPECT_TRUE(why.empty()) << value.dump() << "\n" << fmt::format("{}", fmt::join(why, "; "));
}

// examples/NAME.expected.json is the correct fill of examples/NAME.txt, written by hand (what
// `make run` is held to once a model ships): it validates against NAME.schema.json, answers
// every field that is not x-generate, and every string in it is copied from the document.
TEST(Examples, ExpectedFillsAreValidCompleteAndFromTheDocument) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::source_path("examples"))) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".schema.json")) continue;
    const std::string stem = name.substr(0, name.size() - std::strlen(".schema.json"));
    SCOPED_TRACE(stem);
    const std::filesystem::path dir = entry.path().parent_path();
    const OrderedJson schema = OrderedJson::parse(testing::read_text(entry.path()));
    ASSERT_TRUE(std::filesystem::exists(dir / (stem + ".expected.json")));
    const OrderedJson expected =
        OrderedJson::parse(testing::read_text(dir / (stem + ".expected.json")));
    const std::string doc = testing::read_text(dir / (stem + ".txt"));
    expect_valid(schema, expected);
    for (const auto& [key, field] : schema["properties"].items()) {
      if (field.value("x-generate", false)) continue;
      EXPECT_TRUE(expected.contains(key)) << key;
    }
    // Every extracted string (a string field without an enum) is copied from the document.
    std::function<void(const OrderedJson&, const OrderedJson&)> copied = [&](const OrderedJson& f,
                                                                             const OrderedJson& v) {
      if (v.is_string() && !f.contains("enum")) {
        EXPECT_NE(doc.find(v.get<std::string>()), std::string::npos) << v;
      } else if (v.is_array()) {
        for (const auto& x : v) copied(f["items"], x);
      } else if (v.is_object()) {
        for (const auto& [k, x] : v.items()) copied(f["properties"][k], x);
      }
    };
    copied(schema, expected);
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST_F(EngineTest, OutputsValidateAgainstTheirSchemas) {
  for (const char* rel :
       {"examples/invoice.schema.json", "examples/support.schema.json",
        "../shared/data/emails/schema.json", "../shared/data/snips/schema.json"}) {
    OrderedJson schema = load_schema(rel);
    std::vector<FillResult> results = engine_->fill(schema, documents());
    ASSERT_EQ(results.size(), documents().size());
    for (const FillResult& r : results) {
      ASSERT_TRUE(r.ok()) << rel << ": " << r.error;
      expect_valid(schema, r.value);
      for (const FieldReport& f : r.fields) {
        EXPECT_GE(f.confidence, 0.0) << f.path;
        EXPECT_LE(f.confidence, 1.0 + 1e-9) << f.path;
      }
    }
  }
}

// x-generate strings with a minLength are written at least that long: the end of the text is
// passed over (the next most likely token taken) until then, so the value validates. A tiny gpt
// whose LM head makes the end of text likely shows first that without minLength texts end
// early: its row is w, "a"'s w / 2, "b"'s -w / 2, the others 0, so the end of text comes first
// whenever w . h > 0 ("a" second), else "b".
TEST(EngineGenerate, TextsReachTheirMinLength) {
  testing::TempDir t;
  testing::write_tiny_gpt(t / "base", 3);
  const fs::path weights = t / "base" / "model.safetensors";
  std::vector<NamedTensor> all;
  {
    const SafetensorsFile f = SafetensorsFile::open(weights);
    for (const TensorInfo& info : f.tensors())
      all.push_back({info.name, f.tensor(info.name).clone()});
  }
  int patched = 0;
  for (NamedTensor& n : all) {
    if (n.name != "lm_head") continue;
    float* w = n.tensor.mutable_data<float>();
    const int64_t V = n.tensor.dim(0), C = n.tensor.dim(1), eos = 256;  // <|endoftext|>
    for (int64_t r = 0; r < V; ++r) {
      const float f = r == 'a' ? 0.5f : r == 'b' ? -0.5f : 0.0f;
      for (int64_t c = 0; c < C && r != eos; ++c) w[r * C + c] = f * w[eos * C + c];
    }
    ++patched;
  }
  ASSERT_EQ(patched, 1);
  safetensors_write(weights, all);
  checkpoint_create({.base = t / "base", .out = t / "ckpt", .seed = 1});
  const Engine engine = Engine::open({.model = t / "ckpt", .device = "cpu"});
  auto schema = [](bool min_length) {
    OrderedJson props = OrderedJson::object();
    for (int i = 0; i < 8; ++i) {
      OrderedJson f = {{"type", "string"}, {"x-generate", true}, {"maxLength", 48}};
      if (min_length) f["minLength"] = 10 + 4 * i;
      props[fmt::format("note{}", i)] = f;
    }
    return OrderedJson{{"type", "object"}, {"properties", props}};
  };
  auto length = [](const OrderedJson& v) {
    return int64_t(schema::utf8_to_code_points(v.get<std::string>())->size());
  };
  int short_texts = 0;
  for (const FillResult& r : engine.fill(schema(false), documents())) {
    ASSERT_TRUE(r.ok()) << r.error;
    for (int i = 0; i < 8; ++i) {
      const std::string key = fmt::format("note{}", i);
      short_texts += !r.value.contains(key) || length(r.value[key]) < 10 + 4 * i;
    }
  }
  ASSERT_GT(short_texts, 0) << "no text ended early: the case shows nothing";
  const OrderedJson bounded = schema(true);
  for (const FillResult& r : engine.fill(bounded, documents())) {
    ASSERT_TRUE(r.ok()) << r.error;
    expect_valid(bounded, r.value);
    for (int i = 0; i < 8; ++i) {
      const std::string key = fmt::format("note{}", i);
      ASSERT_TRUE(r.value.contains(key)) << r.value.dump();
      EXPECT_GE(length(r.value[key]), 10 + 4 * i) << r.value.dump();
    }
  }
}

// x-generate text that is no value of its field (a tiny random model does not write four Z's or
// a date) is left out, never output as a value the schema rejects: the document is filled, the
// field's report is a null, and a required one is listed missing.
TEST(EngineGenerate, TextsThatAreNoValueAreLeftOut) {
  testing::TempDir t;
  testing::write_tiny_gpt(t / "base", 3);
  checkpoint_create({.base = t / "base", .out = t / "ckpt", .seed = 1});
  const Engine engine = Engine::open({.model = t / "ckpt", .device = "cpu"});
  const OrderedJson code = {{"type", "string"}, {"x-generate", true}, {"pattern", "^Z{4}$"}};
  const OrderedJson when = {
      {"type", "string"}, {"x-generate", true}, {"format", "date"}, {"maxLength", 10}};
  const OrderedJson schema = {
      {"type", "object"}, {"properties", {{"code", code}, {"when", when}}}, {"required", {"code"}}};
  for (const FillResult& r : engine.fill(schema, documents())) {
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.value, OrderedJson::object()) << r.value.dump();
    EXPECT_EQ(r.missing, std::vector<std::string>{"/code"});
    ASSERT_EQ(r.fields.size(), 2u);
    for (const FieldReport& f : r.fields) {
      EXPECT_EQ(f.kind, "generate") << f.path;
      EXPECT_TRUE(f.value.is_null()) << f.path << ": " << f.value.dump();
    }
  }
}

TEST_F(EngineTest, SpansHoldTheirValues) {
  OrderedJson schema = load_schema("examples/invoice.schema.json");
  std::vector<FillResult> results = engine_->fill(schema, documents(), {.keep_nulls = true});
  int spans = 0;
  for (size_t d = 0; d < results.size(); ++d) {
    std::u32string text = *schema::utf8_to_code_points(documents()[d]);
    for (const FieldReport& f : results[d].fields) {
      if (!f.span) continue;
      ++spans;
      ASSERT_EQ(f.kind, "extract");
      ASSERT_LE(0, f.span->first);
      ASSERT_LT(f.span->first, f.span->second);
      ASSERT_LE(f.span->second, int64_t(text.size()));
      std::u32string piece =
          text.substr(size_t(f.span->first), size_t(f.span->second - f.span->first));
      std::string utf8 = engine::utf8_of(piece);
      if (f.value.is_string()) {
        EXPECT_EQ(utf8, f.value.get<std::string>()) << f.path;
      } else {
        ASSERT_TRUE(f.value.is_number()) << f.path;
        std::string digits;
        for (char c : utf8)
          if (std::isdigit(static_cast<unsigned char>(c))) digits += c;
        EXPECT_FALSE(digits.empty()) << f.path << " " << utf8;
      }
    }
  }
  EXPECT_GT(spans, 0);
}

// Adding or removing other fields changes no field's value, confidence or span, bitwise.
TEST_F(EngineTest, FieldsAreIndependent) {
  OrderedJson full = load_schema("examples/invoice.schema.json");
  OrderedJson part = full;
  part["properties"].erase("vendor");
  part["properties"].erase("line_items");
  part["properties"]["extra_flag"] = {{"type", "boolean"}};
  part["required"] = {"invoice_number", "total"};
  std::vector<FillResult> a = engine_->fill(full, documents(), {.keep_nulls = true});
  std::vector<FillResult> b = engine_->fill(part, documents(), {.keep_nulls = true});
  int compared = 0;
  for (size_t d = 0; d < a.size(); ++d) {
    for (const FieldReport& fb : b[d].fields) {
      for (const FieldReport& fa : a[d].fields) {
        if (fa.path != fb.path || fa.path == "/summary") continue;
        EXPECT_EQ(fa.value, fb.value) << fa.path;
        EXPECT_EQ(fa.confidence, fb.confidence) << fa.path;
        EXPECT_EQ(fa.span, fb.span) << fa.path;
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 3 * 4);
}

// A multi-select's options share the array's pointer but are decided apart: each keeps its own
// answer (before, every option's report read one shared answer), and the array holds exactly the
// options decided true, in order.
TEST_F(EngineTest, MultiSelectOptionsAreDecidedApart) {
  const std::vector<std::string> tags = {"urgent",   "billing",   "refund",
                                         "shipping", "complaint", "other"};
  const OrderedJson schema = {
      {"type", "object"},
      {"properties", {{"tags", {{"type", "array"}, {"items", {{"enum", tags}}}}}}}};
  for (const FillResult& r : engine_->fill(schema, documents(), {.keep_nulls = true})) {
    ASSERT_TRUE(r.error.empty()) << r.error;
    std::vector<const FieldReport*> picks;
    for (const FieldReport& f : r.fields)
      if (f.path == "/tags") picks.push_back(&f);
    ASSERT_EQ(picks.size(), tags.size());
    OrderedJson want = OrderedJson::array();
    std::set<double> confidences;
    for (size_t k = 0; k < tags.size(); ++k) {
      EXPECT_EQ(picks[k]->kind, "bool");
      if (picks[k]->value == true) want.push_back(tags[k]);
      confidences.insert(picks[k]->confidence);
    }
    EXPECT_EQ(r.value.value("tags", OrderedJson::array()), want);
    // Six queries over random weights give six different answers.
    EXPECT_EQ(confidences.size(), tags.size());
  }
}

TEST_F(EngineTest, ReportIsTheSameAloneAndInABatch) {
  OrderedJson schema = load_schema("examples/invoice.schema.json");
  std::vector<FillResult> batch = engine_->fill(schema, documents());
  for (size_t d = 0; d < documents().size(); ++d) {
    std::vector<FillResult> alone = engine_->fill(schema, {documents()[d]});
    ASSERT_EQ(alone[0].fields.size(), batch[d].fields.size());
    EXPECT_EQ(alone[0].value, batch[d].value);
    for (size_t i = 0; i < alone[0].fields.size(); ++i) {
      EXPECT_EQ(alone[0].fields[i].path, batch[d].fields[i].path);
      EXPECT_EQ(alone[0].fields[i].confidence, batch[d].fields[i].confidence)
          << alone[0].fields[i].path;
    }
  }
  // A different fork budget changes batching, not results.
  Engine small = Engine::open({.model = *dir_ / "ckpt", .fork_tokens = 64});
  std::vector<FillResult> rebatched = small.fill(schema, documents());
  for (size_t d = 0; d < documents().size(); ++d) {
    for (size_t i = 0; i < batch[d].fields.size(); ++i) {
      EXPECT_EQ(rebatched[d].fields[i].confidence, batch[d].fields[i].confidence);
    }
  }
}

// EngineOptions::gemm: auto (exact on the CPU), exact and bf16 open; bf16 dot products (the
// activations rounded to bf16) move the confidences of the tiny bf16 model a little, not its
// outputs' shape; anything else is refused before the model is read.
TEST_F(EngineTest, GemmPrecisionIsChosen) {
  const OrderedJson schema = load_schema("examples/invoice.schema.json");
  auto fill = [&](const std::string& gemm) {
    return Engine::open({.model = *dir_ / "ckpt", .device = "cpu", .gemm = gemm})
        .fill(schema, documents());
  };
  const auto automatic = fill("auto"), exact = fill("exact"), bf16 = fill("bf16");
  ASSERT_EQ(bf16.size(), exact.size());
  int moved = 0;
  for (size_t d = 0; d < exact.size(); ++d) {
    ASSERT_TRUE(bf16[d].ok()) << bf16[d].error;
    EXPECT_EQ(automatic[d].value, exact[d].value);
    ASSERT_EQ(automatic[d].fields.size(), exact[d].fields.size());
    std::map<std::string, double> confidence;
    for (size_t f = 0; f < exact[d].fields.size(); ++f) {
      EXPECT_EQ(automatic[d].fields[f].confidence, exact[d].fields[f].confidence);
      confidence[exact[d].fields[f].path] = exact[d].fields[f].confidence;
    }
    for (const FieldReport& f : bf16[d].fields) {  // an array may differ in its items
      auto it = confidence.find(f.path);
      moved += it != confidence.end() && it->second != f.confidence;
    }
    expect_valid(schema, bf16[d].value);
  }
  EXPECT_GT(moved, 0) << "bf16 dot products changed no confidence";
  try {
    Engine::open({.model = *dir_ / "ckpt", .gemm = "fast"});
    FAIL() << "gemm \"fast\" was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("auto, exact or bf16"), std::string::npos) << e.what();
  }
}

// Short documents are read together, as many as fill one prefill pass (shortest first), long
// ones alone: every document's report (values, confidences, spans, generated text) is still
// bitwise the one it gets filled alone.
TEST_F(EngineTest, DocumentsReadTogetherAnswerAsAlone) {
  OrderedJson schema = load_schema("examples/invoice.schema.json");
  std::vector<std::string> docs;
  for (int i = 0; i < 9; ++i) {
    std::string d = fmt::format("Invoice {} from Ana Lima, total {}.{}0 EUR, due 2026-0{}-1{}.",
                                100 + i, 12 * (i + 1), i, 1 + i % 9, i);
    for (int r = 0; r < i; ++r) d += " Item: chair.";  // lengths differ
    docs.push_back(d);
  }
  std::string long_doc;
  while (long_doc.size() < 6000) long_doc += documents()[0];  // over one read pass alone
  docs.insert(docs.begin() + 4, long_doc);
  const std::vector<FillResult> together = engine_->fill(schema, docs);
  ASSERT_EQ(together.size(), docs.size());
  for (size_t d = 0; d < docs.size(); ++d) {
    const std::vector<FillResult> alone = engine_->fill(schema, {docs[d]});
    ASSERT_TRUE(alone[0].ok() && together[d].ok()) << alone[0].error << together[d].error;
    EXPECT_EQ(alone[0].value, together[d].value) << "document " << d;
    ASSERT_EQ(alone[0].fields.size(), together[d].fields.size());
    for (size_t i = 0; i < alone[0].fields.size(); ++i) {
      const FieldReport &a = alone[0].fields[i], &b = together[d].fields[i];
      EXPECT_EQ(a.confidence, b.confidence) << "document " << d << " " << a.path;
      EXPECT_EQ(a.span, b.span) << "document " << d << " " << a.path;
    }
  }
}

// One fill_batch call over requests of different schemas and options (the forks of all their
// documents share micro-batches) answers each request bitwise as fill() does alone; a request
// whose schema deg cannot fill, or whose options are out of range, gets its error and costs the
// others nothing.
TEST_F(EngineTest, BatchesOfDifferentSchemasAnswerAsAlone) {
  const OrderedJson invoice = load_schema("examples/invoice.schema.json");
  const OrderedJson support = load_schema("examples/support.schema.json");
  const OrderedJson unsupported = {{"type", "object"},
                                   {"properties", {{"a", {{"not", {{"type", "string"}}}}}}}};
  const std::vector<DocumentParts> two = {{DocumentPart::of_text(documents()[0])},
                                          {DocumentPart::of_text(documents()[2])}};
  const std::vector<DocumentParts> one = {{DocumentPart::of_text(documents()[1])}};
  const std::vector<DocumentParts> with_empty = {{DocumentPart::of_text("")},
                                                 {DocumentPart::of_text(documents()[1])}};
  const std::vector<FillRequest> requests = {
      {.schema = &invoice, .documents = &two},
      {.schema = &support, .documents = &one, .options = {.keep_nulls = true}},
      {.schema = &unsupported, .documents = &one},
      {.schema = &invoice, .documents = &one, .options = {.min_confidence = 0.5}},
      {.schema = &support, .documents = &with_empty},
      {.schema = &support, .documents = &one, .options = {.min_confidence = 2}},
  };
  const std::vector<FillResponse> together = engine_->fill_batch(requests);
  ASSERT_EQ(together.size(), requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    std::vector<FillResult> alone;
    try {
      alone = engine_->fill(*requests[r].schema, *requests[r].documents, requests[r].options);
    } catch (const Error& e) {
      ASSERT_TRUE(together[r].error) << r;
      EXPECT_EQ(together[r].error->kind(), e.kind());
      EXPECT_STREQ(together[r].error->what(), e.what());
      continue;
    }
    ASSERT_FALSE(together[r].error) << r << ": " << together[r].error->what();
    ASSERT_EQ(together[r].results.size(), alone.size()) << r;
    for (size_t d = 0; d < alone.size(); ++d) {
      const FillResult& a = alone[d];
      const FillResult& t = together[r].results[d];
      EXPECT_EQ(t.error, a.error);
      EXPECT_EQ(t.value, a.value) << r << "/" << d;
      EXPECT_EQ(t.missing, a.missing);
      ASSERT_EQ(t.fields.size(), a.fields.size());
      for (size_t i = 0; i < a.fields.size(); ++i) {
        EXPECT_EQ(t.fields[i].path, a.fields[i].path);
        EXPECT_EQ(t.fields[i].span, a.fields[i].span) << a.fields[i].path;
        EXPECT_EQ(t.fields[i].withheld, a.fields[i].withheld) << a.fields[i].path;
        EXPECT_EQ(std::memcmp(&t.fields[i].confidence, &a.fields[i].confidence, sizeof(double)), 0)
            << r << "/" << d << " " << a.fields[i].path;
      }
    }
  }
  EXPECT_EQ(together[2].error->context().pointer, "/properties/a/not");
  EXPECT_EQ(together[5].error->kind(), ErrorKind::invalid_argument);
  EXPECT_FALSE(together[4].results[0].ok());  // the empty document failed alone
  EXPECT_TRUE(together[4].results[1].ok());
}

// on_result hears of each document once, with the result the call returns in its place, as soon
// as the document is finished: the documents of a flat schema before one whose array items need
// a second round, though that one comes first in the call.
TEST_F(EngineTest, ResultsComeAsEachDocumentIsFinished) {
  const OrderedJson items = {
      {"type", "object"},
      {"properties",
       {{"items",
         {{"type", "array"},
          {"minItems", 2},
          {"items", {{"type", "object"}, {"properties", {{"name", {{"type", "string"}}}}}}}}}}}};
  const OrderedJson support = load_schema("examples/support.schema.json");
  const std::vector<DocumentParts> one = {{DocumentPart::of_text(documents()[2])}};
  const std::vector<DocumentParts> two = {{DocumentPart::of_text(documents()[1])},
                                          {DocumentPart::of_text(documents()[0])}};
  std::vector<std::pair<size_t, size_t>> order;  // (request, document)
  std::vector<std::vector<OrderedJson>> heard(2);
  auto hear = [&](size_t request) {
    heard[request].resize(request == 0 ? 1 : 2);
    return [&, request](size_t document, const FillResult& result) {
      order.emplace_back(request, document);
      heard[request][document] = report_to_json(result);
    };
  };
  const std::vector<FillResponse> answers = engine_->fill_batch(
      {{.schema = &items, .documents = &one, .options = {.on_result = hear(0)}},
       {.schema = &support, .documents = &two, .options = {.on_result = hear(1)}}});
  using Order = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(order, (Order{{1, 0}, {1, 1}, {0, 0}}));
  for (size_t r = 0; r < 2; ++r) {
    ASSERT_EQ(answers[r].results.size(), heard[r].size());
    for (size_t d = 0; d < heard[r].size(); ++d) {
      EXPECT_EQ(heard[r][d], report_to_json(answers[r].results[d])) << r << "/" << d;
    }
  }
  ASSERT_TRUE(answers[0].results[0].ok()) << answers[0].results[0].error;
  EXPECT_GE(answers[0].results[0].value["items"].size(), 2u);  // it did ask for items
}

TEST_F(EngineTest, BadDocumentsFailAlone) {
  OrderedJson schema = load_schema("examples/support.schema.json");
  std::vector<std::string> docs = {"", std::string("caf\xc3\x28 bad utf8"), documents()[1]};
  std::vector<FillResult> r = engine_->fill(schema, docs);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_NE(r[0].error.find("empty"), std::string::npos) << r[0].error;
  EXPECT_NE(r[1].error.find("UTF-8"), std::string::npos) << r[1].error;
  EXPECT_TRUE(r[2].ok()) << r[2].error;
  EXPECT_EQ(r[2].value, engine_->fill(schema, {documents()[1]})[0].value);
}

TEST_F(EngineTest, UnsupportedSchemaIsRejectedBeforeModelWork) {
  OrderedJson schema = {{"type", "object"},
                        {"properties", {{"a", {{"not", {{"type", "string"}}}}}}}};
  try {
    engine_->fill(schema, documents());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.context().pointer, "/properties/a/not") << e.what();
  }
}

TEST_F(EngineTest, CliInitFillReportAndEval) {
  testing::TempDir t;
  auto r = testing::run_deg(
      {"init", "--base", (*dir_ / "base").string(), "--out", (t / "ck").string(), "--seed", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string schema = testing::source_path("examples/support.schema.json").string();
  Json rep = Json::parse(testing::expect_fill_support_example(t / "ck"));
  EXPECT_EQ(rep["fields"][0]["path"], "/customer_name");
  r = testing::run_deg({"fill", "--model", (t / "ck").string(), "--schema", schema, "--jsonl"},
                       "\"first doc about billing\"\n{\"document\": \"\"}\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("empty"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("\"error\""), std::string::npos);  // the bad line keeps its place
  // Same checkpoint seed, same heads: the CLI agrees with the library.
  EXPECT_EQ(testing::read_text(t / "ck" / "heads.safetensors"),
            testing::read_text(*dir_ / "ckpt" / "heads.safetensors"));

  testing::write_text(t / "data.jsonl",
                      "{\"document\": \"refund for order AB-123456 please\", \"expected\": "
                      "{\"category\": \"billing\", \"order_id\": \"AB-123456\"}}\n");
  r = testing::run_deg({"eval", "--model", (t / "ck").string(), "--schema", schema, "--data",
                        (t / "data.jsonl").string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json m = Json::parse(r.out);
  EXPECT_EQ(m["records"], 1);
  // --errors: the records with the most errors, each with its line and both values (a fresh
  // checkpoint answers noise, so the one record has errors); the table shows the document.
  testing::write_text(t / "two.jsonl",
                      "{\"document\": \"refund for order AB-123456 please\", \"expected\": "
                      "{\"category\": \"billing\", \"order_id\": \"AB-123456\"}}\n"
                      "{\"document\": \"my login fails\", \"expected\": {\"category\": "
                      "\"technical\"}}\n");
  r = testing::run_deg({"eval", "--model", (t / "ck").string(), "--schema", schema, "--data",
                        (t / "two.jsonl").string(), "--json", "--errors", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  m = Json::parse(r.out);
  ASSERT_EQ(m["worst"].size(), 1u) << r.out;
  EXPECT_GT(m["worst"][0]["errors"].get<int64_t>(), 0);
  EXPECT_TRUE(m["worst"][0]["line"] == 1 || m["worst"][0]["line"] == 2);
  EXPECT_TRUE(m["worst"][0].contains("expected") && m["worst"][0].contains("predicted"));
  r = testing::run_deg({"eval", "--model", (t / "ck").string(), "--schema", schema, "--data",
                        (t / "two.jsonl").string(), "--errors", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("records with the most errors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  document  "), std::string::npos) << r.out;
  // --every 2: the first record of every two (line 1 of two.jsonl's two).
  r = testing::run_deg({"eval", "--model", (t / "ck").string(), "--schema", schema, "--data",
                        (t / "two.jsonl").string(), "--json", "--every", "2", "--errors", "5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  m = Json::parse(r.out);
  EXPECT_EQ(m["records"], 1);
  for (const auto& w : m["worst"]) EXPECT_EQ(w["line"], 1);
}

// Without --model, deg fill takes $DEG_MODEL, else the default model installed beside the
// binary (<prefix>/share/deg/models/default for <prefix>/bin/deg), and says where it looked
// when there is none.
TEST_F(EngineTest, FillFindsTheDefaultModel) {
  testing::TempDir t;
  fs::create_directories(t / "bin");
  fs::create_directories(t / "share" / "deg" / "models");
  fs::copy_file(DEG_BINARY, t / "bin" / "deg");
  fs::permissions(t / "bin" / "deg", fs::perms::owner_all);
  const std::string schema = testing::source_path("examples/support.schema.json").string();
  const std::string doc = testing::source_path("examples/support.txt").string();
  auto fill = [&](const std::string& env) {
    const std::string cmd = "env -u DEG_MODEL DEG_LOG_LEVEL=debug " + env + " '" +
                            (t / "bin" / "deg").string() + "' fill --schema '" + schema + "' '" +
                            doc + "' >'" + (t / "out").string() + "' 2>'" + (t / "err").string() +
                            "'";
    const int status = std::system(cmd.c_str());
    return std::pair{WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::read_text(t / "err")};
  };
  const fs::path installed = t / "share" / "deg" / "models" / "default";
  auto [code, err] = fill("");
  if (!fs::exists(testing::source_path("models/default/deg.json"))) {  // none in this tree yet
    EXPECT_EQ(code, 1);
    EXPECT_NE(err.find(installed.string()), std::string::npos) << err;  // where it looked
    EXPECT_NE(err.find("DEG_MODEL"), std::string::npos) << err;
  }
  fs::copy(*dir_ / "ckpt", installed, fs::copy_options::recursive);
  std::tie(code, err) = fill("");
  EXPECT_EQ(code, 0) << err;
  EXPECT_NE(err.find("model " + installed.string() + " opened"), std::string::npos) << err;
  EXPECT_TRUE(Json::parse(testing::read_text(t / "out")).contains("category"));
  std::tie(code, err) = fill("DEG_MODEL='" + (t / "nowhere").string() + "'");
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find((t / "nowhere").string()), std::string::npos) << err;
  std::tie(code, err) = fill("DEG_MODEL='" + (*dir_ / "ckpt").string() + "'");
  EXPECT_EQ(code, 0) << err;
}

// deg pack: an f32 gpt checkpoint into bf16 parts no larger than asked; every large tensor is
// the original rounded to bf16, every small one the original; the packed checkpoint fills, and
// a missing part is named.
TEST(Pack, GptCheckpointInBf16PartsFills) {
  testing::TempDir t;
  testing::write_tiny_gpt(t / "base", 5);
  checkpoint_create({.base = t / "base", .out = t / "ck", .seed = 5});
  auto r = testing::run_deg({"pack", "--model", (t / "ck").string(), "--out",
                             (t / "packed").string(), "--max-file-mib", "0.6"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(t / "packed" / "backbone.safetensors"));
  const std::vector<fs::path> parts = checkpoint_backbone_files(t / "packed");
  EXPECT_GE(parts.size(), 2u);
  int64_t packed_bytes = 0;
  for (const auto& e : fs::directory_iterator(t / "packed")) {
    EXPECT_LE(fs::file_size(e.path()), 629145u) << e.path();
    if (e.path().filename().string().starts_with("backbone")) packed_bytes += fs::file_size(e);
  }
  // (The tiny model's many small tensors stay f32: a quarter less, where a real trunk halves.)
  EXPECT_LT(packed_bytes, fs::file_size(t / "ck" / "backbone.safetensors") * 8 / 10);
  const WeightStore a = WeightStore::open_files({t / "ck" / "backbone.safetensors"});
  const WeightStore b = WeightStore::open_files(parts);
  ASSERT_EQ(a.names(), b.names());
  int converted = 0;
  for (const std::string& name : a.names()) {
    Tensor want = a.get(name);
    if (want.numel() >= kPackMinValues) {
      want = want.to(DType::bf16);
      ++converted;
    }
    const Tensor got = b.get(name);
    ASSERT_EQ(got.dtype(), want.dtype()) << name;
    EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes())) << name;
  }
  EXPECT_GE(converted, 5);
  testing::expect_fill_support_example(t / "packed");
  r = testing::run_deg({"pack", "--model", (t / "ck").string(), "--out", (t / "packed").string()});
  EXPECT_NE(r.exit_code, 0);  // not into a full directory
  r = testing::run_deg({"pack", "--model", (t / "ck").string(), "--out", (t / "small").string(),
                        "--max-file-mib", "0.1"});
  EXPECT_NE(r.exit_code, 0);  // the heads (0.5 MiB) fit no 0.1 MiB file: said, nothing written
  EXPECT_NE(r.err.find("heads.safetensors"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(t / "small"));
  fs::remove(parts[1]);
  r = testing::run_deg({"fill", "--model", (t / "packed").string(), "--schema",
                        testing::source_path("examples/support.schema.json").string(),
                        testing::source_path("examples/support.txt").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("part 2 of"), std::string::npos) << r.err;
}

// --min-confidence: every leaf answer below the threshold is withheld (its report says so, it is
// not in the value, a required one is reported missing), the value still validates with those
// excused, nothing else changes; 0 withholds nothing.
TEST_F(EngineTest, AnswersBelowMinConfidenceAreWithheld) {
  const OrderedJson schema = load_schema("examples/invoice.schema.json");
  const std::vector<FillResult> all = engine_->fill(schema, documents());
  auto leaf = [](const FieldReport& f) { return f.kind != "anchor" && f.kind != "count"; };
  std::vector<double> seen;
  for (const FillResult& r : all)
    for (const FieldReport& f : r.fields)
      if (leaf(f) && !f.value.is_null()) seen.push_back(f.confidence);
  ASSERT_GE(seen.size(), 4u);
  std::sort(seen.begin(), seen.end());
  const double p = seen[seen.size() / 2];  // the median: some answers on each side
  ASSERT_LT(seen.front(), p);
  const std::vector<FillResult> cut = engine_->fill(schema, documents(), {.min_confidence = p});
  const schema::SchemaValidator validator(schema);
  int withheld = 0;
  for (size_t d = 0; d < cut.size(); ++d) {
    ASSERT_TRUE(cut[d].ok()) << cut[d].error;
    ASSERT_EQ(cut[d].fields.size(), all[d].fields.size());
    for (size_t k = 0; k < cut[d].fields.size(); ++k) {
      const FieldReport& f = cut[d].fields[k];
      EXPECT_EQ(f.confidence, all[d].fields[k].confidence) << f.path;  // the answers are the same
      EXPECT_EQ(f.withheld, leaf(f) && !f.value.is_null() && f.confidence < p) << f.path;
      if (!f.withheld) continue;
      ++withheld;
      EXPECT_FALSE(cut[d].value.contains(OrderedJson::json_pointer(f.path))) << f.path;
    }
    EXPECT_TRUE(validator.violations(Json::parse(cut[d].value.dump()), cut[d].missing).empty())
        << cut[d].value.dump();
  }
  EXPECT_GT(withheld, 0);
  for (const FillResult& r : engine_->fill(schema, documents(), {.min_confidence = 0}))
    for (const FieldReport& f : r.fields) EXPECT_FALSE(f.withheld) << f.path;
  EXPECT_THROW(engine_->fill(schema, documents(), {.min_confidence = 1.5}), Error);
  // The CLI: a threshold outside [0, 1] is a usage error; --report marks what it withheld.
  const std::string ckpt = (*dir_ / "ckpt").string();
  auto r = testing::run_deg({"fill", "--model", ckpt, "--schema",
                             testing::source_path("examples/invoice.schema.json").string(),
                             "--min-confidence", "2",
                             testing::source_path("examples/invoice.txt").string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = testing::run_deg({"fill", "--model", ckpt, "--schema",
                        testing::source_path("examples/invoice.schema.json").string(), "--report",
                        "--allow-missing", "--min-confidence", "1",
                        testing::source_path("examples/invoice.txt").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"withheld\": true"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace deg
