#include "core/buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace deg {

namespace {

class HostBuffer : public Buffer {
 public:
  HostBuffer(std::byte* data, size_t size) : Buffer(data, size, true, Device::cpu) {}
  ~HostBuffer() override { std::free(data()); }
};

class ViewBuffer : public Buffer {
 public:
  ViewBuffer(std::byte* data, size_t size) : Buffer(data, size, true, Device::cpu) {}
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

std::shared_ptr<Buffer> buffer_view(std::byte* data, size_t bytes) {
  return std::make_shared<ViewBuffer>(data, bytes);
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

std::string read_file(const std::filesystem::path& path, int64_t max_bytes, const char* what) {
  const std::string p = path.string();
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT)
      throw Error(ErrorKind::not_found, fmt::format("{} not found", what), {.path = p});
    throw Error(ErrorKind::io, fmt::format("cannot open the {}: {}", what, std::strerror(err)),
                {.path = p});
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    throw Error(ErrorKind::io, fmt::format("cannot stat the {}: {}", what, std::strerror(errno)),
                {.path = p});
  }
  if (S_ISDIR(st.st_mode)) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("this is a directory, not a {}; pass a file", what), {.path = p});
  }
  auto too_big = [&](const std::string& size) {
    return Error(ErrorKind::unsupported,
                 fmt::format("the {} {} the limit of {} bytes, so deg does not read it; shorten or "
                             "split it",
                             what, size, max_bytes),
                 {.path = p});
  };
  if (S_ISREG(st.st_mode) && int64_t(st.st_size) > max_bytes) {
    throw too_big(fmt::format("is {} bytes, over", int64_t(st.st_size)));
  }
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(size_t(st.st_size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::io, fmt::format("cannot read the {}: {}", what, std::strerror(errno)),
                  {.path = p});
    }
    if (n == 0) break;
    out.append(chunk, size_t(n));
    if (int64_t(out.size()) > max_bytes) throw too_big("runs past");
  }
  return out;
}

}  // namespace deg
