// The CPU kernels of attention_f64 and its backward (kernels/ops.h; internal to kernels/cpu).
// kernels/cpu/ops.cc spreads them over the thread pool.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace deg {

// Zero the padded tokens' outputs.
void attention_f64_zero_padded(const AttendF64Args& a);

// Queries [t0, t1) of row b, query head h.
void attention_f64_range(const AttendF64Args& a, int64_t b, int64_t h, int64_t t0, int64_t t1);

// Slot `slot` (a head, or with paired heads the query heads slot and slot + H/2 and the K/V
// heads they read) over every row in order: dq of its queries, dK / dV of the keys they read.
void attention_f64_backward_task(const AttendF64BackwardArgs& a, int64_t slot);

}  // namespace deg
