// The one thread pool of the process (DESIGN.md §2: the only global mutable state besides the
// CUDA context). parallel_for splits [0, n) into fixed contiguous chunks by index, so which
// thread computes an element never changes a result. The caller and the workers claim chunks
// from a shared counter, so a worker the OS has not scheduled (more threads than free cores: a
// busy machine, several processes) delays nothing; the caller waits only for chunks a worker has
// started. Nested calls from inside a worker run inline. Workers and the caller spin briefly
// before they sleep: a training step issues thousands of short parallel_fors, and a futex sleep
// and wake-up per call cost more than the work (40% of a tiny CPU pretrain step went to them).
#pragma once

#include <atomic>
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
  void worker_loop();

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one parallel_for at a time from outside the pool
  // Takes and runs chunks of the current job until none is left.
  void run_chunks();

  // The job: written by the caller before it publishes claim_ (release); read by a thread only
  // after it has taken one of its chunks (acquire), so the caller is still waiting for it.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  // chunks (upper 32 bits) | next chunk to take (lower 32): a thread takes a chunk with one
  // fetch_add, and a number at or past the count means none is left (each thread overshoots
  // at most once a job, so the lower half never overflows).
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint64_t> generation_{0};  // wakes the workers (bumped after claim_)
  std::atomic<int> unfinished_{0};       // chunks of the current generation not yet done
  // Sleeping: generation_ and stop_ change under mutex_, so a worker that checks them under
  // mutex_ before it waits cannot miss a wake-up; likewise the caller's done_waiting_.
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  int sleepers_ = 0;
  bool done_waiting_ = false;
  std::atomic<bool> stop_{false};
};

// Number of cores this process may run on (sched affinity, capped by its cgroup's CPU quota),
// at least 1.
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
