// A backend that wraps another: every op goes to `inner` through run(op name, call site, call),
// which a decorator overrides to add something around each op (a wait until the results are in
// memory, a timing). Memory and copies go straight to `inner`.
#pragma once

#include <functional>

#include "kernels/ops.h"

namespace deg {

// Where the op was called from: the return address of the decorator's (virtual, so never
// inlined) op method, an address in the caller's code (a profile names it with addr2line).
#define DEG_OP_SITE __builtin_return_address(0)

class OpsDecorator : public Ops {
 public:
  explicit OpsDecorator(const Ops& inner) : inner_(inner) {}
  const Ops& inner() const { return inner_; }

  Device device() const override { return inner_.device(); }
  bool prefers_delta_history() const override { return inner_.prefers_delta_history(); }
  const char* name() const override { return inner_.name(); }
  Tensor alloc(const Shape& s, DType t) const override { return inner_.alloc(s, t); }
  Tensor upload(const Tensor& host) const override { return inner_.upload(host); }
  void to_device(void* dst, const void* src, size_t bytes) const override {
    inner_.to_device(dst, src, bytes);
  }
  void to_host(void* dst, const void* src, size_t bytes) const override {
    inner_.to_host(dst, src, bytes);
  }
  void synchronize() const override { inner_.synchronize(); }

