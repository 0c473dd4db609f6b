// The Family contract and the machinery every backbone family shares (DESIGN.md §2, seed
// `Family` / `Backbone` / `State` / `ForkState`): a hybrid stack of state-carrying layers
// (recurrent state + causal-conv tail per row) and attention layers (K/V per row), run three ways:
//
//   prefill(ids, lengths, state)      trunk: reads long inputs in chunks (O(L) memory, no length
//                                     cap), extending `state` in place (consume: the incoming
//                                     prefix is not kept beside its extension)
//   fork(prefixes, rows, capacity)    fork rows that continue prefixes BY REFERENCE (no per-row
//                                     copy of a context; several prefixes in one batch)
//   fork_forward(ids, lengths, fs, keep)   the rows' own tokens; `keep` stores each row's state
//                                     for continued decoding (a decode step is fork_forward with
//                                     one token per row and keep; the seed's DecodeGraph is a
//                                     CUDA-graph replay of exactly that)
//   lm_logits(hidden)
//
// A Family (qwen35.cc, later lfm2/gemma4/gpt) supplies only its math: embedding, one layer given
// per-row views of its state, the final norm, the LM head. Trunk rows and fork rows go through
// the SAME layer code: a trunk row's "own" K/V buffer is the state itself, a fork row's prefix is
// another state's buffer. Every op is per row (GEMMs with a row-count-independent reduction order,
// per-row norms, conv, delta rule and attention), so a row's outputs are bitwise the same alone,
// in any batch, in any order. Inputs are right-padded; a padded position reads and writes no
// state (beta = 0, g = 0, masked in attention: kernels only see a row's real positions).
//
// Two attention variants a family may declare per layer: sliding attention (LayerSpec::window:
// a query sees its last `window` positions, itself included; trunk states keep only each row's
// last window - 1 positions and back to a multiple of 64 (RowView::skipped says how many went),
// so prefill of a long input and a fork over it stay bounded) and
// K/V sharing (LayerSpec::kv_source: the layer owns no K/V and attends an earlier layer's, in
// trunk and fork alike; that layer writes this call's K/V first).
//
// Letters: B rows, L tokens of this call, C hidden, V vocab, P prefix positions, H heads, D head
// dim, K conv kernel. Activations and state are f32, on the family's backend (kernels/ops.h: the
// CPU, or a GPU); token ids, row tables and results are host memory.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"

namespace deg {

enum class LayerKind : uint8_t { recurrent, attention };

// The per-row state one layer keeps, declared by the family.
struct LayerSpec {
  LayerKind kind = LayerKind::recurrent;
  Shape rec_shape;  // recurrent: per-row recurrent state (e.g. [Hv, Dk, Dv]); may be {}
  // recurrent, a delta rule's state (rec_shape [Hv, Dk, Dv]): its key heads, so that fork rows
  // can carry the state as history (DeltaRuleHistory); 0: not a delta rule.
  int64_t delta_k_heads = 0;
  int64_t conv_channels = 0;  // recurrent: conv tail [K-1, conv_channels]
  int64_t conv_kernel = 0;
  int64_t kv_heads = 0;  // attention: K/V [Hkv, capacity, D]
  int64_t head_dim = 0;
  int64_t window = 0;  // attention: > 0 sliding over the last `window` positions (itself included)
  int kv_source = -1;  // attention: >= 0 reads that earlier layer's K/V (same Hkv, D, window)
};

struct BackboneSpec {
  std::string family;  // "qwen3_5"
  int64_t hidden = 0;  // C
  int64_t vocab = 0;   // V
  // S: floats per token of the residual stream a family's layers see (>= C). Lanes [0, C) are
  // the hidden state; a family may keep per-token side streams after them (an x0 copy, saved
  // layer outputs, per-layer embeddings), written by embed and read by its layers. 0 means C.
  int64_t stream = 0;
  // Token ids before a call's first token that the family's embedding reads (smear gates, n-gram
  // hashes): each state keeps its rows' last `history` ids. 0: tokens are embedded alone.
  int64_t history = 0;
  std::vector<LayerSpec> layers;
  float logit_softcap = 0;  // > 0: lm_logits returns cap * tanh(logits / cap)
  // Soft tokens (media read as precomputed embeddings, TokenBatch::soft): the id that stands at a
  // soft position, which the family's embedding may still read (HF Gemma 4: the text pad id, for
  // the per-layer embedding lookup); -1: the family reads no soft tokens.
  int32_t soft_id = -1;
  // The media kinds the family reads as soft tokens, with the ids its prompt wraps them in and
  // the placeholder id HF marks their positions with.
  struct Media {
    std::string kind;  // "image", "audio"
    int32_t open = -1, placeholder = -1, close = -1;
  };
  std::vector<Media> media;

