// Lesson 10: the HTTP server around the engine, and a small streaming client (given).
//
// Threads: httplib's pool runs the handlers, one per connection; one engine thread owns the
// Engine (or, naive, the model) and is the only one to touch it. They meet in two places:
// the inbox (requests and cancellations in, under `mutex`) and each request's Job (tokens out,
// under the job's own mutex).
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/tokenizer.hpp"
#include "lessons/10_serving/server.hpp"

// After Eigen: httplib brings in <resolv.h>, whose `_res` macro would rename a parameter of Eigen's.
#include <httplib.h>

namespace infer {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

/// A Prometheus histogram (cumulative buckets are computed when printed).
struct Histogram {
  std::vector<double> bounds;
  std::vector<long> counts;  // per bucket, the last one above every bound
  double sum = 0;
  long count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
  void print(std::ostream& os, const std::string& name, const std::string& help) const {
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
    long cumulative = 0;
    for (size_t i = 0; i < bounds.size(); ++i) {
      cumulative += counts[i];
      os << name << "_bucket{le=\"" << bounds[i] << "\"} " << cumulative << "\n";
    }
    os << name << "_bucket{le=\"+Inf\"} " << count << "\n" << name << "_sum " << sum << "\n" << name << "_count " << count << "\n";
  }
};

std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

/// The longest prefix of `bytes` that does not end inside a UTF-8 sequence: a stream must not cut
/// a character in two (each event's text is a JSON string, and JSON strings hold whole characters).
size_t complete_utf8(const std::string& bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;  // a lead byte whose sequence is not complete yet
  }
  return n;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

// ------------------------------------------------------------------- jobs --

namespace {

/// One request on its way through the server: the handler waits on it, the engine thread fills it.
struct Job {
  int id = 0;
  CompletionRequest request;
  Clock::time_point arrived;

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int> tokens;    // generated so far (EOS included if produced)
  bool finished = false;
  std::string finish_reason;  // "stop" (EOS), "length" (max_tokens), "cancelled", "error"
  int error_status = 0;       // with "error"
  std::string error;
  bool accepted = false;      // taken by the engine (submit() passed); naive: queued
};

}  // namespace

struct Server::Impl {
  ApiModel model;
  ServerOptions options;
  std::unique_ptr<Engine> engine;  // engine mode
  const ModelWeights* weights = nullptr;  // naive mode
  httplib::Server http;
  std::thread listener, worker;
  int bound_port = 0;
  int listen_socket = -1;  // the listening socket (httplib's socket_t is an int on POSIX)
  bool started = false, stopped = false;

  // The inbox: the handlers' side of the engine thread.
  mutable std::mutex mutex;
  mutable std::condition_variable wake, quiet;
  std::deque<std::shared_ptr<Job>> inbox;
  std::unordered_set<int> cancels;
  bool stopping = false;
  int next_id = 1;
  int open_jobs = 0;  // queued or in the engine
  bool engine_idle = true;
  std::string broken;  // the engine threw: every later request fails with this

  // Metrics, under `mutex` too.
  std::map<std::string, long> finished_by_reason{{"stop", 0}, {"length", 0}, {"cancelled", 0}, {"error", 0}};
  std::map<int, long> rejected_by_status;
  long prompt_tokens = 0, cached_tokens = 0, generation_tokens = 0;
  int running = 0, waiting = 0;
  long kv_reserved = 0, kv_capacity = 0;
  long engine_held = 0, engine_queued = 0;  // what the engine holds (EngineFootprint): flat under a long load
  long steps = 0, preemptions = 0;
  Histogram ttft{latency_bounds()}, tpot{latency_bounds()}, itl{latency_bounds()};

  Impl(ApiModel m, ServerOptions o) : model(std::move(m)), options(std::move(o)) {}

  // ---- handlers' side

