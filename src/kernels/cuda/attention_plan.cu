// The CUDA attention's plan, made on the host from a launch's rows alone (attention.cu's top
// comment: jobs, packing of rows that share a prefix, chunking of key ranges, workspace records).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention_plan.cuh"
#include "kernels/cuda/stream.h"

namespace deg::cuda::att {

// ---- host: the plan ----

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

bool valid_launch(const AttentionLaunch& a) {
  return a.head_dim > 0 && a.head_dim <= kMaxWideHeadDim && a.group > 0 && a.kv_heads > 0 &&
         a.kv_heads <= 65535 && a.rows.count <= kRows;
}

int record_floats(const AttentionLaunch& a) {
  return int((a.head_dim + 3) / 4 * 4 + 4);
}

// The workspace records of each row (row_records, records, merge_queries of the plan): a row
// whose last query row's key index is 64 or more may have query rows of several splits.
void plan_records(const AttentionLaunch& a, Plan& p) {
  const int64_t HG = a.kv_heads * a.group;
  for (int i = 0; i < a.rows.count; ++i) {
    p.row_records[i] = -1;
    const int64_t n = a.rows.length[i];
    const int64_t key0 = a.kv[i].prefix_len + a.kv[i].own_before;
    if (n <= 0 || key0 + n - 1 < kKeyBlock) continue;
    p.row_records[i] = p.records;
    p.records += (slot_prefix(key0 + n) - slot_prefix(key0)) * HG;
    p.merge_queries = std::max(p.merge_queries, n * HG);
  }
}

// A job before its chunking: split_blocks is the largest split of its query rows.
struct Draft {
  Job job;
  int64_t split_blocks;
  bool few;
  int64_t passes;  // key blocks per CTA at most (the sort key)
};

// Chunks the drafts of one kernel (aiming at kCtasPerSm CTAs per SM), orders them costliest
// first and numbers their CTAs from 0. Returns the CTA count, or -1 past the grid's limit.
int64_t chunk_jobs(Draft* d, int count, int64_t kv_heads) {
  int64_t work = 0;
  for (int i = 0; i < count; ++i)
    work += int64_t(d[i].job.query_blocks) * kv_heads * (d[i].job.key_end - d[i].job.key_begin);
  const int64_t target = std::max<int64_t>(1, work / (int64_t(kCtasPerSm) * sm_count()));
  for (int i = 0; i < count; ++i) {
    Job& j = d[i].job;
    const int64_t range = j.key_end - j.key_begin;
    // A range up to half past the target stays whole (prefill: no Q tile loaded twice).
    const int64_t pieces = range * 2 <= target * 3 ? 1 : ceil_div(range, target);
    const int64_t per = ceil_div(range, pieces);
    // Whole splits: a range kept whole rounds up; a cut one takes the multiple of the split
    // nearest the share (at least one split), so that splits as long as the share do not halve
    // the CTAs.
    const int64_t split = d[i].split_blocks;
    const int64_t chunk = pieces == 1 ? ceil_div(per, split) * split
                                      : std::max<int64_t>(1, (per + split / 2) / split) * split;
    j.chunk_blocks = int32_t(chunk);
    j.chunk0 = int32_t(j.key_begin / chunk);
    j.chunks = int32_t((j.key_end - 1) / chunk - j.chunk0 + 1);
    d[i].passes = std::min(chunk, range);
  }
  std::stable_sort(d, d + count,
                   [](const Draft& x, const Draft& y) { return x.passes > y.passes; });
  int64_t ctas = 0;
  for (int i = 0; i < count; ++i) {
    d[i].job.cta_begin = int32_t(ctas);
    ctas += int64_t(d[i].job.query_blocks) * kv_heads * d[i].job.chunks;
    if (ctas > INT32_MAX) return -1;
  }
  return ctas;
}

// The first key block row `row`'s queries see: its first query's reach (a window's start).
int64_t first_block(const AttentionLaunch& a, int row) {
  const int64_t key0 = a.kv[row].prefix_len + a.kv[row].own_before;
  return (a.window > 0 && key0 - a.window + 1 > 0 ? key0 - a.window + 1 : 0) / kKeyBlock;
}

bool same_prefix(const KvRow& x, const KvRow& y) {
  return x.prefix_k == y.prefix_k && x.prefix_v == y.prefix_v &&
         x.prefix_stride == y.prefix_stride && x.prefix_len == y.prefix_len;
}

// The jobs of a launch. False when the grid would be too large.
bool make_plan(const AttentionLaunch& a, Plan& p) {
  p = Plan{};
  plan_records(a, p);
  const Rows& r = a.rows;
  const int64_t G = a.group;
  // Head dims past the block kernel's run every job, one row each, in the few kernel's wide form.
  const bool wide = a.head_dim > kMaxHeadDim;
  int64_t count[kRows] = {}, lo_block[kRows] = {}, end_block[kRows] = {}, blocks[kRows] = {};
  for (int i = 0; i < r.count; ++i) {
    if (r.length[i] <= 0) continue;
    const int64_t hi = a.kv[i].prefix_len + a.kv[i].own_before + r.length[i] - 1;
    count[i] = r.length[i] * G;
    lo_block[i] = first_block(a, i);
    end_block[i] = hi / kKeyBlock + 1;
    blocks[i] = split_blocks(hi);  // the row's largest split: its last query row's
  }

  Draft block[kMaxJobs], few[kMaxJobs];
  int blocks_n = 0, few_n = 0, pos = 0;
  auto add = [&](int member_begin, int member_end, int64_t queries, int64_t key_begin,
                 int64_t key_end, int64_t split, bool shared, bool to_few) {
    Draft d{};
    const int64_t per_cta = !to_few ? kBlockQueries : wide ? kWideQueries : kFewQueries;
    d.job.member_begin = int16_t(member_begin);
    d.job.member_end = int16_t(member_end);
    d.job.queries = int32_t(queries);
    d.job.query_blocks = int32_t(ceil_div(queries, per_cta));
    d.job.key_begin = int32_t(key_begin);
    d.job.key_end = int32_t(key_end);
    d.job.shared = shared ? 1 : 0;
    d.split_blocks = split;
    d.few = to_few;
    (to_few ? few[few_n++] : block[blocks_n++]) = d;
  };

  bool placed[kRows] = {}, packed[kRows] = {};
  for (int i = 0; i < r.count; ++i) {
    if (count[i] == 0 || placed[i]) continue;
    int members[kRows], m = 0;
    members[m++] = i;
    placed[i] = true;
    if (a.kv[i].prefix_len > 0)
      for (int j = i + 1; j < r.count; ++j)
        if (count[j] > 0 && !placed[j] && same_prefix(a.kv[i], a.kv[j])) {
          members[m++] = j;
          placed[j] = true;
        }
    int64_t queries = 0, split = 1, lo = INT64_MAX;
    for (int k = 0; k < m; ++k) {
      queries += count[members[k]];
      split = std::max(split, blocks[members[k]]);
      lo = std::min(lo, lo_block[members[k]]);
    }
    // The prefix blocks that whole splits of every member cover.
    const int64_t shared_end = a.kv[i].prefix_len / kKeyBlock / split * split;
    const bool pack = !wide && m >= 2 && queries >= kPackQueries && lo < shared_end;
    const int begin = pos;
    int64_t before = 0;
    for (int k = 0; k < m; ++k) {
      p.member[pos] = uint8_t(members[k]);
      p.member_query[pos++] = int32_t(before);
      before += count[members[k]];
    }
    if (pack) {
      add(begin, pos, queries, lo, shared_end, split, true, false);
      for (int k = 0; k < m; ++k) packed[members[k]] = true;
    }
    for (int k = 0; k < m; ++k) {
      const int row = members[k];
      const int64_t from = pack ? std::max(shared_end, lo_block[row]) : lo_block[row];
      if (from < end_block[row])
        add(begin + k, begin + k + 1, count[row], from, end_block[row], blocks[row], false,
            wide || (count[row] <= kFewLimit && !a.bf16));
    }
  }

  const int64_t block_ctas = chunk_jobs(block, blocks_n, a.kv_heads);
  const int64_t few_ctas = chunk_jobs(few, few_n, a.kv_heads);
  if (block_ctas < 0 || few_ctas < 0) return false;
  // Rows not packed whose own job is one chunk: each CTA walks all of its query rows' splits.
  for (int k = 0; k < blocks_n + few_n; ++k) {
    const Job& j = k < blocks_n ? block[k].job : few[k - blocks_n].job;
    if (!j.shared && j.chunks == 1 && !packed[p.member[j.member_begin]])
      p.row_local[p.member[j.member_begin]] = 1;
  }
  for (int i = 0; i < r.count; ++i)
    if (p.row_records[i] >= 0 && !p.row_local[i]) ++p.merge_rows;
  p.block_jobs = blocks_n;
  p.few_jobs = few_n;
  p.block_ctas = int32_t(block_ctas);
  p.few_ctas = int32_t(few_ctas);
  for (int i = 0; i < blocks_n; ++i) p.jobs[i] = block[i].job;
  for (int i = 0; i < few_n; ++i) p.jobs[blocks_n + i] = few[i].job;
  return true;
}

bool uses_copy(const AttentionLaunch& a) {
  return a.bf16 && a.head_dim <= kMaxHeadDim;
}

int copy_dims(int64_t head_dim) {
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

int64_t records_floats(const AttentionLaunch& a, const Plan& p) {
  return (p.records * record_floats(a) + 3) / 4 * 4;
}

void plan_kv_copy(const AttentionLaunch& a, KvCopy& c) {
  c.data = nullptr;
  c.regions = 0;
  c.elements = 0;
  c.dims = copy_dims(a.head_dim);
  if (!uses_copy(a)) return;
  const Rows& r = a.rows;
  const int64_t H = a.kv_heads, D = a.head_dim, dims = c.dims;
  // Each row's first key any of its jobs reads (make_plan's lo_block); -1: a row without queries.
  int64_t first[kRows];
  for (int i = 0; i < r.count; ++i) first[i] = r.length[i] > 0 ? first_block(a, i) * kKeyBlock : -1;
  int64_t vectors = 0;
  auto add = [&](const float* k, const float* v, int64_t stride, int64_t from, int64_t keys) {
    KvRegion& g = c.region[c.regions];
    g = {k + from * D, v + from * D, stride, keys, c.elements};
    vectors += H * keys;
    c.vectors_end[c.regions++] = vectors;
    c.elements += 2 * H * keys * dims;
    return g.offset - from * dims;
  };
  // Prefixes: one region per distinct prefix, from the earliest key of the rows sharing it (a
  // packed job reads the prefix through its first member, whatever that member's own reach).
  bool done[kRows] = {};
  for (int i = 0; i < r.count; ++i) {
    const KvRow& kv = a.kv[i];
    if (first[i] < 0 || done[i] || kv.prefix_len <= 0) continue;
    int64_t from = first[i];
    for (int j = i + 1; j < r.count; ++j)
      if (first[j] >= 0 && same_prefix(kv, a.kv[j])) from = std::min(from, first[j]);
    const int64_t base = from < kv.prefix_len ? add(kv.prefix_k, kv.prefix_v, kv.prefix_stride,
                                                    from, kv.prefix_len - from)
                                              : 0;
    const int64_t keys = std::max<int64_t>(kv.prefix_len - from, 0);
    for (int j = i; j < r.count; ++j) {
      if (first[j] < 0 || !same_prefix(kv, a.kv[j])) continue;
      done[j] = true;
      c.prefix_base[j] = base;
      c.prefix_head[j] = keys * dims;
      c.prefix_v[j] = H * keys * dims;
    }
  }
  // Own keys: from the row's first key past its prefix to its last query's.
  for (int i = 0; i < r.count; ++i) {
    if (first[i] < 0) continue;
    const KvRow& kv = a.kv[i];
    const int64_t from = std::max<int64_t>(first[i] - kv.prefix_len, 0);
    const int64_t end = kv.own_before + r.length[i], keys = end - from;
    c.own_base[i] = add(kv.own_k, kv.own_v, kv.own_stride, from, keys);
    c.own_head[i] = keys * dims;
    c.own_v[i] = H * keys * dims;
  }
}

Geometry geometry_of(const AttentionLaunch& a) {
  const int D = int(a.head_dim), dim4 = (D + 3) / 4 * 4;
  Geometry g{D, dim4, (D + 31) / 32 * 32 + 4, record_floats(a), false, false, false, a.scale};
  const bool d4 = D % 4 == 0;
  g.q_wide = d4 && a.ldq % 4 == 0 && aligned16(a.q);
  g.out_wide = d4 && a.ldo % 4 == 0 && aligned16(a.out);
  g.kv_wide = d4;
  for (int i = 0; i < a.rows.count; ++i) {
    const KvRow& kv = a.kv[i];
    if (kv.prefix_len > 0)
      g.kv_wide = g.kv_wide && kv.prefix_stride % 4 == 0 && aligned16(kv.prefix_k) &&
                  aligned16(kv.prefix_v);
    g.kv_wide = g.kv_wide && kv.own_stride % 4 == 0 && aligned16(kv.own_k) && aligned16(kv.own_v);
  }
  return g;
}

}  // namespace deg::cuda::att

namespace deg::cuda {

int64_t attention_workspace_floats(const AttentionLaunch& a) {
  if (a.rows.count <= 0 || !att::valid_launch(a)) return 0;
  att::Plan p{};
  att::plan_records(a, p);
  static thread_local att::KvCopy c;  // 9 KB: off the stack
  att::plan_kv_copy(a, c);
  return att::records_floats(a, p) + (c.elements + 7) / 8 * 4;
}

}  // namespace deg::cuda
