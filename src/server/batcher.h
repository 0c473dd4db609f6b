// Cross-request batching of fills: one engine thread takes every request waiting for the engine
// (up to max_documents documents in all) and fills them in one Engine::fill_batch call, whatever
// their schemas and options: the forks of all their documents share micro-batches, and batch
// invariance keeps every answer bitwise the one it gets alone (EngineTest, ServerTest); a request
// is answered as soon as its own documents are finished, not when the call ends. The engine
// runs on that one thread only, so its working memory is drawn from one malloc arena rather than
// from one per connection thread (the server's RSS, docs/serve.md "Load test").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "deg/engine.h"
#include "deg/json.h"

namespace deg::server {

class Batcher {
 public:
  // At most `max_documents` documents go into one engine call (a request with more runs alone).
  Batcher(const Engine& engine, int64_t max_documents);
  // Fills what still waits, then stops the engine thread.
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  using Clock = std::chrono::steady_clock;
  // Thrown when a request's deadline passes while it waits for the engine.
  struct DeadlineExceeded {};

  // Fills `documents`, alone or together with other requests' documents; blocks until done.
  // Throws what Engine::fill throws for this schema, or DeadlineExceeded when `deadline` passes
  // before the request reaches the engine (once there, it runs to the end: a fill cannot be
  // interrupted).
  std::vector<FillResult> fill(const OrderedJson& schema,
                               const std::vector<DocumentParts>& documents,
                               const FillOptions& options,
                               std::optional<Clock::time_point> deadline = std::nullopt);

  int64_t engine_calls() const;  // Engine::fill_batch calls so far

 private:
  struct Job {
    FillRequest request;
    std::vector<FillResult> results;
    std::exception_ptr error;
    bool taken = false;  // in the engine's batch: no longer waiting
    bool done = false;
  };
  void run();  // the engine thread

  const Engine& engine_;
  const int64_t max_documents_;
  mutable std::mutex mutex_;
  std::condition_variable work_;     // to the engine thread: a job waits, or stop
  std::condition_variable changed_;  // to the requests: jobs were taken or done
  std::deque<Job*> waiting_;         // arrival order
  bool stopping_ = false;
  int64_t calls_ = 0;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace deg::server
