// The CUDA backend's kernel launchers (src/kernels/cuda/*.cu), as plain C++ that both nvcc and
// the host compiler read: the .cu files hold kernels and their launchers only (no deg headers:
// nvcc cannot compile fmt), and cuda/ops.cc turns the op interface's arguments into these
// structs. Row tables travel BY VALUE as kernel parameters (up to 32 KB on sm_90): a call's rows
// go to the device in chunks of kRows, one launch per chunk, so no table is copied through memory
// and no launch waits for a copy (a CUDA graph can capture any op). Rows are independent in every
// op that reads a row table, so chunking changes no result.
//
// Each launcher enqueues its kernels on `stream` and returns the launch's error (cudaSuccess, or
// what cudaGetLastError says), which the caller turns into a deg::Error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

namespace deg::cuda {

// Rows [first, first + count) of a call.
constexpr int kRows = 64;
struct Rows {
  int count = 0;
  int64_t tokens = 0;  // L: row i's token t is token row (first + i) L + t of the call
  int64_t first = 0;
  int64_t length[kRows];
  int64_t position[kRows];  // the position of the row's token 0
};

// Row i's K/V (the attention half of a RowView; kernels/ops.h says what each field means).
struct KvRow {
  const float* prefix_k;
  const float* prefix_v;
  int64_t prefix_len, prefix_stride;
  float* own_k;
  float* own_v;
  int64_t own_before, own_stride;
};

// Row i's recurrent state and conv tail (the recurrent half of a RowView).
struct StateRow {
  const float* rec_in;
  float* rec_out;
  const float* tail_in;
  float* tail_out;
};

// ---- attention.cu: AttendArgs of kernels/ops.h for the rows of one chunk ----
struct AttentionLaunch {
  Rows rows;
  KvRow kv[kRows];
  const float* q;  // token row (rows.first + i) L + t at q + that * ldq
  int64_t ldq;
  float* out;
  int64_t ldo;
  int64_t kv_heads, group, head_dim;
  float scale;
  int64_t window;
  // Tensor cores: Q K^T and P V of bf16-rounded operands, f32 accumulation (every query in the
  // block kernel, so a query's bits never depend on which kernel a batch sends it to). Head dims
  // past 256 run in f32 whatever this says (the few-query kernel's wide form takes them all).
  bool bf16;
  // Device scratch for the key splits' partial results (16-byte aligned): at least
  // attention_workspace_floats(*this) floats; null: the launcher takes it from the stream's
  // memory pool (cudaMallocAsync) and gives it back after the launch.
  float* workspace;
  int64_t workspace_floats;
};
cudaError_t launch_attention(const AttentionLaunch& a, cudaStream_t stream);
// The floats of scratch launch_attention needs for `a` (its rows, K/V and shapes; the workspace
// fields are not read). 0: none.
int64_t attention_workspace_floats(const AttentionLaunch& a);

// ---- delta_rule.cu: DeltaRuleOpArgs of kernels/ops.h for the rows of one chunk ----
// A row's DeltaRuleHistory (kernels/ops.h); len 0 and append 0: none.
struct HistRow {
  float* k;  // [Hk, cap, Dk]
  float* d;  // [Hv, cap, Dv]
  float* g;  // [Hv, cap]
  int32_t len, cap, append;
};
struct DeltaRuleLaunch {
  Rows rows;
  StateRow state[kRows];  // rec_in / rec_out: [Hv, Dk, Dv] per row
  HistRow hist[kRows];
  const float* q;
  const float* k;
  const float* v;
  int64_t ld;
  const float* g;
  const float* beta;
  int64_t ldg;
  float* out;
  int64_t ldo;
  int64_t k_heads, v_heads, dk, dv;
  // Device scratch of the chunked form (16-byte aligned): delta_rule_workspace_floats(*this)
  // floats, or null when that is 0.
  float* workspace;
  int64_t workspace_floats;
  // Every row's rec_out is scratch (RowView::rec_scratch): the recurrence stores no final state.
  bool rec_scratch;
};
cudaError_t launch_delta_rule(const DeltaRuleLaunch& a, cudaStream_t stream);
// The floats of scratch launch_delta_rule needs for `a` (its rows and shapes; the workspace
// fields are not read). 0: none. At most `cap` floats (the rows' chunks run in segments that fit)
// unless one chunk of every row needs more.
constexpr int64_t kDeltaRuleWorkspaceCap = int64_t(1) << 26;  // 256 MB
int64_t delta_rule_workspace_floats(const DeltaRuleLaunch& a, int64_t cap = kDeltaRuleWorkspaceCap);

// ---- elementwise.cu: the row-wise and elementwise ops ----

// rms_norm (NormArgs): scale 0 = w, 1 = one_plus_w; w null = unit weight; gate null = plain.
struct NormLaunch {
  const float* x;
  int64_t ldx, hx;
  float* y;
  int64_t ldy, hy;
  int64_t rows, heads, dim;
  const float* w;
  float eps;
  int one_plus_w;
  const float* gate;
  int64_t ldg, hg;
  uint16_t* yb;  // non-null: the results as bf16 bits here (y's strides) instead of y
};
cudaError_t launch_rms_norm(const NormLaunch& a, cudaStream_t stream);

struct L2NormLaunch {
  float* x;
  int64_t ldx, rows, heads, dim;
  float eps, post_scale;
  int64_t unscaled_heads = 0;  // the last ones skip post_scale (L2NormArgs)
};
cudaError_t launch_l2_norm(const L2NormLaunch& a, cudaStream_t stream);

// rope (RopeArgs): the table's inverse frequencies by value.
constexpr int kRopeFreqs = 256;
struct RopeLaunch {
  Rows rows;
  float* x;
  int64_t ldx, heads, hs;
  int half;  // rot / 2
  float inv_freq[kRopeFreqs];
};
cudaError_t launch_rope(const RopeLaunch& a, cudaStream_t stream);

struct KvWriteLaunch {
  Rows rows;
  KvRow kv[kRows];
  const float* k;
  int64_t ldk;
  const float* v;
  int64_t ldv;
  int64_t kv_heads, dim, k_dim, v_dim, hk, hv;
};
cudaError_t launch_kv_write(const KvWriteLaunch& a, cudaStream_t stream);

struct ConvLaunch {
  Rows rows;
  StateRow state[kRows];
  const float* x;
  int64_t ldx;
  float* y;
  int64_t ldy;
  int64_t channels, kernel;
  const float* w;  // [channels, kernel]
  int64_t ldt;
  bool silu;
};
cudaError_t launch_causal_conv(const ConvLaunch& a, cudaStream_t stream);

struct DeltaGatesLaunch {
  Rows rows;
  float* beta;
  float* g;
  int64_t ld, heads;
  const float* neg_decay;
  const float* dt_bias;
};
cudaError_t launch_delta_gates(const DeltaGatesLaunch& a, cudaStream_t stream);

// act: 0 silu, 1 gelu_tanh, 2 sigmoid (the GLU gates of kernels/ops.h).
struct GluLaunch {
  const float* gate;
  int64_t ldg;
  const float* up;
  int64_t ldu;
  float* out;
  int64_t ldo, rows, n;
  int act;
  uint16_t* outb;  // non-null: the results as bf16 bits here (stride ldo) instead of out
};
cudaError_t launch_glu(const GluLaunch& a, cudaStream_t stream);

// y = y + a (mul: y * a), or with a null y = y * s; rows of n.
struct BinaryLaunch {
  const float* a;
  int64_t lda;
  float* y;
  int64_t ldy, rows, n;
  bool mul;
  float s;
};
cudaError_t launch_binary(const BinaryLaunch& a, cudaStream_t stream);
cudaError_t launch_softcap(float* y, int64_t n, float cap, cudaStream_t stream);
// Ops::logit_picks: a block per row.
struct LogitPicksLaunch {
  const float* logits;
  int64_t ld, rows, n;
  int32_t* best;
  int32_t* second;
  float* best_logit;
  float* second_logit;
  double* max;
  double* sum;
  int32_t* bad;
};
// workspace: logit_picks_workspace(rows, n) bytes of device memory.
size_t logit_picks_workspace(int64_t rows, int64_t n);
cudaError_t launch_logit_picks(const LogitPicksLaunch& a, void* workspace, cudaStream_t stream);
// y[r, 0:n] = x[r, 0:n]; the caller stages overlapping copies.
cudaError_t launch_copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                             int64_t n, cudaStream_t stream);
// y[i] = x[index[i]] (rows of n floats); x and y do not overlap.
cudaError_t launch_gather_rows(const float* x, int64_t ldx, const int32_t* index, float* y,
                               int64_t ldy, int64_t rows, int64_t n, cudaStream_t stream);
