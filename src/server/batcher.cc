// The engine thread (batcher.h): it sleeps until a request waits, takes every waiting request
// whose documents still fit the call (in arrival order; the first always), fills them all in one
// Engine::fill_batch, hands each its results or its error and wakes the requests.
#include "server/batcher.h"

#include <algorithm>

namespace deg::server {

Batcher::Batcher(const Engine& engine, int64_t max_documents)
    : engine_(engine), max_documents_(max_documents), thread_([this] { run(); }) {}

Batcher::~Batcher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_one();
  thread_.join();
}

std::vector<FillResult> Batcher::fill(const OrderedJson& schema,
                                      const std::vector<DocumentParts>& documents,
                                      const FillOptions& options,
                                      std::optional<Clock::time_point> deadline) {
  Job job{.request = {.schema = &schema, .documents = &documents, .options = options}};
  std::unique_lock lock(mutex_);
  waiting_.push_back(&job);
  work_.notify_one();
  if (deadline && !changed_.wait_until(lock, *deadline, [&] { return job.taken; })) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &job));
    throw DeadlineExceeded{};
  }
  changed_.wait(lock, [&] { return job.done; });
  if (job.error) std::rethrow_exception(job.error);
  return std::move(job.results);
}

void Batcher::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
    if (waiting_.empty()) return;  // stopping, and nothing is left to fill
    std::vector<Job*> batch;
    int64_t count = 0;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      const auto n = int64_t((*it)->request.documents->size());
      if (!batch.empty() && count + n > max_documents_) {
        ++it;
        continue;
      }
      batch.push_back(*it);
      count += n;
      (*it)->taken = true;
      it = waiting_.erase(it);
    }
    ++calls_;
    changed_.notify_all();  // taken: their deadlines no longer apply
    lock.unlock();
    std::vector<FillRequest> requests;
    for (const Job* j : batch) requests.push_back(j->request);
    std::vector<FillResponse> responses;
    std::exception_ptr error;  // not one request's: a failure of the whole call (out of memory)
    try {
      responses = engine_.fill_batch(requests);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    for (size_t i = 0; i < batch.size(); ++i) {
      Job& j = *batch[i];
      if (error) {
        j.error = error;
      } else if (responses[i].error) {
        j.error = std::make_exception_ptr(*responses[i].error);
      } else {
        j.results = std::move(responses[i].results);
      }
      j.done = true;
    }
    changed_.notify_all();
  }
}

int64_t Batcher::engine_calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

}  // namespace deg::server
