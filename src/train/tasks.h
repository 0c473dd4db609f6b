// Labeled records -> training examples for `deg train`: every field of a record becomes exactly
// the query the engine asks at fill time (the same trunk, the same rendered fork query, the same
// item lines), with its head's target taken from `expected` (shared/data's format: only values
// present in the document are listed; every extracted string is an exact substring of it).
//
// Targets, field kind by field kind:
//   choice, score  the option whose value equals the expected one; absent: the null option, or
//                  no query when the field has none
//   boolean        the expected value; absent: no query
//   multi-select   one boolean per option: is it in the expected array
//   extract        the tokens of the expected text's first occurrence in the document; absent:
//                  the null outcome (no query when the null outcome is masked); a value the
//                  document does not hold (a normalised number, say): no query
//   count          the expected number of items (absent: 0), then each item's queries by index
//   anchor         the first token of each expected item in the document (items are located in
//                  order: a string item by its text, an object item by its earliest located
//                  string), then each item's queries with the item line the engine would render
//                  from those anchors
//   generate       not a head: no query (the LM writes it)
// Items that cannot be located are dropped from the example and counted in `unlocated`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/decode.h"
#include "engine/model.h"
#include "io/json.h"
#include "model/heads.h"
#include "schema/plan.h"
#include "train/head_loss.h"

namespace deg::train {

enum class QueryHead : uint8_t { choice, score, noul, count, extract, anchor };
const char* query_head_name(QueryHead head);

struct TaskQuery {
  QueryHead head = QueryHead::extract;
  std::string pointer;  // the concrete field pointer, "/slots/artist/0"
  std::vector<int32_t> ids;
  std::vector<int64_t> option_positions;                  // choice, score
  int64_t option = -1;                                    // choice, score: the expected option
  bool yes = false;                                       // noul
  int64_t count = 0, count_lo = 0, count_hi = kMaxCount;  // count: target and allowed range
  SpanQuery span_query;                                   // extract: inside an anchored item
  SpanTarget span;                                        // extract
  Region region;                                          // anchor
  std::vector<int64_t> starts;                            // anchor: the expected item starts
};

struct TaskExample {
  int task = 0;                // which --task it came from
  std::vector<int32_t> trunk;  // bos + prefix, the context, "\n"
  int64_t ctx_start = 0, ctx_tokens = 0;
  std::vector<TaskQuery> queries;
  int64_t unlocated = 0;   // expected values (items or extracts) not found in the document
  int64_t tokens() const;  // trunk + every query
};

// Throws deg::Error (invalid_argument) for a record whose document is empty or not UTF-8, or
// whose expected value does not fit the plan (an option that is not one of the field's).
// `shuffle_options`: 0 asks every choice field with its options in the schema's order, as deg
// fill does; otherwise a seed: each choice query lists its options in an order drawn from a
// stream of that seed (the record's choice fields in plan order), its target the expected option
// where it now stands, so that training reads the options' words rather than their places. Score
// fields keep their order (it means something).
TaskExample make_example(const engine::DegModel& model, const schema::Plan& plan,
                         const std::string& document, const Json& expected, int task = 0,
                         uint64_t shuffle_options = 0);

}  // namespace deg::train
