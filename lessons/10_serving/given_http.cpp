// Lesson 10's server, the routes room (given): the HTTP front, on Boost.Beast. Each connection is
// a small state machine driven by a few threads (no thread of its own): read the headers (with a
// deadline), refuse what they already rule out, read the body (with a deadline), then either answer
// at once or queue a Job in the Mailbox and answer it, whole or as server-sent events, each time
// the engine thread (given_http_engine.cpp) says the job changed. The other rooms are listed in
// server_parts.hpp.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/rng.hpp"
#include "common/tokenizer.hpp"
#include "lessons/10_serving/server.hpp"
#include "lessons/10_serving/server_parts.hpp"

namespace infer {

using nlohmann::json;
using namespace server;
namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr size_t kMaxHeaderBytes = 64 << 10;           ///< a request's headers in all, as h11's default
constexpr auto kLinger = std::chrono::seconds(2);      ///< reading what a refused client still sends
constexpr auto kCrowdedLinger = std::chrono::milliseconds(250);  ///< ... when refused for the connection limit
constexpr auto kAnswerGrace = std::chrono::seconds(2);  ///< past a request's deadline, to write its 408 before the socket closes
constexpr size_t kMaxLingerBytes = 4 << 20;            ///< ... at most this much of it
constexpr int kSendBufferBytes = 256 << 10;            ///< a connection's socket send buffer (Linux doubles it)

/// One HTTP/1.1 answer with a body, as bytes on the wire. `head`: the headers only (a HEAD request).
std::string http_response(int status, const std::string& type, const std::string& body, bool close,
                          const std::string& extra_headers = "", bool head = false) {
  std::string out = cat("HTTP/1.1 ", status, " ", http::obsolete_reason(http::int_to_status(status)), "\r\n",
                        "Content-Type: ", type, "\r\nContent-Length: ", body.size(), "\r\n", extra_headers);
  if (close) out += "Connection: close\r\n";
  out += "\r\n";
  if (!head) out += body;
  return out;
}

/// `s` seconds, as the timers count them.
std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

/// One chunk of a chunked body (a stream's server-sent event).
std::string http_chunk(const std::string& data) {
  std::ostringstream size;
  size << std::hex << data.size();
  return size.str() + "\r\n" + data + "\r\n";
}

/// Whether `given` is `secret`, in a time that does not depend on where they first differ (a
/// client timing its guesses learns nothing of the key but its length).
bool same_secret(std::string_view given, std::string_view secret) {
  unsigned char differ = given.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < secret.size(); ++i) differ |= static_cast<unsigned char>(i < given.size() ? given[i] ^ secret[i] : 1);
  return differ == 0;
}

/// The path a request target names, without its query: "/v1/models" from "/v1/models?x=1", and
/// from the absolute form "http://host:8000/v1/models" (what clients send to a proxy; RFC 9112
/// says a server must accept it too), "/" where such a target has no path.
std::string origin_path(std::string_view target) {
  target = target.substr(0, target.find_first_of("?#"));
  if (const size_t scheme = target.find("://"); scheme != std::string_view::npos && target.substr(0, 1) != "/") {
    const size_t path = target.find('/', scheme + 3);
    return path == std::string_view::npos ? "/" : std::string(target.substr(path));
  }
  return std::string(target);
}

/// The method each route answers, by path (a GET route answers HEAD too); "" for no route.
std::string route_method(std::string_view path) {
  if (path == "/v1/completions" || path == "/v1/chat/completions") return "POST";
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0 || path == "/health" || path == "/metrics") return "GET";
  return "";
}

}  // namespace

struct Server::Impl {
  class Connection;

  ApiModel model;
  ServerOptions options;
  std::unique_ptr<Engine> engine;         // engine mode
  NaiveForward naive;  // naive mode: what runs every token
  Metrics metrics;
  Mailbox mailbox{metrics};
  ServerLog log;  // (destroyed after the connections and threads that write to it)
  std::atomic<int> answering{0};  ///< requests queued for the engine whose answer is not written yet
  std::atomic<int> connections{0};       ///< open connections (ServerOptions::max_connections)
  std::atomic<size_t> body_bytes{0};     ///< bytes of bodies received and not yet parsed (max_body_bytes_in_flight)
  // After what a connection uses: destroyed before it, with the connections still in it.
  net::io_context io;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> http_threads;
  std::thread worker;
  int bound_port = 0;
  bool started = false, stopped = false;
  bool accept_failing = false;  ///< the last accept failed (only the accept loop, one at a time, reads it)