  /// Hands a job to the engine thread, or fails it at once (shutting down, engine broken).
  void enqueue(const std::shared_ptr<Job>& job) {
    std::lock_guard lock(mutex);
    job->id = next_id++;
    if (stopping || !broken.empty()) {
      fail(*job, stopping ? 503 : 500, stopping ? "the server is shutting down" : broken);
      return;
    }
    if (!engine) {  // naive: nothing can refuse it after this
      std::lock_guard job_lock(job->mutex);
      job->accepted = true;
    }
    ++open_jobs;
    engine_idle = false;  // wait_idle() must wait for it, even if it ends within one iteration
    inbox.push_back(job);
    wake.notify_all();
  }

  void cancel(int id) {
    std::lock_guard lock(mutex);
    cancels.insert(id);
    wake.notify_all();
  }

  static void fail(Job& job, int status, const std::string& message) {
    std::lock_guard lock(job.mutex);
    if (job.finished) return;
    job.finished = true;
    job.finish_reason = "error";
    job.error_status = status;
    job.error = message;
    job.changed.notify_all();
  }

  // ---- the engine thread's side

  /// Appends `tokens` to the job (time `t`), recording latencies; `reason` non-empty ends it.
  void deliver(Job& job, std::span<const int> fresh, Clock::time_point t, const std::string& reason, int cached,
               int preempted = 0) {
    // The metrics first, the client then: whoever reads /metrics after an answer finds it counted.
    size_t before = 0;
    {
      std::lock_guard lock(job.mutex);
      before = job.tokens.size();
    }
    record(job, before, fresh.size(), t, reason, cached, preempted);
    {
      std::lock_guard lock(job.mutex);
      job.tokens.insert(job.tokens.end(), fresh.begin(), fresh.end());
      if (!reason.empty()) {
        job.finished = true;
        job.finish_reason = reason;
      }
      job.changed.notify_all();
    }
    if (!reason.empty()) {
      std::lock_guard lock(mutex);
      --open_jobs;
      quiet.notify_all();
    }
  }

  /// Counts `n` new tokens of `job` (which had `before`) at time `t`, and its end if `reason`.
  void record(const Job& job, size_t before, size_t n, Clock::time_point t, const std::string& reason, int cached,
              int preempted) {
    std::lock_guard lock(mutex);
    generation_tokens += static_cast<long>(n);
    if (n > 0) {
      // The first token measures TTFT; each later one the gap since the one before it (tokens
      // that come in one step share its time).
      if (before == 0) {
        ttft.observe(seconds_between(job.arrived, t));
        first_token[job.id] = t;
      } else {
        itl.observe(seconds_between(job_last(job), t));
      }
      for (size_t i = 1; i < n; ++i) itl.observe(0.0);
      last_token[job.id] = t;
    }
    if (!reason.empty()) {
      ++finished_by_reason[reason];
      preemptions += preempted;
      prompt_tokens += static_cast<long>(job.request.prompt.size());
      cached_tokens += cached;
      const size_t total = before + n;
      if (reason != "cancelled" && total >= 2 && first_token.count(job.id))
        tpot.observe(seconds_between(first_token[job.id], t) / static_cast<double>(total - 1));
      first_token.erase(job.id);
      last_token.erase(job.id);
    }
  }
  std::unordered_map<int, Clock::time_point> first_token, last_token;  // under `mutex`
  Clock::time_point job_last(const Job& job) const {
    const auto it = last_token.find(job.id);
    return it == last_token.end() ? job.arrived : it->second;
  }

  /// Ends queued or running jobs with an error. A job the engine had accepted is counted as
  /// ended in error; one it had not is counted by its handler, as refused (reply_error()).
  void fail_open(std::vector<std::shared_ptr<Job>>& jobs, int status, const std::string& message) {
    for (auto& job : jobs) {
      bool accepted = false;
      {
        std::lock_guard job_lock(job->mutex);
        accepted = job->accepted;
      }
      fail(*job, status, message);
      std::lock_guard lock(mutex);
      if (accepted) ++finished_by_reason["error"];
      first_token.erase(job->id);
      last_token.erase(job->id);
      --open_jobs;
      quiet.notify_all();
    }
    jobs.clear();
  }

