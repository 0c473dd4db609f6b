// The CUDA attention's host plan of its bf16 K/V copy (src/kernels/cuda/attention_plan.cu,
// KvCopy), checked where the build has the CUDA backend (the plan is host code: no GPU needed,
// so CI runs it): for random launches — ragged rows, fork rows sharing a prefix, decode rows,
// sliding windows, a sliding trunk whose held keys start past key 0 — every key any job of the
// launch's plan reads, through the addresses the tensor-core kernel forms (attention_mma.cu's
// staging: row0's prefix or own base, + head stride, + key * dims), must hold that key's K and V
// of that head; the regions must lie apart inside the copy; the workspace must hold the split
// records and the copy. A wrong region bound reads another key's (or uninitialised) bf16 data
// silently on the GPU: this test is where that shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#if DEG_HAVE_CUDA
#include "kernels/cuda/attention_plan.cuh"

namespace deg::cuda::att {
namespace {

// Where each vector of the copy comes from: the source K and V pointers the copy kernel reads
// for it (kv_copy_kernel's addressing, replayed on the host).
struct Source {
  const float* k = nullptr;
  const float* v = nullptr;
};

std::vector<Source> replay_copy(const AttentionLaunch& a, const KvCopy& c) {
  std::vector<Source> copy(size_t(c.elements / c.dims));
  for (int r = 0; r < c.regions; ++r) {
    const KvRegion& g = c.region[r];
    for (int64_t h = 0; h < a.kv_heads; ++h)
      for (int64_t j = 0; j < g.keys; ++j) {
        const int64_t local = h * g.keys + j, at = g.offset / c.dims + local;
        const int64_t v_at = at + a.kv_heads * g.keys;
        const int64_t src = h * g.stride + j * a.head_dim;
        EXPECT_EQ(copy[size_t(at)].k, nullptr) << "regions overlap at vector " << at;
        EXPECT_EQ(copy[size_t(v_at)].v, nullptr) << "regions overlap at vector " << v_at;
        copy[size_t(at)].k = g.k + src;
        copy[size_t(v_at)].v = g.v + src;
      }
  }
  return copy;
}

// The keys a job reads for KV head `head` (the kernel's walk, summed over its CTAs): a packed
// job its key range (all in the prefix), a row's own job its key range up to the row's last
// query's key and from its first query's reach (make_plan's lo_block).
struct Read {
  int row0;
  int64_t first, last;  // keys [first, last]
};

std::vector<Read> reads_of(const AttentionLaunch& a, const Plan& p) {
  std::vector<Read> reads;
  for (int j = 0; j < p.block_jobs; ++j) {
    const Job& job = p.jobs[j];
    const int row0 = p.member[job.member_begin];
    int64_t first = int64_t(job.key_begin) * kKeyBlock, last = int64_t(job.key_end) * kKeyBlock - 1;
    if (!job.shared) {
      const KvRow& kv = a.kv[row0];
      last = std::min(last, kv.prefix_len + kv.own_before + a.rows.length[row0] - 1);
    }
    reads.push_back({row0, first, last});
  }
  return reads;
}

struct Arena {
  std::vector<float>& floats;
  int64_t used = 0;
  // A buffer of `keys` keys for H heads of D dims (not dereferenced: only its addresses count).
  float* take(int64_t keys, int64_t H, int64_t D) {
    float* p = floats.data() + used;
    used += keys * H * D;
    EXPECT_LE(used, int64_t(floats.size()));
    return p;
  }
};

struct Shape {
  int64_t kv_heads, group, head_dim, window;
  bool shared_prefix;  // fork rows over one trunk
  bool sliding_trunk;  // row 0 a sliding layer's trunk row holding keys from key `skipped`
};

void check_launch(const Shape& s, std::mt19937& rng) {
  const int64_t H = s.kv_heads, D = s.head_dim;
  std::uniform_int_distribution<int> row_count(1, 12), len(0, 40), before(0, 300), pick(0, 3);
  static AttentionLaunch a;  // ~6 KB
  a = AttentionLaunch{};
  a.kv_heads = H;
  a.group = s.group;
  a.head_dim = D;
  a.window = s.window;
  a.bf16 = true;
  static std::vector<float> memory(size_t(1) << 24);  // 64 MB, made once
  Arena arena{memory};
  Rows& r = a.rows;
  r.count = row_count(rng);
  r.first = 0;
  const int64_t trunk_len = std::vector<int64_t>{0, 70, 1100, 3000}[size_t(pick(rng))] + 64;
  const float* trunk_k = arena.take(trunk_len, H, D);
  const float* trunk_v = arena.take(trunk_len, H, D);
  if (s.sliding_trunk) arena.take(4096, H, D);  // no other buffer where row 0's shifted base is
  for (int i = 0; i < r.count; ++i) {
    const int64_t n = pick(rng) == 0 ? 1 : len(rng);  // decode rows too
    r.length[i] = n;
    r.tokens = std::max(r.tokens, n);
    KvRow& kv = a.kv[i];
    kv.own_before = pick(rng) == 0 ? 0 : before(rng);
    // A sliding trunk row holds at least its window's keys before this call's.
    if (i == 0 && s.sliding_trunk) kv.own_before = s.window - 1 + before(rng);
    kv.own_stride = (kv.own_before + n + 2) * D;
    kv.own_k = arena.take(kv.own_before + n + 2, H, D);
    kv.own_v = arena.take(kv.own_before + n + 2, H, D);
    if (i == 0 && s.sliding_trunk) {
      // below
    } else if (s.shared_prefix && pick(rng) != 0) {
      kv.prefix_k = trunk_k;
      kv.prefix_v = trunk_v;
      kv.prefix_len = trunk_len;
      kv.prefix_stride = trunk_len * D;
    } else if (pick(rng) == 0) {
      const int64_t own_prefix = 1 + before(rng);
      kv.prefix_k = arena.take(own_prefix, H, D);
      kv.prefix_v = arena.take(own_prefix, H, D);
      kv.prefix_len = own_prefix;
      kv.prefix_stride = own_prefix * D;
    }
  }
  if (s.sliding_trunk) {
    // CudaOps::attention's form of a trunk row whose held keys start at key `skipped` (a
    // multiple of 64; its first query's window starts at or after it): a prefix of `skipped`
    // keys before them, their buffer shifted back by that many keys.
    KvRow& kv = a.kv[0];
    const int64_t skipped = kKeyBlock * (1 + pick(rng));
    kv.prefix_len = skipped;
    kv.prefix_stride = kv.own_stride;
    kv.prefix_k = kv.own_k - skipped * D;
    kv.prefix_v = kv.own_v - skipped * D;
  }

  static Plan p;
  ASSERT_TRUE(make_plan(a, p));
  static KvCopy c;
  plan_kv_copy(a, c);
  ASSERT_EQ(c.dims, copy_dims(D));
  ASSERT_GE(attention_workspace_floats(a), records_floats(a, p) + (c.elements + 1) / 2);
  const std::vector<Source> copy = replay_copy(a, c);

  for (const Read& read : reads_of(a, p)) {
    const KvRow& kv = a.kv[read.row0];
    for (int64_t h = 0; h < H; ++h)
      for (int64_t k = read.first; k <= read.last; ++k) {
        const bool prefix = k < kv.prefix_len;
        // The kernel's element offset of key k (attention_mma.cu's stage).
        const int64_t at =
            prefix
                ? c.prefix_base[read.row0] + h * c.prefix_head[read.row0] + k * c.dims
                : c.own_base[read.row0] + h * c.own_head[read.row0] + (k - kv.prefix_len) * c.dims;
        const int64_t v_at = at + (prefix ? c.prefix_v[read.row0] : c.own_v[read.row0]);
        ASSERT_GE(at, 0) << "row " << read.row0 << " key " << k;
        ASSERT_LT(v_at, c.elements) << "row " << read.row0 << " key " << k;
        ASSERT_EQ(at % c.dims, 0);
        const float* want_k = prefix ? kv.prefix_k + h * kv.prefix_stride + k * D
                                     : kv.own_k + h * kv.own_stride + (k - kv.prefix_len) * D;
        const float* want_v = prefix ? kv.prefix_v + h * kv.prefix_stride + k * D
                                     : kv.own_v + h * kv.own_stride + (k - kv.prefix_len) * D;
        ASSERT_EQ(copy[size_t(at / c.dims)].k, want_k)
            << "row " << read.row0 << " head " << h << " key " << k;
        ASSERT_EQ(copy[size_t(v_at / c.dims)].v, want_v)
            << "row " << read.row0 << " head " << h << " key " << k;
      }
  }
  // No region reads a key row 0's buffer does not hold (the shifted trunk's keys before
  // `skipped`, which lie in the gap taken before it).
  if (s.sliding_trunk) {
    for (int i = 0; i < c.regions; ++i) {
      if (c.region[i].k < a.kv[0].own_k) {
        EXPECT_LT(c.region[i].k, a.kv[0].own_k - 4096 * H * D) << "region " << i;
      }
    }
  }
}

TEST(CudaAttentionPlan, TheBf16CopyHoldsEveryKeyTheJobsRead) {
  std::mt19937 rng(2026);
  const Shape shapes[] = {
      {.kv_heads = 2, .group = 4, .head_dim = 256, .window = 0, .shared_prefix = true},
      {.kv_heads = 1, .group = 2, .head_dim = 256, .window = 0, .shared_prefix = false},
      {.kv_heads = 2, .group = 3, .head_dim = 18, .window = 0, .shared_prefix = true},
      {.kv_heads = 2, .group = 4, .head_dim = 64, .window = 128, .shared_prefix = true},
      {.kv_heads = 1, .group = 8, .head_dim = 128, .window = 100, .shared_prefix = false},
      {.kv_heads = 1,
       .group = 8,
       .head_dim = 256,
       .window = 512,
       .shared_prefix = false,
       .sliding_trunk = true},
  };
  for (const Shape& s : shapes)
    for (int trial = 0; trial < 40; ++trial) {
      SCOPED_TRACE(testing::Message()
                   << "D " << s.head_dim << " window " << s.window << " trial " << trial);
      check_launch(s, rng);
      if (HasFatalFailure()) return;
    }
}

// A launch of f32 products, or of head dims past 256 (the few kernel's wide form), makes no copy.
TEST(CudaAttentionPlan, OnlyTensorCoreLaunchesCopy) {
  static AttentionLaunch a;
  a = AttentionLaunch{};
  static float k[4096], v[4096];
  a.rows.count = 1;
  a.rows.tokens = 3;
  a.rows.length[0] = 3;
  a.kv[0] = {nullptr, nullptr, 0, 0, k, v, 0, 3 * 256};
  a.kv_heads = 1;
  a.group = 1;
  a.head_dim = 256;
  static KvCopy c;
  plan_kv_copy(a, c);
  EXPECT_EQ(c.elements, 0);
  a.bf16 = true;
  plan_kv_copy(a, c);
  EXPECT_EQ(c.elements, 2 * 3 * 256);
  a.head_dim = 512;
  a.kv[0].own_stride = 3 * 512;
  plan_kv_copy(a, c);
  EXPECT_EQ(c.elements, 0);
}

}  // namespace
}  // namespace deg::cuda::att
#endif
