// One training step of the gpt family without an autograd framework, on the model's one
// definition (src/model/gpt.cc, gpt_attention.cc, gpt_backward.cc): the forward inference runs,
// kept for its backward. The whole-model loss and gradients are checked against PyTorch autograd
// of tools/reference/gpt_reference.py (tests/train_gpt_reference_test.cc) and by finite
// differences (tests/train_gradcheck_test.cc); each op's backward by finite differences
// (tests/ops_backward_test.cc).
//
// A batch is one packed token stream (the seed's B = 1 varlen layout): attention runs inside
// segments (seg_start), while smear, n-gram hashes and multi-token targets read the stream as
// is, as the seed's do — one row of the model, its documents apart by attention segments. `deg
// train` packs documents with their fork queries: a query's tokens follow its document's last
// token (prev), continue its positions (pos) and see its keys (ctx_lo, ctx_hi) besides their own,
// exactly as the inference fork reads the trunk state — the documents become rows of one call
// and the queries rows of a second call that continues them.
//
// Letters: T tokens, C model dim, V vocab.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/gpt_params.h"
#include "train/loss.h"
#include "train/ops.h"

namespace deg::train {

struct GptBatch {
  std::vector<int32_t> inputs;     // [T]
  std::vector<int32_t> targets;    // [T] (-1: none)
  std::vector<int32_t> prefix;     // [T] prefix-token targets, or empty
  std::vector<int32_t> seg_start;  // [T] first position of each token's attention segment
  // The fork layout, all [T] or all empty (the stream as is: t - 1, t, no context range). A
  // segment's tokens follow each other (prev t - 1, pos + 1); a segment with a context range
  // continues the whole segment [ctx_lo, ctx_hi): its first token's prev is ctx_hi - 1 and its
  // pos the context's length; a segment without one starts at pos 0 with prev -1.
  std::vector<int32_t> prev;            // stream index of the token before this one, -1: none
  std::vector<int32_t> pos;             // position in its sequence
  std::vector<int32_t> ctx_lo, ctx_hi;  // keys [ctx_lo, ctx_hi) are visible too
  int64_t size() const { return int64_t(inputs.size()); }
};

// The parameters and their gradients resident in one backend's memory for a run of steps: a
// step's forward reads the parameters there and its backward and loss add into the gradients
// there, and the optimizer (a GptOptimizer over the same ops) updates both in place, so only the
// batch and the losses cross to and from a GPU. The host GptParams is brought up to date by
// download() (checkpoints, the end of a run). Tensors in params.tensors()' order and shapes.
struct GptResident {
  GptResident(const GptParams& params, const Ops& ops);
  const Ops* ops;
  std::vector<Tensor> values, grads;
  // Every tensor of `grads` is a view into this one zero-filled block, each at a 256-byte
  // boundary with the gaps left zero: a norm or a scale of all the gradients is one op (one
  // host wait for the norm, not one a tensor).
  Tensor grad_block;
  // The n-gram sign pool (a fixed buffer, not trained) on the backend, uploaded once for the run.
  Tensor sign_pool;
  std::vector<float*> value_ptrs();
  std::vector<float*> grad_ptrs();
  void download(GptParams& params) const;
};

struct GptStepOptions {
  std::vector<float> mtp_weights{1.0f};
  float prefix_weight = 0.0f;
  int64_t window_short = 0;  // attention windows (tokens)
  int64_t window_long = 0;
  // Where the model runs: on a GPU the step copies the parameters in and the gradients (added
  // to the host's) out, unless they are resident there.
  Device device = Device::cpu;
  // Non-null: the step reads the parameters from it (not the GptParams passed, whose buffers —
  // the sign pool and rotary state — it still reads) and adds the gradients into its gradients
  // (the host `grads` passed are not read or written: an empty vector will do). On o.device's
  // backend.
  GptResident* resident = nullptr;
  // The fork layout splits documents, and queries, into calls by length: each call costs its
  // padded tokens (rows x longest) plus this many (its launches); the split minimises the sum.
  // 0: a call per length.
  int64_t call_tokens = 512;
  // exact: f32 products throughout (what the PyTorch fixture checks). bf16_all: the layers' and
  // the loss's matrix products round their operands to bf16 with f32 accumulation (tensor cores
  // on a GPU); parameters, gradients and optimizer state stay f32 (GptTrainCall::precision).
  GemmPrecision precision = GemmPrecision::exact;
  // gpt_forward copies the final hidden state into acts.final_xn (heads on the host read it),
  // and the loss's d(final) comes back into the host's `dfinal`. false (pretraining: the loss runs
  // where the state is): both stay on the backend — no [T, C] copies each way a step — and
  // gpt_backward, given a null dfinal, reads the loss's from there.
  bool host_final = true;
};

// "f32" -> exact, "bf16" -> bf16_all (PretrainOptions::precision); throws invalid_argument
// otherwise.
GemmPrecision train_precision(const std::string& name);

// A forward kept for its backward: the model over the parameters, the pass's memory and tape.
// Reusing one GptActs for every step reuses its memory.
struct GptPass;
struct GptActs {
  GptActs();
  ~GptActs();
  GptActs(GptActs&&) noexcept;
  GptActs& operator=(GptActs&&) noexcept;
  Buf final_xn;  // [T, C] the final normed hidden state, in stream order
  std::unique_ptr<GptPass> pass;
  // The forward's calls and the tokens they ran over, padding included (a step's profile).
  int64_t calls() const;
  int64_t padded_tokens() const;
};

// The forward up to the final normed hidden state (acts.final_xn).
void gpt_forward(const GptParams& p, const GptBatch& b, const GptStepOptions& o, GptActs& acts);
// Mean loss of a batch (forward only); `work` (optional) is the pass's memory, kept for the next.
double gpt_loss(const GptParams& p, const GptBatch& b, const GptStepOptions& o,
                GptActs* work = nullptr);
// The mean loss of a forward (`acts` from gpt_forward) with d(final_xn) into `dfinal` [T, C]
// (with o.host_final; else kept in `acts` and dfinal left empty) and lm_head's gradient added
// into `grads`: the step between gpt_forward and gpt_backward. The loss runs on the forward's
// backend (softcap_cross_entropy), where its hidden state is.
double gpt_loss_of_forward(const GptParams& p, const GptBatch& b, const GptStepOptions& o,
                           GptActs& acts, Buf& dfinal, std::vector<ParamTensor>& grads);
// Mean loss, and its gradients added into `grads` (GptParams::zeros_like layout).
double gpt_loss_and_grad(const GptParams& p, const GptBatch& b, const GptStepOptions& o,
                         std::vector<ParamTensor>& grads, GptActs* work = nullptr);
// Soft-capped logits [T, V] of a batch's inputs (the inference conformance door).
Buf gpt_logits(const GptParams& p, const GptBatch& b, const GptStepOptions& o);

// The backward of gpt_forward given d(final_xn) [T, C] (null: the one gpt_loss_of_forward kept
// on the backend without o.host_final); adds into grads. `acts` is spent (its memory stays for
// the next gpt_forward).
void gpt_backward(const GptParams& p, const GptBatch& b, const GptStepOptions& o, GptActs& acts,
                  const float* dfinal, std::vector<ParamTensor>& grads);

}  // namespace deg::train
