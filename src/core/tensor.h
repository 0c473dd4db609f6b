// Tensor: a typed, shaped, strided view into a shared Buffer. Views (reshape, slice, select,
// transpose) share memory; contiguous() and to() copy. Tensors over a read-only buffer (a mapped
// weight file) can be read but not written: mutable_data() checks.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/error.h"

namespace deg {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);    // throws deg::Error on a negative or overflowing shape
std::string shape_str(const Shape& shape);  // "[2, 3]"

class Tensor {
 public:
  Tensor() = default;
  // A view of `buffer` at `byte_offset`; empty strides mean contiguous (row-major).
  Tensor(std::shared_ptr<Buffer> buffer, size_t byte_offset, DType dtype, Shape shape,
         Shape strides = {});

  static Tensor empty(const Shape& shape, DType dtype);  // zero-filled, 64-byte aligned
  static Tensor zeros(const Shape& shape, DType dtype) { return empty(shape, dtype); }
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int rank() const { return int(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }
  bool is_contiguous() const;
  bool writable() const { return buffer_ && buffer_->writable(); }
  Device device() const { return buffer_ ? buffer_->device() : Device::cpu; }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  size_t byte_offset() const { return offset_; }

  const std::byte* raw() const { return buffer_->data() + offset_; }
  std::byte* raw_mutable() const;
  template <class T>
  const T* data() const {
    DEG_CHECK(dtype_of<T>() == dtype_, "tensor is {}, accessed as {}", dtype_name(dtype_),
              dtype_name(dtype_of<T>()));
    return reinterpret_cast<const T*>(raw());
  }
  template <class T>
  T* mutable_data() const {
    DEG_CHECK(dtype_of<T>() == dtype_, "tensor is {}, accessed as {}", dtype_name(dtype_),
              dtype_name(dtype_of<T>()));
    return reinterpret_cast<T*>(raw_mutable());
  }

  // Views.
  Tensor view(const Shape& shape) const;  // contiguous only; one -1 is inferred
  Tensor slice(int dim, int64_t begin, int64_t end) const;
  Tensor select(int dim, int64_t index) const;  // drops the dimension
  Tensor transpose(int a, int b) const;

  // Copies.
  Tensor contiguous() const;  // returns *this when already contiguous
  Tensor clone() const;       // always a fresh, writable, contiguous copy
  Tensor to(DType dtype) const;

  // Element access for tests and small tools (slow: one index computation per call).
  double get(std::initializer_list<int64_t> index) const;
  std::vector<float> to_f32_vector() const;

  std::string describe() const;  // "bf16[2, 3]"

 private:
  int norm_dim(int d) const;
  size_t element_offset(std::initializer_list<int64_t> index) const;

  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;  // bytes
  DType dtype_ = DType::f32;
  Shape shape_;
  Shape strides_;
  int64_t numel_ = 0;
};

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  Tensor t = empty(shape, dtype_of<T>());
  if (size_t(t.numel()) != values.size()) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("{} values do not fill shape {}", values.size(), shape_str(shape)));
  }
  if (!values.empty()) std::memcpy(t.raw_mutable(), values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace deg
