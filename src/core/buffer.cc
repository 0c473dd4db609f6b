#include "core/buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace deg {

namespace {

class HostBuffer : public Buffer {
 public:
  HostBuffer(std::byte* data, size_t size) : Buffer(data, size, true, Device::cpu) {}
  ~HostBuffer() override { std::free(data()); }
};

}  // namespace

std::shared_ptr<Buffer> buffer_alloc(size_t bytes) {
  size_t rounded = (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  if (rounded == 0) rounded = kBufferAlignment;
  void* p = std::aligned_alloc(kBufferAlignment, rounded);
  if (!p) {
    throw Error(ErrorKind::io, fmt::format("out of memory allocating {} bytes", bytes));
  }
  std::memset(p, 0, rounded);
  return std::make_shared<HostBuffer>(static_cast<std::byte*>(p), bytes);
}

MappedFile::MappedFile(std::byte* data, size_t size, std::string path)
    : Buffer(data, size, false, Device::cpu), path_(std::move(path)) {}

MappedFile::~MappedFile() {
  if (data()) munmap(data(), size());
}

std::shared_ptr<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  const std::string p = path.string();
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ErrorKind kind = errno == ENOENT ? ErrorKind::not_found : ErrorKind::io;
    throw Error(kind, fmt::format("cannot open: {}", std::strerror(errno)), {.path = p});
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::io, "not a regular file", {.path = p});
  }
  size_t size = size_t(st.st_size);
  std::byte* data = nullptr;
  if (size > 0) {
    void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error(ErrorKind::io, fmt::format("cannot map: {}", std::strerror(err)), {.path = p});
    }
    data = static_cast<std::byte*>(m);
  }
  ::close(fd);
  return std::shared_ptr<MappedFile>(new MappedFile(data, size, p));
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ErrorKind kind = std::filesystem::exists(path) ? ErrorKind::io : ErrorKind::not_found;
    throw Error(kind, kind == ErrorKind::not_found ? "file not found" : "cannot read file",
                {.path = path.string()});
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace deg
