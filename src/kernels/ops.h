// The op interface (DESIGN.md §4b): everything a model family asks of a backend. Each op runs
// over a whole call — every row, token and head — so a family file holds no loops, threads or
// scratch of its own, and the backend (CPU here; CUDA behind the same table) owns the machine.
// Ops are named by what they compute, never by a family.
//
// Arguments are pointers into the backend's memory with explicit strides (in elements). Row
// tables (each row's real length and first position, each row's state views) are plain data the
// backend reads once per op. A call's rows are right-padded to L tokens: ops that carry state
// across tokens (conv, delta rule, K/V writes, attention) read and write only a row's real
// positions and zero the padded positions of their outputs; elementwise ops and norms run over
// every position (padded values are finite garbage nothing reads back into state).
//
// Batch invariance: every output element is computed in one fixed order that depends on its own
// inputs and the op's sizes only — never on the number of rows, on the other rows or on how the
// backend splits the work. A row's results are bitwise the same alone, in any batch, in any
// order.
//
// Letters: B rows, L tokens per row, N = B L token rows, H heads, D head dim, K conv kernel.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace deg {

// Scratch of one call on `device`'s memory: taken in order, released together by reset() (the
// memory is kept for the next use). Not zero-filled. Taken pointers stay valid until reset().
class Arena {
 public:
  explicit Arena(Device device = Device::cpu) : device_(device) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  Device device() const { return device_; }
  float* floats(int64_t n);
  int32_t* ints(int64_t n);  // the same memory, as int32 (ids)
  void reset();

 private:
  struct Block {
    std::shared_ptr<float> data;  // host or device memory, with its deleter
    size_t size = 0, used = 0;
  };
  Block block(size_t floats) const;
  Device device_;
  std::vector<Block> blocks_;
};

// The rows of one call: row b has lengths[b] real tokens of L, the first at positions[b].
struct RowTable {
  int64_t rows = 0;                    // B
  int64_t tokens = 0;                  // L
  const int64_t* lengths = nullptr;    // [B]
  const int64_t* positions = nullptr;  // [B]

  int64_t n() const { return rows * tokens; }
};

// A fork row's delta-rule state as the prefix's (rec_in, shared by the prefix's fork rows) plus
// the row's own tokens since, each as the update it made: token j's log decay g_j, key k_j and
// delta d_j = beta_j (v_j - e^(g_j) Sᵀ k_j), so the row's state is rec_in's after
//   S <- S e^(g_j);  S <- S + k_j ⊗ d_j     for j = 0 .. len - 1
// (the recurrence's own steps: a backend whose recurrence rounds these two steps as it replays
// them gets the state it would have kept). A step then reads the shared state and its own
// history instead of a state of its own (decode at many rows is bound by reading and writing
// those states). With `append`, the row's n tokens of the call go to the history at len ..
// len + n - 1 (len + n <= cap, and n <= kDeltaHistoryMax: CUDA appends from its recurrence);
// without, the history is only read. k: [k_heads, cap, dk], d: [v_heads, cap, dv], g: [v_heads,
// cap]. len 0 and no append: no history (the state is rec_in's).
struct DeltaRuleHistory {
  float* k = nullptr;
  float* d = nullptr;
  float* g = nullptr;
  int64_t len = 0;
  int64_t cap = 0;
  bool append = false;
};
// The longest history a row keeps (Backbone forks past it keep a state of their own).
inline constexpr int64_t kDeltaHistoryMax = 63;

// What one layer sees of row b's state. Recurrent layers: start from rec_in/tail_in, write
// rec_out (it may equal rec_in; what it holds after the call is unspecified when rec_scratch)
// and tail_out (when non-null). Attention layers: keys are
// prefix [0, prefix_len) then own [0, own_before + t]; this call's K/V are written into own at
// own_before. Strides are per KV head, in elements (capacity * D). Sliding layers see only the
// keys a window can reach (prefix_len is the prefix's kept tail, own_before the own keys kept
// before this call); K/V-sharing layers see their source layer's view (and must not write it).
struct RowView {
  const float* rec_in = nullptr;
  float* rec_out = nullptr;
  // rec_out is scratch: nothing reads the state after the call (fork rows that are not kept),
  // so a backend may leave it as it likes there (CUDA's recurrence then stores no final state).
  bool rec_scratch = false;
  const float* tail_in = nullptr;
  float* tail_out = nullptr;
  const float* prefix_k = nullptr;
  const float* prefix_v = nullptr;
  int64_t prefix_len = 0;
  int64_t prefix_stride = 0;
  float* own_k = nullptr;
  float* own_v = nullptr;
  int64_t own_before = 0;
  int64_t own_stride = 0;
  // Keys before the first one the views hold (a sliding window's state keeps only its last
  // keys): the first held key's absolute index, a multiple of kSkippedAlign. A backend whose key
  // blocks are cut at absolute indices reads the held keys there; the results do not depend on
  // it otherwise.
  int64_t skipped = 0;
  // Recurrent layers whose state a row carries as history (DeltaRuleHistory): the state the
  // call starts from is rec_in's with the history's tokens replayed over it.
  DeltaRuleHistory hist;
};
// What RowView::skipped is a multiple of: the CUDA attention's key block (attention_plan.cuh).
inline constexpr int64_t kSkippedAlign = 64;

