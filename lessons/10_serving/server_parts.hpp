/// @file server_parts.hpp
/// @brief The rooms of lesson 10's server (given), one job each, as server.hpp's Server puts them
/// together:
///
/// | room | file | its job |
/// | --- | --- | --- |
/// | routes | given_http.cpp | HTTP on Boost.Beast: read with deadlines, check, queue a Job, answer it whole or as server-sent events |
/// | OpenAI format | given_http_openai.cpp | the response and chunk bodies; UTF-8 held back at a stream's edge |
/// | the mailbox | given_http_mailbox.cpp | Jobs and cancellations in, tokens and ends out, between the threads |
/// | metrics | given_http_metrics.cpp | the counters, gauges and histograms of `/metrics` |
/// | the engine thread | given_http_engine.cpp | owns the Engine: submit, cancel, step, hand out its events |
/// | the naive thread | given_http_naive.cpp | the baseline: one request at a time, no cache |
/// | the client | given_http_client.cpp | the HTTP client the tests and the load generator use |
/// | the log | given_http_log.cpp | the server's lines on stderr, written by a thread of their own |
///
/// Two kinds of lock: the Mailbox's (what travels between the HTTP threads and the engine
/// thread), each Job's own (its tokens, for the connection answering it); Metrics keeps its own
/// for its counters. Only the engine thread touches the Engine. No thread waits on a client: the
/// HTTP threads (a few) run every connection's reads and writes as they become possible, and the
/// engine thread tells a connection that its job changed through Job::on_change.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "lessons/10_serving/api.hpp"
#include "lessons/10_serving/server.hpp"
#include "lessons/10_serving/serving.hpp"

/// Lesson 10's HTTP server in its rooms (server_parts.hpp's table): routes, OpenAI's format, the
/// mailbox between the threads, the metrics, and the threads that run the engine and the baseline.
namespace infer::server {

/// The server's clock: steady, for latencies.
using Clock = std::chrono::steady_clock;

/// Seconds from `a` to `b`.
inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// One request on its way through the server: its connection answers it, the engine thread fills it.
struct Job {
  int id = 0;                  ///< the request id the engine knows it by
  CompletionRequest request;   ///< as parsed
  Clock::time_point arrived;   ///< when its connection queued it

  /// Called (under `mutex`) after every change below, by whichever thread made it: the
  /// connection's, which posts itself a look at the job (it must not block). Set before the job
  /// is queued.
  std::function<void()> on_change;

  std::mutex mutex;               ///< guards what follows
  std::vector<int> tokens;        ///< generated so far (EOS included if produced)
  std::vector<TokenEvent> logprobs;  ///< with request.logprobs >= 0: one per token, its log-probabilities
  bool finished = false;          ///< no more tokens will come
  std::string finish_reason;      ///< "stop" (EOS), "length" (max_tokens), "cancelled", "error"
  int error_status = 0;           ///< with "error"
  std::string error;              ///< with "error"
  bool accepted = false;          ///< taken by the engine (submit() passed); naive: queued
};

// ------------------------------------------------------------ OpenAI format --

/// Stop sequences (CompletionRequest::stop). Where the first of `stops` begins in `text`, searching
/// only where one could end past `from` (text before it was searched already); npos if none.
size_t find_stop(const std::string& text, size_t from, const std::vector<std::string>& stops);
/// With `fresh` appended to `job`'s tokens: how many tokens it keeps if a stop sequence now
/// appears in its text (the tokens before it), else npos. The thread that writes job.tokens (the
/// engine's, or the naive one) calls it, and so reads them without the lock.
size_t stop_point(const Job& job, std::span<const TokenEvent> fresh);
/// How many bytes at the end of `text` must be held back from a stream: the longest suffix that
/// is the start of a stop sequence (it may still become one).
size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops);

/// The longest prefix of `bytes` that does not end inside a UTF-8 sequence: a stream must not cut
/// a character in two (each event's text is a JSON string, and JSON strings hold whole characters).
size_t complete_utf8(const std::string& bytes);
/// `j` as one line of JSON (invalid UTF-8 replaced, never thrown on).
std::string dump(const nlohmann::json& j);
/// A whole answer's body: `text`, its token count and finish reason, for `model`.
nlohmann::json completion_body(const Job& job, const std::string& model, const std::string& text,
                               int completion_tokens, const std::string& reason);
