// Tensor views and copies, aligned buffers, the thread pool's fixed chunking.
#include "core/tensor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>

#include "core/thread_pool.h"

namespace deg {
namespace {

Tensor iota(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = float(i);
  return t;
}

TEST(Tensor, EmptyIsZeroedAndAligned) {
  Tensor t = Tensor::empty({3, 7}, DType::bf16);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % kBufferAlignment, 0u);
  EXPECT_EQ(t.nbytes(), 42u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data<bf16>()[i].bits, 0);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.describe(), "bf16[3, 7]");
}

TEST(Tensor, ViewsShareMemory) {
  Tensor t = iota({2, 3, 4});
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), Shape({6, 4}));
  v.mutable_data<float>()[5] = 100;
  EXPECT_EQ(t.get({0, 1, 1}), 100);

  Tensor s = t.slice(2, 1, 3);  // [2, 3, 2]
  EXPECT_EQ(s.shape(), Shape({2, 3, 2}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.get({1, 2, 0}), t.get({1, 2, 1}));

  Tensor row = t.select(0, 1);  // [3, 4]
  EXPECT_EQ(row.shape(), Shape({3, 4}));
  EXPECT_TRUE(row.is_contiguous());
  EXPECT_EQ(row.get({2, 3}), 23);

  Tensor tr = t.transpose(0, 2);  // [4, 3, 2]
  EXPECT_EQ(tr.get({3, 1, 0}), t.get({0, 1, 3}));
  Tensor c = tr.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k) EXPECT_EQ(c.get({i, j, k}), t.get({k, j, i}));
}

TEST(Tensor, ConversionCopies) {
  Tensor t = iota({5});
  Tensor h = t.to(DType::bf16);
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(h.to_f32_vector(), std::vector<float>({0, 1, 2, 3, 4}));
  Tensor i = t.to(DType::i64);
  EXPECT_EQ(i.data<int64_t>()[4], 4);
  Tensor back = t.slice(0, 1, 4).to(DType::f16).to(DType::f32);
  EXPECT_EQ(back.to_f32_vector(), std::vector<float>({1, 2, 3}));
}

TEST(Tensor, FromVectorChecksSize) {
  EXPECT_NO_THROW(Tensor::from_vector<int32_t>({1, 2, 3, 4}, {2, 2}));
  EXPECT_THROW(Tensor::from_vector<int32_t>({1, 2, 3}, {2, 2}), Error);
  EXPECT_THROW(Tensor::empty({-1}, DType::f32), Error);
}

TEST(ThreadPool, CoversRangeOnceWithFixedChunks) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.size(), 4);
  for (int64_t n : {1, 3, 4, 17, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::mutex m;
    std::set<std::pair<int64_t, int64_t>> chunks;
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      std::lock_guard<std::mutex> lock(m);
      chunks.insert({b, e});
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    // Chunk boundaries depend only on n and the pool size.
    std::set<std::pair<int64_t, int64_t>> want;
    int k = int(std::min<int64_t>(4, n));
    for (int i = 0; i < k; ++i) want.insert({n * i / k, n * (i + 1) / k});
    EXPECT_EQ(chunks, want) << n;
  }
}

// Chunks are claimed from a counter shared by the caller and the workers: over many short
// calls (where late workers meet later generations) every chunk still runs exactly once.
TEST(ThreadPool, ManyShortCallsRunEveryChunkOnce) {
  ThreadPool pool(4);
  std::vector<int64_t> hits(7);
  for (int call = 0; call < 20000; ++call) {
    const int64_t n = 1 + call % 7;
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];  // chunks are disjoint
    });
  }
  for (int64_t i = 0; i < 7; ++i) {
    int64_t want = 0;
    for (int call = 0; call < 20000; ++call) want += i < 1 + call % 7;
    EXPECT_EQ(hits[size_t(i)], want) << i;
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(6, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) { sum += (e2 - b2) * (i + 1); });
    }
  });
  EXPECT_EQ(sum.load(), 10 * 21);
}

}  // namespace
}  // namespace deg