// ---- argument structs (one per op; designated initializers at call sites) ----

// y = rms_norm(x) * scale(w) for `rows` token rows of `heads` vectors of `dim` each: vector
// (r, h) at x + r * ldx + h * hx (hx 0: dim), the same in y. w null: unit weight. gate non-null:
// the gated form y = w * norm(x) * silu(gate) (gate laid out as y, strides ldg / hg). yb
// non-null (y null): each result rounded to bf16 (nearest even) into yb, at y's strides — rows
// for bf16 dot products (GemmArgs::xb).
struct NormArgs {
  const float* x = nullptr;
  int64_t ldx = 0, hx = 0;
  float* y = nullptr;
  int64_t ldy = 0, hy = 0;
  int64_t rows = 0;
  int64_t heads = 1;
  int64_t dim = 0;
  const float* w = nullptr;  // [dim] or null
  float eps = 1e-6f;
  NormScale scale = NormScale::w;
  const float* gate = nullptr;
  int64_t ldg = 0, hg = 0;
  bf16* yb = nullptr;
};

// x = x / sqrt(sum(x²) + eps) * post_scale in place, per vector (r, h) at x + r * ldx + h * dim.
struct L2NormArgs {
  float* x = nullptr;
  int64_t ldx = 0;
  int64_t rows = 0;
  int64_t heads = 1;
  int64_t dim = 0;
  float eps = 1e-6f;
  float post_scale = 1.0f;
  // The last unscaled_heads heads (0 .. heads) skip post_scale: a delta rule's q and then k
  // normalised in one call.
  int64_t unscaled_heads = 0;
};

// Rotary embedding (kernels/rope.h's rotate-half form) in place over the real tokens of a call:
// token t of row b rotates at position positions[b] + t; `heads` vectors at x + i * ldx + h * hs.
struct RopeArgs {
  RowTable rows;
  const RopeTable* table = nullptr;
  float* x = nullptr;
  int64_t ldx = 0;
  int64_t heads = 0;
  int64_t hs = 0;
};

// The real tokens' K and V (`kv_heads` heads, head h at k + i ldk + h hk, the same for v) into
// each row's own K/V at own_before + t, whose positions are `dim` wide: k_dim floats of K and
// v_dim of V per head (0: dim; head strides 0: the widths written).
struct KvWriteArgs {
  RowTable rows;
  const RowView* views = nullptr;  // [B]
  const float* k = nullptr;
  int64_t ldk = 0;
  const float* v = nullptr;
  int64_t ldv = 0;
  int64_t kv_heads = 0;
  int64_t dim = 0;
  int64_t k_dim = 0, v_dim = 0;
  int64_t hk = 0, hv = 0;
};

// Causal softmax attention of every row over its prefix and own keys (this call's K/V already
// written): query head g of KV head h at q[(b L + t) ldq + (h group + g) D]; out the same
// layout at ldo; padded positions of out are zeroed. window > 0: sliding attention. bf16: the
// model's dot products are bf16 (GemmPrecision::bf16 over bf16 weights), so a backend with
// tensor cores may round Q, K, the probabilities and V to bf16 for its products (f32
// accumulation, softmax in f32); the CPU backends compute in f32 either way.
struct AttendArgs {
  RowTable rows;
  const RowView* views = nullptr;  // [B]
  const float* q = nullptr;
  int64_t ldq = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  int64_t kv_heads = 0;
  int64_t group = 1;
  int64_t head_dim = 0;
  float scale = 1;
  int64_t window = 0;
  bool bf16 = false;
};

// Depthwise causal conv over each row's real tokens, carrying the row's conv tail (views'
// tail_in / tail_out, [K-1, channels] at stride ldt): y = conv(x) (then SiLU when `silu`).
// Padded positions of y are zeroed. x and y must not alias.
struct ConvArgs {
  RowTable rows;
  const RowView* views = nullptr;  // [B]
  const float* x = nullptr;        // [N, channels] at row stride ldx
  int64_t ldx = 0;
  float* y = nullptr;  // [N, channels] at ldy
  int64_t ldy = 0;
  int64_t channels = 0;
  int64_t kernel = 0;        // K
  const float* w = nullptr;  // [channels, K]
  int64_t ldt = 0;           // tail row stride (0: channels)
  bool silu = false;
};

// Gated DeltaNet gates in place over [N, heads] at ldx: beta = sigmoid(b), g = neg_decay[h] *
// softplus(a + dt_bias[h]); padded positions get beta = 0, g = 0 (they write no state).
struct DeltaGatesArgs {
  RowTable rows;
  float* beta = nullptr;  // in: b
  float* g = nullptr;     // in: a
  int64_t ld = 0;
  int64_t heads = 0;
  const float* neg_decay = nullptr;  // [heads]
  const float* dt_bias = nullptr;    // [heads]
};

