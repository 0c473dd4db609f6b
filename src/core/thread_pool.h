// The one thread pool of the process (DESIGN.md §2: the only global mutable state besides the
// CUDA context). parallel_for splits [0, n) into fixed contiguous chunks by index, so which
// thread computes an element never changes a result; the calling thread takes a chunk too.
// Nested calls from inside a worker run inline.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deg {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // fn(begin, end) over at most size() chunks of [0, n), each at least `grain` long.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one parallel_for at a time from outside the pool
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// Number of cores this process may run on (sched affinity), at least 1.
int available_cores();

// The process pool; created on first use with set_thread_count's value, else DEG_THREADS, else
// available_cores().
ThreadPool& thread_pool();
// Sets the pool size (`--threads`); call before the first thread_pool() use, or it rebuilds it.
void set_thread_count(int threads);

inline void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                         int64_t grain = 1) {
  thread_pool().parallel_for(n, fn, grain);
}

}  // namespace deg