/// One streamed chunk: `text` (none: an empty delta), `finish_reason` (null while it runs), and
/// for chat the assistant's role in the first.
nlohmann::json chunk_body(const Job& job, const std::string& model, const std::string* text,
                          const nlohmann::json& finish_reason, bool role);
/// The last chunk of a stream that asked for usage (`stream_options.include_usage`).
nlohmann::json usage_chunk(const Job& job, const std::string& model, int completion_tokens);

// ------------------------------------------------------------------ metrics --

/// `/metrics`: counters, gauges and latency histograms, under their own lock. What a request
/// counts is recorded before its client hears of it, so that whoever reads `/metrics` after an
/// answer finds it counted.
class Metrics {
 public:
  /// The gauges the engine thread sets after each step.
  struct Gauges {
    int running = 0;         ///< requests in the batch
    int waiting = 0;         ///< requests queued for it
    long kv_reserved = 0;    ///< KV positions reserved
    long engine_held = 0;    ///< EngineFootprint: requests running, waiting, or finished and not taken
    long engine_queued = 0;  ///< EngineFootprint: entries in the admission queue
  };
  Metrics();
  /// A request refused before the engine, with HTTP `status`.
  void rejected(int status);
  /// `n` new tokens of `job`, which had `before`, at time `t` (TTFT for the first, ITL after).
  void tokens(const Job& job, size_t before, size_t n, Clock::time_point t);
  /// `job` ended at `t` with `total` tokens, for `reason` ("stop", "length", "cancelled").
  void ended(const Job& job, size_t total, Clock::time_point t, const std::string& reason, int cached, int preempted);
  /// `job` ended in error; counted only if the engine had `accepted` it (else its connection counts
  /// a refusal).
  void failed(const Job& job, bool accepted);
  /// One engine step that ran a forward (naive: one forward).
  void step();
  /// The gauges, as of now.
  void set(const Gauges& gauges);
  /// The most positions one sequence can hold.
  void set_kv_capacity(long positions);
  /// The HTTP front's open connections and the bytes of request bodies it is reading, shown as
  /// they are whenever the page is made (both must outlive this).
  void watch_http(const std::atomic<int>& connections, const std::atomic<size_t>& body_bytes);
  /// The Prometheus text page.
  std::string text() const;

 private:
  /// A Prometheus histogram (cumulative buckets are computed when printed).
  struct Histogram {
    std::vector<double> bounds;
    std::vector<long> counts;  // per bucket, the last one above every bound
    double sum = 0;
    long count = 0;
    void observe(double v);
    void print(std::ostream& os, const std::string& name, const std::string& help) const;
  };
  mutable std::mutex mutex_;
  const std::atomic<int>* connections_ = nullptr;
  const std::atomic<size_t>* body_bytes_ = nullptr;
  std::map<std::string, long> finished_by_reason_;
  std::map<int, long> rejected_by_status_;
  long prompt_tokens_ = 0, cached_tokens_ = 0, generation_tokens_ = 0, steps_ = 0, preemptions_ = 0;
  Gauges gauges_;
  long kv_capacity_ = 0;
  Histogram ttft_, tpot_, itl_;
  std::unordered_map<int, Clock::time_point> first_token_, last_token_;  ///< by job id, while it runs
};

// ------------------------------------------------------------------ mailbox --

/// What travels between the HTTP threads and the engine thread: Jobs and cancellations in, tokens
/// and ends out, and whether the server is stopping or broken. Every Job that enters leaves
/// exactly once, through deliver() with a reason or fail().
class Mailbox {
 public:
  /// A mailbox whose deliveries and failures are counted in `metrics` (which must outlive it).
  explicit Mailbox(Metrics& metrics) : metrics_(metrics) {}

  // The HTTP threads' side.

  /// Numbers `job` and hands it to the engine thread, or fails it at once (closed or stopping: 503;
  /// broken: 500; `max_open` jobs already open, running or waiting: 503). `accept`: mark it
  /// accepted now (the naive thread refuses nothing). `max_open` 0: no limit.
  void enqueue(const std::shared_ptr<Job>& job, bool accept, size_t max_open = 0);
  /// Asks the engine thread to cancel job `id` (its client hung up).
  void cancel(int id);
  /// Waits until every job has ended and the engine thread says it is idle; false after `seconds`.
  bool wait_idle(double seconds) const;
  /// Whether the engine failed, and how ("" if not).
  std::string broken() const;
  /// Takes no new job from now on (each fails at once with 503, the server shutting down); the
  /// open ones go on to their end.
  void close();
  /// Whether close() or stop() was called.
  bool closing() const;
  /// Tells the engine thread to stop.
  void stop();

