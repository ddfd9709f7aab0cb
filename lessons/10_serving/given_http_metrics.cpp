// Lesson 10's server, the metrics room (given): what /metrics reports, under its own lock.
#include <ostream>
#include <sstream>

#include "lessons/10_serving/server_parts.hpp"

namespace infer::server {

namespace {

std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

}  // namespace

void Metrics::Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

void Metrics::Histogram::print(std::ostream& os, const std::string& name, const std::string& help) const {
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  long cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += counts[i];
    os << name << "_bucket{le=\"" << bounds[i] << "\"} " << cumulative << "\n";
  }
  os << name << "_bucket{le=\"+Inf\"} " << count << "\n" << name << "_sum " << sum << "\n" << name << "_count " << count << "\n";
}

Metrics::Metrics()
    : finished_by_reason_{{"stop", 0}, {"length", 0}, {"cancelled", 0}, {"error", 0}},
      ttft_{latency_bounds(), std::vector<long>(latency_bounds().size() + 1, 0)},
      tpot_{latency_bounds(), std::vector<long>(latency_bounds().size() + 1, 0)},
      itl_{latency_bounds(), std::vector<long>(latency_bounds().size() + 1, 0)} {}

void Metrics::rejected(int status) {
  std::lock_guard lock(mutex_);
  ++rejected_by_status_[status];
}

void Metrics::tokens(const Job& job, size_t before, size_t n, Clock::time_point t) {
  if (n == 0) return;
  std::lock_guard lock(mutex_);
  generation_tokens_ += static_cast<long>(n);
  // The first token measures TTFT; each later one the gap since the one before it (tokens that
  // come in one step share its time).
  if (before == 0) {
    ttft_.observe(seconds_between(job.arrived, t));
    first_token_[job.id] = t;
  } else {
    const auto last = last_token_.find(job.id);
    itl_.observe(seconds_between(last == last_token_.end() ? job.arrived : last->second, t));
  }
  for (size_t i = 1; i < n; ++i) itl_.observe(0.0);
  last_token_[job.id] = t;
}

void Metrics::ended(const Job& job, size_t total, Clock::time_point t, const std::string& reason, int cached,
                    int preempted) {
  std::lock_guard lock(mutex_);
  ++finished_by_reason_[reason];
  preemptions_ += preempted;
  prompt_tokens_ += static_cast<long>(job.request.prompt.size());
  cached_tokens_ += cached;
  const auto first = first_token_.find(job.id);
  if (reason != "cancelled" && total >= 2 && first != first_token_.end())
    tpot_.observe(seconds_between(first->second, t) / static_cast<double>(total - 1));
  first_token_.erase(job.id);
  last_token_.erase(job.id);
}

void Metrics::failed(const Job& job, bool accepted) {
  std::lock_guard lock(mutex_);
  if (accepted) ++finished_by_reason_["error"];
  first_token_.erase(job.id);
  last_token_.erase(job.id);
}

void Metrics::step() {
  std::lock_guard lock(mutex_);
  ++steps_;
}

void Metrics::set(const Gauges& gauges) {
  std::lock_guard lock(mutex_);
  gauges_ = gauges;
}

void Metrics::watch_http(const std::atomic<int>& connections, const std::atomic<size_t>& body_bytes) {
  std::lock_guard lock(mutex_);
  connections_ = &connections;
  body_bytes_ = &body_bytes;
}

void Metrics::set_kv_capacity(long positions) {
  std::lock_guard lock(mutex_);
  kv_capacity_ = positions;
}

std::string Metrics::text() const {
  std::ostringstream os;
  std::lock_guard lock(mutex_);
  os << "# HELP course_requests_total Requests that ended, by how they ended.\n"
        "# TYPE course_requests_total counter\n";
  for (const auto& [reason, n] : finished_by_reason_)
    os << "course_requests_total{finish_reason=\"" << reason << "\"} " << n << "\n";
  os << "# HELP course_requests_rejected_total Requests refused before reaching the engine, by HTTP status.\n"
        "# TYPE course_requests_rejected_total counter\n";
  for (const auto& [status, n] : rejected_by_status_)
    os << "course_requests_rejected_total{status=\"" << status << "\"} " << n << "\n";
  const auto counter = [&](const char* name, const char* help, long v) {
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << v << "\n";
  };
  const auto gauge = [&](const char* name, const char* help, double v) {
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n" << name << " " << v << "\n";
  };
  counter("course_prompt_tokens_total", "Prompt tokens of the requests that ended.", prompt_tokens_);
  counter("course_prompt_tokens_cached_total", "Of those, tokens found in the prefix cache (not computed).",
          cached_tokens_);
  counter("course_generation_tokens_total", "Tokens generated (EOS included).", generation_tokens_);
  counter("course_engine_steps_total", "Engine steps that ran a forward (naive: forwards).", steps_);
  counter("course_preemptions_total", "Times the requests that ended were preempted.", preemptions_);
  gauge("course_requests_running", "Requests in the engine's batch.", gauges_.running);
  gauge("course_requests_waiting", "Requests queued for the batch.", gauges_.waiting);
  gauge("course_engine_requests_held", "Requests the engine holds: running, waiting, or finished and not yet handed over.",
        static_cast<double>(gauges_.engine_held));
  gauge("course_engine_queue_entries", "Entries in the engine's admission queue.",
        static_cast<double>(gauges_.engine_queued));
  gauge("course_kv_reserved_tokens",
        "KV memory reserved, in positions (blocks x block size when paged), the prefix cache's blocks included.",
        static_cast<double>(gauges_.kv_reserved));
  gauge("course_kv_capacity_tokens", "The most positions one sequence can hold.", static_cast<double>(kv_capacity_));
  if (connections_) gauge("course_http_connections", "Connections open.", connections_->load());
  if (body_bytes_)
    gauge("course_http_body_bytes", "Bytes of request bodies received and not yet parsed.",
          static_cast<double>(body_bytes_->load()));
  gauge("course_prefix_cache_hit_rate", "Cached prompt tokens over prompt tokens, of the requests that ended.",
        prompt_tokens_ > 0 ? static_cast<double>(cached_tokens_) / static_cast<double>(prompt_tokens_) : 0.0);
  ttft_.print(os, "course_time_to_first_token_seconds", "From a request's arrival to its first token.");
  tpot_.print(os, "course_time_per_output_token_seconds", "Per finished request: (last token - first token) / (tokens - 1).");
  itl_.print(os, "course_inter_token_latency_seconds", "The gap before each token after the first.");
  return os.str();
}

}  // namespace infer::server
