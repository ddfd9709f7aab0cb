// Lesson 10's server, the engine thread (given): the only thread that touches the Engine. It
// submits what came in, cancels what was hung up on, runs a step, and hands each job the tokens
// the step's events carry; a request that leaves the engine ends its job.
#include "common/tokenizer.hpp"
#include "lessons/10_serving/server_parts.hpp"

namespace infer::server {


void run_engine(Engine& engine, Mailbox& mailbox, Metrics& metrics) {
  std::unordered_map<int, std::shared_ptr<Job>> active;  // by request id: submitted, not yet ended
  std::deque<std::shared_ptr<Job>> arrived;
  std::unordered_set<int> cancelled;
  while (mailbox.wait(!engine.idle(), arrived, cancelled)) {
    for (auto& job : arrived) {
      try {
        engine.submit({job->id, job->request.prompt, job->request.max_tokens, job->request.sampling, engine.now(),
                       job->request.logprobs});
        active[job->id] = job;
        Mailbox::accept(*job);
      } catch (const std::exception& ex) {  // refused by the engine's own checks: a 400 from its connection
        std::vector<std::shared_ptr<Job>> one{job};
        mailbox.fail(one, 400, ex.what());
      }
    }
    arrived.clear();
    for (const int id : cancelled)
      if (active.contains(id)) engine.cancel(id);  // its result comes out of take_finished() below
    cancelled.clear();
    std::vector<TokenEvent> events;
    if (!engine.idle()) {
      try {
        events = engine.step();
      } catch (const std::exception& ex) {
        const std::string why = cat("the engine failed: ", ex.what());
        mailbox.set_broken(why);
        std::vector<std::shared_ptr<Job>> open;
        for (auto& [id, job] : active) open.push_back(job);
        mailbox.fail(open, 500, why);
        mailbox.fail_queued(500, why);
        metrics.set({});
        mailbox.set_idle(true);
        return;  // nothing more can be trusted of this engine
      }
      if (!engine.log().empty() && engine.log().back().forwards > 0) metrics.step();
    }
    const auto now = Clock::now();
    // Each job's new tokens, and the end of those that left the engine (finished or cancelled).
    std::unordered_map<int, std::vector<TokenEvent>> fresh;
    for (TokenEvent& ev : events) fresh[ev.id].push_back(std::move(ev));
    std::unordered_map<int, GenerationResult> ended;
    for (GenerationResult& r : engine.take_finished()) ended.emplace(r.id, std::move(r));
    // A stop sequence ends a request where it begins: the tokens before it are kept, and the
    // sequence leaves the engine now, before the gauges are read (its result, cancelled, gives
    // the job's counts; the job ends by its stop).
    std::unordered_map<int, size_t> stopped;  // request id -> tokens its job keeps
    for (const auto& [id, mine] : fresh)
      if (const size_t keep = stop_point(*active.at(id), mine); keep != std::string::npos) {
        stopped[id] = keep;
        if (!ended.contains(id)) engine.cancel(id);
      }
    for (GenerationResult& r : engine.take_finished()) ended.emplace(r.id, std::move(r));
    const EngineFootprint held = engine.footprint();  // the gauges before the answers, as the counters
    metrics.set({.running = static_cast<int>(engine.running().size()),
                 .waiting = engine.waiting(),
                 .kv_reserved = engine.memory().reserved_tokens(),
                 .engine_held = static_cast<long>(held.requests + held.finished),
                 .engine_queued = static_cast<long>(held.queued)});
    mailbox.set_idle(engine.idle());
    for (auto& [id, mine] : fresh) {
      if (const auto s = stopped.find(id); s != stopped.end()) {
        const auto r = ended.find(id);
        mailbox.deliver(*active.at(id), mine, now, "stop", r == ended.end() ? 0 : r->second.cached_tokens,
                        r == ended.end() ? 0 : r->second.preemptions, s->second);
        if (r != ended.end()) ended.erase(r);
        active.erase(id);
      } else if (!ended.contains(id)) {
        mailbox.deliver(*active.at(id), mine, now, "");
      }
    }
    for (auto& [id, r] : ended) {
      const auto f = fresh.find(id);
      mailbox.deliver(*active.at(id), f == fresh.end() ? std::span<const TokenEvent>() : std::span<const TokenEvent>(f->second),
                      now, finish_reason_name(r.finish), r.cached_tokens, r.preemptions);
      active.erase(id);
    }
  }
  std::vector<std::shared_ptr<Job>> open;
  for (auto& [id, job] : active) open.push_back(job);
  mailbox.fail(open, 503, "the server is shutting down");
  mailbox.fail_queued(503, "the server is shutting down");
}

}  // namespace infer::server