// y[j, i] = x[i, j] for x [rows, cols]; x and y do not overlap.
cudaError_t launch_transpose(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                             int64_t cols, cudaStream_t stream);

// gather (GatherArgs): table rows f32 (bf16 false) or bf16 of `cols` columns.
struct GatherLaunch {
  const void* table;
  bool bf16;
  int64_t cols;
  const int32_t* ids;
  int64_t n;
  float* y;
  int64_t ldy;
  float scale;
  bool keep;
  float mix;
  const int32_t* soft_rows;
  const float* soft;
  const float* id_lane;
  int64_t ld_id;
  const float* row_scale;
  int64_t ld_scale;
};
cudaError_t launch_gather(const GatherLaunch& a, cudaStream_t stream);

// ---- mixing.cu: the f32 row ops with f64 dot products, hashes and combinations
// (ActivationArgs ... ProjectionArgs of kernels/ops.h), in the CPU's expression order ----

// act: 0 relu_squared, 1 gelu_erf, 2 scaled_sigmoid (a sigmoid((x + b) / c)), 3 sigmoid, 4 silu,
// 5 gelu_tanh.
struct ActivationLaunch {
  const float* x;
  int64_t ldx;
  float* y;
  int64_t ldy, rows, n;
  int act;
  float a, b, c;
};
cudaError_t launch_activation(const ActivationLaunch& a, cudaStream_t stream);

