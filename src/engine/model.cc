#include "engine/model.h"

#include "core/error.h"
#include "core/log.h"
#include "deg/checkpoint.h"
#include "io/weights.h"
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

void tokenizer_check(const text::Tokenizer& tokenizer, const BackboneSpec& spec,
                     const ChatLayout& layout) {
  if (tokenizer.vocab_size() > spec.vocab) {
    throw Error(ErrorKind::format,
                fmt::format("the tokenizer has {} tokens, the model's vocabulary only {}; use the "
                            "tokenizer.json that belongs to this model",
                            tokenizer.vocab_size(), spec.vocab),
                {.path = tokenizer.source()});
  }
  // Every visible character of the renderer's plain text must reach the model in some token
  // (offsets may leave out whitespace: trim_offsets).
  const std::string probe = "FIELD /a_b\nTYPE: string\nANSWER: 0-9 {\"x\"}";
  const text::Encoding enc = tokenizer.encode(probe, {.special_tokens = false});
  std::vector<bool> covered(probe.size(), false);
  for (const auto& [start, end] : enc.offsets) {
    for (int64_t c = std::max<int64_t>(0, start); c < std::min<int64_t>(end, covered.size()); ++c)
      covered[size_t(c)] = true;
  }
  for (size_t c = 0; c < probe.size(); ++c) {
    if (covered[c] || probe[c] == ' ' || probe[c] == '\n') continue;
    throw Error(ErrorKind::format,
                fmt::format("the tokenizer drops the character '{}' of plain ASCII text: its "
                            "vocabulary lacks byte or character tokens; use the model's own "
                            "tokenizer.json",
                            probe[c]),
                {.path = tokenizer.source()});
  }
  for (const auto& [token, role] :
       {std::pair{layout.pad, "pad"}, std::pair{layout.eos, "end-of-turn"}}) {
    if (!tokenizer.token_to_id(token)) {
      throw Error(ErrorKind::format,
                  fmt::format("the tokenizer has no {} token '{}' that the {} layout needs", role,
                              token, spec.family),
                  {.path = tokenizer.source()});
    }
  }
}

std::vector<int32_t> DegModel::encode(std::string_view text) const {
  return text.empty() ? std::vector<int32_t>{}
                      : tokenizer_.encode(text, {.special_tokens = false}).ids;
}

std::vector<int32_t> DegModel::encode_template(std::string_view text) const {
  return text.empty() ? std::vector<int32_t>{} : tokenizer_.encode(text).ids;
}

std::vector<int32_t> DegModel::trunk_ids(const std::vector<int32_t>& context,
                                         int64_t* ctx_start) const {
  std::vector<int32_t> ids = encode_template(layout_.bos + layout_.prefix);
  *ctx_start = int64_t(ids.size());
  ids.insert(ids.end(), context.begin(), context.end());
  std::vector<int32_t> suffix = encode("\n");
  ids.insert(ids.end(), suffix.begin(), suffix.end());
  return ids;
}

DegModel::Query DegModel::encode_query(const schema::Field& field,
                                       const schema::QueryPlace& place) const {
  Query q;
  for (const schema::TextPiece& piece : schema::query_pieces(schema::render_query(field, place))) {
    std::vector<int32_t> ids = encode(piece.text);
    q.ids.insert(q.ids.end(), ids.begin(), ids.end());
    if (piece.option_end) q.option_positions.push_back(int64_t(q.ids.size()) - 1);
  }
  if (q.ids.empty()) {
    throw Error(ErrorKind::format,
                fmt::format("the tokenizer encodes the query of {} to no tokens; it cannot "
                            "encode plain text (use the model's own tokenizer.json)",
                            field.pointer),
                {.path = tokenizer_.source()});
  }
  return q;
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
  std::vector<fs::path> weights = checkpoint_backbone_files(dir);
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
  tokenizer_check(m->tokenizer_, m->backbone_->spec(), m->layout_);
  m->pad_id_ = *m->tokenizer_.token_to_id(m->layout_.pad);
  m->eos_id_ = *m->tokenizer_.token_to_id(m->layout_.eos);
  return m;
}

}  // namespace deg::engine

namespace deg {

void checkpoint_create(const CheckpointInitOptions& options) {
  if (!std::filesystem::exists(options.base / "config.json")) {
    throw Error(ErrorKind::not_found,
                "config.json not found; --base must be an HF snapshot directory",
                {.path = options.base.string()});
  }
  const std::unique_ptr<Backbone> backbone = backbone_open(options.base, {.device = Device::cpu});
  const text::Tokenizer tokenizer = text::Tokenizer::load(options.base);
  engine::tokenizer_check(tokenizer, backbone->spec(),
                          engine::chat_layout(backbone->spec().family));
  log::debug("base {} checked: {} backbone, {} tensors' shapes and values, tokenizer {}",
             options.base.string(), backbone->spec().family, backbone->spec().layers.size(),
             tokenizer.source());
  checkpoint_init(options);
}

}  // namespace deg
