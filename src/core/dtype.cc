// Narrow-float encoders/decoders. One generic rounding routine covers f16, e4m3fn and e5m2 (and is
// checked against known bit patterns in tests/dtype_test.cc); bf16 has its own bit trick in the
// header because it is on hot paths.
#include "core/dtype.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace deg {

namespace {

// An IEEE-like binary format narrower than f32.
struct SmallFloat {
  int exp_bits;
  int man_bits;
  bool has_inf;  // false: e4m3fn, whose all-ones exponent is still finite (but S.1111.111 is NaN)
  uint32_t nan_bits;  // canonical NaN without sign
};

constexpr SmallFloat kF16{5, 10, true, 0x7e00};
constexpr SmallFloat kE4M3{4, 3, false, 0x7f};
constexpr SmallFloat kE5M2{5, 2, true, 0x7f};

int bias(const SmallFloat& f) {
  return (1 << (f.exp_bits - 1)) - 1;
}

double small_max(const SmallFloat& f) {
  int b = bias(f);
  int emax_field = (1 << f.exp_bits) - (f.has_inf ? 2 : 1);
  // e4m3fn: the top mantissa pattern of the top exponent is NaN, so max mantissa is all-ones - 1.
  double man_max =
      f.has_inf ? (2.0 - std::ldexp(1.0, -f.man_bits)) : (2.0 - std::ldexp(2.0, -f.man_bits));
  return std::ldexp(man_max, emax_field - b);
}

uint32_t encode(float x, const SmallFloat& f) {
  const int total_bits = 1 + f.exp_bits + f.man_bits;
  const uint32_t sign = (f32_to_bits(x) >> 31) << (total_bits - 1);
  const uint32_t inf_bits = ((1u << f.exp_bits) - 1) << f.man_bits;
  if (std::isnan(x)) return sign | f.nan_bits;
  double a = std::fabs(double(x));
  if (std::isinf(a)) return sign | (f.has_inf ? inf_bits : f.nan_bits);
  if (a == 0) return sign;
  const int b = bias(f);
  const int emin = 1 - b;  // exponent of the smallest normal
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  e -= 1;             // now a = m' * 2^e, m' in [1, 2)
  if (e < emin) e = emin;
  const double quantum = std::ldexp(1.0, e - f.man_bits);
  double q = std::nearbyint(a / quantum);  // exact division (power of two); RNE in default mode
  double rounded = q * quantum;
  if (rounded > small_max(f)) return sign | (f.has_inf ? inf_bits : f.nan_bits);
  if (q >= std::ldexp(1.0, f.man_bits + 1)) {  // rounded up into the next binade
    q /= 2;
    e += 1;
  }
  uint32_t mant = uint32_t(q);
  if (mant < (1u << f.man_bits)) return sign | mant;  // subnormal (exponent field 0)
  uint32_t exp_field = uint32_t(e + b);
  return sign | (exp_field << f.man_bits) | (mant - (1u << f.man_bits));
}

float decode(uint32_t bits, const SmallFloat& f) {
  const int total_bits = 1 + f.exp_bits + f.man_bits;
  const bool negative = (bits >> (total_bits - 1)) & 1u;
  const uint32_t exp_field = (bits >> f.man_bits) & ((1u << f.exp_bits) - 1);
  const uint32_t mant = bits & ((1u << f.man_bits) - 1);
  const uint32_t exp_all_ones = (1u << f.exp_bits) - 1;
  double v;
  if (f.has_inf && exp_field == exp_all_ones) {
    v = mant ? std::nan("") : INFINITY;
  } else if (!f.has_inf && exp_field == exp_all_ones && mant == (1u << f.man_bits) - 1) {
    v = std::nan("");
  } else if (exp_field == 0) {
    v = std::ldexp(double(mant), 1 - bias(f) - f.man_bits);
  } else {
    v = std::ldexp(double(mant | (1u << f.man_bits)), int(exp_field) - bias(f) - f.man_bits);
  }
  return float(negative ? -v : v);
}

}  // namespace