struct BiasScaleLaunch {
  const float* x;
  int64_t ldx;
  float* y;
  int64_t ldy, rows, n;
  const float* bias;  // [n] or null
  float s;
};
cudaError_t launch_bias_scale(const BiasScaleLaunch& a, cudaStream_t stream);

constexpr int kCombineTerms = 6;
struct CombineTermLaunch {
  const float* x;  // null: the output row as it was
  int64_t ldx;
  float s;
  const float* lane;
  int64_t ldl, gl;
  const float* add;
  int64_t lda, ga;
  float offset;
};
struct CombineLaunch {
  float* y;
  int64_t ldy, rows, n, group;
  int terms;
  CombineTermLaunch term[kCombineTerms];
};
cudaError_t launch_combine(const CombineLaunch& a, cudaStream_t stream);

struct SigmoidGatesLaunch {
  const float* x;
  int64_t ldx;
  const float* x2;
  int64_t ldx2;
  const float* w;
  int64_t ldw, rows, heads, n;
  float s;
  float* out;
  int64_t ldo;
};
cudaError_t launch_sigmoid_gates(const SigmoidGatesLaunch& a, cudaStream_t stream);

struct RopePairsLaunch {
  Rows rows;
  const float* freq;
  float* x;
  int64_t ldx, heads, hs, dims;
  bool paired_heads, inverse;
};
cudaError_t launch_rope_pairs(const RopePairsLaunch& a, cudaStream_t stream);

struct ProjectionLaunch {
  Rows rows;
  float* y;
  int64_t ldy, hy;
  const float* v;
  int64_t ldv, hv;
  const float* strength;
  int64_t lds, heads, dim;
  float eps;
};
cudaError_t launch_subtract_projection(const ProjectionLaunch& a, cudaStream_t stream);

struct ShiftIdsLaunch {
  Rows rows;
  const int32_t* ids;      // token row (rows.first + i) L + t at ids[that]
  const int32_t* history;  // [B, history_len] of the whole call
  int64_t history_len, back;
  int32_t* out;
  float* lane;
  int64_t ld_lane;
};
cudaError_t launch_shift_ids(const ShiftIdsLaunch& a, cudaStream_t stream);

struct NgramLaunch {
  Rows rows;
  const int32_t* ids;
  const int32_t* prev1;
  const int32_t* prev2;
  const void* table;  // [V, dim] f32, or bf16 when bf16
  bool bf16;
  int64_t table_rows, dim;
  const float* sign_pool;  // [sign_rows, dim]
  int64_t sign_rows;
  int32_t bigram_rows[2], trigram_rows[3], bigram_signs[2], trigram_signs[3];
  float* y;
  int64_t ldy;
};
cudaError_t launch_ngram_embed(const NgramLaunch& a, cudaStream_t stream);
// The table rows and sign rows ngram_embed reads, every token of the chunk's rows: entry 2 t + 0
// (bigram) and 2 t + 1 (trigram) of rows[] and signs[] (table and y unused).
cudaError_t launch_ngram_entries(const NgramLaunch& a, int32_t* rows, int32_t* signs,
                                 cudaStream_t stream);

