// Per-thread scratch slots (kernels/scratch.h).
#include "kernels/scratch.h"

#include <memory>

#include "core/error.h"

namespace deg {

float* scratch_floats(int slot, size_t n) {
  struct Slot {
    std::unique_ptr<float[]> data;
    size_t size = 0;
  };
  thread_local Slot slots[kScratchSlots];
  DEG_CHECK(slot >= 0 && slot < kScratchSlots, "scratch slot {}", slot);
  Slot& s = slots[slot];
  if (s.size < n) {
    s.data.reset();
    s.data = std::make_unique_for_overwrite<float[]>(n);
    s.size = n;
  }
  return s.data.get();
}

}  // namespace deg