  // The engine thread's side.

  /// Waits until there is work (jobs, cancellations, or `busy`) or a stop; takes the jobs and
  /// cancellations that came in. False when stopping.
  bool wait(bool busy, std::deque<std::shared_ptr<Job>>& jobs, std::unordered_set<int>& cancels);
  /// Takes the next job, waiting for one; null when stopping.
  std::shared_ptr<Job> wait_one();
  /// Whether job `id`'s cancellation came in (and forgets it).
  bool take_cancel(int id);
  /// Whether the server is stopping.
  bool stopping() const;
  /// Jobs queued and not yet taken.
  size_t queued() const;
  /// Marks `job` accepted by the engine: its connection may stream it.
  static void accept(Job& job);
  /// Appends `fresh` to `job` at time `t` (counted in Metrics first); a non-empty `reason` ends it.
  /// `keep`: the tokens the job keeps after that (a stop sequence cut it short; npos: all).
  /// A job that wants log-probabilities keeps the events themselves as well.
  void deliver(Job& job, std::span<const TokenEvent> fresh, Clock::time_point t, const std::string& reason,
               int cached = 0, int preempted = 0, size_t keep = std::string::npos);
  /// Ends each of `jobs` with an error (HTTP `status`) and clears the list.
  void fail(std::vector<std::shared_ptr<Job>>& jobs, int status, const std::string& message);
  /// Fails whatever is still queued, with `status`.
  void fail_queued(int status, const std::string& message);
  /// The engine failed: every job queued now or later fails with `why`.
  void set_broken(const std::string& why);
  /// Whether the engine has nothing to do (wait_idle() waits for it).
  void set_idle(bool idle);

 private:
  /// Ends `job` with an error, unless it has ended.
  static void end_in_error(Job& job, int status, const std::string& message);

  Metrics& metrics_;
  mutable std::mutex mutex_;
  mutable std::condition_variable wake_, quiet_;
  std::deque<std::shared_ptr<Job>> inbox_;
  std::unordered_set<int> cancels_;
  bool stopping_ = false;
  bool closed_ = false;  ///< close(): new jobs fail, open ones go on
  bool idle_ = true;
  int next_id_ = 1;
  int open_jobs_ = 0;   ///< queued or in the engine
  std::string broken_;  ///< the engine threw: every later job fails with this
};

// ------------------------------------------------------------------ the log --

/// The server's log: lines on stderr (a request's, an accept that failed), queued by whichever
/// thread has one and written by a thread of the log's own, so that no HTTP thread ever waits on
/// stderr (a pipe that nobody reads would otherwise stop every answer). At most kMaxQueued lines
/// wait; more are dropped, and a line says how many when writing goes on. Each line is one line:
/// every byte outside printable ASCII (a client's path, the values an error quotes) is written as
/// `\xNN`, so that nothing a client sends can start a line or move a terminal's cursor.
class ServerLog {
 public:
  static constexpr size_t kMaxQueued = 4096;  ///< lines that may wait for stderr; more are dropped
  ServerLog();
  /// Writes what is queued, for at most a second more if stderr will not take it (then drops it).
  ~ServerLog();
  ServerLog(const ServerLog&) = delete;
  ServerLog& operator=(const ServerLog&) = delete;
  /// Queues `line` (without its newline), made printable; never waits on stderr.
  void add(const std::string& line);
  /// `text` with every byte outside 0x20..0x7e written as `\xNN` (a backslash as `\x5c`).
  static std::string printable(const std::string& text);

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::string> queued_;
  size_t dropped_ = 0;
  bool stopping_ = false;
  std::thread writer_;
};

// ------------------------------------------------------------ the two loops --

/// The engine thread: takes jobs and cancellations from `mailbox`, submits and cancels them,
/// runs one Engine::step(), and hands each job its tokens (the step's TokenEvents) and, when it
/// leaves the engine, its end. Returns when the mailbox stops (failing what is open) or the engine
/// throws (failing everything, the mailbox marked broken).
void run_engine(Engine& engine, Mailbox& mailbox, Metrics& metrics);

/// The naive thread: one job at a time, each token from `forward` over the whole sequence (no
/// cache, no batching: lesson 00's forward() on the CPU). `eos` ends a job. Returns when the
/// mailbox stops.
void run_naive(const NaiveForward& forward, int eos, Mailbox& mailbox, Metrics& metrics);

}  // namespace infer::server