  void gemm(const GemmArgs& a) const override {
    run("gemm", DEG_OP_SITE, [&] { inner_.gemm(a); });
  }
  void rms_norm(const NormArgs& a) const override {
    run("rms_norm", DEG_OP_SITE, [&] { inner_.rms_norm(a); });
  }
  void l2_norm(const L2NormArgs& a) const override {
    run("l2_norm", DEG_OP_SITE, [&] { inner_.l2_norm(a); });
  }
  void rope(const RopeArgs& a) const override {
    run("rope", DEG_OP_SITE, [&] { inner_.rope(a); });
  }
  void kv_write(const KvWriteArgs& a) const override {
    run("kv_write", DEG_OP_SITE, [&] { inner_.kv_write(a); });
  }
  void attention(const AttendArgs& a) const override {
    run("attention", DEG_OP_SITE, [&] { inner_.attention(a); });
  }
  void causal_conv(const ConvArgs& a) const override {
    run("causal_conv", DEG_OP_SITE, [&] { inner_.causal_conv(a); });
  }
  void delta_gates(const DeltaGatesArgs& a) const override {
    run("delta_gates", DEG_OP_SITE, [&] { inner_.delta_gates(a); });
  }
  void delta_rule(const DeltaRuleOpArgs& a) const override {
    run("delta_rule", DEG_OP_SITE, [&] { inner_.delta_rule(a); });
  }
  void glu(const GluArgs& a) const override {
    run("glu", DEG_OP_SITE, [&] { inner_.glu(a); });
  }
  void binary(const BinaryArgs& a) const override {
    run("binary", DEG_OP_SITE, [&] { inner_.binary(a); });
  }
  void scale(const ScaleArgs& a) const override {
    run("scale", DEG_OP_SITE, [&] { inner_.scale(a); });
  }
  void gather(const GatherArgs& a) const override {
    run("gather", DEG_OP_SITE, [&] { inner_.gather(a); });
  }
  void softcap(const SoftcapArgs& a) const override {
    run("softcap", DEG_OP_SITE, [&] { inner_.softcap(a); });
  }
  void logit_picks(const LogitPicksArgs& a) const override {
    run("logit_picks", DEG_OP_SITE, [&] { inner_.logit_picks(a); });
  }
  void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                 int64_t n) const override {
    run("copy_rows", DEG_OP_SITE, [&] { inner_.copy_rows(x, ldx, y, ldy, rows, n); });
  }
  void gather_rows(const float* x, int64_t ldx, const int32_t* index, float* y, int64_t ldy,
                   int64_t rows, int64_t n) const override {
    run("gather_rows", DEG_OP_SITE, [&] { inner_.gather_rows(x, ldx, index, y, ldy, rows, n); });
  }
  void transpose(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                 int64_t cols) const override {
    run("transpose", DEG_OP_SITE, [&] { inner_.transpose(x, ldx, y, ldy, rows, cols); });
  }
  void activation(const ActivationArgs& a) const override {
    run("activation", DEG_OP_SITE, [&] { inner_.activation(a); });
  }
  void bias_scale(const BiasScaleArgs& a) const override {
    run("bias_scale", DEG_OP_SITE, [&] { inner_.bias_scale(a); });
  }
  void combine(const CombineArgs& a) const override {
    run("combine", DEG_OP_SITE, [&] { inner_.combine(a); });
  }
  void shift_ids(const ShiftIdsArgs& a) const override {
    run("shift_ids", DEG_OP_SITE, [&] { inner_.shift_ids(a); });
  }
  void ngram_embed(const NgramEmbedArgs& a) const override {
    run("ngram_embed", DEG_OP_SITE, [&] { inner_.ngram_embed(a); });
  }
  void sigmoid_gates(const SigmoidGateArgs& a) const override {
    run("sigmoid_gates", DEG_OP_SITE, [&] { inner_.sigmoid_gates(a); });
  }
  void rope_pairs(const RopePairsArgs& a) const override {
    run("rope_pairs", DEG_OP_SITE, [&] { inner_.rope_pairs(a); });
  }
  void attention_f64(const AttendF64Args& a) const override {
    run("attention_f64", DEG_OP_SITE, [&] { inner_.attention_f64(a); });
  }
  void subtract_projection(const ProjectionArgs& a) const override {
    run("subtract_projection", DEG_OP_SITE, [&] { inner_.subtract_projection(a); });
  }
  void matmul(const MatmulOpArgs& a) const override {
    run("matmul", DEG_OP_SITE, [&] { inner_.matmul(a); });
  }
  void rms_norm_backward(const NormBackwardArgs& a) const override {
    run("rms_norm_backward", DEG_OP_SITE, [&] { inner_.rms_norm_backward(a); });
  }
  void activation_backward(const ActivationBackwardArgs& a) const override {
    run("activation_backward", DEG_OP_SITE, [&] { inner_.activation_backward(a); });
  }
  void column_sum(const ColumnSumArgs& a) const override {
    run("column_sum", DEG_OP_SITE, [&] { inner_.column_sum(a); });
  }
  void combine_backward(const CombineBackwardArgs& a) const override {
    run("combine_backward", DEG_OP_SITE, [&] { inner_.combine_backward(a); });
  }
  void gather_backward(const GatherBackwardArgs& a) const override {
    run("gather_backward", DEG_OP_SITE, [&] { inner_.gather_backward(a); });
  }
  void sigmoid_gates_backward(const SigmoidGatesBackwardArgs& a) const override {
    run("sigmoid_gates_backward", DEG_OP_SITE, [&] { inner_.sigmoid_gates_backward(a); });
  }
  void subtract_projection_backward(const ProjectionBackwardArgs& a) const override {
    run("subtract_projection_backward", DEG_OP_SITE,
        [&] { inner_.subtract_projection_backward(a); });
  }
  void ngram_embed_backward(const NgramBackwardArgs& a) const override {
    run("ngram_embed_backward", DEG_OP_SITE, [&] { inner_.ngram_embed_backward(a); });
  }
  void attention_f64_backward(const AttendF64BackwardArgs& a) const override {
    run("attention_f64_backward", DEG_OP_SITE, [&] { inner_.attention_f64_backward(a); });
  }
  void adam_step(const AdamStepArgs& a) const override {
    run("adam_step", DEG_OP_SITE, [&] { inner_.adam_step(a); });
  }
  void nesterov(const NesterovArgs& a) const override {
    run("nesterov", DEG_OP_SITE, [&] { inner_.nesterov(a); });
  }
  void normuon_step(const NorMuonStepArgs& a) const override {
    run("normuon_step", DEG_OP_SITE, [&] { inner_.normuon_step(a); });
  }
  double sum_squares(const float* x, int64_t n) const override {
    double s = 0;
    run("sum_squares", DEG_OP_SITE, [&] { s = inner_.sum_squares(x, n); });
    return s;
  }
  void frobenius_normalize(const FrobeniusNormalizeArgs& a) const override {
    run("frobenius_normalize", DEG_OP_SITE, [&] { inner_.frobenius_normalize(a); });
  }

  void softcap_cross_entropy(const SoftcapCrossEntropyArgs& a) const override {
    run("softcap_cross_entropy", DEG_OP_SITE, [&] { inner_.softcap_cross_entropy(a); });
  }

 protected:
  // Runs one op (`call`), named `op`, called from `site` (DEG_OP_SITE).
  virtual void run(const char* op, const void* site, const std::function<void()>& call) const = 0;

 private:
  const Ops& inner_;
};

}  // namespace deg
