// The fill report as JSON (deg/report.h); docs/report.schema.json is its format.
#include "deg/report.h"

namespace deg {

OrderedJson report_to_json(const FillResult& result) {
  if (!result.ok()) return {{"version", kReportVersion}, {"error", result.error}};
  OrderedJson fields = OrderedJson::array();
  for (const FieldReport& f : result.fields) {
    OrderedJson span = nullptr;
    if (f.span) span = {f.span->first, f.span->second};
    fields.push_back({{"path", f.path},
                      {"kind", f.kind},
                      {"value", f.value},
                      {"confidence", f.confidence},
                      {"span", span}});
    if (f.withheld) fields.back()["withheld"] = true;
  }
  OrderedJson out = {{"version", kReportVersion}, {"value", result.value}, {"fields", fields}};
  if (!result.missing.empty()) out["missing"] = result.missing;
  return out;
}

}  // namespace deg
