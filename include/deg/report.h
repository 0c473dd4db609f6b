// The fill report (`deg fill --report`, `POST /v1/fill`) as JSON: a versioned format described by
// docs/report.schema.json (docs/report.md). A change that breaks a reader bumps kReportVersion.
#pragma once

#include "deg/engine.h"
#include "deg/json.h"

namespace deg {

inline constexpr int kReportVersion = 1;

// {"version", "value", "fields": [{"path", "kind", "value", "confidence", "span", "withheld"?}],
// "missing"?} for a filled document; {"version", "error"} for one that failed.
OrderedJson report_to_json(const FillResult& result);

}  // namespace deg
