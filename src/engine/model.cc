#include "engine/model.h"

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/load.h"

namespace deg::engine {

namespace fs = std::filesystem;

namespace {

const char* kSystemTurn =
    "system\nFill JSON Schema fields from the context: decide, copy spans from the context, and "
    "write text only for fields marked x-generate.";

}  // namespace

ChatLayout chat_layout(const std::string& family) {
  if (family == "gpt") {  // our own trunk: plain text after its document-start token
    return {"<|endoftext|>", "CONTEXT:\n", "<|endoftext|>", "<|endoftext|>"};
  }
  if (family.starts_with("gemma")) {
    return {"<bos>", std::string("<|turn>") + kSystemTurn + "<turn|>\n<|turn>user\nCONTEXT:\n",
            "<pad>", "<turn|>"};
  }
  ChatLayout chatml{
      "", std::string("<|im_start|>") + kSystemTurn + "<|im_end|>\n<|im_start|>user\nCONTEXT:\n",
      "<|endoftext|>", "<|im_end|>"};
  if (family.starts_with("lfm")) {
    chatml.bos = "<|startoftext|>";
    chatml.pad = "<|pad|>";
  }
  return chatml;
}

std::vector<int32_t> DegModel::encode(std::string_view text) const {
  return text.empty() ? std::vector<int32_t>{} : tokenizer_.encode(text).ids;
}

std::unique_ptr<DegModel> DegModel::open(const fs::path& dir, const fs::path& base,
                                         const BackboneOptions& options) {
  if (!fs::is_directory(dir)) {
    throw Error(ErrorKind::not_found,
                "model directory not found; pass --model pointing at a deg checkpoint (make one "
                "with `deg init --base HF_DIR --out DIR`)",
                {.path = dir.string()});
  }
  if (!fs::exists(dir / "deg.json")) {
    throw Error(ErrorKind::not_found,
                "no deg.json here: this is not a deg checkpoint. An HF snapshot has no heads; "
                "make a checkpoint with `deg init --base " +
                    dir.string() + " --out DIR`",
                {.path = dir.string()});
  }
  CheckpointMeta meta = checkpoint_meta_load(dir);
  fs::path config_dir = model_config_dir(dir, base);
  std::vector<fs::path> weights = {dir / "backbone.safetensors"};
  std::unique_ptr<Backbone> backbone = backbone_open_checkpoint(config_dir, weights, options);
  Heads heads = Heads::load(dir / "heads.safetensors");
  if (heads.hidden != backbone->spec().hidden) {
    throw Error(ErrorKind::format,
                fmt::format("heads are for hidden size {}, the backbone has {}", heads.hidden,
                            backbone->spec().hidden),
                {.path = (dir / "heads.safetensors").string()});
  }
  text::Tokenizer tokenizer =
      text::Tokenizer::load(fs::exists(dir / "tokenizer.json") ? dir : config_dir);
  auto m = std::unique_ptr<DegModel>(
      new DegModel(std::move(backbone), std::move(heads), std::move(tokenizer)));
  m->name_ = meta.backbone.empty() ? m->backbone_->spec().family : meta.backbone;
  m->layout_ = chat_layout(m->backbone_->spec().family);
  m->array_mode_ =
      meta.array_mode == "index" ? schema::ArrayMode::index : schema::ArrayMode::anchor;
  auto id_of = [&](const std::string& token, const char* role) {
    auto id = m->tokenizer_.token_to_id(token);
    if (!id) {
      throw Error(ErrorKind::format,
                  fmt::format("the tokenizer has no {} token '{}' that the {} layout needs", role,
                              token, m->backbone_->spec().family),
                  {.path = m->tokenizer_.source()});
    }
    return *id;
  };
  m->pad_id_ = id_of(m->layout_.pad, "pad");
  m->eos_id_ = id_of(m->layout_.eos, "end-of-turn");
  return m;
}

}  // namespace deg::engine
