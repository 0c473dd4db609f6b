// Metric arithmetic on hand-made predictions; every expected number is worked out by hand in the
// comments next to it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "schema/metrics.h"

namespace deg::schema {
namespace {

const char* kSchema = R"({"properties":{
  "intent":{"enum":["a","b"]},
  "ok":{"type":"boolean"},
  "names":{"type":"array","items":{"type":"string"}},
  "city":{"type":"string"},
  "tags":{"type":"array","items":{"enum":["x","y"]}},
  "summary":{"type":"string","x-generate":true}}})";

TEST(SchemaMetrics, HandComputedRecords) {
  const Plan plan = plan_compile(schema_parse(kSchema, "test"));
  MetricsAccumulator acc(plan);
  // The first record's errors: /ok wrong, /tags option y wrong (2 decisions); /names fp Cid and
  // fn Bob, /city fn (3 extract errors): 5. The second: none.
  const int64_t first_errors =
      acc.add(Json::parse(R"({"intent":"a","ok":true,"names":["Ann","Bob","Ann"],"city":"Oslo",
                          "tags":["x"],"summary":"s1"})"),
              Json::parse(R"({"intent":"a","ok":false,"names":["Ann","Ann","Cid"],"tags":["x","y"],
                          "summary":"other"})"),
              {{"/intent", Json("a"), 0.9},
               {"/ok", Json(false), 0.6},
               {"/names/0", Json("Ann"), 0.95},
               {"/names/1", Json("Ann"), 0.85},
               {"/names/2", Json("Cid"), 0.45},
               {"/city", Json(nullptr), 0.3},
               {"/summary", Json("other"), 0.99}});  // generate: never scored
  const int64_t second_errors =
      acc.add(Json::parse(R"({"intent":"b","ok":false})"),
              Json::parse(R"({"intent":"b","ok":false,"names":[],"summary":"whatever"})"), {});
  EXPECT_EQ(first_errors, 5);
  EXPECT_EQ(second_errors, 0);
  const Metrics& m = acc.result();

  // choice /intent: a==a, b==b -> 2 of 2.
  EXPECT_EQ(m.decisions.at("choice").correct, 2);
  EXPECT_EQ(m.decisions.at("choice").total, 2);
  // bool: /ok wrong then right (1 of 2); /tags option x: present in both (right), then absent in
  // both (right); option y: predicted but not gold (wrong), then absent in both (right): 3 of 4.
  // Together 4 of 6.
  EXPECT_EQ(m.decisions.at("bool").correct, 4);
  EXPECT_EQ(m.decisions.at("bool").total, 6);
  EXPECT_EQ(m.decisions_by_field.at("/ok").correct, 1);
  // extract: /names/* gold {Ann, Bob, Ann}, predicted {Ann, Ann, Cid}: tp 2, fp 1 (Cid), fn 1
  // (Bob); /city gold Oslo, predicted nothing: fn 1. tp 2, fp 1, fn 2:
  // P = 2/3, R = 2/4, F1 = 2PR/(P+R) = (2/3)/(7/6) = 4/7.
  EXPECT_EQ(m.extract.true_positives, 2);
  EXPECT_EQ(m.extract.false_positives, 1);
  EXPECT_EQ(m.extract.false_negatives, 2);
  EXPECT_DOUBLE_EQ(m.extract.precision(), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.extract.recall(), 0.5);
  EXPECT_NEAR(m.extract.f1(), 4.0 / 7.0, 1e-12);
  EXPECT_EQ(m.extract_by_field.at("/names/*").false_negatives, 1);
  EXPECT_EQ(m.extract_by_field.at("/city").false_negatives, 1);
  // exact match: record 1 differs; record 2 equals once the empty array and the x-generate
  // value are dropped: 1 of 2.
  EXPECT_EQ(m.records, 2);
  EXPECT_EQ(m.exact, 1);
  EXPECT_DOUBLE_EQ(m.exact_match(), 0.5);
  // Calibration (6 scored values; most confident first claims gold values):
  //   bin 9: 0.95 Ann (right), 0.9 a (right): acc 1, conf 0.925 -> |1 - 0.925| = 0.075
  //   bin 8: 0.85 Ann (right, the second gold Ann): acc 1, conf 0.85 -> 0.15
  //   bin 6: 0.6 ok=false (gold true): acc 0 -> 0.6
  //   bin 4: 0.45 Cid (no gold Cid): acc 0 -> 0.45
  //   bin 3: 0.3 city=null (gold Oslo): acc 0 -> 0.3
  //   ECE = (2 * 0.075 + 0.15 + 0.6 + 0.45 + 0.3) / 6 = 1.65 / 6 = 0.275
  EXPECT_EQ(m.calibrated(), 6);
  EXPECT_EQ(m.bins[9].count, 2);
  EXPECT_EQ(m.bins[8].correct, 1);
  EXPECT_EQ(m.bins[3].correct, 0);
  EXPECT_NEAR(m.ece(), 0.275, 1e-12);

  // Confusions: /intent was right both times, so none.
  EXPECT_TRUE(m.confusions.empty());

  const OrderedJson j = metrics_to_json(m);
  EXPECT_EQ(j["records"], 2);
  EXPECT_NEAR(j["extract"]["f1"].get<double>(), 4.0 / 7.0, 1e-12);
  EXPECT_EQ(j["bins"].size(), 10u);
}