  Impl(ApiModel m, ServerOptions o) : model(std::move(m)), options(std::move(o)) { metrics.watch_http(connections, body_bytes); }

  /// A seed for a request that sent none: a new one each call (a counter that starts from the
  /// system's entropy, mixed).
  uint64_t fresh_seed() { return Rng(seeds.fetch_add(1)).next_u64(); }
  std::atomic<uint64_t> seeds{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};

  /// What the headers alone decide, before a byte of the body is read (so that nothing a client
  /// sends is held in memory, or inflated, to be refused after): the method, the key, and for a
  /// POST its framing, its size and its type. Empty when the request may go on.
  std::optional<ApiError> refuse_by_headers(const http::request_header<>& req, std::string_view path) const {
    if (const size_t hosts = req.count(http::field::host); hosts != 1)  // (RFC 9112: exactly one, or 400)
      return ApiError(400, cat("An HTTP/1.1 request names its host in one Host header; this one has ", hosts));
    const std::string method = route_method(path);
    const std::string verb(req.method_string());
    if (!method.empty() && verb != method && !(method == "GET" && verb == "HEAD"))
      return ApiError(405, cat("Method ", verb, " is not allowed on ", path, "; use ", method));
    if (!options.api_key.empty() && path.rfind("/v1/", 0) == 0 &&
        !same_secret(std::string(req[http::field::authorization]), "Bearer " + options.api_key))
      return ApiError(401, req.count(http::field::authorization) ? "Incorrect API key provided"
                                                                 : "No API key provided: send the header 'Authorization: Bearer KEY'",
                      "", "invalid_api_key");
    // The framing of a body, whatever the method (a GET may carry one: it is read and dropped);
    // its encoding and type only where it is read.
    const bool has_length = req.count(http::field::content_length) > 0;
    if (verb != "POST" && !has_length && !req.count(http::field::transfer_encoding)) return std::nullopt;
    if (req.count(http::field::transfer_encoding))
      return has_length ? ApiError(400, "A request may not carry both Transfer-Encoding and Content-Length")
                        : ApiError(411, "A request body needs a Content-Length header on this server (no chunked bodies)");
    if (!has_length) return ApiError(411, "A request body needs a Content-Length header on this server");
    const std::string length(req[http::field::content_length]);
    if (length.empty() || length.size() > 18 || length.find_first_not_of("0123456789") != std::string::npos)
      return ApiError(400, cat("Content-Length must be a number of bytes, got '", length, "'"));
    if (std::stoull(length) > options.max_body_bytes)
      return ApiError(413, cat("The request body (", length, " bytes) is larger than this server's limit of ",
                               options.max_body_bytes, " bytes"));
    if (verb != "POST") return std::nullopt;
    const std::string encoding(req[http::field::content_encoding]);
    if (!encoding.empty() && encoding != "identity")
      return ApiError(415, cat("Content-Encoding '", encoding, "' is not accepted: send the JSON body as it is"));
    std::string type(req[http::field::content_type]);
    type = type.substr(0, type.find(';'));
    while (!type.empty() && type.back() == ' ') type.pop_back();
    std::transform(type.begin(), type.end(), type.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (type != "application/json")
      return ApiError(415, cat("The body must be JSON, sent with 'Content-Type: application/json' (got '",
                               std::string(req[http::field::content_type]), "')"));
    return std::nullopt;
  }

  /// The model as /v1/models lists it.
  json model_object() const {
    return json{{"id", model.name},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "course"},
                {"max_model_len", model.config.max_position_embeddings}};
  }

  void accept();
  /// accept(), in 50 ms.
  void accept_later() {
    auto timer = std::make_shared<net::steady_timer>(io, std::chrono::milliseconds(50));
    timer->async_wait([this, timer](beast::error_code) { accept(); });
  }
};

