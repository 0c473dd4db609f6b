// The `gpt` family for inference (seed 003, the modded-nanogpt "track 1 short" GPT that
// `deg pretrain` trains): the tensor-name table of a gpt checkpoint and the Family that runs it,
// so `deg forward`, `deg init` and `deg fill` serve a trained trunk. The math is the trainer's
// forward (src/train/gpt_step.cc, itself checked against PyTorch autograd) for one row given its
// prefix; docs/training.md lists the components.
#pragma once

#include <map>
#include <memory>
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

}  // namespace deg