// The gated delta rule (kernels/delta_rule.h) per (row, value head) over the row's real tokens,
// value head h reading key head h / (v_heads / k_heads); the state starts at the view's rec_in
// ([Hv, Dk, Dv]) with its history replayed (RowView::hist) and ends in rec_out (unless
// rec_scratch: a row that appends to its history sets it). Padded positions of out are zeroed.
struct DeltaRuleOpArgs {
  RowTable rows;
  const RowView* views = nullptr;  // [B]
  const float* q = nullptr;        // [N, Hk Dk] at ld (normed, scaled)
  const float* k = nullptr;        // [N, Hk Dk] at ld (normed)
  const float* v = nullptr;        // [N, Hv Dv] at ld
  int64_t ld = 0;
  const float* g = nullptr;  // [N, Hv] at ldg
  const float* beta = nullptr;
  int64_t ldg = 0;
  float* out = nullptr;  // [N, Hv Dv] at ldo
  int64_t ldo = 0;
  int64_t k_heads = 0, v_heads = 0, dk = 0, dv = 0;
};

// silu, gelu_tanh, sigmoid: the GLU gates. relu_squared: max(x, 0)²; gelu_erf: the exact GELU
// 0.5 x (1 + erf(x / sqrt 2)); scaled_sigmoid: a sigmoid((x + b) / c) (a sigmoid soft cap).
enum class Activation : uint8_t {
  silu,
  gelu_tanh,
  sigmoid,
  relu_squared,
  gelu_erf,
  scaled_sigmoid
};

// out[r, i] = act(gate[r, i]) * up[r, i] for `rows` rows of n (strides in elements; out may
// alias gate or up). up null: out = act(gate) * out (a gate applied in place). Backends take
// silu and gelu_tanh with `up`, sigmoid without (the forms the families use). outb non-null:
// each result rounded to bf16 (nearest even) into outb at stride ldo instead (out is then only
// read, by the form without up) — rows for bf16 dot products (GemmArgs::xb).
struct GluArgs {
  const float* gate = nullptr;
  int64_t ldg = 0;
  const float* up = nullptr;
  int64_t ldu = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  int64_t rows = 0;
  int64_t n = 0;
  Activation act = Activation::silu;
  bf16* outb = nullptr;
};

// y[r, i] += a[r, i] for `rows` rows of n (residual adds), or with `mul` y[r, i] *= a[r, i].
struct BinaryArgs {
  const float* a = nullptr;
  int64_t lda = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t rows = 0;
  int64_t n = 0;
  bool mul = false;
};

// y[r, i] *= s for `rows` rows of n.
struct ScaleArgs {
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t rows = 0;
  int64_t n = 0;
  float s = 1.0f;
};

// Rows of an f32 or bf16 table [V, C] by id: y[i] = (keep ? y[i] : 0) + table[ids[i]] * scale,
// then times `mix` (when != 1). A negative id leaves y[i] as it is. soft_rows non-null: position
// i with soft_rows[i] >= 0 copies soft[soft_rows[i]] ([n, C], contiguous) instead. id_lane
// instead of ids: position i's id is the float id_lane[i * ld_id] (an exact integer).
// row_scale non-null: position i's scale is row_scale[i * ld_scale].
struct GatherArgs {
  const Tensor* table = nullptr;
  const int32_t* ids = nullptr;  // [n]
  int64_t n = 0;
  float* y = nullptr;  // [n, C] at ldy
  int64_t ldy = 0;
  float scale = 1.0f;
  bool keep = false;
  float mix = 1.0f;
  const int32_t* soft_rows = nullptr;
  const float* soft = nullptr;
  const float* id_lane = nullptr;
  int64_t ld_id = 0;
  const float* row_scale = nullptr;
  int64_t ld_scale = 0;
};

// y = cap * tanh(y / cap) over n values.
struct SoftcapArgs {
  float* y = nullptr;
  int64_t n = 0;
  float cap = 0;
};

// Greedy decoding's reading of LM logits [rows, n] (f32, row stride ld), row by row: best =
// the first index of the largest finite logit (-1 when none is finite), second = the first
// index of the largest finite logit other than best (-1: none), their logits, and the softmax
// normaliser: max = the largest finite logit, sum = Σ exp(l - max) over the finite logits, in
// double; bad = 1 when a logit is NaN or +inf (0 otherwise). Outputs [rows] each, in the
// backend's memory. The CPU backends sum in index order; another may sum in any order fixed by
// n alone (never by the other rows).
struct LogitPicksArgs {
  const float* logits = nullptr;
  int64_t ld = 0, rows = 0, n = 0;
  int32_t* best = nullptr;
  int32_t* second = nullptr;
  float* best_logit = nullptr;
  float* second_logit = nullptr;
  double* max = nullptr;
  double* sum = nullptr;
  int32_t* bad = nullptr;
};

// out[r, j] = act(x[r, j]) for `rows` rows of n (strides in elements; y may alias x). a, b, c:
// the scaled_sigmoid parameters.
struct ActivationArgs {
  const float* x = nullptr;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t rows = 0;
  int64_t n = 0;
  Activation act = Activation::relu_squared;
  float a = 1.0f, b = 0.0f, c = 1.0f;
};

// y[r, j] = (x[r, j] + bias[j]) * s for `rows` rows of n (bias null: x[r, j] * s; y may alias x).
struct BiasScaleArgs {
  const float* x = nullptr;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t rows = 0;
  int64_t n = 0;
  const float* bias = nullptr;  // [n] or null
  float s = 1.0f;
};

