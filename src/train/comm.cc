// Comm's solo and in-process (thread) groups (train/comm.h).
#include "train/comm.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "kernels/cuda_runtime.h"

namespace deg::train {
namespace {

class Solo final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void sum(float*, int64_t) const override {}
  void sum(double*, int64_t) const override {}
};

// The state a local group's ranks share: each rank's buffer, element size and length for the
// sum under way, the total, and the barriers around it (all posted; all copied out).
struct Shared {
  explicit Shared(int n) : posted(n), taken(n), buffers(size_t(n)), kinds(size_t(n)) {}
  std::barrier<> posted, taken;
  std::vector<void*> buffers;
  std::vector<std::pair<size_t, int64_t>> kinds;  // element size, length
  std::vector<double> total;
  bool agreed = true;
};

class Local final : public Comm {
 public:
  Local(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return int(s_->buffers.size()); }
  void sum(float* x, int64_t n) const override { run(x, n); }
  void sum(double* x, int64_t n) const override { run(x, n); }

 private:
  // Every rank posts its buffer; rank 0 adds them in rank order, in T, into the total (checking
  // that all ranks summed alike); every rank copies the total out; then the buffers are free.
  template <class T>
  void run(T* x, int64_t n) const {
    Shared& s = *s_;
    s.buffers[size_t(rank_)] = x;
    s.kinds[size_t(rank_)] = {sizeof(T), n};
    s.posted.arrive_and_wait();
    if (rank_ == 0) {
      s.agreed = std::all_of(s.kinds.begin(), s.kinds.end(),
                             [&](const auto& k) { return k == s.kinds[0]; });
      if (s.agreed) {
        s.total.assign(size_t(n), 0.0);
        for (int64_t i = 0; i < n; ++i) {
          T v = x[i];
          for (size_t r = 1; r < s.buffers.size(); ++r) v += static_cast<T*>(s.buffers[r])[i];
          s.total[size_t(i)] = double(v);  // exact: a float is a double
        }
      }
    }
    s.posted.arrive_and_wait();
    const bool ok = s.agreed;
    if (ok)
      for (int64_t i = 0; i < n; ++i) x[i] = T(s.total[size_t(i)]);
    s.taken.arrive_and_wait();
    if (!ok)
      throw Error(ErrorKind::internal, "the ranks of a local group summed different buffers");
  }

  std::shared_ptr<Shared> s_;
  int rank_;
};

// ---- TCP ----

constexpr uint32_t kHello = 0x64656731;  // "deg1": a rank's first words are {kHello, rank, size}

[[noreturn]] void lost(const std::string& what) {
  throw Error(ErrorKind::io, "data-parallel training: " + what);
}

void send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) lost(fmt::format("a peer went away ({})", std::strerror(errno)));
    p += k;
    n -= size_t(k);
  }
}

void recv_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) lost("a peer went away (its process ended)");
    if (k < 0) lost(fmt::format("a peer went away ({})", std::strerror(errno)));
    p += k;
    n -= size_t(k);
  }
}