  void engine_loop() {
    std::unordered_map<int, std::shared_ptr<Job>> active;  // by request id: submitted, not yet ended
    Engine& e = *engine;
    while (true) {
      std::deque<std::shared_ptr<Job>> arrived;
      std::unordered_set<int> cancelled;
      {
        std::unique_lock lock(mutex);
        wake.wait(lock, [&] { return stopping || !inbox.empty() || !cancels.empty() || !e.idle(); });
        if (stopping) break;
        arrived.swap(inbox);
        cancelled.swap(cancels);
      }
      for (auto& job : arrived) {
        try {
          e.submit({job->id, job->request.prompt, job->request.max_tokens, job->request.sampling, e.now()});
          active[job->id] = job;
          std::lock_guard job_lock(job->mutex);
          job->accepted = true;
          job->changed.notify_all();
        } catch (const std::exception& ex) {  // refused by the engine's own checks: a 400 from the handler
          std::vector<std::shared_ptr<Job>> one{job};
          fail_open(one, 400, ex.what());
        }
      }
      for (const int id : cancelled)
        if (active.contains(id)) e.cancel(id);  // its result comes out of take_finished() below
      std::vector<TokenEvent> events;
      bool forwarded = false;
      if (!e.idle()) {
        try {
          events = e.step();
          forwarded = !e.log().empty() && e.log().back().forwards > 0;
        } catch (const std::exception& ex) {
          std::vector<std::shared_ptr<Job>> open;
          for (auto& [id, job] : active) open.push_back(job);
          active.clear();
          {
            std::lock_guard lock(mutex);
            broken = cat("the engine failed: ", ex.what());
          }
          fail_open(open, 500, cat("the engine failed: ", ex.what()));
          std::vector<std::shared_ptr<Job>> queued;
          {
            std::lock_guard lock(mutex);
            queued.assign(inbox.begin(), inbox.end());
            inbox.clear();
            engine_idle = true;
            running = waiting = 0;
            kv_reserved = 0;
          }
          fail_open(queued, 500, broken);
          break;  // nothing more can be trusted of this engine
        }
      }
      const auto now = Clock::now();
      {  // the gauges before the answers, as the counters (deliver())
        std::lock_guard lock(mutex);
        if (forwarded) ++steps;
        running = static_cast<int>(e.running().size());
        waiting = e.waiting();
        kv_reserved = e.memory().reserved_tokens();
        const EngineFootprint held = e.footprint();
        engine_held = static_cast<long>(held.requests + held.finished);
        engine_queued = static_cast<long>(held.queued);
        engine_idle = e.idle();
        quiet.notify_all();
      }
      // Each job's new tokens, and the end of those that left the engine (finished or cancelled).
      std::unordered_map<int, std::vector<int>> fresh;
      for (const TokenEvent& ev : events) fresh[ev.id].push_back(ev.token);
      std::unordered_map<int, GenerationResult> ended;
      for (GenerationResult& r : e.take_finished()) ended.emplace(r.id, std::move(r));
      for (auto& [id, tokens] : fresh)
        if (!ended.contains(id)) deliver(*active.at(id), tokens, now, "", 0);
      for (auto& [id, r] : ended) {
        const auto f = fresh.find(id);
        deliver(*active.at(id), f == fresh.end() ? std::span<const int>() : std::span<const int>(f->second), now,
                finish_reason_name(r.finish), r.cached_tokens, r.preemptions);
        active.erase(id);
      }
    }
    std::vector<std::shared_ptr<Job>> open;
    for (auto& [id, job] : active) open.push_back(job);
    fail_open(open, 503, "the server is shutting down");
    drain_inbox();
  }

  /// Fails whatever is still queued (at shutdown).
  void drain_inbox() {
    std::vector<std::shared_ptr<Job>> queued;
    {
      std::lock_guard lock(mutex);
      queued.assign(inbox.begin(), inbox.end());
      inbox.clear();
    }
    fail_open(queued, 503, "the server is shutting down");
  }

