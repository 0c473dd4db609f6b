// deg plan --schema S.json [--json] [--array-mode anchor|index]: the compiled field plan, or the
// rejection naming the JSON pointer of the unsupported part. Needs no model.
#include "deg/plan.h"

#include <cstdio>

#include "cli/commands.h"
#include "deg/error.h"

namespace deg::cli {

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan",
      "Compile a JSON Schema into deg's field plan and print it: every field's JSON pointer "
      "(`*` for array items), its kind (choice, score, bool, extract, generate, anchor, count, "
      "multi_select, object), flags, and the exact query text the model will read (shown for "
      "the first item of each array). A schema deg cannot fill is rejected with the JSON "
      "pointer of the part at fault and a nonzero exit. Needs no model.\n\n"
      "Example:\n  deg plan --schema examples/invoice.schema.json\n"
      "  deg plan --schema s.json --json | jq '.fields[] | {pointer, kind}'\n\n"
      "docs/schema.md lists how each JSON Schema construct maps to a field kind.");
  auto schema = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto mode = std::make_shared<std::string>("anchor");
  cmd->add_option("--schema", *schema, "The JSON Schema file")->required();
  cmd->add_flag("--json", *json,
                "Print the plan as JSON ({\"units\", \"fields\": [...]}); a rejection prints "
                "{\"error\": {...}} and exits nonzero");
  cmd->add_option("--array-mode", *mode,
                  "How arrays are addressed: anchor (anchor checkpoints, the default: items "
                  "found by position anchors) or index (count then \"ITEM i of n\")")
      ->check(CLI::IsMember({"anchor", "index"}))
      ->capture_default_str();
  cmd->callback([schema, json, mode] {
    try {
      const PlanSummary plan = plan_describe(
          schema_load(*schema), *mode == "index" ? ArrayMode::index : ArrayMode::anchor);
      if (*json) {
        OrderedJson out = plan.json;
        out["schema"] = *schema;
        std::printf("%s\n", out.dump(2).c_str());
      } else {
        std::printf(
            "plan of %s: %lld fields, %lld queries per document (before array items); "
            "%lld of %lld budget units\n\n%s",
            schema->c_str(), (long long)plan.fields, (long long)plan.queries, (long long)plan.units,
            (long long)plan.max_units, plan.text.c_str());
      }
    } catch (const Error& e) {
      const Error located = e.with_path(*schema);
      if (*json) {
        const OrderedJson out = {{"error",
                                  {{"kind", error_kind_name(e.kind())},
                                   {"pointer", e.context().pointer},
                                   {"message", e.message()}}}};
        std::printf("%s\n", out.dump(2).c_str());
      }
      throw located;
    }
  });
}

}  // namespace deg::cli
