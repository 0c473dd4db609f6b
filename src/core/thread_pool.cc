#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "core/config.h"
#include "core/error.h"

namespace deg {

namespace {
thread_local bool t_inside_worker = false;
}  // namespace

ThreadPool::ThreadPool(int threads) {
  threads = std::max(1, threads);
  for (int i = 0; i < threads - 1; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

namespace {
void chunk_bounds(int64_t n, int chunks, int index, int64_t* begin, int64_t* end) {
  *begin = n * index / chunks;
  *end = n * (index + 1) / chunks;
}

// Polls `ready` for up to about 50 microseconds; true as soon as it holds.
template <typename Ready>
bool spin_until(const Ready& ready) {
  for (int i = 0; i < 2048; ++i) {
    if (ready()) return true;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  for (int i = 0; i < 64; ++i) {
    if (ready()) return true;
    std::this_thread::yield();
  }
  return ready();
}
}  // namespace

void ThreadPool::worker_loop() {
  t_inside_worker = true;
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mutex_);
      ++sleepers_;
      start_cv_.wait(lock, ready);
      --sleepers_;
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks();
  }
}

void ThreadPool::run_chunks() {
  for (;;) {
    // Any chunk this takes below the count is a chunk of the job being run now: its caller
    // waits for it, so job_ and job_n_ stay as published. Past the count, nothing is taken.
    const uint64_t c = claim_.fetch_add(1, std::memory_order_acq_rel);
    const auto chunk = int64_t(c & 0xffffffffu), chunks = int64_t(c >> 32);
    if (chunk >= chunks) return;
    int64_t b, e;
    chunk_bounds(job_n_, int(chunks), int(chunk), &b, &e);
    if (b < e) (*job_)(b, e);
    if (unfinished_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_waiting_) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int chunks = int(std::min<int64_t>(size(), (n + grain - 1) / grain));
  if (chunks <= 1 || t_inside_worker || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> run(run_mutex_);
  job_ = &fn;
  job_n_ = n;
  unfinished_.store(chunks, std::memory_order_relaxed);
  const uint64_t generation = generation_.load(std::memory_order_relaxed) + 1;
  claim_.store(uint64_t(chunks) << 32, std::memory_order_release);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.store(generation, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) start_cv_.notify_all();
  t_inside_worker = true;
  run_chunks();
  t_inside_worker = false;
  auto done = [&] { return unfinished_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_waiting_ = true;
    done_cv_.wait(lock, done);
    done_waiting_ = false;
  }
  job_ = nullptr;
}

namespace {
// The CPU quota of this process's cgroup in whole cores (rounded up), or 0 when there is none:
// cgroup v2's cpu.max ("max 100000" or "QUOTA PERIOD"), else v1's cfs quota and period. A
// container may see every core of its host through sched_getaffinity yet run on a few.
int cgroup_cpu_quota() {
  auto ratio = [](double quota, double period) {
    return quota > 0 && period > 0 ? int(std::ceil(quota / period)) : 0;
  };
  if (std::ifstream v2("/sys/fs/cgroup/cpu.max"); v2) {
    std::string quota;
    double period = 0;
    if (v2 >> quota >> period && quota != "max") return ratio(std::atof(quota.c_str()), period);
    return 0;
  }
  std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  double quota = 0, period = 0;
  if (q >> quota && p >> period) return ratio(quota, period);
  return 0;
}
}  // namespace

int available_cores() {
  int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  const int quota = cgroup_cpu_quota();
  return quota > 0 ? std::min(cores, quota) : cores;
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
int& requested_threads() {
  static int n = 0;
  return n;
}
std::mutex& pool_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

ThreadPool& thread_pool() {
  std::lock_guard<std::mutex> lock(pool_mutex());
  auto& pool = pool_slot();
  if (!pool) {
    int n = requested_threads();
    if (n <= 0) n = env_config().threads;
    if (n <= 0) n = available_cores();
    pool = std::make_unique<ThreadPool>(n);
  }
  return *pool;
}

void set_thread_count(int threads) {
  if (threads < 0 || threads > kMaxThreads) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("--threads must be in [0, {}] (0: one per available core), got {}",
                            kMaxThreads, threads));
  }
  std::lock_guard<std::mutex> lock(pool_mutex());
  requested_threads() = threads;
  pool_slot().reset();
}

}  // namespace deg