  int64_t stream_width() const { return stream > 0 ? stream : hidden; }
};

// One layer's state for B rows. Unused members stay undefined (k/v of a K/V-sharing layer).
// A sliding layer's trunk K/V hold each row's last positions at [0, ..): the last window - 1 and
// before them back to a multiple of 64 (at most 63 more), or all when there are fewer.
struct LayerState {
  Tensor rec;   // f32 [B, rec_shape...]
  Tensor tail;  // f32 [B, K-1, conv_channels]
  Tensor k;     // f32 [B, Hkv, capacity, D]
  Tensor v;     // f32 [B, Hkv, capacity, D]
  // Fork rows' delta-rule histories (ForkState::hist_cap): f32 [B, Hk, cap, Dk], [B, Hv, cap,
  // Dv], [B, Hv, cap].
  Tensor hist_k, hist_d, hist_g;
};

// Trunk state of B rows: row b has read lengths[b] tokens (its next position); its K/V are
// positions [0, lengths[b]) of its K/V buffers (sliding layers: the kept last ones, above).
struct State {
  std::vector<int64_t> lengths;  // [B]
  int64_t capacity = 0;          // K/V positions allocated per row (full-attention layers)
  std::vector<LayerState> layers;
  std::vector<int32_t> history;  // [B, spec.history] each row's last ids, oldest first

  int64_t rows() const { return int64_t(lengths.size()); }
  State clone() const;         // a deep copy (prefill extends its state in place)
  State row(int64_t b) const;  // a deep copy of row b alone (a state of one row)
};

// One row of one trunk state, read by reference by fork rows.
struct PrefixRef {
  const State* state = nullptr;
  int64_t row = 0;
};

// B fork rows. Row b continues prefix prow[b]; the prefixes' buffers are shared (Tensor views
// keep them alive), never copied per row, so a prefix's state must not change (no prefill into
// it) while fork rows read it: rows that carry their delta-rule states as history read the
// prefix's on every pass. Own K/V hold the rows' own tokens; own recurrent state and conv tails
// exist once a pass ran with keep (before that, rows read the prefix's).
struct ForkState {
  struct Prefix {
    std::vector<LayerState> layers;  // views of the prefix state (all its rows)
    int64_t row = 0;                 // which row of those views
    int64_t length = 0;              // its positions
    std::vector<int32_t> history;    // [spec.history] its last ids
  };
  std::vector<Prefix> prefixes;
  std::vector<int64_t> prow;     // [B] prefix of each row
  std::vector<int64_t> own_len;  // [B] own tokens kept so far
  int64_t capacity = 0;          // own K/V positions per row
  std::vector<LayerState> own;   // rec/tail [B, ...] once kept; k/v [B, Hkv, capacity, D]
  bool fresh = true;  // rows still start from the prefix's tail (and, without hist_cap, rec)
  // > 0 (a backend that prefers it, Ops::prefers_delta_history): each row carries its delta-rule
  // states as the prefix's plus a history of its own tokens (own hist_*), up to hist_cap tokens;
  // a kept pass past that folds the row's state into own rec, and the row goes on from there
  // (owns_rec). Results are those of the state form (bitwise where the backend prefers it).
  int64_t hist_cap = 0;
  Tensor scratch;  // [B, the largest rec_shape]: states no one reads back

  // With hist_cap > 0: whether row b's delta-rule states are own rec (its kept tokens passed its
  // history), not the prefix's plus a history.
  bool owns_rec(int64_t b) const { return own_len[size_t(b)] > hist_cap; }

  std::vector<int32_t> own_history;  // [B, spec.history] once kept (fresh: the prefix's)

  int64_t rows() const { return int64_t(prow.size()); }
};

// Soft tokens of a batch: position p = b * L + t reads row rows[p] of `embeddings` (f32 [n, C])
// instead of its id's embedding when rows[p] >= 0. Empty rows: every position is a token id.
struct SoftTokens {
  std::vector<int32_t> rows;  // [B * L]: -1, or a row of embeddings
  Tensor embeddings;          // f32 [n, C]

