// What the op tests share: vectors in memory every backend under test addresses (CUDA managed
// memory, which host and GPU share, when a GPU is visible; plain host memory otherwise), random
// normal ones, and a device backend that waits after every op.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <new>
#include <random>
#include <vector>

#include "kernels/cuda_runtime.h"
#include "kernels/ops_decorator.h"

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

// n draws of N(0, sd^2).
inline ManagedVector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  ManagedVector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// A device backend as the tests run it: each op, then a wait until its results are in memory
// the host reads (ops on a device return before they finish).
class Synchronized final : public OpsDecorator {
 public:
  using OpsDecorator::OpsDecorator;

 protected:
  void run(const char*, const void*, const std::function<void()>& call) const override {
    call();
    inner().synchronize();
  }
};

}  // namespace deg::testing
