// Soft tokens: media parts given as precomputed embeddings, read where HF's placeholders stand.
// The golden fixture (tests/fixtures/gemma4/soft_media, HF Gemma4ForConditionalGeneration
// merging two images and an audio clip) through `deg forward --soft`; the backbone's batch
// invariance and errors with soft rows; documents in parts through the engine and `deg fill
// --parts` on a tiny random Gemma 4 checkpoint whose config carries media ids (random heads: only
// the machinery is checked — spans index the text parts, media are zero-width, results do not
// depend on the batch, a part the model cannot read fails its document alone).
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "backbone_test_util.h"
#include "core/error.h"
#include "deg/engine.h"
#include "engine/context.h"
#include "io/json.h"
#include "io/npy.h"
#include "model/gemma4.h"
#include "model/load.h"
#include "schema/plan.h"
#include "schema/spans.h"
#include "test_util.h"
#include "text/tokenizer.h"
#include "tiny_model.h"

namespace deg {
namespace {

using testing::rel_max_error;

constexpr int32_t kBoi = 250, kImage = 251, kEoi = 252, kBoa = 253, kAudio = 254, kEoa = 255;

// A tiny random Gemma 4 (multimodal layout) whose config names media ids inside its vocabulary.
void write_tiny_gemma4_media(const std::filesystem::path& dir, uint64_t seed) {
  testing::write_tiny_gemma4(dir, seed, /*multimodal=*/true);
  Json config = json_load(dir / "config.json");
  config["boi_token_id"] = kBoi;
  config["image_token_id"] = kImage;
  config["eoi_token_id"] = kEoi;
  config["boa_token_id"] = kBoa;
  config["audio_token_id"] = kAudio;
  config["eoa_token_index"] = kEoa;
  // The encoders' own settings do not matter to deg; their presence offers the media kinds.
  config["vision_config"] = {{"hidden_size", 16}};
  config["audio_config"] = {{"hidden_size", 16}};
  testing::write_text(dir / "config.json", config.dump(2));
}

std::vector<float> random_rows(int64_t rows, int64_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> v(size_t(rows * width));
  for (float& x : v) x = nd(rng);
  return v;
}

TEST(SoftTokens, ForwardDoorReadsMediaLikeHf) {
  testing::TempDir tmp;
  const auto dir = testing::fixture_path("gemma4/soft_media");
  const std::vector<int32_t> ids = testing::npy_ids(dir / "ids.npy");
  std::string text;
  for (int32_t id : ids) text += std::to_string(id) + " ";
  testing::write_text(tmp / "ids.txt", text);
  auto r = testing::run_deg({"forward", "--model", dir.string(), "--ids-file",
                             (tmp / "ids.txt").string(), "--soft", (dir / "soft.npy").string(),
                             "--out", (tmp / "l.npy").string(), "--fork-at", "40"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(rel_max_error(npy_read(tmp / "l.npy"), npy_read(dir / "logits.npy")), 1e-4);
  // Fewer embedding rows than placeholders: refused, saying why.
  Tensor soft = npy_read(dir / "soft.npy");
  npy_write(tmp / "short.npy", soft.slice(0, 0, soft.dim(0) - 1).contiguous());
  r = testing::run_deg({"forward", "--model", dir.string(), "--ids-file",
                        (tmp / "ids.txt").string(), "--soft", (tmp / "short.npy").string(), "--out",
                        (tmp / "x.npy").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("placeholder"), std::string::npos) << r.err;
}

TEST(SoftTokens, RowsWithMediaAreBatchInvariantAndReadInPieces) {
  testing::TempDir tmp;
  write_tiny_gemma4_media(tmp / "m", 5);
  auto bb = backbone_open(tmp / "m", {.read_chunk = 64});
  ASSERT_EQ(bb->spec().media.size(), 2u);
  const int64_t C = bb->spec().hidden;
  // Row 0: text, an image of 9 rows, text (90 tokens: two reads); row 1: text only, shorter.
  std::vector<int32_t> a = testing::random_ids(40, 240, 1);
  a.push_back(kBoi);
  a.insert(a.end(), 9, kImage);
  a.push_back(kEoi);
  const std::vector<int32_t> tail = testing::random_ids(39, 240, 2);
  a.insert(a.end(), tail.begin(), tail.end());
  const std::vector<int32_t> b = testing::random_ids(50, 240, 3);
  const Tensor emb = Tensor::from_vector(random_rows(9, C, 4), {9, C});
  const SoftTokens soft = soft_at_placeholders(bb->spec(), a, emb);

  State alone_state = bb->empty_state(1);
  TokenBatch alone = TokenBatch::single(a);
  alone.soft = soft;
  Tensor h_alone = bb->prefill(alone, alone_state);

  TokenBatch both = TokenBatch::padded({b, a});
  both.soft = {.rows = std::vector<int32_t>(size_t(2 * both.tokens), -1), .embeddings = emb};
  std::copy(soft.rows.begin(), soft.rows.end(), both.soft.rows.begin() + both.tokens);
  State both_state = bb->empty_state(2);
  Tensor h_both = bb->prefill(both, both_state);
  EXPECT_TRUE(testing::bitwise_equal(testing::row_of(h_both, 1, int64_t(a.size())),
                                     testing::row_of(h_alone, 0, int64_t(a.size()))));
  // One read of the whole row: the same bits.
  bb->set_options({.read_chunk = 4096});
  State dense_state = bb->empty_state(1);
  EXPECT_TRUE(testing::bitwise_equal(bb->prefill(alone, dense_state).to_f32_vector(),
                                     h_alone.to_f32_vector()));
  // Other embeddings, other hidden states after the image (the media are read).
  TokenBatch other = alone;
  other.soft.embeddings = Tensor::from_vector(random_rows(9, C, 5), {9, C});
  State other_state = bb->empty_state(1);
  EXPECT_GT(rel_max_error(bb->prefill(other, other_state), h_alone), 1e-3);
}

TEST(SoftTokens, FamiliesWithoutMediaRefuseSoftRows) {
  testing::TempDir tmp;
  testing::write_tiny_qwen35(tmp / "q", 1);
  auto bb = backbone_open(tmp / "q");
  TokenBatch batch = TokenBatch::single({1, 2, 3});
  batch.soft = {.rows = {-1, 0, -1},
                .embeddings = Tensor::from_vector(random_rows(1, bb->spec().hidden, 1),
                                                  {1, bb->spec().hidden})};
  State state = bb->empty_state(1);
  try {
    bb->prefill(batch, state);
    FAIL() << "qwen3_5 read a soft token";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reads no media"), std::string::npos) << e.what();
  }
  // Gemma 4 reads a media kind only where the snapshot configures its encoder: a text snapshot
  // none, a multimodal one without an audio tower images only.
  testing::write_tiny_gemma4(tmp / "g", 1);
  EXPECT_TRUE(backbone_open(tmp / "g")->spec().media.empty());
  write_tiny_gemma4_media(tmp / "v", 1);
  Json config = json_load(tmp / "v" / "config.json");
  config.erase("audio_config");
  testing::write_text(tmp / "v" / "config.json", config.dump());
  const auto media = backbone_open(tmp / "v")->spec().media;
  ASSERT_EQ(media.size(), 1u);
  EXPECT_EQ(media[0].kind, "image");
  // Images attending each other both ways ("vision") are not implemented: no image parts.
  write_tiny_gemma4_media(tmp / "b", 1);
  Json both = json_load(tmp / "b" / "config.json");
  both["text_config"]["use_bidirectional_attention"] = "vision";
  testing::write_text(tmp / "b" / "config.json", both.dump());
  const auto audio_only = backbone_open(tmp / "b")->spec().media;
  ASSERT_EQ(audio_only.size(), 1u);
  EXPECT_EQ(audio_only[0].kind, "audio");
  // A pad id outside the vocabulary is refused by name.
  config["text_config"]["pad_token_id"] = 100000;
  testing::write_text(tmp / "v" / "config.json", config.dump());
  try {
    backbone_open(tmp / "v");
    FAIL() << "pad id 100000 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pad_token_id"), std::string::npos) << e.what();
  }
}

TEST(SoftTokens, ContextPlacesMediaZeroWidthBetweenTheTextParts) {
  testing::TempDir tmp;
  write_tiny_gemma4_media(tmp / "m", 2);
  auto bb = backbone_open(tmp / "m");
  const text::Tokenizer tok = text::Tokenizer::load(tmp / "m");
  const int64_t C = bb->spec().hidden;
  const std::vector<float> img = random_rows(3, C, 1), aud = random_rows(2, C, 2);
  // One token per byte: "é" is two tokens over one code point.
  const engine::DocumentContext ctx = engine::document_context(
      tok, bb->spec(), "tiny",
      {DocumentPart::of_text("ab"), DocumentPart::of_media("image", img, 3),
       DocumentPart::of_text("é!"), DocumentPart::of_media("audio", aud, 2),
       DocumentPart::of_text("")});
  EXPECT_EQ(ctx.text, U"abé!");
  const std::vector<int32_t> ids = {'a',  'b',  kBoi, kImage, kImage, kImage, kEoi,
                                    0xC3, 0xA9, '!',  kBoa,   kAudio, kAudio, kEoa};
  EXPECT_EQ(ctx.ids, ids);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const schema::CharRange& r : ctx.ranges) ranges.push_back({r.start, r.end});
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 1}, {1, 2}, {2, 2}, {2, 2}, {2, 2},
                                                         {2, 2}, {2, 2}, {2, 3}, {2, 3}, {3, 4},
                                                         {4, 4}, {4, 4}, {4, 4}, {4, 4}};
  EXPECT_EQ(ranges, want);
  EXPECT_EQ(ctx.soft_rows,
            (std::vector<int32_t>{-1, -1, -1, 0, 1, 2, -1, -1, -1, -1, -1, 3, 4, -1}));
  std::vector<float> both = img;
  both.insert(both.end(), aud.begin(), aud.end());
  EXPECT_EQ(ctx.embeddings, both);
  // The family's own placeholders mark the same positions.
  EXPECT_EQ(soft_at_placeholders(bb->spec(), ctx.ids, Tensor::from_vector(both, {5, C})).rows,
            ctx.soft_rows);
}

class SoftTokensEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    write_tiny_gemma4_media(*dir_ / "base", 6);
    auto r = testing::run_deg({"init", "--base", (*dir_ / "base").string(), "--out",
                               (*dir_ / "ck").string(), "--seed", "3"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::filesystem::path ck() { return *dir_ / "ck"; }
  static std::filesystem::path root() { return dir_->path(); }
  static OrderedJson schema() {
    return OrderedJson::parse(R"({"type": "object", "properties": {
        "name": {"type": "string"}, "note": {"type": "string"},
        "urgent": {"type": "boolean"}}, "required": ["name", "note"]})");
  }
  static inline testing::TempDir* dir_ = nullptr;
};

const std::string kBefore = "From: Marta Oliveira\nSubject: order SK-204518 — photo below\n";
const std::string kAfter = "The kettle stops heating after a minute; the lid hinge is cracked.\n";

TEST_F(SoftTokensEngine, PartsFillWithSpansInTheTextAndMediaZeroWidth) {
  Engine engine = Engine::open({.model = ck()});
  EXPECT_EQ(engine.media_kinds(), (std::vector<std::string>{"image", "audio"}));
  const int64_t C = engine.hidden_size();
  const DocumentParts doc = {
      DocumentPart::of_text(kBefore), DocumentPart::of_media("image", random_rows(6, C, 7), 6),
      DocumentPart::of_text(kAfter), DocumentPart::of_media("audio", random_rows(3, C, 8), 3)};
  std::vector<FillResult> r = engine.fill(schema(), std::vector<DocumentParts>{doc});
  ASSERT_TRUE(r[0].ok()) << r[0].error;
  // Spans are code points of the text parts joined; each copied value is exactly its span.
  const std::u32string text = *schema::utf8_to_code_points(kBefore + kAfter);
  int spans = 0;
  for (const FieldReport& f : r[0].fields) {
    if (!f.span) continue;
    ++spans;
    const auto [s, e] = *f.span;
    ASSERT_LE(0, s);
    ASSERT_LT(s, e);
    ASSERT_LE(e, int64_t(text.size()));
    EXPECT_EQ(f.value.get<std::string>(),
              schema::code_points_to_utf8(text.substr(size_t(s), size_t(e - s))))
        << f.path;
  }
  EXPECT_EQ(spans, 2);  // both required strings copied
  // A short first part: the copies come from the text after the media, whose code points count
  // from the end of the first part.
  const std::string lead = "Re: ";
  std::vector<FillResult> shifted = engine.fill(
      schema(),
      std::vector<DocumentParts>{{DocumentPart::of_text(lead),
                                  DocumentPart::of_media("image", random_rows(6, C, 7), 6),
                                  DocumentPart::of_text(kBefore + kAfter)}});
  ASSERT_TRUE(shifted[0].ok()) << shifted[0].error;
  const std::u32string joined = *schema::utf8_to_code_points(lead + kBefore + kAfter);
  int after = 0;
  for (const FieldReport& f : shifted[0].fields) {
    if (!f.span) continue;
    const auto [s, e] = *f.span;
    ASSERT_LE(e, int64_t(joined.size()));
    after += s >= int64_t(lead.size());
    EXPECT_EQ(f.value.get<std::string>(),
              schema::code_points_to_utf8(joined.substr(size_t(s), size_t(e - s))))
        << f.path << " [" << s << ", " << e << ")";
  }
  EXPECT_GT(after, 0);

  // The media are read: other embeddings, other confidences.
  DocumentParts other = doc;
  other[1].embeddings = random_rows(6, C, 9);
  std::vector<FillResult> r2 = engine.fill(schema(), std::vector<DocumentParts>{other});
  ASSERT_TRUE(r2[0].ok()) << r2[0].error;
  bool moved = false;
  for (size_t i = 0; i < r[0].fields.size(); ++i)
    moved |= r[0].fields[i].confidence != r2[0].fields[i].confidence;
  EXPECT_TRUE(moved);

  // Bitwise the same report in a batch with other documents.
  std::vector<FillResult> batch =
      engine.fill(schema(), std::vector<DocumentParts>{{DocumentPart::of_text(kAfter)}, doc});
  ASSERT_TRUE(batch[1].ok()) << batch[1].error;
  ASSERT_EQ(batch[1].fields.size(), r[0].fields.size());
  for (size_t i = 0; i < r[0].fields.size(); ++i) {
    EXPECT_EQ(batch[1].fields[i].value, r[0].fields[i].value);
    EXPECT_EQ(batch[1].fields[i].confidence, r[0].fields[i].confidence);
  }
}

