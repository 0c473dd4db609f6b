// Prometheus text format 0.0.4 (metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

namespace deg::server {

void Metrics::request_done(const std::string& route, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{route, status}];
  if (status >= 400) ++errors_[status];
}

void Metrics::latency(double seconds) {
  std::lock_guard lock(mutex_);
  size_t b = 0;
  while (b < kBuckets.size() && seconds > kBuckets[b]) ++b;
  ++latency_[b];
  latency_sum_ += seconds;
  ++latency_count_;
}

void Metrics::documents_done(int64_t filled, int64_t failed) {
  std::lock_guard lock(mutex_);
  filled_ += filled;
  failed_ += failed;
}

void Metrics::queue_depth(int64_t waiting) {
  std::lock_guard lock(mutex_);
  queue_ = waiting;
}

std::string Metrics::text(int64_t engine_calls) const {
  std::lock_guard lock(mutex_);
  std::string out;
  auto put = std::back_inserter(out);
  fmt::format_to(put,
                 "# HELP deg_http_requests_total HTTP requests answered, by route and status.\n"
                 "# TYPE deg_http_requests_total counter\n");
  for (const auto& [key, n] : requests_) {
    fmt::format_to(put, "deg_http_requests_total{{route=\"{}\",code=\"{}\"}} {}\n", key.first,
                   key.second, n);
  }
  fmt::format_to(put,
                 "# HELP deg_http_errors_total HTTP requests answered with an error, by status.\n"
                 "# TYPE deg_http_errors_total counter\n");
  for (const auto& [status, n] : errors_) {
    fmt::format_to(put, "deg_http_errors_total{{code=\"{}\"}} {}\n", status, n);
  }
  fmt::format_to(put,
                 "# HELP deg_documents_filled_total Documents filled.\n"
                 "# TYPE deg_documents_filled_total counter\n"
                 "deg_documents_filled_total {}\n"
                 "# HELP deg_documents_failed_total Documents that failed alone (empty, not "
                 "UTF-8, over the limits).\n"
                 "# TYPE deg_documents_failed_total counter\n"
                 "deg_documents_failed_total {}\n"
                 "# HELP deg_fill_queue_depth Fills running or waiting for the engine.\n"
                 "# TYPE deg_fill_queue_depth gauge\n"
                 "deg_fill_queue_depth {}\n"
                 "# HELP deg_engine_fills_total Engine calls (requests waiting together share "
                 "one).\n"
                 "# TYPE deg_engine_fills_total counter\n"
                 "deg_engine_fills_total {}\n",
                 filled_, failed_, queue_, engine_calls);
  fmt::format_to(put,
                 "# HELP deg_http_request_duration_seconds Time in the request handler.\n"
                 "# TYPE deg_http_request_duration_seconds histogram\n");
  int64_t cumulative = 0;
  for (size_t b = 0; b < latency_.size(); ++b) {
    cumulative += latency_[b];
    const std::string le = b < kBuckets.size() ? fmt::format("{}", kBuckets[b]) : "+Inf";
    fmt::format_to(put, "deg_http_request_duration_seconds_bucket{{le=\"{}\"}} {}\n", le,
                   cumulative);
  }
  fmt::format_to(put,
                 "deg_http_request_duration_seconds_sum {}\n"
                 "deg_http_request_duration_seconds_count {}\n",
                 latency_sum_, latency_count_);
  return out;
}

}  // namespace deg::server
