// Folding one schema location into a flat keyword set (internal to the plan compiler): `$ref`
// targets, `allOf` branches and single-branch unions merge into one Node that remembers where
// each keyword came from, so errors can name the JSON pointer of the exact keyword at fault.
// Unions of constants become a synthesized `enum`; a union with a null branch makes the node
// nullable. Everything else about a node's meaning is decided in plan.cc.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/json.h"
#include "schema/plan.h"

namespace deg::schema {

// A schema value and the JSON pointer where it lives in the root schema.
struct Located {
  const OrderedJson* value = nullptr;
  std::string pointer;
};

struct Node {
  std::string pointer;  // the location that declared this node (the first part folded)
  std::vector<std::pair<std::string, Located>> keywords;  // all but the structural ones below
  std::vector<std::pair<std::string, std::vector<Located>>> properties;  // schema order
  std::vector<std::string> required;  // names listed in `required` arrays
  std::string required_at;            // pointer of the first `required` array
  bool required_flag = false;         // draft 3: `"required": true` inside the property
  std::vector<std::string> refs;      // $ref targets opened while folding
  bool nullable_union = false;        // an anyOf/oneOf branch admits null
  bool never = false;                 // the `false` schema was folded in
  std::string cut_at;                 // non-empty: a $ref hit the recursion limit here

  const Located* find(std::string_view key) const;
};

// Folds schema parts into Nodes. Owns the JSON it synthesizes (merged enums and types), so the
// Located pointers it hands out stay valid while it lives.
class Folder {
 public:
  Folder(const OrderedJson& root, const PlanOptions& options) : root_(root), options_(options) {}

  // One node from several parts (a property declared in several allOf branches has several).
  // `open_refs`: the $ref targets open on the path from the root to this node.
  Node fold(const std::vector<Located>& parts, const std::vector<std::string>& open_refs);

 private:
  void merge_part(Node& node, const Located& part, const std::vector<std::string>& open_refs,
                  int& steps);
  void merge_ref(Node& node, const Located& ref, const std::vector<std::string>& open_refs,
                 int& steps);
  void merge_node(Node& node, const Node& other);
  void add_keyword(Node& node, const std::string& key, const Located& value);
  void fold_union(Node& node, const std::string& key, const std::vector<std::string>& open_refs);
  const OrderedJson* own(OrderedJson value);

  const OrderedJson& root_;
  const PlanOptions& options_;
  std::deque<OrderedJson> owned_;
  int64_t total_steps_ = 0;  // parts merged over the whole compile (unions can multiply them)
};

// Errors the compiler throws, with the pointer set.
[[noreturn]] void reject(const std::string& pointer, const std::string& message);
[[noreturn]] void reject_invalid(const std::string& pointer, const std::string& message);

}  // namespace deg::schema
