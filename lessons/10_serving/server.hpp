/// @file server.hpp
/// @brief Lesson 10's OpenAI-compatible HTTP server around the engine (lesson 03's Engine, planned by your ChunkedPrefill; given), and a small
/// streaming client for the tests and the load generator.
///
/// The shape is the one vLLM and nano-vllm share: HTTP threads never touch the engine. One engine
/// thread owns it and loops: take the requests that came in (submitted with arrival_step =
/// engine.now()), take the cancellations, run one step(), hand each request its new tokens. The
/// HTTP front (Boost.Beast over Asio: a few threads serve every connection, so an open socket costs
/// memory, not a thread) reads a request, parses and checks it (parse_completion_request(),
/// yours), queues it, and writes its answer as the engine fills it: whole, or for a streaming
/// client a server-sent event per step that gave it text and `data: [DONE]` at the end. While it
/// answers, it keeps reading the connection: a client that hangs up, streaming or not, cancels its
/// request, and the engine frees its memory before the next step. Requests on one connection
/// (keep-alive, pipelined) are answered in order.
///
/// Deadlines: a request's headers must arrive within request_timeout_s of the connection asking
/// for them (the first request, or the next on a kept-alive connection), its body within
/// request_timeout_s more, and each write of its answer must be taken within request_timeout_s.
/// A client past the first two that sent part of its request hears 408 Request Timeout; a
/// connection past any of them is closed (its request cancelled). A generation has no deadline.
///
/// Endpoints: POST /v1/completions, POST /v1/chat/completions (both with "stream": true or not),
/// GET /v1/models, GET /v1/models/{name}, GET /health, GET /metrics (Prometheus text: time to first token, time per
/// output token and inter-token latency histograms; running and waiting requests; KV memory
/// reserved; prefix cache hit rate; tokens and requests by how they ended). Each path may come in
/// absolute form too (http://host/v1/models, as a client sends it through a proxy).
///
/// Refused on the headers, before a byte of the body is read or inflated (OpenAI's error body each
/// time, then the connection closed): a Content-Length above max_body_bytes (413; with Expect:
/// 100-continue, before the client sends the body), no Content-Length or a chunked body (411),
/// Transfer-Encoding with Content-Length (400), no Host header or two (400), any Content-Encoding (415), a Content-Type other
/// than application/json (415), headers above 64 KB in all (431), a known path with the wrong
/// method (405), a missing or wrong key on /v1/ when api_key is set (401), anything that is not
/// HTTP/1.1 (505), a body past max_body_bytes_in_flight or a connection past max_connections
/// (503). The framing checks hold for a body on any method. A refused client still sending hears the answer: the server stops writing and
/// reads (dropping) what comes for up to 2 s and 4 MB before it closes, rather than resetting the
/// connection under it. A request beyond max_running + max_waiting open ones gets 503 with
/// Retry-After.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lessons/10_serving/api.hpp"
#include "lessons/10_serving/serving.hpp"