/// One client connection. Every handler runs on the connection's strand, so its state needs no
/// lock; the engine thread reaches it only through Job::on_change, which posts on_job() there.
class Server::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, Server::Impl& server)
      : stream_(std::move(socket)), s_(server), began_(Clock::now()), deadline_(stream_.get_executor()) {
    ++s_.connections;
    beast::error_code ec;
    const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
    if (!ec)
      peer_ = peer.address().is_v6() ? cat("[", peer.address().to_string(), "]:", peer.port())
                                     : cat(peer.address().to_string(), ":", peer.port());
  }
  ~Connection() {
    uncount();
    release_body();
    --s_.connections;
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if (const int open = self->s_.connections.load(); open > self->s_.options.max_connections) {
        self->linger_for_ = kCrowdedLinger;  // (a crowd of these must not hold memory for long)
        return self->refuse(ApiError(503, cat("This server has ", open - 1, " connections open, its limit; retry in a moment")));
      }
      self->read_header();
    });
  }

 private:
  // --------------------------------------------------------------- reading --

  void read_header() {
    began_ = Clock::now();  // (for the log of a request whose headers never come whole; on_header() sets it again)
    method_.clear(), path_.clear(), log_detail_.clear();
    logged_ = false;
    header_.emplace();
    header_->header_limit(kMaxHeaderBytes);
    header_->body_limit(std::numeric_limits<std::uint64_t>::max());  // the body's size is refuse_by_headers()'s to judge (not boost::none: Boost 1.74 compares it wrongly)
    arm_deadline();
    reading_ = true;
    http::async_read_header(stream_, buffer_, *header_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    reading_ = false;
    disarm_deadline();
    if (closed_) return;  // (a hang-up seen by the watch closed it while the answer was written)
    if (ec == net::error::operation_aborted && timed_out_)  // (bytes of it are in the buffer, not yet parsed)
      return past_deadline(buffer_.size() > 0 || header_->got_some(), "headers");
    if (ec == http::error::header_limit)
      return refuse(ApiError(431, cat("The request's headers are larger than this server's limit of ", kMaxHeaderBytes,
                                      " bytes")));
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::operation_aborted ||
        ec == net::error::eof || ec == net::error::connection_reset)
      return close();  // gone, or silent past the deadline: nobody to answer
    if (ec == http::error::bad_version)
      return refuse(ApiError(505, "This server speaks HTTP/1.1; the request line names another version"));
    if (ec) return refuse(ApiError(400, cat("The request is not valid HTTP/1.1: ", ec.message())));
    const http::request_header<>& req = header_->get();
    if (req.version() != 11)  // (HTTP/1.0 would need its own framing: no chunked streams, no default keep-alive)
      return refuse(ApiError(505, cat("This server speaks HTTP/1.1; the request is HTTP/", req.version() / 10, ".",
                                      req.version() % 10)));
    began_ = Clock::now();  // (the log's seconds count from here: a keep-alive connection's idle wait is not the request's)
    path_ = origin_path({req.target().data(), req.target().size()});
    method_ = std::string(req.method_string());
    head_only_ = req.method() == http::verb::head;
    keep_alive_ = header_->keep_alive();
    if (const std::optional<ApiError> e = s_.refuse_by_headers(req, path_)) return refuse(*e);
    const bool expects_continue = beast::iequals(req[http::field::expect], "100-continue");
    body_.emplace(std::move(*header_));  // (req is moved from here on)
    body_->body_limit(s_.options.max_body_bytes);
    if (expects_continue) {
      // The client waits for this before it sends the body (a refusal came above, before it).
      send("HTTP/1.1 100 Continue\r\n\r\n");
    }
    arm_deadline();
    read_body();
  }

  /// Reads on into the body. Its bytes are held from their arrival until it is parsed, and all
  /// bodies being read share a bound: each part is counted as it comes (a Content-Length only
  /// announced holds nothing).
  void read_body() {
    if (body_->is_done()) return on_body({});  // no body, or all of it came with the headers
    reading_ = true;
    http::async_read_some(stream_, buffer_, *body_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->reading_ = false;
      if (self->closed_) return;
      if (ec) return self->on_body(ec);
      const size_t have = self->body_->get().body().size();
      if (have > self->reserved_ && !self->reserve_body(have - self->reserved_)) {
        self->disarm_deadline();
        self->drop_body();
        return self->refuse(ApiError(503, cat("The server is reading ", self->s_.body_bytes.load(), " bytes of other requests' bodies and ",
                                              "holds at most ", self->s_.options.max_body_bytes_in_flight,
                                              " at once; retry in a moment")));
      }
      self->read_body();
    });
  }

  void on_body(beast::error_code ec) {
    reading_ = false;
    disarm_deadline();
    if (ec == net::error::operation_aborted && timed_out_) return past_deadline(true, "body");
    if (ec == http::error::body_limit) {
      drop_body();
      return refuse(ApiError(413, cat("The request body is larger than this server's limit of ",
                                      s_.options.max_body_bytes, " bytes")));
    }
    if (ec) return close();  // gone, or too slow: the deadline closed it
    stream_.expires_never();  // a generation takes as long as it takes; a hang-up ends it
    route(body_->get());      // (what is kept of the body is parsed into its job by now)
    drop_body();
  }

  /// A request's deadline (its headers, then its body; each has request_timeout_s): past it, a
  /// client that sent part of the request hears 408 and is closed (RFC 9110, 15.5.9); one that sent
  /// nothing of it (an idle connection between requests) is closed without a word. The read is
  /// stopped by this timer, not by the stream's own deadline, which closes the socket and so leaves
  /// no way to answer: that one comes kAnswerGrace later, as a backstop.
  void arm_deadline() {
    stream_.expires_after(seconds(s_.options.request_timeout_s) + kAnswerGrace);
    timed_out_ = false;
    deadline_.expires_after(seconds(s_.options.request_timeout_s));
    deadline_.async_wait([self = shared_from_this(), armed = ++armed_](beast::error_code ec) {
      // (a wait cancelled after it was due comes here without an error: the count tells it is old)
      if (ec || armed != self->armed_ || !self->reading_ || self->closed_) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);  // the read comes back with operation_aborted
    });
  }

  void disarm_deadline() {
    ++armed_;
    deadline_.cancel();
  }

  /// The request did not arrive whole within its deadline; `partial`: some of it did.
  void past_deadline(bool partial, const char* what) {
    if (!partial) return close();  // nobody is waiting for an answer
    if (body_) drop_body();
    linger_for_ = kCrowdedLinger;  // (a crowd of these must not hold memory for long)
    refuse(ApiError(408, cat("The request's ", what, " did not arrive within this server's request timeout of ",
                             s_.options.request_timeout_s, " s; send the whole request at once")));
  }

  /// The body is done with (parsed, or refused): its bytes go, and leave the shared bound. Only
  /// where no read uses the parser.
  void drop_body() {
    body_.reset();
    release_body();
  }

  /// Counts `bytes` more of body in Server::Impl::body_bytes, if they fit under the bound.
  bool reserve_body(size_t bytes) {
    size_t held = s_.body_bytes.load();
    do {
      if (bytes > s_.options.max_body_bytes_in_flight - std::min(held, s_.options.max_body_bytes_in_flight)) return false;
    } while (!s_.body_bytes.compare_exchange_weak(held, held + bytes));
    reserved_ += bytes;
    return true;
  }

  void release_body() {
    s_.body_bytes -= reserved_;
    reserved_ = 0;
  }

  /// While an answer is being prepared: read on, to see the client hang up (the read ends with an
  /// error) and cancel its request at once. Bytes that come are a next request (pipelined), kept
  /// for it; the watch goes on reading behind them, up to kMaxHeaderBytes of them (a client that
  /// far ahead is not watched until its answer is written).
  void watch() {
    if (reading_ || closed_ || (!closing_ && buffer_.size() >= kMaxHeaderBytes)) return;
    reading_ = true;
    const size_t room = closing_ ? 4 << 10 : std::min<size_t>(16 << 10, kMaxHeaderBytes - buffer_.size());
    stream_.async_read_some(buffer_.prepare(room), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->reading_ = false;
      const bool resuming = std::exchange(self->resuming_, false);
      if (ec == net::error::operation_aborted && resuming) return self->after_answer();  // stopped to read the next request
      if (ec) return self->hung_up();
      self->buffer_.commit(n);
      if (self->closing_) return self->linger();  // what a refused client still sends, dropped
      if (self->answered_ && !self->writing_ && self->out_.empty()) return self->after_answer();  // the next request
      self->watch();
    });
  }

  /// The client went away (or its connection broke): its request, if running, is cancelled.
  void hung_up() {
    if (job_) {
      bool finished = false;
      {
        std::lock_guard lock(job_->mutex);
        finished = job_->finished;
      }
      if (!finished) s_.mailbox.cancel(job_->id);  // the engine frees its sequence before its next step
      log_request(shown_.head_sent ? 200 : 0,
                  cat(": the client hung up after ", shown_.bytes, " bytes of its answer's text",
                      finished ? ", before the rest was written" : "; cancelled"));
    }
    close();
  }

  // ---------------------------------------------------------------- routing --

  void route(const http::request<http::string_body>& req) {
    answered_ = false;
    if (path_ == "/v1/completions") return generate(req.body(), Endpoint::Completions);
    if (path_ == "/v1/chat/completions") return generate(req.body(), Endpoint::ChatCompletions);
    if (path_ == "/v1/models") return reply(200, dump(json{{"object", "list"}, {"data", json::array({s_.model_object()})}}));
    if (path_.rfind("/v1/models/", 0) == 0) {
      const std::string id = path_.substr(11);
      if (id != s_.model.name)
        return reply_error(ApiError(404, cat("The model ", shown(id), " does not exist; this server serves '", s_.model.name, "'"),
                                    "model", "model_not_found"));
      return reply(200, dump(s_.model_object()));
    }
    if (path_ == "/health") {  // (a balancer sends no more here once it says 503)
      const std::string broken = s_.mailbox.broken();
      if (broken.empty() && s_.mailbox.closing()) return reply(503, R"({"status":"shutting down"})");
      return reply(broken.empty() ? 200 : 503,
                   broken.empty() ? R"({"status":"ok"})" : dump(json{{"status", "failed"}, {"error", broken}}));
    }
    if (path_ == "/metrics") return reply(200, s_.metrics.text(), "text/plain; version=0.0.4");
    reply_error(ApiError(404, cat("No route ", std::string(req.method_string()), " ", path_, " on this server")));
  }

  void generate(const std::string& body, Endpoint endpoint) {
    auto job = std::make_shared<Job>();
    try {
      const json fields = parse_json_object(body);
      refuse_unsupported(fields);
      job->request = parse_completion_request(body, endpoint, s_.model);
      // Without a seed, a sample of its own each time (OpenAI's API does the same), where the
      // parse's default, 0, would give every such request the same text.
      if (!fields.contains("seed") || fields["seed"].is_null()) job->request.sampling.seed = s_.fresh_seed();
    } catch (const ApiError& e) {
      return reply_error(e);
    } catch (const json::exception& e) {  // a field of an unexpected type read without a check
      return reply_error(ApiError(400, cat("The request has a field of an unexpected type or value: ", e.what())));
    } catch (const std::exception& e) {  // e.g. a starter's NotImplemented
      return reply_error(ApiError(500, cat("parse_completion_request failed: ", e.what())));
    }
    job->arrived = Clock::now();
    // The job keeps its connection alive until it ends (nothing else may: a connection waiting
    // for its answer has no read or write under way).
    job->on_change = [self = shared_from_this()] { net::post(self->stream_.get_executor(), [self] { self->on_job(); }); };
    job_ = job;
    shown_ = {};
    counted_ = true;
    s_.answering.fetch_add(1);
    const size_t running = s_.engine ? static_cast<size_t>(s_.engine->options().max_running) : 1;
    s_.mailbox.enqueue(job, /*accept=*/s_.engine == nullptr,  // the naive thread refuses nothing
                       running + static_cast<size_t>(s_.options.max_waiting));
    watch();
    on_job();  // it may have been refused already (a full queue, a stopping server)
  }

  /// The job changed (or may have): write what is new of its answer.
  void on_job() {
    if (!job_) return;
    const std::shared_ptr<Job> held = job_;  // (end_job() below lets go of job_)
    Job& job = *held;
    std::vector<int> tokens;
    bool accepted = false, finished = false;
    std::string reason, error;
    int status = 0;
    {
      std::lock_guard lock(job.mutex);
      accepted = job.accepted;
      finished = job.finished;
      tokens = job.tokens;
      reason = job.finish_reason;
      error = job.error;
      status = job.error_status;
    }
    if (!accepted) {  // until the engine takes it, a request can be refused with a status of its own
      if (finished) {
        end_job();
        reply_error(ApiError(status, error));
      }
      return;
    }
    if (!job.request.stream) {
      if (!finished) return;
      end_job();
      if (reason == "error") return reply_error(ApiError(status, error), /*refused=*/false);  // counted as ended in error
      log_detail_ = generated(job, tokens.size(), reason);
      return reply(200, dump(completion_body(job, s_.model.name, ByteTokenizer::decode(tokens),
                                             static_cast<int>(tokens.size()), reason)));
    }
    std::string out;
    if (!shown_.head_sent) {
      out += "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             "Transfer-Encoding: chunked\r\n";
      if (!keep_alive_) out += "Connection: close\r\n";
      out += "\r\n";
      shown_.head_sent = true;
    }
    const auto event = [&](const std::string& payload) { out += http_chunk("data: " + payload + "\n\n"); };
    // What may be sent: the text past what was, without the end of a character not complete yet,
    // nor an end that may still become a stop sequence (a stop cuts the tokens short, never before
    // what was sent).
    const std::string text = ByteTokenizer::decode(tokens);
    const std::string rest = text.size() > shown_.bytes ? text.substr(shown_.bytes) : "";
    size_t n = finished ? rest.size() : complete_utf8(rest);
    if (!finished && !job.request.stop.empty()) {
      const size_t held = stop_holdback(text, job.request.stop);
      n = std::min(n, rest.size() > held ? rest.size() - held : 0);
    }
    const bool chat = job.request.endpoint == Endpoint::ChatCompletions;
    if (n > 0 || (chat && !shown_.role_sent)) {
      const std::string piece = rest.substr(0, n);
      shown_.bytes += n;
      event(dump(chunk_body(job, s_.model.name, &piece, nullptr, chat && !shown_.role_sent)));
      shown_.role_sent = true;
    }
    if (finished) {
      log_request(200, reason == "error" ? cat(", streamed: ended by an error: ", error)
                                         : generated(job, tokens.size(), reason) + ", streamed");
      if (reason == "error") {
        event(ApiError(status, error).body());
      } else {
        event(dump(chunk_body(job, s_.model.name, nullptr, reason, false)));
        if (job.request.include_usage) event(dump(usage_chunk(job, s_.model.name, static_cast<int>(tokens.size()))));
      }
      event("[DONE]");
      out += "0\r\n\r\n";  // the chunked body's end
      end_job();
      answered_ = true;
    }
    send(std::move(out));
  }

  /// The job's answer is complete (being written): the connection no longer follows it.
  void end_job() { job_.reset(); }

  /// The answer to a queued request is written (or its client is gone): Server::stop() waits for
  /// no more of them.
  void uncount() {
    if (counted_) s_.answering.fetch_sub(1);
    counted_ = false;
  }

  // --------------------------------------------------------------- the log --

  /// The request's line in the server's log (ServerOptions::log_requests), once: who, what, the
  /// status (0: none was sent, "-"), the seconds from its headers' arrival, and `detail`.
  /// Successful /health and /metrics requests (a balancer's or a scraper's, every few seconds) are
  /// left out.
  void log_request(int status, const std::string& detail) {
    if (!s_.options.log_requests || logged_) return;
    logged_ = true;
    if (status == 200 && (path_ == "/health" || path_ == "/metrics")) return;
    const double seconds = std::chrono::duration<double>(Clock::now() - began_).count();
    std::string line = cat("serve: ", peer_.empty() ? "-" : peer_, " ", method_.empty() ? "-" : method_, " ",
                           path_.empty() ? "-" : path_.size() > 100 ? path_.substr(0, 100) + "..." : path_, " ",
                           status > 0 ? std::to_string(status) : "-", " ");
    char time[32];
    std::snprintf(time, sizeof time, "%.3f s", seconds);
    line += time + detail;
    s_.log.add(line);  // (made printable there: a client's bytes are in it, its path and what its error quotes)
  }

  /// What a generation's log line says of it.
  static std::string generated(const Job& job, size_t tokens, const std::string& reason) {
    return cat(", prompt ", job.request.prompt.size(), " tokens, ", tokens, " generated (", reason, ")");
  }

  // --------------------------------------------------------------- writing --

  /// Answers with `body` (JSON unless told), then goes on to the next request or closes.
  void reply(int status, const std::string& body, const std::string& type = "application/json",
             const std::string& extra = "") {
    log_request(status, log_detail_);
    answered_ = true;
    send(http_response(status, type, body, !keep_alive_, extra, head_only_));
  }

  /// Answers with OpenAI's error body; `refused`: count it as a request refused before the engine.
  void reply_error(const ApiError& e, bool refused = true) {
    if (refused) s_.metrics.rejected(e.status());
    log_detail_ = cat(": ", e.message().size() > 200 ? e.message().substr(0, 200) + "..." : e.message());
    reply(e.status(), e.body(), "application/json", e.status() == 503 ? "Retry-After: 1\r\n" : "");
  }

  /// Refuses a request whose body was not read (or not wholly): the answer, then a lingering close
  /// (the client, perhaps still sending, hears the answer instead of a reset).
  void refuse(const ApiError& e) {
    keep_alive_ = false;
    closing_ = true;
    reply_error(e);
  }

  void send(std::string bytes) {
    out_ += bytes;
    flush();
  }

  void flush() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    sending_.swap(out_);
    out_.clear();
    // A client that stops reading its answer holds it in memory: each write has the deadline too.
    stream_.expires_after(seconds(s_.options.request_timeout_s));
    net::async_write(stream_, net::buffer(sending_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->sending_.clear();
      if (ec) return self->hung_up();
      if (!self->out_.empty()) return self->flush();
      if (self->answered_ && !self->job_) {
        self->uncount();
        self->after_answer();
      } else if (self->job_) {
        self->stream_.expires_never();  // the engine's turn again: no deadline while it generates
      }
    });
  }

  /// The answer is written: the next request on this connection, or the end of it.
  void after_answer() {
    if (closed_) return;
    if (closing_ || !keep_alive_) return linger();
    if (reading_) {  // the watch is still reading
      if (buffer_.size() > 0) {  // behind a pipelined request: stop it, and read that request
        resuming_ = true;
        beast::error_code ignored;
        stream_.socket().cancel(ignored);
        return;
      }
      stream_.expires_after(seconds(s_.options.request_timeout_s));  // idle deadline: it brings the next request or the hang-up
      return;
    }
    answered_ = false;
    read_header();  // (a pipelined request may be in the buffer already)
  }

  /// Stops sending, and reads (dropping) what the client still sends for a moment, then closes.
  void linger() {
    closing_ = true;
    if (writing_) return;  // flush() comes back here
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(linger_for_);
    lingered_ += buffer_.size();
    buffer_.consume(buffer_.size());
    if (lingered_ > kMaxLingerBytes) return close();
    watch();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    end_job();
    uncount();
    release_body();  // (the parser itself goes with the connection: a read may still be using it)
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  Server::Impl& s_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> header_;
  std::optional<http::request_parser<http::string_body>> body_;
  std::string path_;
  std::string method_;        ///< the request's method, for the log
  std::string peer_;          ///< the client's address and port, for the log
  Clock::time_point began_;   ///< when the request's headers began to be read, for the log
  std::string log_detail_;    ///< what the log line adds after the status (reply_error's message, a generation's counts)
  bool logged_ = false;       ///< the request's line is written
  bool head_only_ = false, keep_alive_ = true;
  std::shared_ptr<Job> job_;  ///< the request being answered, if it went to the engine
  struct Shown {
    bool head_sent = false;  ///< the stream's headers
    bool role_sent = false;  ///< chat: the assistant's role, in the first event
    size_t bytes = 0;        ///< of the job's text
  } shown_;
  std::string out_, sending_;  ///< bytes to write; bytes being written
  bool reading_ = false, writing_ = false;
  bool answered_ = false;  ///< the answer is complete (in out_ or written)
  bool closing_ = false;   ///< close once the answer is written
  bool closed_ = false;
  bool counted_ = false;   ///< in Server::Impl::answering
  size_t lingered_ = 0;    ///< bytes read and dropped while closing
  size_t reserved_ = 0;    ///< of Server::Impl::body_bytes, for the body being read
  bool resuming_ = false;  ///< the watch was cancelled to read a pipelined request
  net::steady_timer deadline_;  ///< the request's deadline (arm_deadline)
  unsigned armed_ = 0;          ///< arm_deadline() and disarm_deadline() calls: which wait is the current one
  bool timed_out_ = false;      ///< the deadline stopped the read
  std::chrono::steady_clock::duration linger_for_ = kLinger;  ///< how long a refused client is read before closing
};

