// The server's counters and their Prometheus text exposition (GET /metrics). Route labels come
// from the fixed route table (anything else counts as "other"), so no client can grow the set of
// series.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace deg::server {

class Metrics {
 public:
  // One answered request: its route (a known path or "other") and status.
  void request_done(const std::string& route, int status);
  // Time a routed request spent in its handler.
  void latency(double seconds);
  void documents_done(int64_t filled, int64_t failed);
  void queue_depth(int64_t waiting);
  // The exposition, with the engine calls the batcher made so far.
  std::string text(int64_t engine_calls) const;

  // Upper bounds of the latency histogram's buckets, seconds (+Inf follows).
  static constexpr std::array<double, 12> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                      0.5,   1,    2.5,   5,    10,  30};

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // (route, status) -> count
  std::map<int, int64_t> errors_;                            // status >= 400 -> count
  std::array<int64_t, kBuckets.size() + 1> latency_{};       // per bucket, +Inf last
  double latency_sum_ = 0;
  int64_t latency_count_ = 0;
  int64_t filled_ = 0, failed_ = 0, queue_ = 0;
};

}  // namespace deg::server