float f16_to_f32(f16 x) {
  return decode(x.bits, kF16);
}
f16 f32_to_f16(float f) {
  if (std::isnan(f)) {  // keep the payload's top bits, as numpy does; always quiet
    uint32_t b = f32_to_bits(f);
    return f16{uint16_t(((b >> 16) & 0x8000u) | 0x7e00u | ((b & 0x7fffffu) >> 13))};
  }
  return f16{uint16_t(encode(f, kF16))};
}
float f8e4m3_to_f32(f8e4m3 x) {
  return decode(x.bits, kE4M3);
}
f8e4m3 f32_to_f8e4m3(float f) {
  return f8e4m3{uint8_t(encode(f, kE4M3))};
}
float f8e5m2_to_f32(f8e5m2 x) {
  return decode(x.bits, kE5M2);
}
f8e5m2 f32_to_f8e5m2(float f) {
  return f8e5m2{uint8_t(encode(f, kE5M2))};
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::boolean: return 1;
    case DType::f8e4m3: return 1;
    case DType::f8e5m2: return 1;
  }
  DEG_CHECK(false, "bad dtype {}", int(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
  }
  DEG_CHECK(false, "bad dtype {}", int(t));
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::boolean: return "BOOL";
    case DType::f8e4m3: return "F8_E4M3";
    case DType::f8e5m2: return "F8_E5M2";
  }
  DEG_CHECK(false, "bad dtype {}", int(t));
}

bool dtype_from_safetensors_name(std::string_view name, DType* out) {
  for (DType t : kAllDTypes) {
    if (dtype_safetensors_name(t) == name) {
      *out = t;
      return true;
    }
  }
  return false;
}

bool dtype_is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f8e4m3 ||
         t == DType::f8e5m2;
}

namespace {

double load_as_double(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const bf16*>(p)[i]);
    case DType::f16: return f16_to_f32(static_cast<const f16*>(p)[i]);
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return double(static_cast<const int64_t*>(p)[i]);
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    case DType::boolean: return static_cast<const uint8_t*>(p)[i] != 0;
    case DType::f8e4m3: return f8e4m3_to_f32(static_cast<const f8e4m3*>(p)[i]);
    case DType::f8e5m2: return f8e5m2_to_f32(static_cast<const f8e5m2*>(p)[i]);
  }
  return 0;
}

int64_t load_as_int(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<const int64_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    case DType::boolean: return static_cast<const uint8_t*>(p)[i] != 0;
    default: return 0;
  }
}

// Saturating float -> int, truncating toward zero; NaN -> 0.
template <class I>
I float_to_int(double v) {
  if (std::isnan(v)) return 0;
  constexpr double lo = double(std::numeric_limits<I>::min());
  constexpr double hi = double(std::numeric_limits<I>::max());
  if (v <= lo) return std::numeric_limits<I>::min();
  if (v >= hi) return std::numeric_limits<I>::max();
  return I(v);
}

void store(void* p, DType t, size_t i, double v, int64_t iv, bool src_is_int) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = src_is_int ? float(iv) : float(v); return;
    case DType::bf16:
      static_cast<bf16*>(p)[i] = f32_to_bf16(src_is_int ? float(iv) : float(v));
      return;
    case DType::f16:
      static_cast<f16*>(p)[i] = f32_to_f16(src_is_int ? float(iv) : float(v));
      return;
    case DType::f8e4m3:
      static_cast<f8e4m3*>(p)[i] = f32_to_f8e4m3(src_is_int ? float(iv) : float(v));
      return;
    case DType::f8e5m2:
      static_cast<f8e5m2*>(p)[i] = f32_to_f8e5m2(src_is_int ? float(iv) : float(v));
      return;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = src_is_int ? int32_t(iv) : float_to_int<int32_t>(v);
      return;
    case DType::i64:
      static_cast<int64_t*>(p)[i] = src_is_int ? iv : float_to_int<int64_t>(v);
      return;
    case DType::u8:
      static_cast<uint8_t*>(p)[i] = src_is_int ? uint8_t(iv) : uint8_t(float_to_int<int32_t>(v));
      return;
    case DType::boolean: static_cast<uint8_t*>(p)[i] = src_is_int ? (iv != 0) : (v != 0); return;
  }
}

}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  const bool src_is_int = !dtype_is_float(src_type);
  for (size_t i = 0; i < n; ++i) {
    double v = src_is_int ? 0.0 : load_as_double(src, src_type, i);
    int64_t iv = src_is_int ? load_as_int(src, src_type, i) : 0;
    store(dst, dst_type, i, v, iv, src_is_int);
  }
}

}  // namespace deg