void Server::Impl::accept() {
  acceptor->async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor->is_open()) return;  // stopping
    if (ec) {  // out of file descriptors, say: try again in a moment, never stop accepting
      if (!accept_failing)  // (said once while it lasts: the loop comes back every 50 ms)
        log.add(cat("serve: cannot accept connections: ", ec.message(), " (with ", connections.load(),
                    " open; `ulimit -n` bounds them): new ones wait in the system's queue until some close"));
      accept_failing = true;
      return accept_later();
    }
    if (accept_failing) log.add("serve: accepting connections again");
    accept_failing = false;
    // One event per token: do not let Nagle hold them back. A send buffer of its own size: the
    // system would let it grow to megabytes for a client that reads nothing, which the write
    // deadline then never sees. (A socket the options cannot be set on is broken already: it is
    // dropped, and the server goes on accepting.)
    socket.set_option(tcp::no_delay(true), ec);
    if (!ec) socket.set_option(net::socket_base::send_buffer_size(kSendBufferBytes), ec);
    if (!ec)
      std::make_shared<Connection>(std::move(socket), *this)->start();
    else
      log.add(cat("serve: dropped a connection that could not be set up: ", ec.message()));
    if (connections.load() >= 2 * options.max_connections) return accept_later();  // a flood: the system's queue holds the next ones
    accept();
  });
}

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
    : Server([&weights](std::span<const int> tokens) -> Matrix { return forward(weights, tokens).bottomRows(1); },
             std::move(model), std::move(options)) {}

