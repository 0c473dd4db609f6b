// safetensors: round trip through the writer and the mmap reader, sharded directories, both HF
// layouts, and a corpus of damaged files that must each be refused with a clear deg::Error.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "io/json.h"
#include "io/weights.h"
#include "test_util.h"

namespace deg {
namespace {

using testing::TempDir;

Tensor iota_f32(const Shape& shape, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.mutable_data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(i) * scale - 3.0f;
  return t;
}

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  std::vector<NamedTensor> tensors;
  for (DType t : kAllDTypes) {
    tensors.push_back({"w." + std::string(dtype_name(t)), iota_f32({3, 5}, 0.5f).to(t)});
  }
  tensors.push_back({"scalar", iota_f32({})});
  tensors.push_back({"empty", Tensor::empty({0, 4}, DType::bf16)});
  tensors.push_back({"transposed", iota_f32({4, 6}).transpose(0, 1)});  // written contiguous
  safetensors_write(dir / "m.safetensors", tensors, {{"format", "pt"}});

  SafetensorsFile f = SafetensorsFile::open(dir / "m.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.tensors().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    Tensor got = f.tensor(name);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    Tensor want = t.contiguous();
    ASSERT_EQ(got.nbytes(), want.nbytes());
    EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), got.nbytes())) << name;
  }
  // Aligned tensors are views into the read-only map (never copied); a tensor the file leaves
  // misaligned for its dtype (i64 after odd-sized ones) is the one case that gets a copy.
  EXPECT_FALSE(f.tensor("w.f32").writable());
  EXPECT_EQ(f.tensor("w.f32").raw(), f.tensor("w.f32").raw());
  EXPECT_DOUBLE_EQ(f.tensor("transposed").get({1, 2}), iota_f32({4, 6}).get({2, 1}));
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_THROW(f.tensor("nope"), Error);
}

TEST(Safetensors, DataSectionIsAligned) {
  TempDir dir;
  safetensors_write(dir / "a.safetensors", {{"x", iota_f32({7})}});
  std::string bytes = testing::read_text(dir / "a.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
}

// Builds a file image from a header string and a data section.
std::string image(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\x01');
}

struct Damaged {
  const char* what;
  std::string bytes;
  const char* expect;  // a piece of the message
};

std::vector<Damaged> damaged_corpus() {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  std::vector<Damaged> c;
  c.push_back({"empty file", "", "too short"});
  c.push_back({"short length", std::string(5, '\0'), "too short"});
  std::string full = image(ok, 16);
  for (size_t cut : {size_t(9), size_t(20), full.size() - 1}) {
    c.push_back(
        {"truncated", full.substr(0, cut), cut < 8 + ok.size() ? "past the end" : "run past"});
  }
  c.push_back({"huge header length", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}",
               "implausible"});
  c.push_back({"bad json", image(R"({"a":{"dtype":"F32",)", 16), "not valid JSON"});
  c.push_back({"not an object", image("[1,2]", 0), "not a JSON object"});
  c.push_back({"entry not object", image(R"({"a":3})", 0), "not an object"});
  c.push_back({"unknown dtype",
               image(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8),
               "unsupported dtype"});
  c.push_back({"missing dtype", image(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "dtype"});
  c.push_back({"negative shape",
               image(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
               "non-negative"});
  c.push_back({"float shape",
               image(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
               "non-negative"});
  c.push_back({"shape mismatch",
               image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
               "needs 12 bytes"});
  c.push_back({"dtype mismatch",
               image(R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", 16),
               "needs 8 bytes"});
  c.push_back({"offsets reversed",
               image(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8),
               "end before"});
  c.push_back({"offsets past file",
               image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[100,116]}})", 16),
               "run past"});
  c.push_back({"offsets wrong arity",
               image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
               "data_offsets"});
  c.push_back({"overlap",
               image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                     12),
               "overlap"});
  c.push_back(
      {"shape overflow",
       image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4),
       "overflows"});
  c.push_back({"metadata not strings", image(R"({"__metadata__":{"k":1}})", 0), "not a string"});
  return c;
}

TEST(Safetensors, DamagedFilesAreRefusedClearly) {
  TempDir dir;
  for (const Damaged& d : damaged_corpus()) {
    std::string path = (dir / "bad.safetensors").string();
    testing::write_text(path, d.bytes);
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << d.what << ": accepted";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(d.expect), std::string::npos) << d.what << ": " << msg;
      EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << d.what << ": names the file";
      EXPECT_EQ(e.kind(), ErrorKind::format) << d.what;
    }
  }
}

TEST(Safetensors, ErrorsNameTheTensor) {
  TempDir dir;
  testing::write_text(
      dir / "x.safetensors",
      image(R"({"layers.3.w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  try {
    SafetensorsFile::open(dir / "x.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.context().tensor, "layers.3.w");
    EXPECT_NE(std::string(e.what()).find("tensor 'layers.3.w'"), std::string::npos);
  }
}

TEST(Safetensors, MissingFileIsNotFound) {
  try {
    SafetensorsFile::open("/nonexistent/m.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::not_found);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/m.safetensors"), std::string::npos);
  }
}

TEST(WeightStore, ShardedIndexAndLayouts) {
  TempDir dir;
  safetensors_write(dir / "model-00001-of-00002.safetensors",
                    {{"model.language_model.embed_tokens.weight", iota_f32({4, 2})},
                     {"model.language_model.layers.0.mlp.up_proj.weight", iota_f32({3, 2})}});
  safetensors_write(dir / "model-00002-of-00002.safetensors",
                    {{"model.language_model.norm.weight", iota_f32({2})},
                     {"model.visual.patch.weight", iota_f32({5})}});
  Json index = {
      {"metadata", {{"total_size", 80}}},
      {"weight_map",
       {{"model.language_model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
        {"model.language_model.layers.0.mlp.up_proj.weight", "model-00001-of-00002.safetensors"},
        {"model.language_model.norm.weight", "model-00002-of-00002.safetensors"},
        {"model.visual.patch.weight", "model-00002-of-00002.safetensors"}}}};
  testing::write_text(dir / "model.safetensors.index.json", index.dump());
  WeightStore w = WeightStore::open_dir(dir.path());
  EXPECT_EQ(w.names().size(), 4u);
  EXPECT_EQ(w.text_prefix(), "model.language_model.");
  EXPECT_EQ(w.text("norm.weight").shape(), Shape({2}));
  EXPECT_DOUBLE_EQ(w.text("layers.0.mlp.up_proj.weight").get({2, 1}), 2.0);
  EXPECT_THROW(w.text("layers.1.mlp.up_proj.weight"), Error);

  // An index that lists a tensor its shard lacks is refused, naming the tensor.
  index["weight_map"]["model.language_model.lm_head.weight"] = "model-00002-of-00002.safetensors";
  testing::write_text(dir / "model.safetensors.index.json", index.dump());
  try {
    WeightStore::open_dir(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.context().tensor, "model.language_model.lm_head.weight");
  }
}

TEST(WeightStore, PlainLayoutAndMissingWeights) {
  TempDir dir;
  EXPECT_THROW(WeightStore::open_dir(dir.path()), Error);
  safetensors_write(dir / "model.safetensors", {{"model.embed_tokens.weight", iota_f32({4, 2})}});
  WeightStore w = WeightStore::open_dir(dir.path());
  EXPECT_EQ(w.text_prefix(), "model.");
  EXPECT_TRUE(w.has_text("embed_tokens.weight"));
}

}  // namespace
}  // namespace deg