// ---- attention_f64.cu: AttendF64Args of kernels/ops.h for the rows of one chunk ----
struct AttentionF64Launch {
  Rows rows;
  KvRow kv[kRows];
  const float* q;
  int64_t ldq, hq;
  float* out;
  int64_t ldo, ho;
  int64_t heads, qk_dim, v_dim, kv_dim;
  float scale;
  int64_t window;
  bool paired_heads, key_offset;
  int64_t offset_from;
  const int32_t* segment;  // [N] first visible token position per token, or null
};
cudaError_t launch_attention_f64(const AttentionF64Launch& a, cudaStream_t stream);

// ---- backward.cu: the training ops' kernels (kernels/ops.h "training"), one thread per output
// element or per (row, group) / (token, head) / table-row column, each summing in order ----

struct NormBackwardLaunch {
  const float* x;
  int64_t ldx, hx;
  const float* dy;
  int64_t ldy, hy;
  float* dx;
  int64_t lddx, hdx, rows, heads, dim;
  float eps;
};
cudaError_t launch_rms_norm_backward(const NormBackwardLaunch& a, cudaStream_t stream);

struct ActivationBackwardLaunch {
  const float* x;
  int64_t ldx;
  const float* dy;
  int64_t ldy;
  float* dx;
  int64_t lddx, rows, n;
  int act;  // 0 relu_squared, 1 gelu_erf, 2 scaled_sigmoid
  float a, b, c;
  bool accumulate;
};
cudaError_t launch_activation_backward(const ActivationBackwardLaunch& a, cudaStream_t stream);

// Rows are summed in chunks of kColumnSumChunk (a block's tree each, into f64 partials at
// `partial`, column_sum_partials(rows, n) of them), then each column's partials by one block's
// tree; a column of at most one chunk is summed by one block directly (partial unused).
constexpr int64_t kColumnSumChunk = 1024;
inline int64_t column_sum_partials(int64_t rows, int64_t n) {
  const int64_t chunks = (rows + kColumnSumChunk - 1) / kColumnSumChunk;
  return chunks > 1 ? chunks * n : 0;
}
struct ColumnSumLaunch {
  const float* x;
  int64_t ldx, rows, n;
  float s;
  float* out;
  bool accumulate;
  double* partial;
};
cudaError_t launch_column_sum(const ColumnSumLaunch& a, cudaStream_t stream);

struct CombineGradLaunch {
  float* dx;
  int64_t lddx;
  float* dcoef;
  int64_t ldc;
};
struct CombineBackwardLaunch {
  CombineLaunch forward;  // y unused
  const float* dy;
  int64_t ldy;
  const float* y_before;
  int64_t ldb;
  float* dy_before;
  int64_t lddb;
  CombineGradLaunch grad[kCombineTerms];
};
cudaError_t launch_combine_backward(const CombineBackwardLaunch& a, cudaStream_t stream);

// ---- row_order.cu: a table's positions grouped by row on the device ----
// order: the entries i whose keys[i] are in [0, rows), by key and, within a key, in increasing i;
// starts [rows + 1]: where each key's entries begin (gather_order of kernels/cpu/backward.h).
// temp: row_order_bytes(n, rows) of device scratch.
size_t row_order_bytes(int64_t n, int64_t rows);
cudaError_t launch_row_order(const int32_t* keys, int64_t n, int64_t rows, int64_t* order,
                             int64_t* starts, void* temp, size_t temp_bytes, cudaStream_t stream);

// Table rows' positions grouped (order / starts of launch_row_order).
struct ScatterRowsLaunch {
  const int32_t* keys;  // [entries] each entry's table row (outside [0, rows): none)
  int64_t entries;
  const int64_t* order;   // [entries]
  const int64_t* starts;  // [rows + 1]
  int64_t rows, cols;
  const float* dy;
  int64_t ldy;
  int entry_shift;         // position i = order[q] >> entry_shift (2: n-gram entries 2 i + channel)
  const float* row_scale;  // gather: per position, or null (then `scale`)
  int64_t ld_scale;
  float scale;
  const int32_t* signs;  // n-gram: the sign row of each entry, or null
  const float* sign_pool;
  float* dtable;  // [rows, cols]
};
cudaError_t launch_scatter_rows(const ScatterRowsLaunch& a, cudaStream_t stream);