Server::Server(NaiveForward forward, ApiModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), std::move(options))) {
  require(forward != nullptr, "Server: no naive forward");
  impl_->naive = std::move(forward);
}

Server::~Server() { stop(); }

int Server::start() {
  Impl& s = *impl_;
  require(!s.started, "Server::start: already started");
  require(s.options.http_threads >= 1, "Server: http_threads must be >= 1, got ", s.options.http_threads);
  require(s.options.request_timeout_s >= kMinRequestTimeout && s.options.request_timeout_s <= kMaxRequestTimeout,
          "Server: request_timeout_s must be in [", kMinRequestTimeout, ", ", kMaxRequestTimeout, "] seconds, got ",
          s.options.request_timeout_s);
  require(s.options.max_connections >= 1, "Server: max_connections must be >= 1, got ", s.options.max_connections);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hung up must not kill the process
  // A connection costs a file descriptor: allow as many as the system lets this process have
  // (a shell's default soft limit, 1,024, is below what a server meets).
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  // The server's own files (its listener, Asio's, the standard streams) are about ten;
  // said at once where the limit leaves max_connections no room.
  constexpr rlim_t kOwnFiles = 16;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
      files.rlim_cur < static_cast<rlim_t>(s.options.max_connections) + kOwnFiles)
    std::fprintf(stderr, "serve: warning: this process may open %llu files (`ulimit -n`), too few for %d connections "
                         "(--max-connections) and the server's own; past about %llu, new connections wait until "
                         "others close: raise the limit, or lower --max-connections\n",
                 static_cast<unsigned long long>(files.rlim_cur), s.options.max_connections,
                 static_cast<unsigned long long>(files.rlim_cur > kOwnFiles ? files.rlim_cur - kOwnFiles : 0));
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(s.options.host, ec);
  require(!ec, "Server::start: '", s.options.host, "' is not an IP address");
  s.acceptor.emplace(s.io);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(s.options.port));
  s.acceptor->open(endpoint.protocol(), ec);
  if (!ec) s.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor->bind(endpoint, ec);
  if (!ec) s.acceptor->listen(net::socket_base::max_listen_connections, ec);
  require(!ec, "Server::start: cannot listen on ", s.options.host, ":", s.options.port,
          " (in use, or not an address of this machine?): ", ec.message());
  s.bound_port = s.acceptor->local_endpoint().port();
  s.started = true;
  // The engine computes with the OpenMP threads of the thread that starts the server (a program's
  // --threads): a new thread would start from OpenMP's default, every core.
  const int compute_threads = omp_get_max_threads();
  s.worker = std::thread([&s, compute_threads] {
    omp_set_num_threads(compute_threads);
    if (s.engine) server::run_engine(*s.engine, s.mailbox, s.metrics);
    else server::run_naive(s.naive, s.model.config.eos_token_id, s.mailbox, s.metrics);
  });
  s.accept();
  for (int i = 0; i < s.options.http_threads; ++i)
    s.http_threads.emplace_back([&s] {
      // A handler that throws costs its connection, never the server: log it and serve on.
      for (;;) {
        try {
          s.io.run();
          return;
        } catch (const std::exception& e) {
          s.log.add(cat("serve: a connection's handler failed: ", e.what()));
        }
      }
    });
  return s.bound_port;
}

