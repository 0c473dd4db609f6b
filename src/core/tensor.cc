#include "core/tensor.h"

#include <cstring>
#include <limits>

namespace deg {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      throw Error(ErrorKind::invalid_argument, "negative dimension in " + shape_str(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      throw Error(ErrorKind::invalid_argument, "shape " + shape_str(shape) + " overflows");
    }
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

}  // namespace

Tensor::Tensor(std::shared_ptr<Buffer> buffer, size_t byte_offset, DType dtype, Shape shape,
               Shape strides)
    : buffer_(std::move(buffer)),
      offset_(byte_offset),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(strides.empty() ? contiguous_strides(shape_) : std::move(strides)),
      numel_(shape_numel(shape_)) {
  DEG_CHECK(strides_.size() == shape_.size(), "strides rank {} != shape rank {}", strides_.size(),
            shape_.size());
  if (is_contiguous()) {
    DEG_CHECK(offset_ + nbytes() <= buffer_->size(), "view {} at {} overruns a buffer of {} bytes",
              describe(), offset_, buffer_->size());
  }
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  int64_t n = shape_numel(shape);
  return Tensor(buffer_alloc(size_t(n) * dtype_size(dtype)), 0, dtype, shape);
}

int Tensor::norm_dim(int d) const {
  int r = rank();
  int nd = d < 0 ? d + r : d;
  DEG_CHECK(nd >= 0 && nd < r, "dim {} out of range for {}", d, describe());
  return nd;
}

int64_t Tensor::dim(int i) const {
  return shape_[size_t(norm_dim(i))];
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

std::byte* Tensor::raw_mutable() const {
  DEG_CHECK(buffer_ && buffer_->writable(), "tensor {} is read-only (a mapped file?)", describe());
  return buffer_->data() + offset_;
}

Tensor Tensor::view(const Shape& shape) const {
  DEG_CHECK(is_contiguous(), "view() of non-contiguous {}", describe());
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DEG_CHECK(infer < 0, "view {}: more than one -1", shape_str(shape));
      infer = int(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    DEG_CHECK(known > 0 && numel_ % known == 0, "cannot view {} as {}", describe(),
              shape_str(shape));
    s[size_t(infer)] = numel_ / known;
  }
  DEG_CHECK(shape_numel(s) == numel_, "cannot view {} as {}", describe(), shape_str(shape));
  return Tensor(buffer_, offset_, dtype_, s);
}

Tensor Tensor::slice(int d, int64_t begin, int64_t end) const {
  int nd = norm_dim(d);
  DEG_CHECK(0 <= begin && begin <= end && end <= shape_[size_t(nd)],
            "slice [{}, {}) of dim {} of {}", begin, end, d, describe());
  Tensor t = *this;
  t.offset_ += size_t(begin * strides_[size_t(nd)]) * dtype_size(dtype_);
  t.shape_[size_t(nd)] = end - begin;
  t.numel_ = shape_numel(t.shape_);
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  int nd = norm_dim(d);
  Tensor t = slice(nd, index, index + 1);
  t.shape_.erase(t.shape_.begin() + nd);
  t.strides_.erase(t.strides_.begin() + nd);
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  Tensor t = *this;
  int na = norm_dim(a), nb = norm_dim(b);
  std::swap(t.shape_[size_t(na)], t.shape_[size_t(nb)]);
  std::swap(t.strides_[size_t(na)], t.strides_[size_t(nb)]);
  return t;
}

namespace {

// Copies a strided tensor element by element into contiguous memory (dst has t.numel() slots).
void gather(const Tensor& t, std::byte* dst) {
  const size_t es = dtype_size(t.dtype());
  const int r = t.rank();
  if (t.numel() == 0) return;
  std::vector<int64_t> idx(size_t(r), 0);
  const std::byte* base = t.raw();
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t off = 0;
    for (int i = 0; i < r; ++i) off += idx[size_t(i)] * t.strides()[size_t(i)];
    std::memcpy(dst + size_t(n) * es, base + off * int64_t(es), es);
    for (int i = r - 1; i >= 0; --i) {
      if (++idx[size_t(i)] < t.shape()[size_t(i)]) break;
      idx[size_t(i)] = 0;
    }
  }
}

}  // namespace

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_);
  if (is_contiguous()) {
    if (nbytes()) std::memcpy(out.raw_mutable(), raw(), nbytes());
  } else {
    gather(*this, out.raw_mutable());
  }
  return out;
}

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor src = contiguous();
  Tensor out = empty(shape_, dtype);
  convert(src.raw(), dtype_, out.raw_mutable(), dtype, size_t(numel_));
  return out;
}

size_t Tensor::element_offset(std::initializer_list<int64_t> index) const {
  DEG_CHECK(int(index.size()) == rank(), "index of rank {} into {}", index.size(), describe());
  int64_t off = 0;
  size_t i = 0;
  for (int64_t x : index) {
    DEG_CHECK(x >= 0 && x < shape_[i], "index {} out of range in dim {} of {}", x, i, describe());
    off += x * strides_[i++];
  }
  return offset_ + size_t(off) * dtype_size(dtype_);
}

double Tensor::get(std::initializer_list<int64_t> index) const {
  size_t off = element_offset(index);
  float f;
  convert(buffer_->data() + off, dtype_, &f, DType::f32, 1);
  if (!dtype_is_float(dtype_)) {
    int64_t v;
    convert(buffer_->data() + off, dtype_, &v, DType::i64, 1);
    return double(v);
  }
  return f;
}

std::vector<float> Tensor::to_f32_vector() const {
  Tensor f = to(DType::f32);
  const float* p = f.data<float>();
  return std::vector<float>(p, p + numel_);
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_);
}

}  // namespace deg
