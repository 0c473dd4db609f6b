// NumPy .npy files (format versions 1-3): f32, f16, i32, i64, u8 and bool, any rank, C order.
// `deg forward` writes its logits this way and the golden tests read fixtures this way.
#pragma once

#include <filesystem>
#include <string>

#include "core/tensor.h"

namespace deg {

Tensor npy_read(const std::filesystem::path& path);
// Parses an in-memory image; `what` names it in errors.
Tensor npy_parse(std::string_view bytes, const std::string& what);
void npy_write(const std::filesystem::path& path, const Tensor& tensor);
std::string npy_serialize(const Tensor& tensor);

}  // namespace deg
