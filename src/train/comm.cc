// Comm's solo and in-process (thread) groups (train/comm.h).
#include "train/comm.h"

#include <barrier>
#include <mutex>

#include "core/error.h"

namespace deg::train {
namespace {

class Solo final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void sum(float*, int64_t) const override {}
  void sum(double*, int64_t) const override {}
};

// The state a local group's ranks share: each rank's pointer and length of the sum under way,
// and the two barriers around it (all posted; all copied out).
struct Shared {
  explicit Shared(int n)
      : posted(n), taken(n), floats(size_t(n)), doubles(size_t(n)), sizes(size_t(n)) {}
  std::barrier<> posted, taken;
  std::vector<float*> floats;
  std::vector<double*> doubles;
  std::vector<int64_t> sizes;
  std::vector<float> total_f;
  std::vector<double> total_d;
};

class Local final : public Comm {
 public:
  Local(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return int(s_->sizes.size()); }
  void sum(float* x, int64_t n) const override { run(x, nullptr, n); }
  void sum(double* x, int64_t n) const override { run(nullptr, x, n); }

 private:
  // Every rank posts its buffer; rank 0 adds them in rank order into the total (checking that
  // all ranks summed alike); every rank copies the total out; then the buffers are free.
  void run(float* xf, double* xd, int64_t n) const {
    Shared& s = *s_;
    s.floats[size_t(rank_)] = xf;
    s.doubles[size_t(rank_)] = xd;
    s.sizes[size_t(rank_)] = n;
    s.posted.arrive_and_wait();
    if (rank_ == 0) {
      bool same = true;
      for (size_t r = 0; r < s.sizes.size(); ++r)
        same = same && s.sizes[r] == n && (s.floats[r] != nullptr) == (xf != nullptr);
      if (same && xf) {
        s.total_f.assign(xf, xf + n);
        for (size_t r = 1; r < s.floats.size(); ++r)
          for (int64_t i = 0; i < n; ++i) s.total_f[size_t(i)] += s.floats[r][i];
      } else if (same) {
        s.total_d.assign(xd, xd + n);
        for (size_t r = 1; r < s.doubles.size(); ++r)
          for (int64_t i = 0; i < n; ++i) s.total_d[size_t(i)] += s.doubles[r][i];
      } else {
        s.sizes[0] = -1;  // the ranks disagree: every rank throws below
      }
    }
    s.posted.arrive_and_wait();
    const bool ok = s.sizes[0] == n;
    if (ok && xf) std::copy(s.total_f.begin(), s.total_f.begin() + n, xf);
    if (ok && xd) std::copy(s.total_d.begin(), s.total_d.begin() + n, xd);
    s.taken.arrive_and_wait();
    if (!ok)
      throw Error(ErrorKind::internal, "the ranks of a local group summed different buffers");
  }

  std::shared_ptr<Shared> s_;
  int rank_;
};

}  // namespace

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
