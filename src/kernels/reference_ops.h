// The reference backend of the op interface (kernels/ops.h): every op as plain single-threaded
// scalar loops that follow the op's documented math directly, accumulating in double. It calls
// none of the optimized kernels, so it is the oracle every backend is scored against in the
// cross-backend op table (tests/ops_test.cc), and the executable documentation of each op. It is
// not a fallback: it is far too slow for a real model.
#pragma once

#include "kernels/ops.h"

namespace deg {

// Host memory only (device() is cpu). Stateless; safe to call from any thread.
const Ops& reference_ops();

}  // namespace deg