struct RowScaleGradLaunch {
  const float* table;  // [V, C]
  int64_t cols;
  const int32_t* ids;  // device ids (from the id lane when the forward read one)
  int64_t n;
  const float* dy;
  int64_t ldy;
  float* drow_scale;
  int64_t ld_drow;
};
cudaError_t launch_row_scale_grad(const RowScaleGradLaunch& a, cudaStream_t stream);
// ids[i] = int(lane[i * ld]) (a float id lane as ids).
cudaError_t launch_lane_ids(const float* lane, int64_t ld, int64_t n, int32_t* ids,
                            cudaStream_t stream);

struct SigmoidGatesBackwardLaunch {
  SigmoidGatesLaunch forward;  // out unused
  const float* dout;
  int64_t lddo;
  float* dx;
  int64_t lddx;
  float* dx2;
  int64_t lddx2;
  float* dw;
  float* dz;        // scratch [rows, heads]
  double* partial;  // scratch [ceil(rows / kGateRowsPerPartial), heads, width (n, or 2 n with x2)]
};
// dw's rows are summed kGateRowsPerPartial at a time (each in order, in f64), then the partial
// sums in order: a thread per weight walking every row left most of the GPU idle.
constexpr int64_t kGateRowsPerPartial = 128;
cudaError_t launch_sigmoid_gates_backward(const SigmoidGatesBackwardLaunch& a, cudaStream_t stream);

struct ProjectionBackwardLaunch {
  ProjectionLaunch forward;  // forward.y: the y before the op
  const float* dy_out;
  int64_t lddo;
  float* dy;
  int64_t lddy;
  float* dv;
  int64_t lddv;
  float* dstrength;
  int64_t ldds;
};
cudaError_t launch_subtract_projection_backward(const ProjectionBackwardLaunch& a,
                                                cudaStream_t stream);

// ---- attention_f64_backward.cu: attention_f64's backward for the rows of one chunk: one block
// per (token, head) for dq, one per (tile of 32 keys, K/V head) for dK / dV (one per key for heads
// wider than 64) ----
struct AttentionF64BackwardLaunch {
  AttentionF64Launch forward;
  KvRow grad[kRows];  // dK / dV views
  const float* dout;
  int64_t lddo, hdo;
  float* dq;
  int64_t lddq, hdq;
  float* stats;  // [N, heads, 3] scratch: each query's softmax max, 1 / sum and sum_j p_j dp_j
};
cudaError_t launch_attention_f64_backward(const AttentionF64BackwardLaunch& a, cudaStream_t stream);

// ---- attention_bf16.cu: AttendF64Args with bf16 (kernels/ops.h) on tensor cores, for the rows of
// one chunk: the forward, and the backward of AttentionF64BackwardLaunch (its `stats` unused).
// Each launch takes a device workspace of attention_bf16_workspace bytes. ----
bool attention_bf16_fits(const AttentionF64Launch& a);  // head dims up to 128
size_t attention_bf16_workspace(const AttentionF64Launch& a, bool backward);
cudaError_t launch_attention_bf16(const AttentionF64Launch& a, void* workspace,
                                  cudaStream_t stream);
cudaError_t launch_attention_bf16_backward(const AttentionF64BackwardLaunch& a, void* workspace,
                                           cudaStream_t stream);

// ---- optimizer.cu: the optimizer steps (kernels/ops.h), elementwise or in fixed orders ----
struct AdamLaunch {
  float* p;
  float* g;
  float* m;
  float* v;
  int64_t n;
  float beta1, beta2, eps, step_size, wd;
};
cudaError_t launch_adam_step(const AdamLaunch& a, cudaStream_t stream);
// NesterovArgs: count vectors (vector j's g and buf at gs[j] / bufs[j] when gs is set, else g
// and buf with count 1).
struct NesterovLaunch {
  float* g;
  float* buf;
  float* u;
  int64_t n;
  float momentum;
  int64_t count;
  float* const* gs;
  float* const* bufs;
};
cudaError_t launch_nesterov(const NesterovLaunch& a, cudaStream_t stream);
// The sum of x² in f64: chunks of `chunk` elements (one thread each, in order), then the chunks in
// order, into *out (device).
cudaError_t launch_sum_squares(const float* x, int64_t n, int64_t chunk, double* partial,
                               double* out, cudaStream_t stream);
