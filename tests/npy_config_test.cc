// .npy round trips and refusals; typed config access with errors that name the JSON pointer.
#include <gtest/gtest.h>

#include "io/hf_config.h"
#include "io/npy.h"
#include "test_util.h"

namespace deg {
namespace {

using testing::TempDir;

TEST(Npy, RoundTripDtypesAndRanks) {
  TempDir dir;
  std::vector<Shape> shapes = {{}, {5}, {2, 3}, {2, 1, 4}, {0, 3}};
  for (DType t : {DType::f32, DType::f16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
    for (const Shape& s : shapes) {
      Tensor x = Tensor::empty(s, DType::f32);
      for (int64_t i = 0; i < x.numel(); ++i) x.mutable_data<float>()[i] = float(i % 7) - 2;
      Tensor want = x.to(t);
      npy_write(dir / "x.npy", want);
      Tensor got = npy_read(dir / "x.npy");
      EXPECT_EQ(got.dtype(), t);
      EXPECT_EQ(got.shape(), s);
      EXPECT_EQ(got.to_f32_vector(), want.to_f32_vector());
    }
  }
}

TEST(Npy, HeaderIsNumpyCompatible) {
  // numpy's own header for np.zeros((2, 3), '<f4'): format 1.0, 128 bytes with magic and length.
  std::string bytes = npy_serialize(Tensor::empty({2, 3}, DType::f32));
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(bytes.size(), 128u + 24u);
  EXPECT_NE(bytes.find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"),
            std::string::npos);
  EXPECT_EQ(bytes[127], '\n');
  EXPECT_NE(npy_serialize(Tensor::empty({4}, DType::i64)).find("'shape': (4,)"), std::string::npos);
}

TEST(Npy, RefusesWhatItCannotRead) {
  std::string good = npy_serialize(Tensor::empty({2, 3}, DType::f32));
  EXPECT_THROW(npy_parse("not numpy", "x"), Error);
  EXPECT_THROW(npy_parse(good.substr(0, good.size() - 1), "x"), Error);  // truncated data
  EXPECT_THROW(npy_parse(good.substr(0, 30), "x"), Error);               // truncated header
  std::string f64 = good;
  f64.replace(f64.find("<f4"), 3, "<f8");
  EXPECT_THROW(npy_parse(f64, "x"), Error);
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_THROW(npy_parse(fortran, "x"), Error);
  EXPECT_THROW(npy_write("/nonexistent/dir/x.npy", Tensor::empty({1}, DType::f32)), Error);
  EXPECT_THROW(npy_serialize(Tensor::empty({1}, DType::bf16)), Error);
}

TEST(JsonConfig, TypedAccessAndErrors) {
  TempDir dir;
  testing::write_text(dir / "config.json", R"({
    "model_type": "qwen3_5",
    "tie_word_embeddings": true,
    "text_config": {"model_type": "qwen3_5_text", "hidden_size": 64, "rms_norm_eps": 1e-6,
                    "layer_types": ["linear_attention", "full_attention"], "bad": "x",
                    "float_int": 128.0}
  })");
  JsonConfig c = JsonConfig::load(dir / "config.json");
  EXPECT_EQ(c.model_type(), "qwen3_5");
  JsonConfig t = c.text();
  EXPECT_EQ(t.model_type(), "qwen3_5_text");
  EXPECT_EQ(t.get<int>("hidden_size"), 64);
  EXPECT_EQ(t.get<int>("float_int"), 128);
  EXPECT_FLOAT_EQ(t.get<float>("rms_norm_eps"), 1e-6f);
  EXPECT_EQ(t.get<std::vector<std::string>>("layer_types").size(), 2u);
  EXPECT_EQ(t.get_or<int>("num_hidden_layers", 7), 7);
  EXPECT_TRUE(c.get<bool>("tie_word_embeddings"));
  try {
    t.get<int>("bad");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.context().pointer, "/text_config/bad");
    EXPECT_NE(std::string(e.what()).find("expected an integer, found string"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos);
  }
  try {
    t.get<int>("vocab_size");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::not_found);
    EXPECT_EQ(e.context().pointer, "/text_config/vocab_size");
  }
  // A config without text_config is its own text config.
  testing::write_text(dir / "plain.json", R"({"model_type": "qwen3_5_text"})");
  EXPECT_EQ(JsonConfig::load(dir / "plain.json").text().model_type(), "qwen3_5_text");
  testing::write_text(dir / "broken.json", R"({"a": )");
  EXPECT_THROW(JsonConfig::load(dir / "broken.json"), Error);
  EXPECT_THROW(JsonConfig::load(dir / "missing.json"), Error);
}

}  // namespace
}  // namespace deg