  void naive_loop() {
    const ModelWeights& m = *weights;
    while (true) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock lock(mutex);
        wake.wait(lock, [&] { return stopping || !inbox.empty(); });
        if (stopping) break;
        job = inbox.front();
        inbox.pop_front();
        running = 1;
        waiting = static_cast<int>(inbox.size());
        engine_idle = false;
      }
      std::vector<int> tokens = job->request.prompt;
      std::string reason = "length";
      try {
        Sampler sampler(job->request.sampling);
        for (int i = 0; i < job->request.max_tokens; ++i) {
          {
            std::lock_guard lock(mutex);
            if (stopping) {
              reason = "shutdown";
              break;
            }
            if (cancels.erase(job->id)) {
              reason = "cancelled";
              break;
            }
          }
          const Matrix logits = forward(m, tokens);  // the whole sequence, every token: no cache
          const int next = sampler.next(logits.row(logits.rows() - 1).transpose());
          tokens.push_back(next);
          const bool eos = next == m.config.eos_token_id;
          if (eos) reason = "stop";
          const bool last = eos || i + 1 == job->request.max_tokens;
          {
            std::lock_guard lock(mutex);
            ++steps;
          }
          deliver(*job, std::span<const int>(&tokens.back(), 1), Clock::now(), last ? reason : "", 0);
          if (last) break;
        }
        if (reason == "cancelled") deliver(*job, {}, Clock::now(), reason, 0);
        if (reason == "shutdown") {
          std::vector<std::shared_ptr<Job>> one{job};
          fail_open(one, 503, "the server is shutting down");
        }
      } catch (const std::exception& ex) {
        std::vector<std::shared_ptr<Job>> one{job};
        fail_open(one, 500, cat("the naive decoder failed: ", ex.what()));
      }
      std::lock_guard lock(mutex);
      running = 0;
      engine_idle = inbox.empty();
      cancels.erase(job->id);  // a hang-up that came after the request ended
      quiet.notify_all();
    }
    drain_inbox();
  }

  // ---- HTTP

  /// Answers with OpenAI's error body; `refused`: count it as a request refused before the engine.
  void reply_error(httplib::Response& res, const ApiError& e, bool refused = true) {
    if (refused) {
      std::lock_guard lock(mutex);
      ++rejected_by_status[e.status()];
    }
    res.status = e.status();
    res.set_content(e.body(), "application/json");
  }

  json completion_body(const Job& job, const std::string& text, int completion_tokens, const std::string& reason) const {
    const bool chat = job.request.endpoint == Endpoint::ChatCompletions;
    json choice = {{"index", 0}, {"finish_reason", reason}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
      choice["logprobs"] = nullptr;
    } else {
      choice["text"] = text;
      choice["logprobs"] = nullptr;
    }
    const int prompt = static_cast<int>(job.request.prompt.size());
    return {{"id", cat(chat ? "chatcmpl-" : "cmpl-", job.id)},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", static_cast<long long>(std::time(nullptr))},
            {"model", model.name},
            {"choices", json::array({choice})},
            {"usage",
             {{"prompt_tokens", prompt}, {"completion_tokens", completion_tokens}, {"total_tokens", prompt + completion_tokens}}}};
  }

  json chunk_body(const Job& job, const std::string* text, const json& finish_reason, bool role) const {
    const bool chat = job.request.endpoint == Endpoint::ChatCompletions;
    json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
    if (chat) {
      json delta = json::object();
      if (role) delta["role"] = "assistant";
      if (text) delta["content"] = *text;
      choice["delta"] = delta;
    } else {
      choice["text"] = text ? *text : "";
    }
    return {{"id", cat(chat ? "chatcmpl-" : "cmpl-", job.id)},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", static_cast<long long>(std::time(nullptr))},
            {"model", model.name},
            {"choices", json::array({choice})}};
  }

  void generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    auto job = std::make_shared<Job>();
    try {
      refuse_unsupported(parse_json_object(req.body));
      job->request = parse_completion_request(req.body, endpoint, model);
    } catch (const ApiError& e) {
      reply_error(res, e);
      return;
    } catch (const std::exception& e) {  // e.g. a starter's NotImplemented
      reply_error(res, ApiError(500, cat("parse_completion_request failed: ", e.what())));
      return;
    }
    job->arrived = Clock::now();
    enqueue(job);
    {
      // Until the engine has taken it, a request can still be refused, with a status of its own.
      std::unique_lock lock(job->mutex);
      job->changed.wait(lock, [&] { return job->accepted || job->finished; });
      if (!job->accepted) {
        const ApiError e(job->error_status, job->error);
        lock.unlock();
        reply_error(res, e);
        return;
      }
    }
    if (!job->request.stream) {
      std::unique_lock lock(job->mutex);
      job->changed.wait(lock, [&] { return job->finished; });
      if (job->finish_reason == "error") {
        const ApiError e(job->error_status, job->error);
        lock.unlock();
        reply_error(res, e, /*refused=*/false);  // counted as ended in error
        return;
      }
      res.set_content(dump(completion_body(*job, ByteTokenizer::decode(job->tokens), static_cast<int>(job->tokens.size()),
                                           job->finish_reason)),
                      "application/json");
      return;
    }
    struct StreamState {
      size_t sent = 0;      // tokens turned into text
      std::string pending;  // bytes held back: the start of a character not complete yet
      bool role_sent = false;
    };
    auto state = std::make_shared<StreamState>();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, state](size_t, httplib::DataSink& sink) -> bool {
          std::vector<int> fresh;
          bool finished = false;
          std::string reason, error;
          int status = 0;
          {
            std::unique_lock lock(job->mutex);
            job->changed.wait_for(lock, std::chrono::seconds(1),
                                  [&] { return job->finished || job->tokens.size() > state->sent; });
            fresh.assign(job->tokens.begin() + static_cast<long>(state->sent), job->tokens.end());
            state->sent = job->tokens.size();
            finished = job->finished;
            reason = job->finish_reason;
            error = job->error;
            status = job->error_status;
          }
          const auto send = [&](const std::string& payload) {
            const std::string event = "data: " + payload + "\n\n";
            return sink.write(event.data(), event.size());
          };
          if (fresh.empty() && !finished) {  // nothing yet (queued): a comment line keeps the
            const std::string ping = ": waiting\n\n";  // connection checked, so a hang-up is seen
            return sink.write(ping.data(), ping.size());
          }
          state->pending += ByteTokenizer::decode(fresh);
          const size_t n = finished ? state->pending.size() : complete_utf8(state->pending);
          const bool chat = job->request.endpoint == Endpoint::ChatCompletions;
          if (n > 0 || (chat && !state->role_sent)) {
            const std::string text = state->pending.substr(0, n);
            state->pending.erase(0, n);
            if (!send(dump(chunk_body(*job, &text, nullptr, chat && !state->role_sent)))) return false;
            state->role_sent = true;
          }
          if (!finished) return true;
          if (reason == "error") {
            if (!send(ApiError(status, error).body())) return false;
          } else {
            if (!send(dump(chunk_body(*job, nullptr, reason, false)))) return false;
            if (job->request.include_usage) {
              json usage = chunk_body(*job, nullptr, nullptr, false);
              const int prompt = static_cast<int>(job->request.prompt.size()), done = static_cast<int>(state->sent);
              usage["choices"] = json::array();
              usage["usage"] = {{"prompt_tokens", prompt}, {"completion_tokens", done}, {"total_tokens", prompt + done}};
              if (!send(dump(usage))) return false;
            }
          }
          if (!send("[DONE]")) return false;
          sink.done();
          return true;
        },
        [this, job](bool success) {
          bool ended = false;
          {
            std::lock_guard lock(job->mutex);
            ended = job->finished;
          }
          if (!success && !ended) cancel(job->id);  // the client hung up: free its sequence
        });
  }

  std::string metrics_text() const {
    std::ostringstream os;
    std::lock_guard lock(mutex);
    os << "# HELP course_requests_total Requests that ended, by how they ended.\n"
          "# TYPE course_requests_total counter\n";
    for (const auto& [reason, n] : finished_by_reason)
      os << "course_requests_total{finish_reason=\"" << reason << "\"} " << n << "\n";
    os << "# HELP course_requests_rejected_total Requests refused before reaching the engine, by HTTP status.\n"
          "# TYPE course_requests_rejected_total counter\n";
    for (const auto& [status, n] : rejected_by_status)
      os << "course_requests_rejected_total{status=\"" << status << "\"} " << n << "\n";
    const auto counter = [&](const char* name, const char* help, long v) {
      os << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << v << "\n";
    };
    const auto gauge = [&](const char* name, const char* help, double v) {
      os << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n" << name << " " << v << "\n";
    };
    counter("course_prompt_tokens_total", "Prompt tokens of the requests that ended.", prompt_tokens);
    counter("course_prompt_tokens_cached_total", "Of those, tokens found in the prefix cache (not computed).",
            cached_tokens);
    counter("course_generation_tokens_total", "Tokens generated (EOS included).", generation_tokens);
    counter("course_engine_steps_total", "Engine steps that ran a forward (naive: forwards).", steps);
    counter("course_preemptions_total", "Times the requests that ended were preempted.", preemptions);
    gauge("course_requests_running", "Requests in the engine's batch.", running);
    gauge("course_requests_waiting", "Requests queued for the batch.", waiting);
    gauge("course_engine_requests_held", "Requests the engine holds: running, waiting, or finished and not yet handed over.",
          static_cast<double>(engine_held));
    gauge("course_engine_queue_entries", "Entries in the engine's admission queue.", static_cast<double>(engine_queued));
    gauge("course_kv_reserved_tokens",
          "KV memory reserved, in positions (blocks x block size when paged), the prefix cache's blocks included.",
          static_cast<double>(kv_reserved));
    gauge("course_kv_capacity_tokens", "The most positions one sequence can hold.", static_cast<double>(kv_capacity));
    gauge("course_prefix_cache_hit_rate", "Cached prompt tokens over prompt tokens, of the requests that ended.",
          prompt_tokens > 0 ? static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens) : 0.0);
    ttft.print(os, "course_time_to_first_token_seconds", "From a request's arrival to its first token.");
    tpot.print(os, "course_time_per_output_token_seconds",
               "Per finished request: (last token - first token) / (tokens - 1).");
    itl.print(os, "course_inter_token_latency_seconds", "The gap before each token after the first.");
    return os.str();
  }

  void routes() {
    http.new_task_queue = [n = options.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    http.set_payload_max_length(options.max_body_bytes);
    http.set_tcp_nodelay(true);  // one event per token: do not let Nagle hold them back
    // Debian's cpp-httplib 0.11 listens with a backlog of 5 connections: 100 clients connecting at
    // once would overflow it and some would be dropped. Keep the listening socket, and start()
    // calls listen() on it again with a deep backlog (Linux lets a listen() change the backlog).
    http.set_socket_options([this](int sock) {
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_socket = sock;
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, Endpoint::Completions);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, Endpoint::ChatCompletions);
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const json body = {{"object", "list"},
                         {"data", json::array({{{"id", model.name},
                                                {"object", "model"},
                                                {"created", 0},
                                                {"owned_by", "course"},
                                                {"max_model_len", model.config.max_position_embeddings}}})}};
      res.set_content(dump(body), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard lock(mutex);
      res.status = broken.empty() ? 200 : 503;
      res.set_content(broken.empty() ? R"({"status":"ok"})" : dump(json{{"status", "failed"}, {"error", broken}}),
                      "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    // httplib enforces max_body_bytes through Content-Length only: a body sent without one
    // (chunked) would be read whole, however large. Such requests are refused before reading.
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.method == "POST" && !req.has_header("Content-Length")) {
        reply_error(res, ApiError(411, "A request body needs a Content-Length header on this server"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // Errors httplib itself answers (no such route, a body over the limit): OpenAI's error body too.
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours already
      const std::string message =
          res.status == 413   ? cat("The request body is larger than this server's limit of ", options.max_body_bytes,
                                    " bytes")
          : res.status == 404 ? cat("No route ", req.method, " ", req.path, " on this server")
                              : cat("HTTP error ", res.status);
      reply_error(res, ApiError(res.status, message));
      return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      reply_error(res, ApiError(500, what));
    });
  }
};

Server::Server(std::unique_ptr<Engine> engine, ApiModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), std::move(options))) {
  require(engine != nullptr, "Server: no engine");
  impl_->engine = std::move(engine);
  // The context a client can use is what one sequence can hold: the model's, or less if the KV
  // memory is smaller. Requests are checked (and /v1/models answers) against that.
  ModelConfig& c = impl_->model.config;
  c.max_position_embeddings = std::min(c.max_position_embeddings, impl_->engine->memory().capacity_tokens());
  impl_->kv_capacity = impl_->engine->memory().capacity_tokens();
}

