// Vectors in memory every backend under test addresses: CUDA managed memory (which host and
// GPU share) when a GPU is visible, plain host memory otherwise. The op tests' buffers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <new>
#include <vector>

#include "kernels/cuda_runtime.h"

namespace deg::testing {

template <class T>
struct ManagedAlloc {
  using value_type = T;
  ManagedAlloc() = default;
  template <class U>
  ManagedAlloc(const ManagedAlloc<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(T);
    return static_cast<T*>(cuda_available() ? cuda_managed_alloc(bytes) : ::operator new(bytes));
  }
  void deallocate(T* p, size_t) {
    if (cuda_available()) {
      cuda_managed_free(p);
    } else {
      ::operator delete(p);
    }
  }
  template <class U>
  bool operator==(const ManagedAlloc<U>&) const {
    return true;
  }
};

template <class T>
using ManagedVector = std::vector<T, ManagedAlloc<T>>;

}  // namespace deg::testing
