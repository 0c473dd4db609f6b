// Cross-request batching of fills: requests waiting for the engine whose schema and options are
// the same are filled in one Engine::fill call, in arrival order. Batch invariance makes that
// safe: a document's answer is bitwise the one it gets alone (EngineTest, ServerTest). Requests
// with different schemas take the engine in turn (sharing micro-batches across schemas needs the
// engine to take several plans in one call: #17 item 3).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "deg/engine.h"
#include "deg/json.h"

namespace deg::server {

class Batcher {
 public:
  // At most `max_documents` documents go into one engine call (a request with more runs alone).
  Batcher(const Engine& engine, int64_t max_documents)
      : engine_(engine), max_documents_(max_documents) {}

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

  int64_t engine_calls() const;  // Engine::fill calls so far

 private:
  struct Job {
    std::string key;  // schema and options: jobs with equal keys may share a call
    const OrderedJson* schema;
    const std::vector<DocumentParts>* documents;
    const FillOptions* options;
    std::vector<FillResult> results;
    std::exception_ptr error;
    bool taken = false;  // in a leader's batch: no longer waiting
    bool done = false;
  };
  void lead(std::unique_lock<std::mutex>& lock);

  const Engine& engine_;
  const int64_t max_documents_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job*> waiting_;  // arrival order
  bool busy_ = false;         // a leader is in Engine::fill
  int64_t calls_ = 0;
};

}  // namespace deg::server