TEST_F(SoftTokensEngine, TextInPartsFillsExactlyAsTheJoinedText) {
  // The tiny tokenizer gives one token per byte, so the text split into parts has the same
  // tokens: the reports must be the same, spans counted in the joined text.
  Engine engine = Engine::open({.model = ck()});
  const std::string text = kBefore + kAfter;
  std::vector<FillResult> a = engine.fill(schema(), std::vector<std::string>{text});
  std::vector<FillResult> b =
      engine.fill(schema(), std::vector<DocumentParts>{{DocumentPart::of_text(kBefore.substr(0, 9)),
                                                        DocumentPart::of_text(kBefore.substr(9)),
                                                        DocumentPart::of_text(kAfter)}});
  ASSERT_TRUE(a[0].ok() && b[0].ok());
  ASSERT_EQ(a[0].fields.size(), b[0].fields.size());
  for (size_t i = 0; i < a[0].fields.size(); ++i) {
    EXPECT_EQ(a[0].fields[i].value, b[0].fields[i].value);
    EXPECT_EQ(a[0].fields[i].confidence, b[0].fields[i].confidence);
    EXPECT_EQ(a[0].fields[i].span, b[0].fields[i].span);
  }
}

TEST_F(SoftTokensEngine, PartsTheModelCannotReadFailTheirDocumentAlone) {
  Engine engine = Engine::open({.model = ck()});
  const int64_t C = engine.hidden_size();
  std::vector<FillResult> r = engine.fill(
      schema(), std::vector<DocumentParts>{
                    {DocumentPart::of_text(kBefore),
                     DocumentPart::of_media("image", random_rows(2, C + 1, 1), 2)},
                    {DocumentPart::of_text(kBefore)},
                    {DocumentPart::of_text(kBefore), DocumentPart::of_media("video", {}, 0)},
                    {DocumentPart::of_text("ok"), DocumentPart::of_text("\xff\xfe")}});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_NE(r[0].error.find("part 1 of the document"), std::string::npos) << r[0].error;
  EXPECT_NE(r[0].error.find("hidden size"), std::string::npos) << r[0].error;
  EXPECT_TRUE(r[1].ok()) << r[1].error;
  EXPECT_NE(r[2].error.find("reads no \"video\" media"), std::string::npos) << r[2].error;
  EXPECT_NE(r[2].error.find("image, audio"), std::string::npos) << r[2].error;
  EXPECT_NE(r[3].error.find("part 1 of the document is not valid UTF-8"), std::string::npos)
      << r[3].error;
}

