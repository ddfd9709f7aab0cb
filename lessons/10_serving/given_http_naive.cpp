// Lesson 10's server, the naive thread (given): the baseline of the lesson's table. One job at a
// time, each token from a forward over the whole sequence (lesson 00's on the CPU): no cache, no
// batching.
#include "lessons/10_serving/server_parts.hpp"

namespace infer::server {

void run_naive(const NaiveForward& forward, int eos_token, Mailbox& mailbox, Metrics& metrics) {
  while (std::shared_ptr<Job> job = mailbox.wait_one()) {
    metrics.set({.running = 1, .waiting = static_cast<int>(mailbox.queued())});
    std::vector<int> tokens = job->request.prompt;
    std::string reason = "length";
    try {
      Sampler sampler(job->request.sampling);
      for (int i = 0; i < job->request.max_tokens; ++i) {
        if (mailbox.stopping()) {
          reason = "shutdown";
          break;
        }
        if (mailbox.take_cancel(job->id)) {
          reason = "cancelled";
          break;
        }
        const Matrix logits = forward(tokens);  // the whole sequence, every token: no cache
        const int next = sampler.next(logits.row(logits.rows() - 1).transpose());
        TokenEvent event{job->id, next};
        fill_logprobs(event, logits.bottomRows(1), job->request.logprobs);
        tokens.push_back(next);
        const bool eos = next == eos_token;
        if (eos) reason = "stop";
        const bool last = eos || i + 1 == job->request.max_tokens;
        metrics.step();
        const std::span<const TokenEvent> fresh(&event, 1);
        if (const size_t keep = stop_point(*job, fresh); keep != std::string::npos) {
          mailbox.deliver(*job, fresh, Clock::now(), "stop", 0, 0, keep);
          reason = "stop";
          break;
        }
        mailbox.deliver(*job, fresh, Clock::now(), last ? reason : "");
        if (last) break;
      }
      if (reason == "cancelled") mailbox.deliver(*job, {}, Clock::now(), reason);
      if (reason == "shutdown") {
        std::vector<std::shared_ptr<Job>> one{job};
        mailbox.fail(one, 503, "the server is shutting down");
      }
    } catch (const std::exception& ex) {
      std::vector<std::shared_ptr<Job>> one{job};
      mailbox.fail(one, 500, cat("the naive decoder failed: ", ex.what()));
    }
    mailbox.take_cancel(job->id);  // a hang-up that came after the request ended
    metrics.set({.running = 0, .waiting = static_cast<int>(mailbox.queued())});
    mailbox.set_idle(mailbox.queued() == 0);
  }
  mailbox.fail_queued(503, "the server is shutting down");
}

}  // namespace infer::server
