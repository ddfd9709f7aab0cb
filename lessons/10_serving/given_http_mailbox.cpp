// Lesson 10's server, the mailbox room (given): what travels between the HTTP threads and the
// engine thread, under one lock, and each Job's own channel to its connection.
#include "lessons/10_serving/server_parts.hpp"

namespace infer::server {

void Mailbox::enqueue(const std::shared_ptr<Job>& job, bool accept, size_t max_open) {
  std::lock_guard lock(mutex_);
  job->id = next_id_++;
  if (stopping_ || closed_ || !broken_.empty()) {
    const bool closing = stopping_ || closed_;
    end_in_error(*job, closing ? 503 : 500, closing ? "the server is shutting down" : broken_);
    return;
  }
  if (max_open > 0 && static_cast<size_t>(open_jobs_) >= max_open) {
    end_in_error(*job, 503, cat("the server is full: ", open_jobs_, " requests are running or waiting, its limit; retry later"));
    return;
  }
  if (accept) Mailbox::accept(*job);
  ++open_jobs_;
  idle_ = false;  // wait_idle() must wait for it, even if it ends within one iteration
  inbox_.push_back(job);
  wake_.notify_all();
}

void Mailbox::cancel(int id) {
  std::lock_guard lock(mutex_);
  cancels_.insert(id);
  wake_.notify_all();
}

bool Mailbox::wait_idle(double seconds) const {
  std::unique_lock lock(mutex_);
  return quiet_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return open_jobs_ == 0 && idle_; });
}

std::string Mailbox::broken() const {
  std::lock_guard lock(mutex_);
  return broken_;
}

void Mailbox::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
}

bool Mailbox::closing() const {
  std::lock_guard lock(mutex_);
  return closed_ || stopping_;
}

void Mailbox::stop() {
  std::lock_guard lock(mutex_);
  stopping_ = true;
  wake_.notify_all();
}

bool Mailbox::wait(bool busy, std::deque<std::shared_ptr<Job>>& jobs, std::unordered_set<int>& cancels) {
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || busy; });
  if (stopping_) return false;
  jobs.swap(inbox_);
  cancels.swap(cancels_);
  return true;
}

std::shared_ptr<Job> Mailbox::wait_one() {
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [&] { return stopping_ || !inbox_.empty(); });
  if (stopping_) return nullptr;
  std::shared_ptr<Job> job = inbox_.front();
  inbox_.pop_front();
  idle_ = false;
  return job;
}

bool Mailbox::stopping() const {
  std::lock_guard lock(mutex_);
  return stopping_;
}

size_t Mailbox::queued() const {
  std::lock_guard lock(mutex_);
  return inbox_.size();
}

bool Mailbox::take_cancel(int id) {
  std::lock_guard lock(mutex_);
  return cancels_.erase(id) > 0;
}

void Mailbox::accept(Job& job) {
  std::lock_guard lock(job.mutex);
  job.accepted = true;
  if (job.on_change) job.on_change();
}

void Mailbox::deliver(Job& job, std::span<const TokenEvent> fresh, Clock::time_point t, const std::string& reason,
                      int cached, int preempted, size_t keep) {
  // The metrics first, the client then: whoever reads /metrics after an answer finds it counted.
  size_t before = 0;
  {
    std::lock_guard lock(job.mutex);
    before = job.tokens.size();
  }
  metrics_.tokens(job, before, fresh.size(), t);
  if (!reason.empty()) metrics_.ended(job, std::min(before + fresh.size(), keep), t, reason, cached, preempted);
  {
    std::lock_guard lock(job.mutex);
    for (const TokenEvent& e : fresh) job.tokens.push_back(e.token);
    if (job.request.logprobs >= 0) job.logprobs.insert(job.logprobs.end(), fresh.begin(), fresh.end());
    if (keep < job.tokens.size()) job.tokens.resize(keep);
    if (keep < job.logprobs.size()) job.logprobs.resize(keep);
    if (!reason.empty()) {
      job.finished = true;
      job.finish_reason = reason;
    }
    if (job.on_change) job.on_change();
  }
  if (!reason.empty()) {
    std::lock_guard lock(mutex_);
    --open_jobs_;
    quiet_.notify_all();
  }
}

void Mailbox::end_in_error(Job& job, int status, const std::string& message) {
  std::lock_guard lock(job.mutex);
  if (job.finished) return;
  job.finished = true;
  job.finish_reason = "error";
  job.error_status = status;
  job.error = message;
  if (job.on_change) job.on_change();
}

void Mailbox::fail(std::vector<std::shared_ptr<Job>>& jobs, int status, const std::string& message) {
  // A job the engine had accepted is counted as ended in error; one it had not is counted by its
  // connection, as refused.
  for (auto& job : jobs) {
    bool accepted = false;
    {
      std::lock_guard job_lock(job->mutex);
      accepted = job->accepted;
    }
    end_in_error(*job, status, message);
    metrics_.failed(*job, accepted);
    std::lock_guard lock(mutex_);
    --open_jobs_;
    quiet_.notify_all();
  }
  jobs.clear();
}

void Mailbox::fail_queued(int status, const std::string& message) {
  std::vector<std::shared_ptr<Job>> queued;
  {
    std::lock_guard lock(mutex_);
    queued.assign(inbox_.begin(), inbox_.end());
    inbox_.clear();
  }
  fail(queued, status, message);
}

void Mailbox::set_broken(const std::string& why) {
  std::lock_guard lock(mutex_);
  broken_ = why;
}

void Mailbox::set_idle(bool idle) {
  std::lock_guard lock(mutex_);
  idle_ = idle;
  quiet_.notify_all();
}

}  // namespace infer::server