class Tcp final : public Comm {
 public:
  Tcp(int rank, int size, std::vector<int> fds) : rank_(rank), size_(size), fds_(std::move(fds)) {}
  ~Tcp() override {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sum(float* x, int64_t n) const override { run(x, n); }
  void sum(double* x, int64_t n) const override { run(x, n); }

 private:
  // Each rank sends {kind, n} and its buffer to rank 0, which adds the buffers in rank order and
  // sends the total back.
  template <class T>
  void run(T* x, int64_t n) const {
    const int64_t head[2] = {int64_t(sizeof(T)), n};
    const size_t bytes = size_t(n) * sizeof(T);
    if (rank_ > 0) {
      send_all(fds_[0], head, sizeof(head));
      send_all(fds_[0], x, bytes);
      recv_all(fds_[0], x, bytes);
      return;
    }
    std::vector<T> part(static_cast<size_t>(n));
    for (int r = 1; r < size_; ++r) {
      int64_t got[2];
      recv_all(fds_[size_t(r)], got, sizeof(got));
      if (got[0] != head[0] || got[1] != head[1])
        lost(fmt::format("rank {} summed {} values of {} bytes where rank 0 summed {} of {}", r,
                         got[1], got[0], n, head[0]));
      recv_all(fds_[size_t(r)], part.data(), bytes);
      for (int64_t i = 0; i < n; ++i) x[i] += part[size_t(i)];
    }
    for (int r = 1; r < size_; ++r) send_all(fds_[size_t(r)], x, bytes);
  }

  int rank_, size_;
  std::vector<int> fds_;  // rank 0: one per rank (fds_[0] unused); others: fds_[0], rank 0's
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rank 0: accepts the other ranks (each names itself) until all have come.
std::vector<int> accept_ranks(const Launch& l, double timeout_s) {
  const int lfd = ::socket(AF_INET6, SOCK_STREAM, 0);
  const bool v6 = lfd >= 0;
  const int fd = v6 ? lfd : ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) lost(fmt::format("no socket ({})", std::strerror(errno)));
  const int one = 1, zero = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (v6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 too
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons(uint16_t(l.master_port));
    len = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons(uint16_t(l.master_port));
    len = sizeof(sockaddr_in);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, l.world_size) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    lost(fmt::format("rank 0 cannot listen on port {} ({})", l.master_port, why));
  }
  std::vector<int> fds(size_t(l.world_size), -1);
  const auto t0 = std::chrono::steady_clock::now();
  int joined = 1;
  try {
    while (joined < l.world_size) {
      const double left = timeout_s - seconds_since(t0);
      if (left <= 0)
        lost(fmt::format("{} of {} ranks reached rank 0 in {:.0f} s", joined, l.world_size,
                         timeout_s));
      timeval tv{.tv_sec = long(left) + 1, .tv_usec = 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      const int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) continue;  // timed out or interrupted: check the clock again
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      uint32_t hello[3];
      recv_all(c, hello, sizeof(hello));
      const int r = int(hello[1]);
      if (hello[0] != kHello || int(hello[2]) != l.world_size || r <= 0 || r >= l.world_size ||
          fds[size_t(r)] >= 0) {
        ::close(c);
        lost(
            fmt::format("a process that is not rank 1 to {} of this run ({} of {}) reached "
                        "rank 0",
                        l.world_size - 1, r, hello[2]));
      }
      fds[size_t(r)] = c;
      ++joined;
    }
  } catch (...) {
    ::close(fd);
    for (int c : fds)
      if (c >= 0) ::close(c);
    throw;
  }
  ::close(fd);
  return fds;
}

// Another rank: connects to rank 0 (retrying while it is not up yet) and names itself.
int join_rank0(const Launch& l, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(l.master_port);
  const int gai = ::getaddrinfo(l.master_addr.c_str(), port.c_str(), &hints, &found);
  if (gai != 0) lost(fmt::format("MASTER_ADDR {}: {}", l.master_addr, ::gai_strerror(gai)));
  const auto t0 = std::chrono::steady_clock::now();
  int fd = -1;
  while (fd < 0) {
    for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        ::close(fd);
        fd = -1;
      }
    }
    if (fd >= 0) break;
    if (seconds_since(t0) > timeout_s) {
      ::freeaddrinfo(found);
      lost(fmt::format("rank {} could not reach rank 0 at {}:{} in {:.0f} s", l.rank, l.master_addr,
                       l.master_port, timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(found);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const uint32_t hello[3] = {kHello, uint32_t(l.rank), uint32_t(l.world_size)};
  send_all(fd, hello, sizeof(hello));
  return fd;
}

}  // namespace

std::unique_ptr<Comm> tcp_comm(const Launch& launch, double timeout_s) {
  if (launch.rank < 0)
    throw Error(ErrorKind::invalid_argument,
                fmt::format("{} started one of {} processes without a rank", launch.launcher,
                            launch.world_size));
  if (launch.world_size > 1 && (launch.master_port == 0 || launch.master_addr.empty()))
    throw Error(ErrorKind::invalid_argument,
                "data-parallel training needs MASTER_ADDR and MASTER_PORT: where rank 0 listens "
                "(torchrun sets them; under mpirun or srun set them in the job)");
  if (launch.world_size == 1) return solo_comm();
  if (launch.rank == 0)
    return std::make_unique<Tcp>(0, launch.world_size, accept_ranks(launch, timeout_s));
  return std::make_unique<Tcp>(launch.rank, launch.world_size,
                               std::vector<int>{join_rank0(launch, timeout_s)});
}

std::unique_ptr<Comm> launch_comm(const std::string& command, const std::string& device) {
  const Launch launch = launch_from_env();
  if (launch.world_size == 1) return solo_comm();
  if (pick_device(device) != Device::cpu) require_one_process(launch, command);
  return tcp_comm(launch);
}

std::unique_ptr<Comm> solo_comm() {
  return std::make_unique<Solo>();
}

std::vector<std::unique_ptr<Comm>> local_comms(int n) {
  if (n < 1) throw Error(ErrorKind::invalid_argument, "a group needs at least one rank");
  auto shared = std::make_shared<Shared>(n);
  std::vector<std::unique_ptr<Comm>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<Local>(shared, r));
  return out;
}

}  // namespace deg::train
