// A loaded deg model: backbone (mapped weights), heads, tokenizer and the backbone's chat layout
// (the trunk prefix, eos, pad), from a deg checkpoint directory.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/backbone.h"
#include "model/checkpoint.h"
#include "model/heads.h"
#include "schema/plan.h"
#include "schema/render.h"
#include "text/tokenizer.h"

namespace deg::engine {

// The plain-text delimiters of a backbone family (the seed's BackboneSpec).
struct ChatLayout {
  std::string bos;     // prepended to every trunk
  std::string prefix;  // system turn + opened user turn before the context
  std::string pad;     // padding token
  std::string eos;     // ends every generated value
};
ChatLayout chat_layout(const std::string& family);

// Throws deg::Error when `tokenizer` cannot serve `spec`'s model: ids beyond its vocabulary,
// plain text it encodes to nothing (an empty or byte-less vocabulary), or a missing layout token.
void tokenizer_check(const text::Tokenizer& tokenizer, const BackboneSpec& spec,
                     const ChatLayout& layout);

class DegModel {
 public:
  // `dir`: a deg checkpoint (deg.json + backbone.safetensors + heads.safetensors); `base`
  // overrides where its config/tokenizer come from. Throws deg::Error with what to do.
  // `options`: the backbone's device and GEMM precision.
  static std::unique_ptr<DegModel> open(const std::filesystem::path& dir,
                                        const std::filesystem::path& base = {},
                                        const BackboneOptions& options = {});

  const Backbone& backbone() const { return *backbone_; }
  const Heads& heads() const { return heads_; }
  // The heads in the backbone's memory (on a GPU: uploaded once), for the context-side products.
  const Heads& heads_on_backend() const { return heads_on_backend_; }
  const text::Tokenizer& tokenizer() const { return tokenizer_; }
  const ChatLayout& layout() const { return layout_; }
  const std::string& name() const { return name_; }
  schema::ArrayMode array_mode() const { return array_mode_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t eos_id() const { return eos_id_; }
  // Text from outside or from a schema (documents, queries, known values): special-token
  // strings in it stay plain text.
  std::vector<int32_t> encode(std::string_view text) const;
  // The layout's own strings (bos, the chat prefix): the only place control tokens come from.
  std::vector<int32_t> encode_template(std::string_view text) const;

  // The trunk of a document (schema/render.h): bos + prefix, its context tokens, "\n".
  // ctx_start receives the first context token's index.
  std::vector<int32_t> trunk_ids(const std::vector<int32_t>& context, int64_t* ctx_start) const;
  // The query of `field` at `place` as its fork reads it, piece by piece, and the last token of
  // each option line (choice and score). Throws deg::Error when it encodes to no tokens.
  struct Query {
    std::vector<int32_t> ids;
    std::vector<int64_t> option_positions;
  };
  Query encode_query(const schema::Field& field, const schema::QueryPlace& place) const;

 private:
  DegModel(std::unique_ptr<Backbone> backbone, Heads heads, text::Tokenizer tokenizer)
      : backbone_(std::move(backbone)),
        heads_(std::move(heads)),
        heads_on_backend_(heads_.on(backbone_->family().ops())),
        tokenizer_(std::move(tokenizer)) {}

  std::unique_ptr<Backbone> backbone_;
  Heads heads_;
  Heads heads_on_backend_;
  text::Tokenizer tokenizer_;
  ChatLayout layout_;
  std::string name_;
  schema::ArrayMode array_mode_ = schema::ArrayMode::anchor;
  int32_t pad_id_ = 0;
  int32_t eos_id_ = 0;
};

}  // namespace deg::engine
