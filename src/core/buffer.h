// Memory that tensors view: 64-byte aligned host allocations, and read-only memory maps of files
// (weights are mapped, never copied). Buffers are shared: a tensor keeps its buffer alive.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>

namespace deg {

enum class Device : uint8_t { cpu, cuda };

class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  bool writable() const { return writable_; }
  Device device() const { return device_; }

 protected:
  Buffer(std::byte* data, size_t size, bool writable, Device device)
      : data_(data), size_(size), writable_(writable), device_(device) {}

 private:
  std::byte* data_;
  size_t size_;
  bool writable_;
  Device device_;
};

inline constexpr size_t kBufferAlignment = 64;

// Zero-filled, 64-byte aligned host memory of `bytes` bytes. Throws deg::Error when the
// allocation fails (the message names the size).
std::shared_ptr<Buffer> buffer_alloc(size_t bytes);

// A view of `bytes` of host memory the caller owns and keeps alive while the buffer is used
// (never freed here): how a raw f32 array becomes a Tensor without a copy.
std::shared_ptr<Buffer> buffer_view(std::byte* data, size_t bytes);

// A whole file mapped read-only. An empty file gives a buffer of size 0.
class MappedFile : public Buffer {
 public:
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& path);
  ~MappedFile() override;
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::byte* data, size_t size, std::string path);
  std::string path_;
};

// Files deg reads whole (configs, tokenizer.json, schemas, .npy media) are at most this big
// unless the caller says otherwise (docs/hardening.md).
inline constexpr int64_t kMaxReadFileBytes = int64_t(1) << 30;  // 1 GiB

// Reads a whole file into a string; throws deg::Error naming the path when it cannot: a
// directory, a missing file, or one over `max_bytes` — refused before it is read whole (a
// regular file by its size, anything else such as a pipe or /dev/zero after max_bytes + 1
// bytes). `what` names the file's role in messages ("document", "schema").
std::string read_file(const std::filesystem::path& path, int64_t max_bytes = kMaxReadFileBytes,
                      const char* what = "file");

}  // namespace deg