// One term coef(r, g) * x[r, j] of a combination (CombineArgs). x null: the output row itself
// (as it was before the op). coef = s without a lane; with one, s * lane[r ldl + g gl], plus
// add[r lda + g ga] when add is set, then plus `offset` when it is nonzero; g = j / group is the
// column group (per-head or per-group coefficients).
struct CombineTerm {
  const float* x = nullptr;
  int64_t ldx = 0;
  float s = 1.0f;
  const float* lane = nullptr;
  int64_t ldl = 0, gl = 0;
  const float* add = nullptr;
  int64_t lda = 0, ga = 0;
  float offset = 0.0f;
};

// y[r, j] = term0 + term1 + ... summed left to right in f32 for `rows` rows of n: each term's
// product rounded, then each sum, so a combination of k terms equals k - 1 axpy passes over
// the first. group: the column-group width the lane coefficients step by (0: n).
struct CombineArgs {
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t group = 0;
  std::span<const CombineTerm> terms;
};

// The ids `back` tokens before each token of a call: out[i] for token t of row b is ids[b L + t
// - back] while t >= back, else history[b hl + hl - (back - t)] while the row's position allows
// (positions[b] + t >= back), else -1. out (int32 [N]) and / or lane (as floats, at stride
// ld_lane) may be null.
struct ShiftIdsArgs {
  RowTable rows;
  const int32_t* ids = nullptr;      // [B, L]
  const int32_t* history = nullptr;  // [B, history_len] ids before each row, oldest first
  int64_t history_len = 0;
  int64_t back = 0;
  int32_t* out = nullptr;
  float* lane = nullptr;
  int64_t ld_lane = 0;
};

// Hashed bigram + trigram embedding per token: y[i] = table[bigram row] * pool[bigram sign] +
// table[trigram row] * pool[trigram sign] over dim, from token i's id x, the previous ids p1,
// p2 and its position (rows table). Hashes multiply in wrapping int32 and reduce with Python's
// modulo: bigram row (b0 x ^ b1 p1) mod (V/2 - 1) (position 0: the reserved row V/2 - 1;
// position 1 hashes the reserved id V/2 - 1 as p1), trigram row V/2 + (t0 x ^ t1 p1 ^ t2 p2)
// mod (V - V/2 - 1) (positions < 2: the reserved row V - 1); signs (s1 p1 ^ s0 x) & (P - 1) and
// (u2 p2 ^ u1 p1 ^ u0 x) & (P - 1), row 0 before a hash has its ids. V table rows, P pool rows.
struct NgramEmbedArgs {
  RowTable rows;
  const int32_t* ids = nullptr;      // [N]
  const int32_t* prev1 = nullptr;    // [N] ids one back (any value where the position lacks one)
  const int32_t* prev2 = nullptr;    // [N] ids two back
  const Tensor* table = nullptr;     // [V, dim] f32 or bf16
  const float* sign_pool = nullptr;  // [P, dim]
  int64_t sign_rows = 0;             // P, a power of two
  std::array<int32_t, 2> bigram_rows{};   // multipliers of x, p1
  std::array<int32_t, 3> trigram_rows{};  // of x, p1, p2
  std::array<int32_t, 2> bigram_signs{};
  std::array<int32_t, 3> trigram_signs{};
  float* y = nullptr;  // [N, dim] at ldy
  int64_t ldy = 0;
};

// out[r, h] = s * sigmoid(w_h[0:n] . x[r] (+ w_h[n:2n] . x2[r] when x2 is set)) for `rows` rows
// and `heads` gates, each dot product accumulated in f64 and rounded before the sum; w_h at
// w + h ldw.
struct SigmoidGateArgs {
  const float* x = nullptr;
  int64_t ldx = 0;
  const float* x2 = nullptr;
  int64_t ldx2 = 0;
  const float* w = nullptr;
  int64_t ldw = 0;
  int64_t rows = 0;
  int64_t heads = 1;
  int64_t n = 0;
  float s = 1.0f;
  float* out = nullptr;
  int64_t ldo = 0;
};

// Rotary embedding on interleaved pairs (2i, 2i+1) of the first `dims` dims of each head, in
// place over the real tokens of a call: angle = double(position) * double(freq[2i]), cos and sin
// rounded to f32, (x0, x1) -> (c x0 + s x1, c x1 - s x0). Token t of row b is at position p =
// positions[b] + t; paired_heads: head h rotates at 2 p + h % 2. Heads at x + i ldx + h hs.
struct RopePairsArgs {
  RowTable rows;
  const float* freq = nullptr;  // [dims]
  float* x = nullptr;
  int64_t ldx = 0;
  int64_t heads = 0;
  int64_t hs = 0;
  int64_t dims = 0;
  bool paired_heads = false;
  bool inverse = false;  // rotate by the negative angle: the backward of the rotation
};