  bool empty() const { return rows.empty(); }
};

// Token ids [B, L] right-padded, with each row's real length.
struct TokenBatch {
  std::vector<int32_t> ids;      // [B * L]
  int64_t rows = 0;              // B
  int64_t tokens = 0;            // L
  std::vector<int64_t> lengths;  // [B], each in [0, L]
  SoftTokens soft;               // media positions (spec().soft_id >= 0 only)

  static TokenBatch single(const std::vector<int32_t>& ids);
  static TokenBatch padded(const std::vector<std::vector<int32_t>>& rows, int32_t pad_id = 0);
};

// What embed_rows sees: B rows of L ids, each row's position and the ids before it.
struct EmbedCall {
  const int32_t* ids = nullptr;      // [B, L] right-padded
  RowTable rows;                     // lengths and positions of the call's rows
  const int32_t* history = nullptr;  // [B, spec.history] ids before each row, oldest first (only
                                     // the last min(position, history) are real)
  float* h = nullptr;                // [B, L, S]
  // [B, L] or null: entries >= 0 are soft tokens, that row of `soft` ([n, C]) is the position's
  // embedding (its id is spec().soft_id). Only families with spec().soft_id >= 0 see them.
  const int32_t* soft_rows = nullptr;
  const float* soft = nullptr;
};

struct LayerCall {
  float* h = nullptr;  // [B, L, S] residual stream (spec().stream_width()), updated in place
  RowTable rows;       // B, L, each row's real tokens and first position
  const RowView* views = nullptr;  // [B] the rows' state for this layer
  GemmPrecision precision = GemmPrecision::exact;
};

// A family's math, written once over the op interface (kernels/ops.h): every method gets the
// call's Exec (backend ops + scratch arena) and loops over nothing itself.
class Family {
 public:
  // `ops`: the backend the family's weights live on and its calls run on.
  explicit Family(const Ops& ops = cpu_ops()) : ops_(&ops) {}
  virtual ~Family() = default;
  const Ops& ops() const { return *ops_; }
  virtual const BackboneSpec& spec() const = 0;
  // The embedding of a call -> call.h [B, L, S].
  virtual void embed_rows(const Exec& x, const EmbedCall& call) const = 0;
  // One layer (mixer + MLP, both residual) over call.h; padded positions' outputs are zeros or
  // finite garbage, never read back into state.
  virtual void layer(const Exec& x, int index, const LayerCall& call) const = 0;
  // h: n tokens [n, C] (lanes [0, C) of the stream, contiguous) -> out [n, C]
  virtual void final_norm(const Exec& x, const float* h, float* out, int64_t n) const = 0;
  virtual const Tensor& lm_head() const = 0;  // [V, C]
  // Logits as the family's loss sees them, in place over n values of h lm_head^T (e.g. a soft
  // cap); the default keeps the plain linear head.
  virtual void finish_logits(const Exec& /*x*/, float* /*logits*/, int64_t /*n*/) const {}

 private:
  const Ops* ops_;
};

using PrefillProgress = std::function<void(int64_t done, int64_t total)>;

enum class ForkHistory : uint8_t { preferred, always, never };

struct BackboneOptions {
  GemmPrecision precision = GemmPrecision::exact;
  // When set and the backbone lands on a GPU: the precision there instead (the engine's
  // default, bf16 dot products on CUDA and exact ones on the CPU, also when `auto` picks the
  // CPU).
  std::optional<GemmPrecision> cuda_precision;
  // Where the weights, the state and every call live (the family is built for it). Results
  // (hidden states, logits) come back to host memory.
  Device device = Device::cpu;
  // Prefill tokens per pass through the stack (a multiple of 64); 0: the device's default, 512
  // on the CPU (scratch stays small), 8192 on a GPU (a pass fills the GPU).
  int64_t read_chunk = 0;
  // Whether fork rows carry their delta-rule states as history (ForkState::hist_cap): where the
  // backend prefers it (CUDA, where the results are bitwise those of states of their own),
  // always (on the CPU, appends run the recurrence where states of their own run the chunked
  // form: the same results to rounding), or never.
  ForkHistory fork_history = ForkHistory::preferred;
};

class Backbone {
 public:
  Backbone(std::unique_ptr<Family> family, BackboneOptions options = {});

  const BackboneSpec& spec() const { return family_->spec(); }
  const Family& family() const { return *family_; }
  const BackboneOptions& options() const { return options_; }
  void set_options(const BackboneOptions& options) {
    options_ = options;
    options_.device = ops_->device();  // fixed when the family was built
  }

