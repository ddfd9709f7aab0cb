// Lesson 10's server, the routes room (given): the HTTP front. Each handler parses and checks a
// request (parse_completion_request(), yours), queues it as a Job in the Mailbox, and answers it
// whole or as server-sent events while the engine thread (given_http_engine.cpp) fills it. The
// other rooms are listed in server_parts.hpp.
#include <algorithm>
#include <cctype>
#include <csignal>
#include <optional>
#include <thread>

#include "common/tokenizer.hpp"
#include "lessons/10_serving/server.hpp"
#include "lessons/10_serving/server_parts.hpp"

// After Eigen: httplib brings in <resolv.h>, whose `_res` macro would rename a parameter of Eigen's.
#include <httplib.h>

namespace infer {

using nlohmann::json;
using namespace server;

struct Server::Impl {
  ApiModel model;
  ServerOptions options;
  std::unique_ptr<Engine> engine;         // engine mode
  const ModelWeights* weights = nullptr;  // naive mode
  Metrics metrics;
  Mailbox mailbox{metrics};
  httplib::Server http;
  std::thread listener, worker;
  int bound_port = 0;
  int listen_socket = -1;  // the listening socket (httplib's socket_t is an int on POSIX)
  bool started = false, stopped = false;

  Impl(ApiModel m, ServerOptions o) : model(std::move(m)), options(std::move(o)) {}

  /// Answers with OpenAI's error body; `refused`: count it as a request refused before the engine.
  void reply_error(httplib::Response& res, const ApiError& e, bool refused = true) {
    if (refused) metrics.rejected(e.status());
    res.status = e.status();
    if (e.status() == 503) res.set_header("Retry-After", "1");
    res.set_content(e.body(), "application/json");
  }

  static constexpr size_t kMaxHeaderBytes = 64 << 10;  ///< headers in all, as h11's default

  /// The method each route answers, by path (a GET route answers HEAD too).
  static std::string route_method(const std::string& path) {
    if (path == "/v1/completions" || path == "/v1/chat/completions") return "POST";
    if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0 || path == "/health" || path == "/metrics") return "GET";
    return "";
  }