namespace infer {

/// The least ServerOptions::request_timeout_s, in seconds (below 10 ms nothing can be served).
constexpr double kMinRequestTimeout = 0.01;
/// The most ServerOptions::request_timeout_s, in seconds: a day (no client is slower; far beyond
/// it the timers overflow).
constexpr double kMaxRequestTimeout = 86400;

/// Where and how the server listens.
struct ServerOptions {
  std::string host = "127.0.0.1";  ///< address to bind
  int port = 0;                    ///< 0: any free port (start() returns it)
  size_t max_body_bytes = 1 << 20;  ///< larger bodies get 413
  /// Threads running the HTTP front. Each serves any number of connections (none waits on a
  /// client), so a few are enough; more only if parsing and writing answers keep them busy.
  int http_threads = 2;
  /// Seconds a client has to send a request's headers, then its body, and to take each write of
  /// its answer: a connection that takes longer is closed, and its request cancelled (a slow
  /// client costs a socket and its answer's bytes for this long, never a thread).
  double request_timeout_s = 10;
  /// Connections open at once: one more is answered 503 (with Retry-After) and closed. Each
  /// holds up to 64 KB of headers while they come.
  int max_connections = 1024;
  /// Bytes of request bodies received and not yet parsed, all connections together: a request
  /// whose next bytes would pass it is answered 503 (with Retry-After) and its body dropped (a
  /// Content-Length only announced holds nothing). With the 64 KB of headers per connection, this
  /// bounds what clients can make the server hold.
  size_t max_body_bytes_in_flight = 64 << 20;
  /// Requests that may wait for a place in the batch beyond those running (the engine's
  /// max_running; naive: 1): one more gets 503 with a Retry-After header.
  int max_waiting = 256;
  /// When not empty, every /v1/ route needs the header `Authorization: Bearer <api_key>` (401
  /// otherwise); /health and /metrics stay open.
  std::string api_key = "";
  /// A line on stderr for each request answered (or whose client left first): the client's
  /// address, the method and path, the status, the seconds from its headers' arrival, and what it
  /// got (a generation's prompt and generated tokens and finish reason; an error's message).
  /// Successful /health and /metrics requests are left out. Written by a thread of its own
  /// (server_parts.hpp's ServerLog): a stderr nobody reads holds up no answer.
  bool log_requests = false;
};

/// What naive serving runs for every token: the logits [1, vocab] after all of `tokens`,
/// computed from nothing (no cache kept between calls). On the CPU, lesson 00's forward(); on a
/// GPU, a CUDA forward over a store emptied before each call.
using NaiveForward = std::function<Matrix(std::span<const int> tokens)>;

/// The HTTP server. Given.
class Server {
 public:
  /// Serves through `engine` (the full engine: continuous batching, chunked prefill, the memory
  /// it was built with). `model.name` is what clients must ask for.
  Server(std::unique_ptr<Engine> engine, ApiModel model, ServerOptions options = {});
  /// Naive serving, the baseline of the lesson's table: one request at a time, each token from
  /// lesson 00's forward() over the whole sequence (no cache, no batching). `weights` must outlive
  /// the server.
  Server(const ModelWeights& weights, ApiModel model, ServerOptions options = {});
  /// Naive serving through `forward` (the same loop, another device: see NaiveForward).
  Server(NaiveForward forward, ApiModel model, ServerOptions options = {});
  /// Stops.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds and starts serving on background threads; returns the port. The engine's thread
  /// computes with as many OpenMP threads as the calling thread would (omp_get_max_threads()).
  /// Throws infer::Error if the address cannot be bound.
  int start();
  /// Stops listening and taking requests (one that comes on an open connection gets 503, the
  /// server shutting down, as /health does); the requests already in go on to their end, which
  /// wait_answered() waits for. The first half of a graceful stop: stop() ends what is left. Idempotent.
  void drain();
  /// Stops listening and the engine; requests still open end with an error. Idempotent.
  void stop();
  /// The port (after start()).
  int port() const;
  /// The /metrics text.
  std::string metrics() const;
  /// Waits until every request has ended and the engine is idle; false after `seconds`.
  bool wait_idle(double seconds) const;
  /// wait_idle(), and every answer written to its client too (or its client gone): what a
  /// drain() waits for before stop(). False after `seconds`.
  bool wait_answered(double seconds) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A server's answer to one POST, as http_post() collected it.
struct HttpReply {
  int status = 0;                   ///< HTTP status; 0 if no answer came (refused, timed out)
  std::string body;                 ///< everything the server sent
  std::vector<std::string> events;  ///< the payload of each server-sent `data:` line, "[DONE]" included
  bool hung_up = false;             ///< the caller's on_event asked to stop reading
  std::string error;                ///< why no answer came, when status is 0
};

/// POSTs a JSON `body` to http://host:port`path` and reads the answer as it comes (given). For a
/// stream, `on_event` (if any) is called with each event's payload the moment it arrives; returning
/// false hangs up. `timeout_s` bounds each wait for bytes. A non-empty `api_key` is sent as
/// `Authorization: Bearer <api_key>`.
HttpReply http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                    const std::function<bool(const std::string&)>& on_event = nullptr, double timeout_s = 60,
                    const std::string& api_key = "");

/// GETs http://host:port`path` (given): the status (0 if no answer) and the body.
std::pair<int, std::string> http_get(const std::string& host, int port, const std::string& path, double timeout_s = 10);

/// Reads one sample of a Prometheus text page: the value of the line `name` (with its labels,
/// e.g. `course_requests_total{finish_reason="stop"}`), or NaN if absent. Given.
double metric_value(const std::string& text, const std::string& name);

}  // namespace infer
