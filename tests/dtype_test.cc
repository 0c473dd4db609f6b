// Narrow-float conversions against known bit patterns (IEEE 754 binary16, bfloat16, OCP FP8
// E4M3FN / E5M2 as PyTorch implements them), including rounding ties, subnormals, overflow, NaN.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace deg {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(DType, Bf16KnownPatterns) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f).bits, 0xc000);
  EXPECT_EQ(f32_to_bf16(0.0f).bits, 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(f32_to_bf16(kInf).bits, 0x7f80);
  EXPECT_EQ(f32_to_bf16(-kInf).bits, 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(kNaN))));
  // A NaN whose payload lives only in the low half must stay a NaN, not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_to_f32(0x7f800001)))));
  // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1 (even).
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000)).bits, 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 -> up to even.
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000)).bits, 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808001)).bits, 0x3f81);
  // The largest finite f32 rounds to infinity in bf16.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  // Subnormals keep their bits.
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x00010000)).bits, 0x0001);
  EXPECT_EQ(bf16_to_f32(bf16{0x0001}), bits_to_f32(0x00010000));
}

TEST(DType, F16KnownPatterns) {
  EXPECT_EQ(f32_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f).bits, 0x7bff);  // max finite
  EXPECT_EQ(f32_to_f16(65519.0f).bits, 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7c00);  // halfway, ties to even -> infinity
  EXPECT_EQ(f32_to_f16(1e6f).bits, 0x7c00);
  EXPECT_EQ(f32_to_f16(-kInf).bits, 0xfc00);
  EXPECT_EQ(f32_to_f16(kNaN).bits & 0x7e00, 0x7e00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)).bits, 0x0400);  // min normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)).bits, 0x0001);  // min subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);  // halfway to it: ties to even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)).bits, 0x0001);  // above halfway
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)).bits, 0x0002);  // 1.5 quanta: tie -> even (2)
  EXPECT_EQ(f32_to_f16(0.1f).bits, 0x2e66);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);  // tie to even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
  EXPECT_FLOAT_EQ(f16_to_f32(f16{0x7bff}), 65504.0f);
  EXPECT_FLOAT_EQ(f16_to_f32(f16{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_FLOAT_EQ(f16_to_f32(f16{0x8400}), -std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(f16_to_f32(f16{0x7c00})));
  EXPECT_TRUE(std::isnan(f16_to_f32(f16{0x7c01})));
  EXPECT_EQ(std::signbit(f16_to_f32(f16{0x8000})), true);
}

TEST(DType, F16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = f16_to_f32(f16{uint16_t(b)});
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f).bits, b) << std::hex << b;
  }
}

TEST(DType, F8E4M3KnownPatterns) {
  EXPECT_EQ(f32_to_f8e4m3(1.0f).bits, 0x38);
  EXPECT_EQ(f32_to_f8e4m3(-1.0f).bits, 0xb8);
  EXPECT_EQ(f32_to_f8e4m3(448.0f).bits, 0x7e);  // max finite
  EXPECT_EQ(f32_to_f8e4m3(464.0f).bits, 0x7e);  // halfway to 480: ties to even -> 448
  EXPECT_EQ(f32_to_f8e4m3(470.0f).bits, 0x7f);  // rounds past the max: NaN (no infinity)
  EXPECT_EQ(f32_to_f8e4m3(1000.0f).bits, 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(-1000.0f).bits, 0xff);
  EXPECT_EQ(f32_to_f8e4m3(kInf).bits, 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(kNaN).bits, 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -9)).bits, 0x01);    // min subnormal
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -10)).bits, 0x00);   // tie -> even (0)
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -6)).bits, 0x08);    // min normal
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(7.0f, -9)).bits, 0x07);    // max subnormal
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(15.0f, -10)).bits, 0x08);  // rounds up into the normals
  EXPECT_FLOAT_EQ(f8e4m3_to_f32(f8e4m3{0x7e}), 448.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f8e4m3{0x7f})));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f8e4m3{0xff})));
  EXPECT_FLOAT_EQ(f8e4m3_to_f32(f8e4m3{0x78}), 256.0f);  // exponent field 15 is finite
  for (uint32_t b = 0; b < 0x100; ++b) {
    float f = f8e4m3_to_f32(f8e4m3{uint8_t(b)});
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f8e4m3(f).bits, b) << b;
  }
}