// Causal softmax attention in the f64-accumulated form a scalar trainer computes: every score
// is one f64 dot product over qk_dim rounded to f32 and scaled, exp in f32, the normaliser
// summed in f64, outputs summed over keys in index order (y += p_j inv v_j). Query head h of
// token t (position p) at attention position p, seeing positions [p - window, p]; K/V head h,
// position p of its row's view (prefix then own keys, kv_dim floats per position).
// paired_heads: a token holds two attention positions, 2p (heads [0, H/2)) and 2p + 1 (heads
// [H/2, H)); query head h sits at 2p + h / (H/2) and attends, per position j, K/V head
// h % (H/2) + (j % 2) (H/2) of token j / 2. key_offset: a key's dims [offset_from, qk_dim) come
// from the previous position's key (position 0 keeps its own). segment non-null: token i (of
// the call's N = B L) sees no key before position segment[i] of its row (the first position of
// its packed document; prefix keys too), as a packed training stream's documents attend only
// inside themselves (a key offset still reads across the boundary, as the seed's shifted keys
// do). Padded outputs are zeroed.
// bf16: the bf16 training path's request (GemmPrecision::bf16_all): a backend with tensor-core
// kernels for it (CUDA, heads up to 128 wide) rounds q, k, v and the backward's output gradient
// to bf16, sums products in f32 and rounds the probabilities to bf16 where they multiply values
// or queries (FlashAttention-2); the others, and wider heads, compute the f64 form above.
struct AttendF64Args {
  RowTable rows;
  const RowView* views = nullptr;  // [B]
  const float* q = nullptr;
  int64_t ldq = 0, hq = 0;
  float* out = nullptr;
  int64_t ldo = 0, ho = 0;
  int64_t heads = 0;
  int64_t qk_dim = 0, v_dim = 0, kv_dim = 0;
  float scale = 1.0f;
  int64_t window = 0;
  bool paired_heads = false;
  bool key_offset = false;
  int64_t offset_from = 0;
  const int32_t* segment = nullptr;  // [N] positions, on the backend's device, or null
  bool bf16 = false;
};

// Per head of each real token: y_h -= tanh(strength_h) (y_h . v_h / max(v_h . v_h, eps)) v_h
// (the component of y along v taken out, dots f64-accumulated). Heads at y + i ldy + h hy, the
// same for v; strength_h at strength[i lds + h]. Padded tokens are left as they are.
struct ProjectionArgs {
  RowTable rows;
  float* y = nullptr;
  int64_t ldy = 0, hy = 0;
  const float* v = nullptr;
  int64_t ldv = 0, hv = 0;
  const float* strength = nullptr;
  int64_t lds = 0;
  int64_t heads = 0;
  int64_t dim = 0;
  float eps = 1e-8f;
};

// ---- training: products and the backward of the ops above ----
// A backward op reads the forward's inputs (never its outputs unless it says so) and the output
// gradient, and ADDS into the input gradients it is given (null: not wanted). Gradients that sum
// over rows (weights, biases, gates) sum them in row order, each element by one thread, so a
// result depends on the rows given and not on how the backend splits the work.