void Server::drain() {
  Impl& s = *impl_;
  if (!s.started || s.stopped || s.mailbox.closing()) return;
  s.mailbox.close();
  net::post(s.io, [&s] {
    beast::error_code ignored;
    s.acceptor->close(ignored);
  });
}

void Server::stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  net::post(s.io, [&s] {
    beast::error_code ignored;
    s.acceptor->close(ignored);
  });
  s.mailbox.stop();
  if (s.worker.joinable()) s.worker.join();                   // fails what is open, which wakes the connections
  s.mailbox.fail_queued(503, "the server is shutting down");  // what came in since
  // Every open request has ended: give the connections a moment to write those answers.
  for (int i = 0; i < 2000 && s.answering.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.io.stop();
  for (std::thread& t : s.http_threads) t.join();
}

int Server::port() const { return impl_->bound_port; }

std::string Server::metrics() const { return impl_->metrics.text(); }

bool Server::wait_idle(double seconds) const { return impl_->mailbox.wait_idle(seconds); }

bool Server::wait_answered(double seconds) const {
  // (The answers are written by the HTTP threads, with no signal to wait on: looked at every 5 ms.)
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(seconds, 0.0));
  for (;;) {
    const double left = std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
    if (impl_->mailbox.wait_idle(std::max(left, 0.0)) && impl_->answering.load() == 0) return true;
    if (left <= 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace infer
