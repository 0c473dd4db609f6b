// Leader / followers (batcher.h): whichever waiting request is first in line when the engine is
// free takes every waiting request with its key, fills them in one call, hands each its results
// and wakes the others. No thread of its own, so nothing to stop.
#include "server/batcher.h"

#include <fmt/format.h>

#include <algorithm>

namespace deg::server {

std::vector<FillResult> Batcher::fill(const OrderedJson& schema,
                                      const std::vector<DocumentParts>& documents,
                                      const FillOptions& options,
                                      std::optional<Clock::time_point> deadline) {
  Job job{.key = fmt::format("{}\n{}\n{}", options.keep_nulls, options.min_confidence,
                             schema.dump(-1, ' ', false, OrderedJson::error_handler_t::replace)),
          .schema = &schema,
          .documents = &documents,
          .options = &options};
  std::unique_lock lock(mutex_);
  waiting_.push_back(&job);
  while (!job.done) {
    if (!job.taken && !busy_ && waiting_.front() == &job) {
      lead(lock);
    } else if (!deadline || job.taken) {
      changed_.wait(lock);
    } else if (changed_.wait_until(lock, *deadline) == std::cv_status::timeout && !job.taken) {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &job));
      changed_.notify_all();  // the next in line may lead now
      throw DeadlineExceeded{};
    }
  }
  if (job.error) std::rethrow_exception(job.error);
  return std::move(job.results);
}

void Batcher::lead(std::unique_lock<std::mutex>& lock) {
  std::vector<Job*> batch = {waiting_.front()};
  int64_t count = int64_t(batch[0]->documents->size());
  for (auto it = waiting_.begin() + 1; it != waiting_.end(); ++it) {
    const int64_t n = int64_t((*it)->documents->size());
    if ((*it)->key == batch[0]->key && count + n <= max_documents_) {
      batch.push_back(*it);
      count += n;
    }
  }
  for (Job* j : batch) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), j));
    j->taken = true;
  }
  busy_ = true;
  ++calls_;
  lock.unlock();
  std::vector<DocumentParts> documents;
  documents.reserve(size_t(count));
  for (const Job* j : batch) {
    documents.insert(documents.end(), j->documents->begin(), j->documents->end());
  }
  std::vector<FillResult> results;
  std::exception_ptr error;
  try {
    results = engine_.fill(*batch[0]->schema, documents, *batch[0]->options);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  size_t at = 0;
  for (Job* j : batch) {
    if (error) {
      j->error = error;
    } else {
      const size_t n = j->documents->size();
      j->results.assign(std::make_move_iterator(results.begin() + long(at)),
                        std::make_move_iterator(results.begin() + long(at + n)));
      at += n;
    }
    j->done = true;
  }
  busy_ = false;
  changed_.notify_all();
}

int64_t Batcher::engine_calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

}  // namespace deg::server