Server::Server(const ModelWeights& weights, ApiModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), std::move(options))) {
  impl_->weights = &weights;
}

Server::~Server() { stop(); }

int Server::start() {
  Impl& s = *impl_;
  require(!s.started, "Server::start: already started");
  require(s.options.http_threads >= 1, "Server: http_threads must be >= 1, got ", s.options.http_threads);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hung up must not kill the process
  s.routes();
  if (s.options.port == 0) {
    s.bound_port = s.http.bind_to_any_port(s.options.host);
  } else {
    s.bound_port = s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1;
  }
  require(s.bound_port > 0, "Server::start: cannot listen on ", s.options.host, ":", s.options.port,
          " (in use, or not an address of this machine?)");
  if (s.listen_socket >= 0) ::listen(s.listen_socket, SOMAXCONN);
  s.started = true;
  s.worker = std::thread([&s] { s.engine ? s.engine_loop() : s.naive_loop(); });
  s.listener = std::thread([&s] { s.http.listen_after_bind(); });
  // httplib's stop() does nothing until the listener runs: a stop() right after start() would
  // otherwise leave the listener in accept() for ever.
  for (int i = 0; i < 5000 && !s.http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s.bound_port;
}

void Server::stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  {
    std::lock_guard lock(s.mutex);
    s.stopping = true;
    s.wake.notify_all();
  }
  if (s.worker.joinable()) s.worker.join();  // fails what is open, which wakes the handlers
  s.drain_inbox();                           // what came in since
  s.http.stop();
  if (s.listener.joinable()) s.listener.join();
}