// c[M, N] (+)= op(a) op(b) in f32: op(a) is a [M, K] at row stride lda, or with ta the
// transpose of a [K, M]; op(b) is b [K, N] at ldb, or with tb the transpose of b [N, K]. Each
// element sums its K products in one order fixed by the shape. precision bf16_all: a and b
// rounded to bf16 first (the products then exact), f32 accumulation; other values: f32.
// batch > 1: that many products of the same shape, product i over a + i stride_a, b + i stride_b
// into c + i stride_c (floats), each computed as it would be alone (a strided batch: one launch
// on CUDA, where a lone product of a small matrix would leave most of the GPU idle); with
// bf16_all each operand's matrices must lie back to back (stride = rows x ld).
struct MatmulOpArgs {
  const float* a = nullptr;
  int64_t lda = 0;
  bool ta = false;
  const float* b = nullptr;
  int64_t ldb = 0;
  bool tb = false;
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;
  GemmPrecision precision = GemmPrecision::exact;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// The backward of the unit-weight rms_norm (NormArgs with w null or ones, no gate): dx +=
// r (dy - y mean(dy y)) per vector with y = x r, r = 1 / sqrt(mean(x²) + eps), from x.
struct NormBackwardArgs {
  const float* x = nullptr;
  int64_t ldx = 0, hx = 0;
  const float* dy = nullptr;
  int64_t ldy = 0, hy = 0;
  float* dx = nullptr;
  int64_t lddx = 0, hdx = 0;
  int64_t rows = 0;
  int64_t heads = 1;
  int64_t dim = 0;
  float eps = 1e-6f;
};

// dx[r, j] += dy[r, j] act'(x[r, j]) for relu_squared, gelu_erf and scaled_sigmoid (a, b, c);
// without accumulate dx = dy act'(x), and dx may be dy.
struct ActivationBackwardArgs {
  const float* x = nullptr;
  int64_t ldx = 0;
  const float* dy = nullptr;
  int64_t ldy = 0;
  float* dx = nullptr;
  int64_t lddx = 0;
  int64_t rows = 0;
  int64_t n = 0;
  Activation act = Activation::relu_squared;
  float a = 1.0f, b = 0.0f, c = 1.0f;
  bool accumulate = true;  // false: dx = dy act'(x)
};

// out[j] (+)= s sum_r x[r, j] over `rows` rows in order (a bias's gradient: bias_scale's dbias
// with x = dy; its dx is the scale op).
struct ColumnSumArgs {
  const float* x = nullptr;
  int64_t ldx = 0;
  int64_t rows = 0;
  int64_t n = 0;
  float s = 1.0f;
  float* out = nullptr;
  bool accumulate = true;
};

// The backward of a combination (CombineArgs, same terms): for each term k with x_k, dx_k[r, j]
// += coef_k(r, g) dy[r, j]; dcoef_k[r, g] (+)= sum_{j in group g} dy[r, j] x_k[r, j] (summed in
// f64 in column order) for the terms given a dcoef. A term with x null (the output row itself)
// reads `y_before` (the output's value before the forward op) and adds its gradient into
// `dy_before`; when dy_before is dy (in place) it replaces dy, after every term has read it.
struct CombineGrad {
  float* dx = nullptr;  // [rows, n] at lddx, or null
  int64_t lddx = 0;
  float* dcoef = nullptr;  // [rows, groups] at ldc, or null
  int64_t ldc = 0;
};
struct CombineBackwardArgs {
  CombineArgs forward;  // the forward's terms (y unused)
  const float* dy = nullptr;
  int64_t ldy = 0;
  const float* y_before = nullptr;  // for a term with x null
  int64_t ldb = 0;
  float* dy_before = nullptr;
  int64_t lddb = 0;
  std::span<const CombineGrad> grads;  // one per term
};

// The backward of gather (GatherArgs with ids or id_lane, scale or row_scale, keep, mix 1, no
// soft rows): dtable[id] += scale_i dy[i] (a table row sums its positions in order), drow_scale[i]
// += dy[i] . table[id] (f64), and with keep the kept y passes dy through (the caller's). f32
// tables only.
struct GatherBackwardArgs {
  GatherArgs forward;
  const float* dy = nullptr;
  int64_t ldy = 0;
  float* dtable = nullptr;      // [V, C] contiguous, or null
  float* drow_scale = nullptr;  // [n] at ld_drow, or null
  int64_t ld_drow = 0;
};

// The backward of sigmoid_gates: dz = dout s sigmoid(z) (1 - sigmoid(z)); dx += dz w_h[0:n],
// dx2 += dz w_h[n:2n]; dw_h (+)= sum_r dz x[r] (and x2) in row order.
struct SigmoidGatesBackwardArgs {
  SigmoidGateArgs forward;  // out unused
  const float* dout = nullptr;
  int64_t lddo = 0;
  float* dx = nullptr;
  int64_t lddx = 0;
  float* dx2 = nullptr;
  int64_t lddx2 = 0;
  float* dw = nullptr;  // laid out as w
};

// The backward of subtract_projection (y' = y - tanh(s) (y.v / max(v.v, eps)) v): from the y
// before the op, v, s and dy': dy (+)= ..., dv +=, dstrength += (per real token and head).
struct ProjectionBackwardArgs {
  ProjectionArgs forward;  // forward.y: the y before the op
  const float* dy_out = nullptr;
  int64_t lddo = 0;
  float* dy = nullptr;  // may be dy_out (in place)
  int64_t lddy = 0;
  float* dv = nullptr;
  int64_t lddv = 0;
  float* dstrength = nullptr;
  int64_t ldds = 0;
};

// The backward of ngram_embed: dtable[row] += dy[i] * pool[sign] for both hashed rows of every
// token (a table row sums its contributions in token order, bigram before trigram).
struct NgramBackwardArgs {
  NgramEmbedArgs forward;  // y unused; f32 table
  const float* dy = nullptr;
  int64_t ldy = 0;
  float* dtable = nullptr;  // [V, dim]
};

// The backward of attention_f64 for the real tokens of the rows: dq (+)=, and for every key a
// query saw, dK / dV (+)= into the gradient views laid out as the forward's K/V views (dviews
// [B]: prefix_k / prefix_v / own_k / own_v are the gradient buffers). Probabilities are
// recomputed as the forward computes them; a key's gradient sums its queries in order.
struct AttendF64BackwardArgs {
  AttendF64Args forward;  // out unused
  const float* dout = nullptr;
  int64_t lddo = 0, hdo = 0;
  float* dq = nullptr;
  int64_t lddq = 0, hdq = 0;
  const RowView* dviews = nullptr;  // [B]
};

// ---- training: optimizer steps (src/train/optim.cc composes them) ----

// Polar Express's first step over `count` blocks of n floats at x + i n: x_i *= float(1 /
// (sqrt(s_i) (1 + margin) + eps)) with s_i the sum of x_i² as sum_squares sums it and the factor
// in f64, rounded once; on the backend, nothing coming back to the host (sum_squares then scale
// give the same bits, but wait for the sum).
struct FrobeniusNormalizeArgs {
  float* x = nullptr;
  int64_t n = 0;
  int64_t count = 1;
  double margin = 0.0, eps = 0.0;
};

// Adam with cautious weight decay over n elements, then g = 0: m = b1 m + (1 - b1) g; v = b2 v +
// (1 - b2) g²; u = m / (sqrt(v) + eps) step_size; u += p wd where u p > 0; p -= u.
struct AdamStepArgs {
  float* p = nullptr;
  float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
  float beta1 = 0.9f, beta2 = 0.99f, eps = 1e-10f;
  float step_size = 0.0f, wd = 0.0f;
};

// Nesterov momentum over n elements: buf += (1 - momentum) (g - buf); u = g + momentum (buf - g).
struct NesterovArgs {
  const float* g = nullptr;
  float* buf = nullptr;
  float* u = nullptr;
  int64_t n = 0;
  float momentum = 0.95f;
};

// NorMuon's step of one [rows, cols] block from its orthogonalised update u: the mean square of
// each row (rows >= cols) or column, the second moment `second` += (1 - beta2) (mean - second),
// u scaled by rsqrt(max(second, 1e-10)) and renormalised to u's own norm, then p -= lr u with
// cautious weight decay (p wd lr where the update and p agree in sign).
struct NorMuonStepArgs {
  const float* u = nullptr;
  float* p = nullptr;
  float* second = nullptr;  // [rows >= cols ? rows : cols]
  int64_t rows = 0, cols = 0;
  float beta2 = 0.9f, lr = 0.0f, wd = 0.0f;
};

// ---- softcap_cross_entropy: the gpt training loss (seed 003 GPT._loss) ----

// Multi-token weights one call takes at most.
constexpr int kMaxMtpWeights = 8;

// Soft-capped cross entropy over T rows: logits z = xn W^T, soft-capped to s = a sigmoid((z + b)
// / c). Row t's terms are (targets[t + k], mtp_weights[k]) for k < mtp where t + k < T and the
// target is in [0, V), plus (prefix[t], prefix_weight) where prefix is set, prefix_weight != 0 and
// prefix[t] is in [0, V). loss[t] = sum over the terms of weight (lse - s[target]), lse =
// log sum_v exp(s_v) taken with the fixed maximum a (s < a); a row without terms has loss 0.
// dxn / dw non-null: the gradient of the mean loss (sum_t loss[t]) / T is ADDED to them, through
// the soft cap: dz_v = (sum of weights p_v - weights on v) / T * a / c * u (1 - u), u = s / a.
//
// Rows go in chunks of R (each chunk's [R, V] logits the only ones that exist: at most 64 MiB
// of f32), chunk by chunk from row 0. loss[t] depends on row t's inputs only (batch invariant);
// dxn rows likewise; dw sums the chunks' products in chunk order, so it is deterministic for a
// given T. bf16: a backend may round the products' operands (xn, W — an f32 W too — and dz) to
// bf16 with f32 accumulation, as GemmPrecision::bf16 / bf16_all; the CPU computes in f32 either
// way (a bf16 W widened exactly).
struct SoftcapCrossEntropyArgs {
  const float* xn = nullptr;  // [T, C] at row stride ldx
  int64_t ldx = 0;
  const Tensor* w = nullptr;         // [V, C] f32 or bf16, contiguous, on the backend's device
  const int32_t* targets = nullptr;  // [T] (-1: none)
  const int32_t* prefix = nullptr;   // [T] (-1: none) or null
  int64_t rows = 0;                  // T
  float a = 23.0f, b = 5.0f, c = 7.5f;
  std::array<float, kMaxMtpWeights> mtp_weights{1.0f};  // weight of target t + k
  int64_t mtp = 1;                                      // how many of mtp_weights are used
  float prefix_weight = 0.0f;
  float* loss = nullptr;  // [T]
  float* dxn = nullptr;   // [T, C] at row stride lddx, or null
  int64_t lddx = 0;
  float* dw = nullptr;  // [V, C] f32, or null
  bool bf16 = false;
};

// Rows per chunk of softcap_cross_entropy for a vocabulary of V: the [R, V] f32 logits within
// 64 MiB (a multiple of 64 rows where V allows, at least 1).
int64_t softcap_cross_entropy_chunk(int64_t V);
// Row r of logit_picks, in index order (the CPU backends').
void logit_picks_row(const LogitPicksArgs& a, int64_t r);

// The backend: one implementation per device. Every op runs over its whole argument and returns
// when the results are visible to the next op on the same backend.
class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
  // Memory the backend owns (model state: K/V, recurrent state, conv tails): zero-filled, of
  // `shape` and `dtype`, on the backend's device.
  virtual Tensor alloc(const Shape& shape, DType dtype) const = 0;
  // A host tensor the backend reads (a model weight, a document's hidden states) on its device:
  // a host backend returns `host` itself (a view, never a copy); a device backend copies it once
  // into its memory (contiguous; any dtype).
  virtual Tensor upload(const Tensor& host) const { return host; }
  // Bytes between host memory and the backend's memory (a host backend: memcpy). to_host waits
  // for the ops before it.
  virtual void to_device(void* dst, const void* src, size_t bytes) const {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  virtual void to_host(void* dst, const void* src, size_t bytes) const {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  // Waits until every op enqueued so far has finished (the CPU's ops finish before returning).
  virtual void synchronize() const {}

  virtual void gemm(const GemmArgs& a) const = 0;
  virtual void rms_norm(const NormArgs& a) const = 0;
  virtual void l2_norm(const L2NormArgs& a) const = 0;
  virtual void rope(const RopeArgs& a) const = 0;
  virtual void kv_write(const KvWriteArgs& a) const = 0;
  virtual void attention(const AttendArgs& a) const = 0;
  virtual void causal_conv(const ConvArgs& a) const = 0;
  virtual void delta_gates(const DeltaGatesArgs& a) const = 0;
  virtual void delta_rule(const DeltaRuleOpArgs& a) const = 0;
  virtual void glu(const GluArgs& a) const = 0;
  virtual void binary(const BinaryArgs& a) const = 0;
  virtual void scale(const ScaleArgs& a) const = 0;
  virtual void gather(const GatherArgs& a) const = 0;
  virtual void softcap(const SoftcapArgs& a) const = 0;
  virtual void logit_picks(const LogitPicksArgs& a) const = 0;
  // y[r, 0:n] = x[r, 0:n] for `rows` rows (strided copies; rows may overlap only when y <= x
  // row by row, as when packing rows to the front of their own buffer).
  virtual void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                         int64_t n) const = 0;
  // y[i] = x[index[i]] for i < rows: whole rows of n floats, x at row stride ldx, y at ldy;
  // index (int32) in the backend's memory. x and y do not overlap.
  virtual void gather_rows(const float* x, int64_t ldx, const int32_t* index, float* y, int64_t ldy,
                           int64_t rows, int64_t n) const = 0;
  // y[j, i] = x[i, j]: x [rows, cols] at row stride ldx into y [cols, rows] at row stride ldy
  // (a checkpoint's [F, C] matrix into the [C, F] a product reads). x and y do not overlap.
  virtual void transpose(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                         int64_t cols) const = 0;
  virtual void activation(const ActivationArgs& a) const = 0;
  virtual void bias_scale(const BiasScaleArgs& a) const = 0;
  virtual void combine(const CombineArgs& a) const = 0;
  virtual void shift_ids(const ShiftIdsArgs& a) const = 0;
  virtual void ngram_embed(const NgramEmbedArgs& a) const = 0;
  virtual void sigmoid_gates(const SigmoidGateArgs& a) const = 0;
  virtual void rope_pairs(const RopePairsArgs& a) const = 0;
  virtual void attention_f64(const AttendF64Args& a) const = 0;
  virtual void subtract_projection(const ProjectionArgs& a) const = 0;
  // The gpt training loss and its gradient (SoftcapCrossEntropyArgs).
  virtual void softcap_cross_entropy(const SoftcapCrossEntropyArgs& a) const = 0;

  // Whether fork rows should keep their delta-rule state as history (DeltaRuleHistory): where a
  // decode step is bound by reading and writing each row's state (CUDA).
  virtual bool prefers_delta_history() const { return false; }

  // Training (the CPU and CUDA backends; another backend says it has none).
  virtual void matmul(const MatmulOpArgs&) const { no_training_op("matmul"); }
  virtual void rms_norm_backward(const NormBackwardArgs&) const {
    no_training_op("rms_norm_backward");
  }
  virtual void activation_backward(const ActivationBackwardArgs&) const {
    no_training_op("activation_backward");
  }
  virtual void column_sum(const ColumnSumArgs&) const { no_training_op("column_sum"); }
  virtual void combine_backward(const CombineBackwardArgs&) const {
    no_training_op("combine_backward");
  }
  virtual void gather_backward(const GatherBackwardArgs&) const {
    no_training_op("gather_backward");
  }
  virtual void sigmoid_gates_backward(const SigmoidGatesBackwardArgs&) const {
    no_training_op("sigmoid_gates_backward");
  }
  virtual void subtract_projection_backward(const ProjectionBackwardArgs&) const {
    no_training_op("subtract_projection_backward");
  }
  virtual void ngram_embed_backward(const NgramBackwardArgs&) const {
    no_training_op("ngram_embed_backward");
  }
  virtual void attention_f64_backward(const AttendF64BackwardArgs&) const {
    no_training_op("attention_f64_backward");
  }
  virtual void adam_step(const AdamStepArgs&) const { no_training_op("adam_step"); }
  virtual void nesterov(const NesterovArgs&) const { no_training_op("nesterov"); }
  virtual void normuon_step(const NorMuonStepArgs&) const { no_training_op("normuon_step"); }
  // sum x[i]² over n in f64, in one order fixed by n (a host value: the op waits for it).
  virtual double sum_squares(const float*, int64_t) const { no_training_op("sum_squares"); }
  virtual void frobenius_normalize(const FrobeniusNormalizeArgs&) const {
    no_training_op("frobenius_normalize");
  }

 protected:
  [[noreturn]] void no_training_op(const char* op) const;
};

// Host backends' bf16 operands (NormArgs::yb, GluArgs::outb, GemmArgs::xb): `run` computes the
// op in f32 into scratch laid out as the bf16 output, whose values are then rounded once (nearest
// even); a GEMM's bf16 rows are widened to f32 exactly first (their rounding is then the
// identity).
void rms_norm_via_f32(const NormArgs& a, const std::function<void(const NormArgs&)>& run);
void glu_via_f32(const GluArgs& a, const std::function<void(const GluArgs&)>& run);
void gemm_via_f32(const GemmArgs& a, const std::function<void(const GemmArgs&)>& run);
// Every backend's check of GemmArgs::xb: bf16 dot products with bf16 weights only.
void check_bf16_rows(const GemmArgs& a);
// Every backend's reading of L2NormArgs::unscaled_heads (checked): the heads that take post_scale.
int64_t scaled_heads(const L2NormArgs& a);

// The CPU backend (src/kernels/cpu): AVX-512 / AVX2 / scalar kernels over the process thread
// pool.
const Ops& cpu_ops();
// The CUDA backend (src/kernels/cuda): cuBLASLt GEMMs and own kernels on the first visible GPU,
// every op enqueued in order on one stream. Throws deg::Error without a CUDA build or a GPU.
const Ops& cuda_ops();
// The backend of `device`.
const Ops& ops_for(Device device);
// `t` in host memory: itself when it is there, else a contiguous copy (tests, tools).
Tensor host_copy(const Tensor& t);

// What every family call receives: the backend's ops and the call's scratch.
struct Exec {
  const Ops& ops;
  Arena& arena;
};

}  // namespace deg
