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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace deg {

// Scratch of one call, from its backend: taken in order, released together by reset() (the
// memory is kept for the next use). Not zero-filled. Taken pointers stay valid until reset().
class Arena {
 public:
  explicit Arena(Device device = Device::cpu) : device_(device) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  Device device() const { return device_; }
  float* floats(int64_t n);
  void reset();

 private:
  struct Block {
    std::unique_ptr<float[]> data;
    size_t size = 0, used = 0;
  };
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

// What one layer sees of row b's state. Recurrent layers: start from rec_in/tail_in, write
// rec_out (always; it may equal rec_in) and tail_out (when non-null). Attention layers: keys are
// prefix [0, prefix_len) then own [0, own_before + t]; this call's K/V are written into own at
// own_before. Strides are per KV head, in elements (capacity * D). Sliding layers see only the
// keys a window can reach (prefix_len is the prefix's kept tail, own_before the own keys kept
// before this call); K/V-sharing layers see their source layer's view (and must not write it).
struct RowView {
  const float* rec_in = nullptr;
  float* rec_out = nullptr;
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
};

// ---- argument structs (one per op; designated initializers at call sites) ----

// y = rms_norm(x) * scale(w) for `rows` token rows of `heads` vectors of `dim` each: vector
// (r, h) at x + r * ldx + h * hx (hx 0: dim), the same in y. w null: unit weight. gate non-null:
// the gated form y = w * norm(x) * silu(gate) (gate laid out as y, strides ldg / hg).
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

// The real tokens' K and V (`kv_heads` heads of `dim`, contiguous per token at strides ldk /
// ldv) into each row's own K/V at own_before + t.
struct KvWriteArgs {
  RowTable rows;
  const RowView* views = nullptr;  // [B]
  const float* k = nullptr;
  int64_t ldk = 0;
  const float* v = nullptr;
  int64_t ldv = 0;
  int64_t kv_heads = 0;
  int64_t dim = 0;
};

// Causal softmax attention of every row over its prefix and own keys (this call's K/V already
// written): query head g of KV head h at q[(b L + t) ldq + (h group + g) D]; out the same
// layout at ldo; padded positions of out are zeroed. window > 0: sliding attention.
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
// ([Hv, Dk, Dv]) and ends in rec_out. Padded positions of out are zeroed.
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

enum class Activation : uint8_t { silu, gelu_tanh, sigmoid };

// out[r, i] = act(gate[r, i]) * up[r, i] for `rows` rows of n (strides in elements; out may
// alias gate or up). up null: out = act(gate) * out (a gate applied in place). Backends take
// silu and gelu_tanh with `up`, sigmoid without (the forms the families use).
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
// then times `mix` (when != 1). soft_rows non-null: position i with soft_rows[i] >= 0 copies
// soft[soft_rows[i]] ([n, C], contiguous) instead.
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
};

// y = cap * tanh(y / cap) over n values.
struct SoftcapArgs {
  float* y = nullptr;
  int64_t n = 0;
  float cap = 0;
};

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
  // y[r, 0:n] = x[r, 0:n] for `rows` rows (strided copies; rows may overlap only when y <= x
  // row by row, as when packing rows to the front of their own buffer).
  virtual void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                         int64_t n) const = 0;
};

// The CPU backend (src/kernels/cpu): AVX-512 / AVX2 / scalar kernels over the process thread
// pool.
const Ops& cpu_ops();

// What every family call receives: the backend's ops and the call's scratch.
struct Exec {
  const Ops& ops;
  Arena& arena;
};

}  // namespace deg
