// Per-thread reusable scratch memory for kernels and layer code. A slot grows and never shrinks
// and is not zero-filled, so hot loops stop paying for allocation, zeroing and page faults. The
// memory stays valid until the same thread asks for the same slot again: give each call site its
// own slot (layer code: kLayerSlots.., kernels: kKernelSlots..) so nested uses never collide.
#pragma once

#include <cstddef>

namespace deg {

inline constexpr int kLayerSlots = 0;    // slots 0..15: model layer code (calling thread)
inline constexpr int kKernelSlots = 16;  // slots 16..31: kernels (any thread)
inline constexpr int kScratchSlots = 32;

float* scratch_floats(int slot, size_t n);

}  // namespace deg