  State empty_state(int64_t rows) const;
  // Tokens of each row that prefill reads per pass through the stack (options().read_chunk, or
  // the device's default): a batch of B rows of L tokens with B x L at most this is one pass.
  int64_t read_chunk() const;
  // Reads batch on top of `state` (rows must match) and extends it in place -> final-norm hidden
  // f32 [B, L, C], in host memory, or where the backend computes with on_backend (device memory
  // on a GPU: nothing comes back to the host). Long inputs run options().read_chunk tokens at a
  // time; `progress` (may be empty) hears (tokens read, L) after each chunk.
  Tensor prefill(const TokenBatch& batch, State& state, const PrefillProgress& progress = {},
                 bool on_backend = false) const;

  // Fork rows: row b continues prefixes[prow[b]]; own K/V room for `capacity` tokens of each row,
  // fixed here (a pass that would exceed it throws): decode never reallocates.
  ForkState fork(const std::vector<PrefixRef>& prefixes, const std::vector<int64_t>& prow,
                 int64_t capacity) const;
  // The rows' next tokens -> final-norm hidden [B, L, C]. keep: store each row's state after its
  // real tokens (continued decoding). decode (one token per row) is a scheduling hint only: the
  // numerics are the same. picks (token indices b L + t): only those tokens' hidden states, [P, C]
  // in that order (the rest are never normed or copied back: a head reads a few per row).
  Tensor fork_forward(const TokenBatch& batch, ForkState& fs, bool keep, bool decode = false,
                      std::span<const int64_t> picks = {}) const;

  // hidden [M, C] (any leading shape) -> logits f32 [M, V]
  Tensor lm_logits(const Tensor& hidden) const;
  // Greedy decoding's reading of lm_logits(hidden), row by row (Ops::logit_picks), where the
  // logits are: only these figures come back from a GPU, not [M, V].
  struct LogitPick {
    int32_t best = -1, second = -1;  // first indices of the largest and next finite logits
    float best_logit = 0, second_logit = 0;
    double max = 0, sum = 0;  // softmax normaliser: Σ exp(l - max) over finite logits
    bool bad = false;         // a NaN or +inf logit
    // log softmax of the logit l (best_logit or second_logit).
    double log_prob(float l) const { return std::log(std::exp(double(l) - max) / sum); }
  };
  // id_limit: only tokens [0, id_limit) compete and count in the normaliser (those a tokenizer
  // can write, text::Tokenizer::id_limit: a model's vocabulary is often padded past them);
  // nullopt: the whole vocabulary.
  std::vector<LogitPick> lm_picks(const Tensor& hidden,
                                  std::optional<int64_t> id_limit = std::nullopt) const;

 private:
  void run_layers(const Exec& x, const TokenBatch& batch, int64_t offset, const RowTable& rows,
                  const int32_t* history, const std::vector<std::vector<RowView>>& views,
                  float* hidden_out, int64_t out_tokens, bool out_on_backend = false,
                  std::span<const int32_t> picks = {}) const;

  Exec call_exec() const;  // the backend's ops and this thread's call arena
  // lm_logits' product, in the backend's memory: host_out on the CPU, the call arena on a GPU.
  const float* logits_on_backend(const Exec& exec, const Tensor& hidden, float* host_out) const;
  Arena& io_arena() const;  // this thread's arena for a call's inputs and outputs on the device

  std::unique_ptr<Family> family_;
  BackboneOptions options_;
  const Ops* ops_;
};

// One token sequence end to end (the `deg forward` door): final-norm hidden [T, C], or logits
// [T, V] when `logits`. fork_at K in (0, T): the first K ids are prefilled as a trunk and the rest
// run as one fork row over it; the result must equal the plain forward (to rounding).
// Soft tokens where `ids` hold a media placeholder of `spec` (HF's layout: a run of image /
// audio placeholder ids per media part), reading the rows of `embeddings` (f32 [n, C]) in
// order. Throws deg::Error when the counts differ or the family reads no media.
SoftTokens soft_at_placeholders(const BackboneSpec& spec, const std::vector<int32_t>& ids,
                                Tensor embeddings);

// soft: the sequence's soft tokens (rows [T]), or null.
Tensor backbone_forward(const Backbone& backbone, const std::vector<int32_t>& ids, bool logits,
                        int64_t fork_at = 0, const SoftTokens* soft = nullptr);

}  // namespace deg
