// The op interface's shared data and the forward ops' argument structs (kernels/ops.h has the
// interface itself, the conventions every op keeps — strides, padded rows, batch invariance —
// and the letters: B rows, L tokens per row, N = B L token rows, H heads, D head dim, K conv
// kernel). The training ops' arguments are in kernels/train_args.h.
#pragma once

#include <cstddef>
#include <cstdint>
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

}  // namespace deg
