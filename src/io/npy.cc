#include "io/npy.h"

#include <cstring>
#include <fstream>

#include "core/buffer.h"
#include "core/error.h"

namespace deg {

namespace {

constexpr char kMagic[] = "\x93NUMPY";

bool descr_to_dtype(const std::string& d, DType* out) {
  // Little-endian (or byte-order-free) types only; this machine and every target are LE.
  if (d == "<f4")
    *out = DType::f32;
  else if (d == "<f2")
    *out = DType::f16;
  else if (d == "<i4")
    *out = DType::i32;
  else if (d == "<i8")
    *out = DType::i64;
  else if (d == "|u1" || d == "<u1")
    *out = DType::u8;
  else if (d == "|b1")
    *out = DType::boolean;
  else
    return false;
  return true;
}

const char* dtype_to_descr(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::u8: return "|u1";
    case DType::boolean: return "|b1";
    default: return nullptr;
  }
}

Error npy_error(const std::string& what, const std::string& msg) {
  return Error(ErrorKind::format, msg, {.path = what});
}

// The header is a Python dict literal, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
std::string dict_value(const std::string& header, const std::string& key, const std::string& what) {
  std::string k = "'" + key + "'";
  size_t p = header.find(k);
  if (p == std::string::npos) throw npy_error(what, "npy header has no '" + key + "'");
  p = header.find(':', p + k.size());
  if (p == std::string::npos) throw npy_error(what, "npy header is malformed near '" + key + "'");
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  size_t e = p;
  if (p < header.size() && header[p] == '(') {
    e = header.find(')', p);
    if (e == std::string::npos) throw npy_error(what, "npy header: unterminated shape");
    return header.substr(p, e - p + 1);
  }
  if (p < header.size() && header[p] == '\'') {
    e = header.find('\'', p + 1);
    if (e == std::string::npos) throw npy_error(what, "npy header: unterminated string");
    return header.substr(p + 1, e - p - 1);
  }
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  return header.substr(p, e - p);
}

Shape parse_shape(const std::string& s, const std::string& what) {
  Shape shape;
  size_t i = 1;  // after '('
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
    if (i >= s.size() || s[i] == ')') break;
    size_t j = i;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i || j - i > 18) throw npy_error(what, "npy header: bad shape " + s);
    shape.push_back(std::stoll(s.substr(i, j - i)));
    i = j;
  }
  return shape;
}

}  // namespace

Tensor npy_parse(std::string_view bytes, const std::string& what) {
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0) {
    throw npy_error(what, "not a .npy file (bad magic)");
  }
  const int major = uint8_t(bytes[6]);
  size_t header_len, header_start;
  if (major == 1) {
    header_len = uint8_t(bytes[8]) | (size_t(uint8_t(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw npy_error(what, "truncated .npy header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | uint8_t(bytes[8 + size_t(i)]);
    header_start = 12;
  } else {
    throw npy_error(what, fmt::format("unsupported .npy version {}", major));
  }
  if (header_len > bytes.size() - header_start) throw npy_error(what, "truncated .npy header");
  std::string header(bytes.substr(header_start, header_len));
  std::string descr = dict_value(header, "descr", what);
  DType dtype;
  if (!descr_to_dtype(descr, &dtype)) {
    throw npy_error(what,
                    "unsupported .npy dtype '" + descr + "' (supported: <f4 <f2 <i4 <i8 |u1 |b1)");
  }
  if (dict_value(header, "fortran_order", what) != "False") {
    throw npy_error(what, "Fortran-ordered .npy is not supported; save with np.ascontiguousarray");
  }
  Shape shape = parse_shape(dict_value(header, "shape", what), what);
  int64_t numel = shape_numel(shape);
  size_t data_start = header_start + header_len;
  size_t need = size_t(numel) * dtype_size(dtype);
  if (numel > 0 &&
      (size_t(numel) > (bytes.size() / dtype_size(dtype)) || bytes.size() - data_start < need)) {
    throw npy_error(what, fmt::format("truncated .npy data: {} needs {} bytes, file has {}",
                                      shape_str(shape), need, bytes.size() - data_start));
  }
  Tensor t = Tensor::empty(shape, dtype);
  if (need) std::memcpy(t.raw_mutable(), bytes.data() + data_start, need);
  return t;
}

Tensor npy_read(const std::filesystem::path& path) {
  std::string bytes = read_file(path);
  return npy_parse(bytes, path.string());
}

std::string npy_serialize(const Tensor& tensor) {
  const char* descr = dtype_to_descr(tensor.dtype());
  if (!descr) {
    throw Error(ErrorKind::unsupported, fmt::format("cannot write {} to .npy; convert to f32 first",
                                                    dtype_name(tensor.dtype())));
  }
  std::string shape = "(";
  for (size_t i = 0; i < tensor.shape().size(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(tensor.shape()[i]);
  }
  if (tensor.rank() == 1) shape += ",";
  shape += ")";
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape);
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic, 6);
  out += char(1);
  out += char(0);
  out += char(header.size() & 0xff);
  out += char(header.size() >> 8);
  out += header;
  Tensor c = tensor.contiguous();
  out.append(reinterpret_cast<const char*>(c.raw()), c.nbytes());
  return out;
}

void npy_write(const std::filesystem::path& path, const Tensor& tensor) {
  std::string bytes = npy_serialize(tensor);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorKind::io, "cannot create file", {.path = path.string()});
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out.flush())
    throw Error(ErrorKind::io, "write failed (disk full?)", {.path = path.string()});
}

}  // namespace deg