TEST(SchemaMetrics, ChoiceConfusionsCountWhatAWrongAnswerWasTakenFor) {
  const Plan plan = plan_compile(schema_parse(kSchema, "test"));
  MetricsAccumulator acc(plan);
  // gold a -> b twice, b -> a once, a -> (no answer) once, a -> a once (right: not a confusion).
  for (const char* pair :
       {R"(["a","b"])", R"(["a","b"])", R"(["b","a"])", R"(["a",null])", R"(["a","a"])"}) {
    const Json p = Json::parse(pair);
    Json predicted = Json::object();
    if (!p[1].is_null()) predicted["intent"] = p[1];
    acc.add(Json{{"intent", p[0]}}, predicted, {});
  }
  const Metrics& m = acc.result();
  ASSERT_EQ(m.confusions.count("/intent"), 1u);
  const Confusions& c = m.confusions.at("/intent");
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.at({"\"a\"", "\"b\""}), 2);
  EXPECT_EQ(c.at({"\"b\"", "\"a\""}), 1);
  EXPECT_EQ(c.at({"\"a\"", "null"}), 1);
  const auto top = top_confusions(c, 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].second, 2);  // a -> b first
  EXPECT_EQ(top[0].first.second, "\"b\"");
  EXPECT_EQ(m.decisions_by_field.at("/intent").correct, 1);
  const OrderedJson j = metrics_to_json(m);
  EXPECT_EQ(j["fields"]["/intent"]["confusions"][0]["count"], 2);
  EXPECT_EQ(j["fields"]["/intent"]["correct"], 1);
}

TEST(SchemaMetrics, NullPredictionIsRightWhenGoldIsAbsent) {
  const Plan plan = plan_compile(schema_parse(kSchema, "test"));
  MetricsAccumulator acc(plan);
  // One value at confidence 0.7, right: bin 7, |1 - 0.7| = 0.3.
  acc.add(Json::parse(R"({"intent":"a"})"), Json::parse(R"({"intent":"a"})"),
          {{"/city", Json(nullptr), 0.7}});
  EXPECT_EQ(acc.result().bins[7].correct, 1);
  EXPECT_NEAR(acc.result().ece(), 0.3, 1e-12);
  EXPECT_EQ(acc.result().exact, 1);
}

TEST(SchemaMetrics, NormalizeSortsMultiSelectAndDropsEmpties) {
  const Plan plan = plan_compile(schema_parse(kSchema, "test"));
  EXPECT_EQ(normalize_record(plan.root, Json::parse(R"({"tags":["y","x"],"city":null})")),
            Json::parse(R"({"tags":["x","y"]})"));
  EXPECT_FALSE(normalize_record(plan.root, Json::parse(R"({"names":[],"summary":"s"})")));
}

TEST(SchemaMetrics, EmptyIsZeroNotNan) {
  const Metrics m;
  EXPECT_EQ(m.ece(), 0.0);
  EXPECT_EQ(m.extract.f1(), 0.0);
  EXPECT_EQ(m.exact_match(), 0.0);
}

}  // namespace
}  // namespace deg::schema

namespace deg::schema {
namespace {

TEST(SchemaMetrics, ReliabilitySvgDrawsEveryNonEmptyBin) {
  Metrics m;
  m.bins[2] = {.count = 4, .confidence_sum = 1.0, .correct = 1};  // conf 0.25, accuracy 0.25
  m.bins[9] = {.count = 6, .confidence_sum = 5.7, .correct = 3};  // conf 0.95, accuracy 0.5
  const std::string svg = reliability_svg(m, "a <model> & data");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t bars = 0;
  for (size_t at = svg.find("class=\"bin\""); at != std::string::npos;
       at = svg.find("class=\"bin\"", at + 1))
    ++bars;
  EXPECT_EQ(bars, 2u);
  EXPECT_NE(svg.find("bin 9: 6 values, accuracy 0.5000, confidence 0.9500"), std::string::npos);
  EXPECT_NE(svg.find(fmt::format("ECE {:.4f}", m.ece())), std::string::npos);
  EXPECT_NE(svg.find("a &lt;model&gt; &amp; data"), std::string::npos);  // escaped
}

}  // namespace
}  // namespace deg::schema