TEST_F(SoftTokensEngine, FillPartsFromTheCommandLine) {
  const auto dir = root() / "docs";
  std::filesystem::create_directories(dir);
  Engine engine = Engine::open({.model = ck()});
  const int64_t C = engine.hidden_size();
  npy_write(dir / "photo.npy", Tensor::from_vector(random_rows(4, C, 11), {4, C}));
  testing::write_text(dir / "after.txt", kAfter);
  testing::write_text(
      dir / "scan.json",
      Json({{"parts",
             {{{"text", kBefore}}, {{"image", "photo.npy"}}, {{"text_file", "after.txt"}}}}})
          .dump());
  testing::write_text(dir / "broken.json",
                      Json({{"parts", {{{"text", kBefore}}, {{"image", "missing.npy"}}}}}).dump());
  testing::write_text(dir / "s.json", schema().dump());
  auto r = testing::run_deg({"fill", "--model", ck().string(), "--schema",
                             (dir / "s.json").string(), "--parts", "--report",
                             (dir / "scan.json").string(), (dir / "broken.json").string()});
  EXPECT_NE(r.exit_code, 0);  // one document failed
  std::istringstream lines(r.out);
  std::string good, bad;
  std::getline(lines, good);
  std::getline(lines, bad);
  Json g = Json::parse(good);
  ASSERT_TRUE(g.contains("fields")) << good;
  EXPECT_TRUE(Json::parse(bad).contains("error")) << bad;
  EXPECT_NE(r.err.find("missing.npy"), std::string::npos) << r.err;
  // The library gives the same report for the same parts.
  std::vector<float> photo = npy_read(dir / "photo.npy").to_f32_vector();
  std::vector<FillResult> lib =
      engine.fill(schema(), std::vector<DocumentParts>{{DocumentPart::of_text(kBefore),
                                                        DocumentPart::of_media("image", photo, 4),
                                                        DocumentPart::of_text(kAfter)}});
  ASSERT_TRUE(lib[0].ok()) << lib[0].error;
  ASSERT_EQ(g["fields"].size(), lib[0].fields.size());
  for (size_t i = 0; i < lib[0].fields.size(); ++i)
    EXPECT_EQ(g["fields"][i]["confidence"].get<double>(), lib[0].fields[i].confidence);
}

}  // namespace
}  // namespace deg