  /// What the headers alone decide, before a byte of the body is read (so that nothing a client
  /// sends is held in memory, or inflated, to be refused after): the method, the key, and for a
  /// POST its framing and its type. Empty when the request may go on.
  std::optional<ApiError> refuse_by_headers(const httplib::Request& req) const {
    size_t header_bytes = 0;  // (httplib has read them already: this bounds what a request may carry on)
    for (const auto& [name, value] : req.headers) header_bytes += name.size() + value.size() + 4;
    if (header_bytes > kMaxHeaderBytes)
      return ApiError(431, cat("The request's headers take ", header_bytes, " bytes, more than this server's limit of ",
                               kMaxHeaderBytes));
    const std::string method = route_method(req.path);
    if (!method.empty() && req.method != method && !(method == "GET" && req.method == "HEAD"))
      return ApiError(405, cat("Method ", req.method, " is not allowed on ", req.path, "; use ", method));
    if (!options.api_key.empty() && req.path.rfind("/v1/", 0) == 0 &&
        req.get_header_value("Authorization") != "Bearer " + options.api_key)
      return ApiError(401, req.has_header("Authorization") ? "Incorrect API key provided"
                                                           : "No API key provided: send the header 'Authorization: Bearer KEY'",
                      "", "invalid_api_key");
    if (req.method != "POST") return std::nullopt;
    const bool has_length = req.has_header("Content-Length");
    if (req.has_header("Transfer-Encoding"))
      return has_length ? ApiError(400, "A request may not carry both Transfer-Encoding and Content-Length")
                        : ApiError(411, "A request body needs a Content-Length header on this server (no chunked bodies)");
    if (!has_length) return ApiError(411, "A request body needs a Content-Length header on this server");
    const std::string length = req.get_header_value("Content-Length");
    if (length.empty() || length.size() > 18 || length.find_first_not_of("0123456789") != std::string::npos)
      return ApiError(400, cat("Content-Length must be a number of bytes, got '", length, "'"));
    if (std::stoull(length) > options.max_body_bytes)
      return ApiError(413, cat("The request body (", length, " bytes) is larger than this server's limit of ",
                               options.max_body_bytes, " bytes"));
    const std::string encoding = req.get_header_value("Content-Encoding");
    if (!encoding.empty() && encoding != "identity")
      return ApiError(415, cat("Content-Encoding '", encoding, "' is not accepted: send the JSON body as it is"));
    std::string type = req.get_header_value("Content-Type");
    type = type.substr(0, type.find(';'));
    while (!type.empty() && type.back() == ' ') type.pop_back();
    std::transform(type.begin(), type.end(), type.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (type != "application/json")
      return ApiError(415, cat("The body must be JSON, sent with 'Content-Type: application/json' (got '",
                               req.get_header_value("Content-Type"), "')"));
    return std::nullopt;
  }

  void generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    auto job = std::make_shared<Job>();
    try {
      refuse_unsupported(parse_json_object(req.body));
      job->request = parse_completion_request(req.body, endpoint, model);
    } catch (const ApiError& e) {
      reply_error(res, e);
      return;
    } catch (const json::exception& e) {  // a field of an unexpected type read without a check
      reply_error(res, ApiError(400, cat("The request has a field of an unexpected type or value: ", e.what())));
      return;
    } catch (const std::exception& e) {  // e.g. a starter's NotImplemented
      reply_error(res, ApiError(500, cat("parse_completion_request failed: ", e.what())));
      return;
    }
    job->arrived = Clock::now();
    const size_t running = engine ? static_cast<size_t>(engine->options().max_running) : 1;
    mailbox.enqueue(job, /*accept=*/engine == nullptr,  // the naive thread refuses nothing
                    running + static_cast<size_t>(options.max_waiting));
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
      res.set_content(dump(completion_body(*job, model.name, ByteTokenizer::decode(job->tokens),
                                           static_cast<int>(job->tokens.size()), job->finish_reason)),
                      "application/json");
      return;
    }
    struct StreamState {
      size_t seen = 0;     // the job's tokens at the last look
      size_t emitted = 0;  // bytes of their text sent
      bool role_sent = false;
    };
    auto state = std::make_shared<StreamState>();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, state, name = model.name](size_t, httplib::DataSink& sink) -> bool {
          std::vector<int> tokens;
          bool finished = false, fresh = false;
          std::string reason, error;
          int status = 0;
          {
            std::unique_lock lock(job->mutex);
            fresh = job->changed.wait_for(lock, std::chrono::seconds(1),
                                          [&] { return job->finished || job->tokens.size() != state->seen; });
            tokens = job->tokens;
            state->seen = tokens.size();
            finished = job->finished;
            reason = job->finish_reason;
            error = job->error;
            status = job->error_status;
          }
          const auto send = [&](const std::string& payload) {
            const std::string event = "data: " + payload + "\n\n";
            return sink.write(event.data(), event.size());
          };
          if (!fresh && !finished) {  // nothing yet (queued): a comment line keeps the
            const std::string ping = ": waiting\n\n";  // connection checked, so a hang-up is seen
            return sink.write(ping.data(), ping.size());
          }
          // What may be sent: the text past what was, without the end of a character not complete
          // yet, nor an end that may still become a stop sequence (a stop cuts the tokens short,
          // never before what was sent).
          const std::string text = ByteTokenizer::decode(tokens);
          const std::string rest = text.size() > state->emitted ? text.substr(state->emitted) : "";
          size_t n = finished ? rest.size() : complete_utf8(rest);
          if (!finished && !job->request.stop.empty()) {
            const size_t held = stop_holdback(text, job->request.stop);
            n = std::min(n, rest.size() > held ? rest.size() - held : 0);
          }
          const bool chat = job->request.endpoint == Endpoint::ChatCompletions;
          if (n > 0 || (chat && !state->role_sent)) {
            const std::string piece = rest.substr(0, n);
            state->emitted += n;
            if (!send(dump(chunk_body(*job, name, &piece, nullptr, chat && !state->role_sent)))) return false;
            state->role_sent = true;
          }
          if (!finished) return true;
          if (reason == "error") {
            if (!send(ApiError(status, error).body())) return false;
          } else {
            if (!send(dump(chunk_body(*job, name, nullptr, reason, false)))) return false;
            if (job->request.include_usage && !send(dump(usage_chunk(*job, name, static_cast<int>(tokens.size())))))
              return false;
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
          if (!success && !ended) mailbox.cancel(job->id);  // the client hung up: free its sequence
        });
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
    const auto model_object = [this] {
      return json{{"id", model.name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "course"},
                  {"max_model_len", model.config.max_position_embeddings}};
    };
    http.Get("/v1/models", [this, model_object](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump(json{{"object", "list"}, {"data", json::array({model_object()})}}), "application/json");
    });
    http.Get("/v1/models/(.+)", [this, model_object](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      if (id != model.name)
        return reply_error(res, ApiError(404, cat("The model '", id, "' does not exist; this server serves '", model.name, "'"),
                                         "model", "model_not_found"));
      res.set_content(dump(model_object()), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const std::string broken = mailbox.broken();
      res.status = broken.empty() ? 200 : 503;
      res.set_content(broken.empty() ? R"({"status":"ok"})" : dump(json{{"status", "failed"}, {"error", broken}}),
                      "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.text(), "text/plain; version=0.0.4");
    });
    // The headers are checked before the body is read: httplib would read a chunked body whole,
    // however large, and inflate a compressed one without a limit. A body too large is left to
    // httplib, which reads it to the end without keeping it and answers 413 (through the error
    // handler below), so that the client, still sending, hears the answer. A body without a
    // usable length cannot be skipped: that refusal closes the connection.
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const std::optional<ApiError> e = refuse_by_headers(req);
      if (!e || e->status() == 413) return httplib::Server::HandlerResponse::Unhandled;
      reply_error(res, *e);
      if (e->status() == 400 || e->status() == 411 || e->status() == 431) res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    });
    // A client that asks before sending its body (Expect: 100-continue) hears the refusal at once.
    http.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (const std::optional<ApiError> e = refuse_by_headers(req)) {
        reply_error(res, *e);
        res.set_header("Connection", "close");
        return e->status();
      }
      return 100;
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
  impl_->metrics.set_kv_capacity(impl_->engine->memory().capacity_tokens());
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
  s.worker = std::thread([&s] {
    if (s.engine) server::run_engine(*s.engine, s.mailbox, s.metrics);
    else server::run_naive(*s.weights, s.mailbox, s.metrics);
  });
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
  s.mailbox.stop();
  if (s.worker.joinable()) s.worker.join();                   // fails what is open, which wakes the handlers
  s.mailbox.fail_queued(503, "the server is shutting down");  // what came in since
  s.http.stop();
  if (s.listener.joinable()) s.listener.join();
}

int Server::port() const { return impl_->bound_port; }

std::string Server::metrics() const { return impl_->metrics.text(); }

bool Server::wait_idle(double seconds) const { return impl_->mailbox.wait_idle(seconds); }

}  // namespace infer
