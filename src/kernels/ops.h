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
#include "kernels/op_args.h"
#include "kernels/train_args.h"

namespace deg {

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
