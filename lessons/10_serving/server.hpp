/// @file server.hpp
/// @brief Lesson 10's OpenAI-compatible HTTP server around the engine (lesson 03's Engine, planned by your ChunkedPrefill; given), and a small
/// streaming client for the tests and the load generator.
///
/// The shape is the one vLLM and nano-vllm share: HTTP threads never touch the engine. One engine
/// thread owns it and loops: take the requests that came in (submitted with arrival_step =
/// engine.now()), take the cancellations, run one step(), hand each request its new tokens. The
/// HTTP threads (one per open connection) parse and check a request (parse_completion_request(),
/// yours), queue it, and then wait on that request's own channel: a streaming client gets a
/// server-sent event per step that gave it text, and `data: [DONE]` at the end. A client that
/// hangs up mid-stream cancels its request, and the engine frees its memory before the next step.
///
/// Endpoints: POST /v1/completions, POST /v1/chat/completions (both with "stream": true or not),
/// GET /v1/models, GET /v1/models/{name}, GET /health, GET /metrics (Prometheus text: time to first token, time per
/// output token and inter-token latency histograms; running and waiting requests; KV memory
/// reserved; prefix cache hit rate; tokens and requests by how they ended).
///
/// Refused on the headers, before the body is kept or inflated (OpenAI's error body each time):
/// a Content-Length above max_body_bytes (413: the body is read and dropped; with Expect:
/// 100-continue it is refused before it is sent), no Content-Length or a chunked body (411, the
/// connection closed), Transfer-Encoding with Content-Length (400, closed), any Content-Encoding
/// (415), a Content-Type other than application/json (415), headers above 64 KB in all (431,
/// closed), a known path with the wrong method (405), a missing or wrong key on /v1/ when api_key
/// is set (401). A request beyond max_running + max_waiting open ones gets 503 with Retry-After.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lessons/10_serving/api.hpp"
#include "lessons/10_serving/serving.hpp"

namespace infer {

/// Where and how the server listens.
struct ServerOptions {
  std::string host = "127.0.0.1";  ///< address to bind
  int port = 0;                    ///< 0: any free port (start() returns it)
  size_t max_body_bytes = 1 << 20;  ///< larger bodies get 413
  int http_threads = 128;           ///< connections served at once (a stream holds one for its whole life)
  /// Requests that may wait for a place in the batch beyond those running (the engine's
  /// max_running; naive: 1): one more gets 503 with a Retry-After header.
  int max_waiting = 256;
  /// When not empty, every /v1/ route needs the header `Authorization: Bearer <api_key>` (401
  /// otherwise); /health and /metrics stay open.
  std::string api_key = "";
};

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
  /// Stops.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds and starts serving on background threads; returns the port. Throws infer::Error if the
  /// address cannot be bound.
  int start();
  /// Stops listening and the engine; requests still open end with an error. Idempotent.
  void stop();
  /// The port (after start()).
  int port() const;
  /// The /metrics text.
  std::string metrics() const;
  /// Waits until every request has ended and the engine is idle; false after `seconds`.
  bool wait_idle(double seconds) const;

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