TEST(DType, F8E5M2KnownPatterns) {
  EXPECT_EQ(f32_to_f8e5m2(1.0f).bits, 0x3c);
  EXPECT_EQ(f32_to_f8e5m2(57344.0f).bits, 0x7b);  // max finite
  EXPECT_EQ(f32_to_f8e5m2(61440.0f).bits, 0x7c);  // halfway: ties to even -> infinity
  EXPECT_EQ(f32_to_f8e5m2(60000.0f).bits, 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(-kInf).bits, 0xfc);
  EXPECT_EQ(f32_to_f8e5m2(kNaN).bits, 0x7f);
  EXPECT_EQ(f32_to_f8e5m2(std::ldexp(1.0f, -16)).bits, 0x01);  // min subnormal
  EXPECT_TRUE(std::isinf(f8e5m2_to_f32(f8e5m2{0x7c})));
  EXPECT_TRUE(std::isnan(f8e5m2_to_f32(f8e5m2{0x7d})));
  for (uint32_t b = 0; b < 0x100; ++b) {
    float f = f8e5m2_to_f32(f8e5m2{uint8_t(b)});
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f8e5m2(f).bits, b) << b;
  }
}

// The generic rounding must agree with the fast bf16 path and with a plain reference on many
// random floats: f16 via exhaustive neighbour check (the nearest representable value wins).
TEST(DType, F16IsNearestOnRandomFloats) {
  uint32_t state = 1;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    float x = bits_to_f32((state & 0x8fffffffu) | 0x30000000u);  // magnitudes around 2^-31..2^32
    if (!std::isfinite(x) || std::fabs(x) > 65504.0f) continue;
    uint16_t h = f32_to_f16(x).bits;
    double got = f16_to_f32(f16{h});
    double up = f16_to_f32(f16{uint16_t(h + 1)});
    double down = h & 0x7fff ? f16_to_f32(f16{uint16_t(h - 1)}) : -got;
    double err = std::fabs(got - x);
    if (std::isfinite(up)) {
      ASSERT_LE(err, std::fabs(up - x)) << x;
    }
    ASSERT_LE(err, std::fabs(down - x)) << x;
  }
}

TEST(DType, ConvertBetweenTypes) {
  float src[4] = {1.5f, -2.75f, 3e9f, kNaN};
  int32_t i[4];
  convert(src, DType::f32, i, DType::i32, 4);
  EXPECT_EQ(i[0], 1);
  EXPECT_EQ(i[1], -2);
  EXPECT_EQ(i[2], std::numeric_limits<int32_t>::max());  // saturates
  EXPECT_EQ(i[3], 0);
  int64_t big[1] = {(int64_t(1) << 40) + 3};
  int64_t back[1];
  convert(big, DType::i64, back, DType::i64, 1);
  EXPECT_EQ(back[0], big[0]);
  int32_t narrow[1];
  convert(big, DType::i64, narrow, DType::i32, 1);
  EXPECT_EQ(narrow[0], 3);  // two's complement truncation, as numpy's astype
  uint8_t b[4];
  convert(src, DType::f32, b, DType::boolean, 4);
  EXPECT_EQ(b[0], 1);
  bf16 h[2];
  convert(src, DType::f32, h, DType::bf16, 2);
  EXPECT_EQ(h[0].bits, 0x3fc0);
  EXPECT_EQ(dtype_size(DType::f8e5m2), 1u);
  DType t;
  EXPECT_TRUE(dtype_from_safetensors_name("F8_E4M3", &t));
  EXPECT_EQ(t, DType::f8e4m3);
  EXPECT_FALSE(dtype_from_safetensors_name("F64", &t));
}

}  // namespace
}  // namespace deg
