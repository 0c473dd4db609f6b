// The training ops' argument structs (kernels/ops.h has the interface): the products, the
// backward of the forward ops (kernels/op_args.h), the optimizer steps and the training loss.
// Letters as kernels/ops.h's.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/op_args.h"

namespace deg {

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
// ab / bb / ab_out (bf16_all): a rounding handed from one op to the next, for a backend that
// rounds into device memory (CUDA): it writes a's rounding (packed [rows, cols] as stored, a
// batch back to back) to ab_out, a forward gemm's x to GemmArgs::xb_out, and reads ab / bb
// instead of rounding a / b again (the same bits). A backend that rounds as it goes (the CPU's)
// neither writes nor reads them, so a caller hands back only what the same backend wrote.
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
  const bf16* ab = nullptr;
  const bf16* bb = nullptr;
  bf16* ab_out = nullptr;
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

// Nesterov momentum over n elements: buf += (1 - momentum) (g - buf); u = g + momentum (buf - g);
// then g = 0 (the gradient is consumed, as adam_step's is). A batch (gs set): count vectors of n,
// vector j's gradient at gs[j] and buffer at bufs[j], its update at u + j n (the tables in the
// backend's memory, like the vectors); g and buf unused.
struct NesterovArgs {
  float* g = nullptr;
  float* buf = nullptr;
  float* u = nullptr;
  int64_t n = 0;
  float momentum = 0.95f;
  int64_t count = 1;
  float* const* gs = nullptr;    // [count]
  float* const* bufs = nullptr;  // [count]
};

// NorMuon's step of one [rows, cols] block from its orthogonalised update u: the mean square of
// each row (rows >= cols) or column, the second moment `second` += (1 - beta2) (mean - second),
// u scaled by rsqrt(max(second, 1e-10)) and renormalised to u's own norm, then p -= lr u with
// cautious weight decay (p wd lr where the update and p agree in sign). A batch (ps set): count
// blocks, block j's update at u + j rows cols, its parameters at ps[j], second moments at
// seconds[j] and rate lr lr_muls[j] (the tables in the backend's memory); each block as it is
// alone. p and second unused.
struct NorMuonStepArgs {
  const float* u = nullptr;
  float* p = nullptr;
  float* second = nullptr;  // [rows >= cols ? rows : cols]
  int64_t rows = 0, cols = 0;
  float beta2 = 0.9f, lr = 0.0f, wd = 0.0f;
  int64_t count = 1;
  float* const* ps = nullptr;       // [count]
  float* const* seconds = nullptr;  // [count]
  const float* lr_muls = nullptr;   // [count]
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

}  // namespace deg
