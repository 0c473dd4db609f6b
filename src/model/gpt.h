// The `gpt` family (seed 003, the modded-nanogpt "track 1 short" GPT that `deg pretrain` trains):
// the tensor-name table of a gpt checkpoint, the Family that runs it (`deg forward`, `deg init`,
// `deg fill`), and training over that same definition — its forward kept for a backward over the
// op interface (checked against PyTorch autograd); docs/training.md lists the components.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/json.h"
#include "kernels/ops.h"
#include "model/backbone.h"
#include "model/gpt_config.h"

namespace deg {

// A config.json (or bare config) of the gpt family: "family": "gpt".
bool gpt_handles(const Json& config);

// Tensor names and shapes of a gpt checkpoint as `deg pretrain` writes them (model.safetensors,
// f32): the trained tensors of train::GptParams, then the buffers (n-gram sign pool, rotary
// frequencies and softmax scales).
std::vector<std::pair<std::string, Shape>> gpt_tensor_table(const GptConfig& cfg);

// Weights by table name (f32 or bf16) on `ops`' device: on the CPU matrices stay views of the
// file, on a GPU they are copied once; vectors are read into f32 copies, the MLP output
// projections are transposed once into the Linear layout. Throws deg::Error naming a missing
// or mis-shaped tensor.
using TensorMap = std::map<std::string, Tensor>;
std::unique_ptr<Family> gpt_family(const GptConfig& cfg, const TensorMap& weights, const Ops& ops);

// Token ids before a token that its embedding reads (the bigram and trigram of the n-gram
// embedding).
inline constexpr int64_t kGptHistory = 2;

// ---- training: the same forward, kept for its backward (src/model/gpt_backward.cc) ----

// One call of a training pass, laid out as the family's calls: rows right-padded to L tokens,
// row b's first token at position positions[b]. segment non-null: token i sees keys from position
// segment[i] of its row on (documents packed in one row, as the pretraining stream). With
// prefix_calls set, row b continues row prefix_rows[b] of the earlier call prefix_calls[b],
// reading its keys [0, positions[b]) as its prefix (deg train's fork rows; the rows of one call
// may continue different calls); its history is the caller's.
struct GptTrainCall {
  RowTable rows;                     // host tables
  const int32_t* ids = nullptr;      // [B, L] on the backend's device (padding: valid ids)
  const int32_t* history = nullptr;  // [B, 2] ids before each row, oldest first (-1: none)
  const int32_t* segment = nullptr;  // [B L] or null
  std::vector<int> prefix_calls;     // [B], or empty: rows without a prefix
  std::vector<int64_t> prefix_rows;  // [B] with prefix_calls
  // exact: f32 products. bf16_all (the bf16 training path): every matrix product of the layers,
  // forward and backward, rounds its operands to bf16 and accumulates in f32. The calls of one
  // pass share it.
  GemmPrecision precision = GemmPrecision::exact;
};

// What a training forward keeps for its backward (memory of the forward's arena).
struct GptTape;
struct GptTapeDeleter {
  void operator()(GptTape* t) const;
};
using GptTapePtr = std::unique_ptr<GptTape, GptTapeDeleter>;

// Runs `family` (a gpt_family with f32 weights) over the calls in order, layer by layer, and
// returns each call's final normed hidden state [B L, C] in x's arena; `tape` receives what
// gpt_train_backward reads. The arena must not be reset until the backward has run.
std::vector<float*> gpt_train_forward(const Family& family, const Exec& x,
                                      std::span<const GptTrainCall> calls, GptTapePtr& tape);

// Gradient buffers of the trained tensors by table name (f32, laid out as the tensors, on the
// backend's device); the backward adds into them. Every trained tensor needs one.
using GptGrads = std::map<std::string, float*>;

// The backward of gpt_train_forward from the gradient of each call's final normed hidden state
// (dfinal[c]: [B L, C], zero at padded positions).
void gpt_train_backward(const Family& family, const Exec& x, const GptTape& tape,
                        std::span<const float* const> dfinal, const GptGrads& grads);

}  // namespace deg