int Server::port() const { return impl_->bound_port; }

std::string Server::metrics() const { return impl_->metrics_text(); }

bool Server::wait_idle(double seconds) const {
  std::unique_lock lock(impl_->mutex);
  return impl_->quiet.wait_for(lock, std::chrono::duration<double>(seconds),
                               [&] { return impl_->open_jobs == 0 && impl_->engine_idle; });
}

// ----------------------------------------------------------------- client --

HttpReply http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                    const std::function<bool(const std::string&)>& on_event, double timeout_s) {
  httplib::Client client(host, port);
  const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(timeout_s));
  client.set_read_timeout(timeout);
  client.set_connection_timeout(timeout);
  HttpReply reply;
  std::string buffer;  // bytes of an event not complete yet
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& r) {
    reply.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    reply.body.append(data, n);
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      std::istringstream lines(event);
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind("data: ", 0) != 0) continue;  // comments, other fields
        reply.events.push_back(line.substr(6));
        if (on_event && !on_event(reply.events.back())) {
          reply.hung_up = true;
          return false;
        }
      }
    }
    return true;
  };
  const httplib::Result result = client.send(req);
  if (!result && !reply.hung_up) {
    reply.status = 0;
    reply.error = httplib::to_string(result.error());
  }
  return reply;
}

std::pair<int, std::string> http_get(const std::string& host, int port, const std::string& path, double timeout_s) {
  httplib::Client client(host, port);
  const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(timeout_s));
  client.set_read_timeout(timeout);
  client.set_connection_timeout(timeout);
  const httplib::Result r = client.Get(path);
  if (!r) return {0, ""};
  return {r->status, r->body};
}

double metric_value(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 && line[name.size()] == ' ')
      return std::stod(line.substr(name.size() + 1));
  return std::nan("");
}

}  // namespace infer
