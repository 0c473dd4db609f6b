// Element types and exact conversions between them. Half-width floats (bf16, f16) and fp8
// (e4m3fn, e5m2) are storage types: arithmetic happens in f32. Conversions from f32 round to
// nearest, ties to even, keep NaN a NaN, and handle subnormals and overflow as PyTorch does
// (f16/bf16/e5m2 overflow to infinity; e4m3fn has no infinity and overflows to NaN).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace deg {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8, boolean, f8e4m3, f8e5m2 };

inline constexpr DType kAllDTypes[] = {DType::f32,     DType::bf16,   DType::f16,
                                       DType::i32,     DType::i64,    DType::u8,
                                       DType::boolean, DType::f8e4m3, DType::f8e5m2};

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);              // "f32", "bf16", ... (deg's own spelling)
std::string_view dtype_safetensors_name(DType t);  // "F32", "BF16", "F8_E4M3", ...
bool dtype_from_safetensors_name(std::string_view name, DType* out);
bool dtype_is_float(DType t);

// Storage types for the narrow floats: just the bits.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};
struct f8e4m3 {
  uint8_t bits;
};
struct f8e5m2 {
  uint8_t bits;
};

inline float bits_to_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// bf16 is the top half of an f32: widening is a shift, narrowing rounds to nearest even.
inline float bf16_to_f32(bf16 x) {
  return bits_to_f32(uint32_t(x.bits) << 16);
}
inline bf16 f32_to_bf16(float f) {
  uint32_t b = f32_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((b >> 16) | 0x40)};  // quiet NaN
  b += 0x7fffu + ((b >> 16) & 1u);
  return bf16{uint16_t(b >> 16)};
}

float f16_to_f32(f16 x);
f16 f32_to_f16(float f);
float f8e4m3_to_f32(f8e4m3 x);
f8e4m3 f32_to_f8e4m3(float f);
float f8e5m2_to_f32(f8e5m2 x);
f8e5m2 f32_to_f8e5m2(float f);

// The C++ type that stores a dtype, for typed access to tensor data.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}
template <>
constexpr DType dtype_of<f8e4m3>() {
  return DType::f8e4m3;
}
template <>
constexpr DType dtype_of<f8e5m2>() {
  return DType::f8e5m2;
}

// Converts n elements between any two dtypes (floats through f32/f64; ints stay exact;
// float -> int truncates toward zero; anything -> bool is "nonzero").
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace deg
