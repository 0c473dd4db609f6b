// The engine thread (batcher.h): it sleeps until a request waits, takes every waiting request
// whose documents still fit the call (in arrival order; the first always) and fills them all in
// one Engine::fill_batch; each request is handed its results and woken as soon as its last
// document is finished (FillOptions::on_result), or its error when the call ends.
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
    // A request is answered as soon as its last document is finished, while the call goes on
    // with the others; from then on its job belongs to its own thread again.
    std::vector<size_t> left(batch.size());
    std::vector<bool> answered(batch.size(), false);
    std::vector<FillRequest> requests;
    for (size_t k = 0; k < batch.size(); ++k) {
      Job& job = *batch[k];
      left[k] = job.request.documents->size();
      job.results.resize(left[k]);
      FillRequest request = job.request;
      request.options.on_result = [this, &job, &left, &answered, k](size_t i,
                                                                    const FillResult& result) {
        std::lock_guard hold(mutex_);
        job.results[i] = result;
        if (--left[k] == 0) {
          answered[k] = job.done = true;
          changed_.notify_all();
        }
      };
      requests.push_back(std::move(request));
    }
    lock.unlock();
    std::vector<FillResponse> responses;
    std::exception_ptr error;  // not one request's: a failure of the whole call (out of memory)
    try {
      responses = engine_.fill_batch(requests);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    // The rest: requests that failed as a whole, or had no document the engine finished.
    for (size_t k = 0; k < batch.size(); ++k) {
      if (answered[k]) continue;
      Job& job = *batch[k];
      if (error) {
        job.error = error;
      } else if (responses[k].error) {
        job.error = std::make_exception_ptr(*responses[k].error);
      } else {
        job.results = std::move(responses[k].results);
      }
      job.done = true;
    }
    changed_.notify_all();
  }
}

int64_t Batcher::engine_calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

}  // namespace deg::server