// FrobeniusNormalizeArgs: each block's sum as launch_sum_squares sums it (partial: [count,
// chunks]), its factor (factor: [count]), then the scaling.
struct FrobeniusNormalizeLaunch {
  float* x;
  int64_t n, count;
  double margin, eps;
};
cudaError_t launch_frobenius_normalize(const FrobeniusNormalizeLaunch& a, int64_t chunk,
                                       double* partial, float* factor, cudaStream_t stream);
// NorMuonStepArgs: count blocks (block j's p, second and lr multiplier from ps, seconds and
// lr_muls when ps is set, else p and second with count 1).
struct NorMuonLaunch {
  const float* u;
  float* p;
  float* second;
  int64_t rows, cols;
  float beta2, lr, wd;
  int64_t count;
  float* const* ps;
  float* const* seconds;
  const float* lr_muls;
  float* work;  // [count, 2 * max(rows, cols) + 1]
};
cudaError_t launch_normuon_step(const NorMuonLaunch& a, cudaStream_t stream);

// ---- loss.cu: softcap_cross_entropy (kernels/ops.h) for one chunk of rows, between its GEMMs ----
constexpr int kLossMtp = 8;               // kernels/ops.h's kMaxMtpWeights
constexpr int kLossTerms = kLossMtp + 1;  // with the prefix target
struct SoftcapLossLaunch {
  float* z;       // [rows, vocab] the chunk's logits; dz over them when grad and dz_bf16 is null
  void* dz_bf16;  // [rows, vocab] bf16 dz, or null
  int64_t rows, vocab;
  int64_t first, total;    // the chunk's first row of the call, the call's rows T
  const int32_t* targets;  // [T]
  const int32_t* prefix;   // [T] or null
  float a, b, c;
  float mtp_weights[kLossMtp];
  int mtp;
  float prefix_weight;
  float* loss;  // [T]
  bool grad;
};
cudaError_t launch_softcap_loss(const SoftcapLossLaunch& a, cudaStream_t stream);

// GEMM operand conversions: x [rows, n] at ldx -> bf16 [rows, n] contiguous (round to nearest
// even, as the CPU's f32_to_bf16); bf16 [count] -> f32 [count].
cudaError_t launch_to_bf16(const float* x, int64_t ldx, int64_t rows, int64_t n, void* out,
                           cudaStream_t stream);
cudaError_t launch_widen_bf16(const void* in, int64_t count, float* out, cudaStream_t stream);
// A split product's partial sums: y [rows, n] at ldy = (accumulate ? y : 0) + parts[0] + ... +
// parts[count - 1], added in that order; parts [count, rows, n] contiguous.
cudaError_t launch_sum_parts(const float* parts, int64_t count, float* y, int64_t ldy, int64_t rows,
                             int64_t n, bool accumulate, cudaStream_t stream);

// ---- gemm_small.cu: y [m, n] (= or +=) x [m, k] w [n, k]^T, bf16 operands, f32 y, m <= 64 ----
// Each output summed as cuBLASLt's pinned bf16 kernels sum it (k ascending in mma.sync k16
// steps, one f32 accumulator; accumulate adds the old y last). Configurations 0 ..
// kSmallGemmConfigs - 1 cut the work differently (small_gemm_config_name says how) with the same
// bits. small_gemm_fits: m in [1, 64], n and k multiples of 8 and 16, ldx >= k and a multiple of
// 8, ldy >= n, x and w 16-byte aligned.
constexpr int kSmallGemmRows = 64;
constexpr int kSmallGemmConfigs = 3;
struct SmallGemmLaunch {
  const uint16_t* x;  // [m, k] at ldx
  int64_t ldx;
  const uint16_t* w;  // [n, k] contiguous
  float* y;           // [m, n] at ldy
  int64_t ldy;
  int64_t m, n, k;
  bool accumulate;
};
const char* small_gemm_config_name(int config);
bool small_gemm_fits(const SmallGemmLaunch& a);
cudaError_t launch_small_gemm(const SmallGemmLaunch& a, int config, cudaStream_t stream);

}  // namespace deg::cuda
