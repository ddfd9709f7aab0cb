// The server against clients that do not play along (lesson 10's given HTTP front): framings that
// would make it read or inflate without a limit, bodies that are not JSON, wrong methods, missing
// keys, a full queue, and a fuzz of request bodies where no answer may be a 500. Loopback only,
// bounded in count and time. Not graded: this is the given server, run over the reference lesson 10.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <omp.h>

#include "common/testing/models.hpp"
#include "common/testing/runners.hpp"
#include "common/tokenizer.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/10_serving/server.hpp"

namespace infer {
namespace {

using nlohmann::json;

/// A server over the bundled model on a small paged pool.
std::unique_ptr<Server> small_server(ServerOptions o = {}) {
  const ModelWeights& m = testing::bundled_model();
  auto engine = serving_engine(std::make_unique<CpuRunner>(m), std::make_unique<PagedKVManager>(m.config, 64, 16),
                               {.max_running = 4, .token_budget = 32});
  auto s = std::make_unique<Server>(std::move(engine), ApiModel{"tiny-fortunes", m.config}, o);
  s->start();
  return s;
}

/// What came back on a raw connection: the status line's code (0: none) and everything read.
struct Raw {
  int status = 0;
  std::string text;
};

/// Whether `text` holds a whole final answer: its headers, and as many body bytes as its
/// Content-Length says (an interim 100 Continue before it is skipped).
bool complete(const std::string& text) {
  size_t start = text.rfind("HTTP/1.1 100", 0) == 0 ? text.find("\r\n\r\n") : std::string::npos;
  start = start == std::string::npos ? 0 : start + 4;
  const size_t end = text.find("\r\n\r\n", start);
  if (end == std::string::npos) return false;
  std::string head = text.substr(start, end - start);
  std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return std::tolower(c); });
  const size_t at = head.find("\r\ncontent-length:");
  if (at == std::string::npos) return false;  // read until the server closes
  return text.size() - (end + 4) >= std::stoul(head.substr(at + 17));
}

/// A connection to the server on loopback: its socket, or -1. `receive_buffer`: the socket's
/// receive buffer in bytes, set before it connects (0: the system's).
int connect_loopback(int port, int receive_buffer = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && receive_buffer > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

/// Sends all of `bytes` on `fd`; false if the connection broke.
bool send_all(int fd, const std::string& bytes) {
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

/// What arrives on `fd` until the server closes it or `seconds` pass without a byte.
std::string read_until_quiet(int fd, double seconds) {
  std::string text;
  char buf[65536];
  for (pollfd p{fd, POLLIN, 0}; ::poll(&p, 1, static_cast<int>(seconds * 1000)) > 0;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

/// What arrives on `fd` until the server closes it; nothing if it has not closed it within `seconds`.
std::optional<std::string> read_to_end(int fd, double seconds) {
  std::string text;
  char buf[65536];
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return text;
    text.append(buf, static_cast<size_t>(n));
  }
}

/// The bodies of the whole answers at the start of `text`, one after another (up to the first
/// that is not whole).
std::vector<std::string> whole_answers(const std::string& text) {
  std::vector<std::string> bodies;
  for (size_t at = 0; at < text.size() && complete(text.substr(at));) {
    const std::string rest = text.substr(at);
    const size_t body_at = rest.find("\r\n\r\n") + 4;
    std::string head = rest.substr(0, body_at);
    std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return std::tolower(c); });
    const size_t length = std::stoul(head.substr(head.find("content-length:") + 15));
    bodies.push_back(rest.substr(body_at, length));
    at += body_at + length;
  }
  return bodies;
}

/// Sends `head` (the request line and headers, ending with an empty line) and then `body`, on a
/// fresh connection, and reads until the server closes or `seconds` pass without a byte. With
/// `wait_before_body`, waits for the server's first answer (an interim 100, or a refusal) before
/// sending the body, as a client that sent `Expect: 100-continue` does.
Raw exchange(int port, const std::string& head, const std::string& body = "", double seconds = 5,
             bool wait_before_body = false) {
  Raw r;
  const int fd = connect_loopback(port);
  if (fd < 0) return r;
  const auto send = [&](const std::string& bytes) { return send_all(fd, bytes); };
  const auto read_some = [&](double wait) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait * 1000)) <= 0) return false;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    r.text.append(buf, static_cast<size_t>(n));
    return true;
  };
  if (send(head)) {
    if (wait_before_body) read_some(seconds);
    if (!wait_before_body || r.text.rfind("HTTP/1.1 100", 0) == 0) send(body);
    while (!complete(r.text) && read_some(seconds)) {
    }
  }
  ::close(fd);
  // The final status: after an interim 100 Continue, the one that follows it.
  size_t at = r.text.rfind("HTTP/1.1 100", 0) == 0 ? r.text.find("HTTP/1.", 5) : 0;
  if (at != std::string::npos && r.text.compare(at, 7, "HTTP/1.") == 0 && r.text.size() >= at + 12)
    r.status = std::atoi(r.text.c_str() + at + 9);
  return r;
}

/// Whether the body after the headers is OpenAI's error body.
bool is_error_body(const Raw& r) {
  const size_t at = r.text.find("\r\n\r\n");
  const json j = json::parse(at == std::string::npos ? "" : r.text.substr(at + 4), nullptr, false);
  return !j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
         j["error"].contains("message");
}

/// `n` headers of about 10 bytes each.
std::string many_headers(int n) {
  std::string h;
  for (int i = 0; i < n; ++i) h += "X-" + std::to_string(i) + ": v\r\n";
  return h;
}

std::string post_head(const std::string& path, const std::string& headers) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + "\r\n";
}

const std::string kGood = R"({"model": "tiny-fortunes", "prompt": "The ", "max_tokens": 2})";

TEST(ServerHostile, FramingsAndTypesAreRefusedBeforeTheBodyIsRead) {
  // Each request is refused on its headers: only they are sent (the server must answer without
  // waiting for a body; a client that sends the body anyway may find the connection closed).
  auto server = small_server();
  const int port = server->port();
  struct Case {
    std::string why, head;
    int status;
  };
  const std::vector<Case> cases = {
      {"a gzip body (inflated without a limit, if read)",
       post_head("/v1/completions", "Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: 409600\r\n"),
       415},
      {"chunked with a Content-Length",
       post_head("/v1/completions", "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 10\r\n"),
       400},
      {"chunked", post_head("/v1/completions", "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"), 411},
      {"no Content-Length", post_head("/v1/completions", "Content-Type: application/json\r\n"), 411},
      {"JSON as text/plain (what a web page may send without asking)",
       post_head("/v1/completions", "Content-Type: text/plain\r\nContent-Length: 60\r\n"), 415},
      {"a 9 KB form (httplib's own limit for forms is 8 KB)",
       post_head("/v1/completions", "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 9216\r\n"), 415},

      {"a Content-Length that is not a number",
       post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: 12abc\r\n"), 400},
      {"GET on a POST route", "GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405},
      {"POST on a GET route", post_head("/v1/models", "Content-Type: application/json\r\nContent-Length: 2\r\n"), 405},
      {"an unknown model by id", "GET /v1/models/gpt-4 HTTP/1.1\r\nHost: x\r\n\r\n", 404},
      {"no Host (RFC 9112: 400)", "GET /health HTTP/1.1\r\n\r\n", 400},
      {"two Hosts", "GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400},
      {"70 KB of headers", "GET /health HTTP/1.1\r\nHost: x\r\n" + many_headers(7000) + "\r\n", 431},
  };
  for (const Case& c : cases) {
    const Raw r = exchange(port, c.head, "", 5);
    EXPECT_EQ(r.status, c.status) << c.why << ": " << r.text.substr(0, 300);
    EXPECT_TRUE(is_error_body(r)) << c.why << ": expected OpenAI's error body, got " << r.text.substr(0, 300);
  }
  // An oversized body is refused on its Content-Length, and the client, still sending, hears it
  // (the server reads and drops what comes before it closes); announced with Expect:
  // 100-continue, it is refused before it is sent.
  const Raw big = exchange(port, post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: 3000000\r\n"),
                           std::string(3000000, 'x'), 5);
  EXPECT_EQ(big.status, 413) << big.text.substr(0, 300);
  EXPECT_TRUE(is_error_body(big)) << big.text.substr(0, 300);
  const Raw expect = exchange(port,
                              post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: 3000000\r\n"
                                                           "Expect: 100-continue\r\n"),
                              std::string(3000000, 'x'), 2, /*wait_before_body=*/true);
  EXPECT_EQ(expect.status, 413) << expect.text.substr(0, 300);
  EXPECT_NE(expect.text.rfind("HTTP/1.1 100", 0), 0u) << "no 100 Continue for a body the server will refuse";
  // The model by its id, and a good request after all of the above.
  const Raw model = exchange(port, "GET /v1/models/tiny-fortunes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(model.status, 200) << model.text.substr(0, 300);
  EXPECT_NE(model.text.find(R"("id":"tiny-fortunes")"), std::string::npos) << model.text;
  // A target in absolute form (what a client sends through a proxy) names the same route.
  const Raw absolute = exchange(port, "GET http://x:8000/v1/models/tiny-fortunes?q=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(absolute.status, 200) << absolute.text.substr(0, 300);
  EXPECT_EQ(exchange(port, "GET http://x:8000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").status, 404);
  EXPECT_EQ(http_post("127.0.0.1", port, "/v1/completions", kGood).status, 200);
  EXPECT_EQ(metric_value(server->metrics(), R"(course_requests_rejected_total{status="415"})"), 3.0);
  // A field of the wrong type deep in the body: 400 naming it, never a 500.
  const HttpReply format = http_post("127.0.0.1", port, "/v1/chat/completions",
                                     R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}],
                                         "response_format": {"type": 5}})");
  EXPECT_EQ(format.status, 400) << format.body;
  EXPECT_NE(format.body.find(R"("param":"response_format")"), std::string::npos) << format.body;
}

TEST(ServerHostile, ARefusedClientStillSendingItsBodyHearsTheRefusal) {
  // Row 11 of the review: a refusal must reach a client that sends its body without waiting (a
  // server that closes with unread bytes resets the connection, and the answer is lost with it).
  auto server = small_server();
  const int port = server->port();
  const std::string body(400 << 10, 'x');
  const std::vector<std::pair<std::string, int>> cases = {
      {"Content-Type: application/json\r\n", 411},
      {"Content-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) + "\r\n", 415},
      {"Content-Type: application/json\r\nContent-Length: 3000000\r\n", 413},
      {"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n", 400},
  };
  for (int round = 0; round < 3; ++round)
    for (const auto& [headers, status] : cases) {
      const Raw r = exchange(port, post_head("/v1/completions", headers), body, 5);
      EXPECT_EQ(r.status, status) << headers << ": " << r.text.substr(0, 300);
    }
}

TEST(ServerHostile, PipelinedRequestsAreAllAnsweredInOrder) {
  // Row 8: three requests written at once on one connection get three answers, in their order.
  auto server = small_server();
  const int fd = connect_loopback(server->port());
  ASSERT_GE(fd, 0);
  const std::string head = post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: " +
                                                            std::to_string(kGood.size()) + "\r\n");
  ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + head + kGood +
                               "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string text = read_until_quiet(fd, 10);
  ::close(fd);
  const std::vector<std::string> bodies = whole_answers(text);
  ASSERT_EQ(bodies.size(), 3u) << text;
  for (size_t at = 0; (at = text.find("HTTP/1.1 ", at)) != std::string::npos; at += 9)
    EXPECT_EQ(text.substr(at + 9, 3), "200") << text.substr(at, 200);
  EXPECT_NE(bodies[0].find(R"("status":"ok")"), std::string::npos) << bodies[0];
  EXPECT_NE(bodies[1].find(R"("object":"text_completion")"), std::string::npos) << bodies[1];
  EXPECT_NE(bodies[2].find(R"("object":"list")"), std::string::npos) << bodies[2];
}

TEST(ServerHostile, AThousandSlowClientsCostSocketsNotService) {
  // Rows 3 and 2 of "what to build": 1,000 connections that send half a request and then nothing
  // hold no thread (the server has two), so /health and a completion are answered at once; the
  // header deadline closes them all.
  ServerOptions o;
  o.request_timeout_s = 2;
  auto server = small_server(o);
  const int port = server->port();
  std::vector<int> slow;
  for (int i = 0; i < 1000; ++i) {
    const int fd = connect_loopback(port);
    ASSERT_GE(fd, 0) << "connection " << i;
    ASSERT_TRUE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "));
    slow.push_back(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(http_get("127.0.0.1", port, "/health", 5).first, 200);
  const double health_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const HttpReply done = http_post("127.0.0.1", port, "/v1/completions", kGood, nullptr, 5);
  EXPECT_EQ(done.status, 200) << done.body;
  std::printf("with 1,000 slow sockets open: /health in %.1f ms, a 2-token completion in %.1f ms\n", health_ms,
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() - health_ms);
  EXPECT_LT(health_ms, 1000.0);
  // Past the deadline, the server has answered every one of them 408 (each sent part of a
  // request) and closed it (a read sees the answer, then the end).
  int answered = 0;
  std::string other;
  for (const int fd : slow) {
    const std::string text = read_to_end(fd, 5).value_or("(no end within 5 s)");
    if (text.rfind("HTTP/1.1 408 ", 0) == 0 && is_error_body(Raw{408, text}))
      ++answered;
    else if (other.empty())
      other = text.substr(0, 300);
    ::close(fd);
  }
  EXPECT_EQ(answered, 1000) << "connections not answered 408 and closed after the header deadline, for example: " << other;
}

TEST(ServerHostile, ARequestCutShortHears408AndAnIdleConnectionIsClosedWithoutAWord) {
  // Past request_timeout_s: headers cut short, or a body cut short, get 408 and OpenAI's error
  // body (RFC 9110, 15.5.9); a connection that sent nothing, or nothing more after its answer, is
  // closed without one (nobody is waiting for an answer).
  ServerOptions o;
  o.request_timeout_s = 0.5;
  auto server = small_server(o);
  const int port = server->port();
  const int idle = connect_loopback(port), headers = connect_loopback(port), body = connect_loopback(port),
            kept = connect_loopback(port);
  ASSERT_TRUE(idle >= 0 && headers >= 0 && body >= 0 && kept >= 0);
  ASSERT_TRUE(send_all(headers, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty"));
  ASSERT_TRUE(send_all(body, post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: 100\r\n") +
                                 R"({"model": )"));
  ASSERT_TRUE(send_all(kept, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  const auto end = [](int fd) { return read_to_end(fd, 5).value_or("(no end within 5 s)"); };
  const std::string idle_text = end(idle), headers_text = end(headers), body_text = end(body), kept_text = end(kept);
  for (const int fd : {idle, headers, body, kept}) ::close(fd);
  EXPECT_EQ(idle_text, "") << "a connection that sent nothing is closed without a word";
  for (const auto& [text, what] : {std::pair{headers_text, "headers"}, std::pair{body_text, "body"}}) {
    EXPECT_EQ(text.rfind("HTTP/1.1 408 ", 0), 0u) << what << ": " << text.substr(0, 300);
    EXPECT_TRUE(is_error_body(Raw{408, text})) << what << ": " << text.substr(0, 300);
    EXPECT_NE(text.find(cat("request's ", what, " did not arrive")), std::string::npos) << text.substr(0, 300);
    EXPECT_NE(text.find("Connection: close"), std::string::npos) << text.substr(0, 300);
  }
  // The answered request's connection: its answer, then the end, with no 408 after it.
  EXPECT_EQ(kept_text.rfind("HTTP/1.1 200 ", 0), 0u) << kept_text.substr(0, 300);
  EXPECT_EQ(kept_text.find("408"), std::string::npos) << kept_text.substr(0, 600);
  EXPECT_EQ(http_post("127.0.0.1", port, "/v1/completions", kGood).status, 200);
}

TEST(ServerHostile, AClientThatHangsUpBeforeAWholeAnswerCancelsIt) {
  // Row 4: a client that asked for a whole (not streamed) answer and hung up before it came frees
  // its sequence within a few steps, as a streaming one does; also when it sent a byte or two
  // after its body (read as the start of a next request, which must not blind the server).
  const ModelWeights& m = testing::bundled_model();
  auto engine = serving_engine(std::make_unique<testing::SlowForward>(m), std::make_unique<PagedKVManager>(m.config, 64, 16),
                               {.max_running = 4, .token_budget = 32});
  Server server(std::move(engine), ApiModel{"tiny-fortunes", m.config}, {.http_threads = 2});
  const int port = server.start();
  const std::string body = R"({"model": "tiny-fortunes", "prompt": "The", "max_tokens": 240})";
  double tokens = 0;
  for (const std::string after : {"", "\r\n"}) {
    const int fd = connect_loopback(port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: " +
                                                                std::to_string(body.size()) + "\r\n") + body + after));
    for (int i = 0; i < 2000 && metric_value(server.metrics(), "course_generation_tokens_total") < tokens + 5; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ::close(fd);
    ASSERT_TRUE(server.wait_idle(20)) << "the server still holds the request of a client that hung up";
    EXPECT_LT(metric_value(server.metrics(), "course_generation_tokens_total"), tokens + 120.0)
        << "it ran on long after its client left (" << after.size() << " bytes after the body)";
    tokens = metric_value(server.metrics(), "course_generation_tokens_total");
  }
  EXPECT_EQ(metric_value(server.metrics(), R"(course_requests_total{finish_reason="cancelled"})"), 2.0);
  EXPECT_EQ(metric_value(server.metrics(), "course_kv_reserved_tokens"), 0.0);
}

TEST(ServerHostile, ClientsThatLeaveRightAfterTheirAnswerAreNotCountedAsRefused) {
  // A client that reads its whole answer and closes at once: the server sees the close while it
  // ends the answer, and must not then read (and refuse) a request on the closed connection.
  auto server = small_server();
  const std::string head = post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: " +
                                                            std::to_string(kGood.size()) + "\r\n");
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t)  // at once, so that the server's handlers run late
    clients.emplace_back([&] {
      for (int i = 0; i < 30; ++i) answered += exchange(server->port(), head, kGood).status == 200;
    });
  for (std::thread& c : clients) c.join();
  EXPECT_EQ(answered.load(), 240);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string metrics = server->metrics();
  EXPECT_EQ(metrics.find("course_requests_rejected_total{status="), std::string::npos) << metrics;
}

TEST(ServerHostile, AnApiKeyGuardsTheApiButNotHealth) {
  auto server = small_server({.api_key = "s3cret"});
  const int port = server->port();
  EXPECT_EQ(http_post("127.0.0.1", port, "/v1/completions", kGood).status, 401);
  EXPECT_EQ(http_post("127.0.0.1", port, "/v1/completions", kGood, nullptr, 60, "wrong").status, 401);
  const HttpReply ok = http_post("127.0.0.1", port, "/v1/completions", kGood, nullptr, 60, "s3cret");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(http_get("127.0.0.1", port, "/v1/models").first, 401);
  EXPECT_EQ(http_get("127.0.0.1", port, "/health").first, 200);
  const HttpReply no_key = http_post("127.0.0.1", port, "/v1/completions", kGood);
  EXPECT_NE(no_key.body.find("invalid_api_key"), std::string::npos) << no_key.body;
}

TEST(ServerThreads, TheEngineComputesWithTheThreadsOfTheThreadThatStartedIt) {
  // A program's --threads is omp_set_num_threads() on its main thread; the engine runs on a
  // thread of the server's, which would otherwise compute with OpenMP's default (every core),
  // and a busy machine then slows every step by the threads waiting for each other.
  const ModelWeights& m = testing::bundled_model();
  const int before = omp_get_max_threads();
  for (const int threads : {1, 3}) {
    omp_set_num_threads(threads);
    std::atomic<int> seen{0};
    auto engine = serving_engine(std::make_unique<testing::WatchedForward>(m, [&](const StepInput&) { seen = omp_get_max_threads(); }),
                                 std::make_unique<PagedKVManager>(m.config, 64, 16), {.max_running = 4, .token_budget = 32});
    Server server(std::move(engine), ApiModel{"tiny-fortunes", m.config}, {.http_threads = 1});
    const int port = server.start();
    omp_set_num_threads(before);  // (what the engine uses was fixed at start())
    const HttpReply r = http_post("127.0.0.1", port, "/v1/completions", kGood);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(seen.load(), threads) << "the engine's forward ran with another number of OpenMP threads";
  }
}

TEST(ServerSeeds, ARequestWithoutASeedSamplesAfreshAndOneWithASeedRepeats) {
  // OpenAI's API samples anew for each request that sends no seed. The parse's default, 0, would
  // give every such request the same text; the server gives each its own seed instead.
  auto server = small_server();
  const int port = server->port();
  const auto text = [&](const std::string& body) {
    const HttpReply r = http_post("127.0.0.1", port, "/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    return j.is_discarded() ? std::string() : j["choices"][0]["text"].get<std::string>();
  };
  const std::string unseeded = R"({"model": "tiny-fortunes", "prompt": "The", "max_tokens": 40, "temperature": 1})";
  std::set<std::string> texts;
  for (int i = 0; i < 4; ++i) texts.insert(text(unseeded));
  EXPECT_GT(texts.size(), 1u) << "four requests without a seed all got the same text";
  const std::string seeded = R"({"model": "tiny-fortunes", "prompt": "The", "max_tokens": 40, "temperature": 1, "seed": 7})";
  EXPECT_EQ(text(seeded), text(seeded)) << "the same seed gives the same text";
  const std::string null_seed = R"({"model": "tiny-fortunes", "prompt": "The", "max_tokens": 40, "seed": null})";
  texts.clear();
  for (int i = 0; i < 4; ++i) texts.insert(text(null_seed));
  EXPECT_GT(texts.size(), 1u) << "a null seed is no seed";
}

/// `line` with each run of digits written as N (but those of the address 127.0.0.1): a log line's
/// shape, whatever its port and seconds.
std::string with_numbers_as_n(const std::string& line) {
  std::string out;
  for (size_t i = 0; i < line.size();) {
    if (line.compare(i, 9, "127.0.0.1") == 0) {
      out += "127.0.0.1";
      i += 9;
    } else if (std::isdigit(static_cast<unsigned char>(line[i]))) {
      out += 'N';
      while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
    } else {
      out += line[i++];
    }
  }
  return out;
}

TEST(ServerLog, EachRequestIsOneLineSayingWhoWhatAndHowItEnded) {
  // ServerOptions::log_requests: one line on stderr per request answered, or left by its client
  // (a stream's status is the 200 its head said); none for a successful /health; nothing at all
  // without the option. A client's bytes outside printable ASCII are written as \xNN: UTF-8's
  // NEL (C2 85) would start a line on a terminal that honours it, its CSI (C2 9B) move the cursor.
  const ModelWeights& m = testing::bundled_model();
  const auto lines_of = [](const std::string& text) {
    std::vector<std::string> lines;
    for (size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1)
      if (text.compare(at, 7, "serve: ") == 0) lines.push_back(text.substr(at, end - at));
    return lines;
  };
  for (const bool log : {true, false}) {
    auto engine = serving_engine(std::make_unique<testing::SlowForward>(m), std::make_unique<PagedKVManager>(m.config, 64, 16),
                                 {.max_running = 4, .token_budget = 32});
    auto server = std::make_unique<Server>(std::move(engine), ApiModel{"tiny-fortunes", m.config},
                                           ServerOptions{.http_threads = 2, .log_requests = log});
    const int port = server->start();
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(http_post("127.0.0.1", port, "/v1/completions", kGood).status, 200);
    EXPECT_EQ(http_post("127.0.0.1", port, "/v1/completions", R"({"model": "tiny-fortunes", "prompt": "The", "max_tokens": 0})").status, 400);
    EXPECT_EQ(http_get("127.0.0.1", port, "/health").first, 200);
    EXPECT_EQ(exchange(port, "GET /x\xc2\x85serve:FAKE\xc2\x9b" "2J HTTP/1.1\r\nHost: a\r\n\r\n").status, 404);
    const int fd = connect_loopback(port);  // a client that leaves before its answer
    const std::string body = R"({"model": "tiny-fortunes", "prompt": "The", "max_tokens": 200, "stream": true})";
    ASSERT_TRUE(send_all(fd, post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: " +
                                                                std::to_string(body.size()) + "\r\n") + body));
    for (int i = 0; i < 2000 && metric_value(server->metrics(), "course_generation_tokens_total") < 10; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ::close(fd);
    EXPECT_TRUE(server->wait_idle(20));
    server.reset();  // (its log's thread has written every line)
    const std::string text = ::testing::internal::GetCapturedStderr();
    const std::vector<std::string> lines = lines_of(text);
    if (!log) {
      EXPECT_TRUE(lines.empty()) << lines.front();
      continue;
    }
    ASSERT_EQ(lines.size(), 4u) << "a line each for the completion, the two refusals and the client that left; none for "
                                   "/health:\n" << text;
    EXPECT_TRUE(std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x7f; }))
        << "a byte outside ASCII in the log: " << lines[2];
    EXPECT_NE(lines[2].find("GET /x\\xc2\\x85serve:FAKE\\xc2\\x9b2J 404 "), std::string::npos) << lines[2];
    std::vector<std::string> rest = lines;
    rest.erase(rest.begin() + 2);
    EXPECT_EQ(with_numbers_as_n(rest[0]), "serve: 127.0.0.1:N POST /vN/completions N N.N s, prompt N tokens, N generated (length)");
    EXPECT_NE(rest[0].find(" 200 "), std::string::npos) << rest[0];
    EXPECT_NE(rest[0].find(", prompt 5 tokens, 2 generated"), std::string::npos) << rest[0];
    EXPECT_EQ(with_numbers_as_n(rest[1]), "serve: 127.0.0.1:N POST /vN/completions N N.N s: 'max_tokens' must be >= N, got N");
    EXPECT_NE(rest[1].find(" 400 "), std::string::npos) << rest[1];
    EXPECT_EQ(with_numbers_as_n(rest[2]),
              "serve: 127.0.0.1:N POST /vN/completions N N.N s: the client hung up after N bytes of its answer's text; cancelled");
    EXPECT_NE(rest[2].find(" 200 "), std::string::npos) << rest[2];
  }
}

TEST(ServerHostile, AFullQueueAnswers503WithRetryAfter) {
  // Room for 4 running and 2 waiting: of 12 long requests sent at once, some get 503 with a
  // Retry-After header, the others their text; none is lost.
  auto server = small_server({.max_waiting = 2});
  const int port = server->port();
  const std::string body = R"({"model": "tiny-fortunes", "prompt": "The ", "max_tokens": 120, "temperature": 0})";
  const std::string head = post_head("/v1/completions", "Content-Type: application/json\r\nConnection: close\r\n"
                                                        "Content-Length: " + std::to_string(body.size()) + "\r\n");
  std::vector<Raw> replies(12);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < replies.size(); ++i)
    clients.emplace_back([&, i] { replies[i] = exchange(port, head, body, 30); });
  for (auto& t : clients) t.join();
  int ok = 0, full = 0;
  for (const Raw& r : replies) {
    if (r.status == 200) ++ok;
    if (r.status == 503) {
      ++full;
      EXPECT_NE(r.text.find("Retry-After: "), std::string::npos) << r.text.substr(0, 300);
      EXPECT_TRUE(is_error_body(r)) << r.text.substr(0, 300);
    }
  }
  EXPECT_EQ(ok + full, 12) << "every request is answered 200 or 503";
  EXPECT_GE(ok, 6) << "4 running and 2 waiting are always served";
  EXPECT_GT(full, 0) << "12 at once cannot all fit in 4 running and 2 waiting";
  EXPECT_EQ(http_get("127.0.0.1", port, "/health").first, 200);
}

TEST(ServerHostile, DeepOrBrokenJsonIsRefusedSayingWhereAndTheServerStaysUp) {
  // Printing or copying a value recurses once per level: 100,000 levels in a typed field would
  // take the process down. They are refused before they are parsed; so is a NUL byte, at which
  // the parser would stop reading (taking what follows for the end).
  auto server = small_server();
  const int port = server->port();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const char* field : {"stop", "max_tokens", "model"}) {
    const HttpReply r = http_post("127.0.0.1", port, "/v1/completions",
                                  R"({"model": "tiny-fortunes", "prompt": "hi", ")" + std::string(field) + "\": " + deep + "}");
    EXPECT_EQ(r.status, 400) << field << ": " << r.body.substr(0, 300);
    EXPECT_NE(r.body.find("more than 64 levels deep"), std::string::npos) << r.body.substr(0, 300);
  }
  const HttpReply nul = http_post("127.0.0.1", port, "/v1/completions", kGood + std::string(1, '\0') + "not JSON {{{");
  EXPECT_EQ(nul.status, 400) << nul.body;
  EXPECT_NE(nul.body.find("NUL byte at byte"), std::string::npos) << nul.body;
  const HttpReply broken = http_post("127.0.0.1", port, "/v1/completions", R"({"model": "tiny-fortunes",})");
  EXPECT_EQ(broken.status, 400) << broken.body;
  EXPECT_NE(broken.body.find("line 1, column 27"), std::string::npos) << "where the JSON broke: " << broken.body;
  // A NUL inside a string value (written \u0000) is the client's text: quoted whole in the error.
  const HttpReply model = http_post("127.0.0.1", port, "/v1/completions", R"({"model": "tiny\u0000x", "prompt": "hi"})");
  EXPECT_EQ(model.status, 404) << model.body;
  EXPECT_NE(model.body.find(R"(The model \"tiny\\u0000x\" does not exist)"), std::string::npos) << model.body;
  EXPECT_EQ(http_post("127.0.0.1", port, "/v1/completions", kGood).status, 200);
}

TEST(ServerHostile, WhatClientsMakeTheServerHoldIsBounded) {
  ServerOptions o;
  o.request_timeout_s = 1;
  o.max_connections = 6;
  o.max_body_bytes_in_flight = 100000;
  auto server = small_server(o);
  const int port = server->port();
  const std::string json_head = "Content-Type: application/json\r\n";
  // HTTP/1.0 has no chunked streams and other keep-alive rules: refused, not half served.
  for (const char* version : {"HTTP/1.0", "HTTP/2.0"}) {
    const std::string request = cat("GET /health ", version, "\r\n\r\n");  // (an lvalue: std::exchange is no candidate)
    const Raw old = exchange(port, request);
    EXPECT_EQ(old.status, 505) << version << ": " << old.text.substr(0, 300);
    EXPECT_TRUE(is_error_body(old)) << old.text.substr(0, 300);
    EXPECT_NE(old.text.find("invalid_request_error"), std::string::npos) << "the client's mistake: " << old.text;
  }
  // A body's framing is checked whatever the method: a GET announcing 2 MB is refused at once.
  const Raw get_body = exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", "", 0.9);
  EXPECT_EQ(get_body.status, 413) << get_body.text.substr(0, 300);
  const Raw get_chunked = exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "", 0.9);
  EXPECT_EQ(get_chunked.status, 411) << get_chunked.text.substr(0, 300);

  // Bodies being read share 100,000 bytes, counted as they arrive: a Content-Length only
  // announced holds nothing (64 sockets announcing a megabyte each would otherwise block every
  // POST). While one client holds 79,999 bytes of a body, another 80,000-byte body is refused with
  // 503 once its bytes pass the bound; a small request still fits; once the holder leaves, its
  // bytes are given back.
  const std::string long_prompt = R"({"model": "tiny-fortunes", "prompt": ")" + std::string(80000 - 40, 'a') + "\"}";
  ASSERT_EQ(long_prompt.size(), 80000u);  // (a prompt too long for the model: 400 where it is read)
  const std::string big_head = post_head("/v1/completions", json_head + "Content-Length: 80000\r\n");
  const Raw announced = exchange(port, big_head, "", 0.5);  // announced, never sent: holds nothing
  EXPECT_EQ(announced.status, 0) << announced.text.substr(0, 300);
  const int holder = connect_loopback(port);
  ASSERT_GE(holder, 0);
  ASSERT_TRUE(send_all(holder, big_head + long_prompt.substr(0, 79999)));
  for (int i = 0; i < 400 && metric_value(server->metrics(), "course_http_body_bytes") < 79999; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  ASSERT_EQ(metric_value(server->metrics(), "course_http_body_bytes"), 79999.0);
  const Raw refused = exchange(port, big_head, long_prompt, 5);
  EXPECT_EQ(refused.status, 503) << refused.text.substr(0, 300);
  EXPECT_NE(refused.text.find("Retry-After: "), std::string::npos) << refused.text.substr(0, 300);
  EXPECT_EQ(http_post("127.0.0.1", port, "/v1/completions", kGood).status, 200);
  ::close(holder);
  for (int i = 0; i < 400 && metric_value(server->metrics(), "course_http_body_bytes") > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  EXPECT_EQ(metric_value(server->metrics(), "course_http_body_bytes"), 0.0) << "the body's bytes were not given back";
  int status = 0;
  for (int i = 0; i < 100 && status != 400; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(50)))
    status = http_post("127.0.0.1", port, "/v1/completions", long_prompt).status;
  EXPECT_EQ(status, 400) << "the body's bytes were not given back when its client left";

  // A client that asks for long answers and never reads them: its connection is closed once a
  // write waits past the deadline, rather than holding its answers for as long as it likes. (20
  // pipelined answers of tens of KB each: more than the sockets' buffers hold, about 10 of them.)
  const std::string chat = R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "The"}],
                               "max_tokens": 200, "logprobs": true, "top_logprobs": 20})";
  const int reader = connect_loopback(port, /*receive_buffer=*/1024);
  ASSERT_GE(reader, 0);
  std::string requests;
  for (int i = 0; i < 20; ++i)
    requests += post_head("/v1/chat/completions", json_head + "Content-Length: " + std::to_string(chat.size()) + "\r\n") + chat;
  ASSERT_TRUE(send_all(reader, requests));
  const auto ended = [&] {  // requests that ended with their text (a counter not shown yet is 0)
    const std::string m = server->metrics();
    double n = 0;
    for (const char* reason : {"stop", "length"})
      if (const double v = metric_value(m, cat("course_requests_total{finish_reason=\"", reason, "\"}")); !std::isnan(v)) n += v;
    return n;
  };
  // Until no answer has ended for 2.5 s: the buffers are full, and the 1 s deadline has passed.
  auto last_change = std::chrono::steady_clock::now();
  for (double seen = ended(); std::chrono::steady_clock::now() - last_change < std::chrono::milliseconds(2500);) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (const double now = ended(); now != seen) seen = now, last_change = std::chrono::steady_clock::now();
  }
  const std::string got = read_until_quiet(reader, 2);
  ::close(reader);
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got.substr(0, 300);
  EXPECT_LT(whole_answers(got).size(), 20u) << "all 20 answers (" << got.size()
                                            << " bytes) waited for a client that read nothing for 3 s";

  // Connections beyond max_connections (6) are answered 503 and closed; once they go, a new one is served.
  std::vector<int> idle;
  for (int i = 0; i < 6; ++i) idle.push_back(connect_loopback(port));
  const Raw crowded = exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", "", 0.9);
  EXPECT_EQ(crowded.status, 503) << crowded.text.substr(0, 300);
  EXPECT_NE(crowded.text.find("connections open, its limit"), std::string::npos) << crowded.text.substr(0, 300);
  for (const int fd : idle) ::close(fd);
  status = 0;
  for (int i = 0; i < 100 && status != 200; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(50)))
    status = http_get("127.0.0.1", port, "/health", 2).first;
  EXPECT_EQ(status, 200);
}

/// Greedy text of `server` for "The ", cut by stop sequences, as a client reads it.
void expect_stops_cut_the_text(Server& server, const std::string& who_serves) {
  const int port = server.port();
  const ModelWeights& m = testing::bundled_model();
  KVCache cache(m.config, m.config.max_position_embeddings);
  Sampler greedy({.temperature = 0.0f});
  const std::string full = ByteTokenizer::decode(generate_cached(m, ByteTokenizer::encode("The "), 60, greedy, cache));
  for (const std::string stop : {" street", "of the", "e"}) {
    const size_t at = full.find(stop);
    ASSERT_NE(at, std::string::npos) << "the greedy text \"" << full << "\" holds \"" << stop << "\"";
    for (const bool chat : {false, true})
      for (const bool stream : {false, true}) {
        json body = {{"model", "tiny-fortunes"}, {"max_tokens", 60}, {"temperature", 0}, {"stream", stream},
                     {"stop", json::array({"no such text", stop})}};
        if (chat) body["messages"] = json::array({{{"role", "user"}, {"content", "The "}}});  // the same prompt text
        else body["prompt"] = "The ";
        const HttpReply r = http_post("127.0.0.1", port, chat ? "/v1/chat/completions" : "/v1/completions", body.dump());
        const std::string who = who_serves + (chat ? ", chat, " : ", completions, ") + (stream ? "streamed" : "whole") +
                                ", stop \"" + stop + "\"";
        ASSERT_EQ(r.status, 200) << who << ": " << r.body.substr(0, 300);
        std::string text, reason;
        const auto read_choice = [&](const json& c, bool delta) {
          if (chat && c[delta ? "delta" : "message"].contains("content"))
            text += c[delta ? "delta" : "message"]["content"].get<std::string>();
          if (!chat) text += c["text"].get<std::string>();
          if (!c["finish_reason"].is_null()) reason = c["finish_reason"].get<std::string>();
        };
        if (!stream) read_choice(json::parse(r.body)["choices"][0], false);
        for (const std::string& e : r.events)
          if (e != "[DONE]") read_choice(json::parse(e)["choices"][0], true);
        EXPECT_EQ(text, full.substr(0, at)) << who;
        EXPECT_EQ(reason, "stop") << who;
      }
  }
  EXPECT_TRUE(server.wait_idle(10)) << who_serves;
  EXPECT_EQ(metric_value(server.metrics(), "course_requests_running"), 0.0) << who_serves;
}

TEST(ServerStop, AStopSequenceEndsTheTextWhereItBeginsStreamedOrNot) {
  // Greedy text cut before the first place a stop sequence appears (every stop here spans several
  // byte tokens), with finish_reason "stop", streamed or not, completions and chat; the sequence
  // leaves the engine at once. The naive server (the table's baseline) as well.
  auto engine = small_server();
  expect_stops_cut_the_text(*engine, "the engine");
  EXPECT_EQ(metric_value(engine->metrics(), "course_kv_reserved_tokens"), 0.0) << "every stopped sequence freed its blocks";
  const ModelWeights& m = testing::bundled_model();
  Server naive(m, ApiModel{"tiny-fortunes", m.config}, ServerOptions{.http_threads = 8});
  naive.start();
  expect_stops_cut_the_text(naive, "naive");
}

/// Sends `bytes` (a whole request) on the open connection `fd` and reads its whole answer: the
/// status (0: none within 10 s) and everything read.
Raw ask_on(int fd, const std::string& bytes) {
  Raw r;
  if (!send_all(fd, bytes)) return r;
  for (pollfd p{fd, POLLIN, 0}; !complete(r.text) && ::poll(&p, 1, 10000) > 0;) {
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    r.text.append(buf, static_cast<size_t>(n));
  }
  if (r.text.rfind("HTTP/1.1 ", 0) == 0 && r.text.size() >= 12) r.status = std::atoi(r.text.c_str() + 9);
  return r;
}

/// Server::drain(), the first half of serve's graceful stop (Ctrl-C or SIGTERM): checked on `server`.
void expect_a_drain_finishes_what_is_in(Server& server, const std::string& who) {
  const int port = server.port();
  const std::string health = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  const std::string post = post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: " +
                                                            std::to_string(kGood.size()) + "\r\n") + kGood;
  // Two kept-alive connections, each answered once before the drain (so both were accepted).
  const int a = connect_loopback(port), b = connect_loopback(port);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_EQ(ask_on(a, health).status, 200) << who;
  EXPECT_EQ(ask_on(b, post).status, 200) << who;
  // A streamed request of 200 tokens in flight: drained after its second event.
  std::atomic<int> events{0};
  std::atomic<bool> answered{false};  // (the loop below must not read `streamed` while it is written)
  HttpReply streamed;
  std::thread client([&] {
    streamed = http_post("127.0.0.1", port, "/v1/completions",
                         R"({"model": "tiny-fortunes", "prompt": "The ", "max_tokens": 200, "temperature": 0, "stream": true})",
                         [&](const std::string&) { return ++events, true; });
    answered = true;
  });
  while (events.load() < 2 && !answered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server.drain();
  const int seen = events.load();
  // No new request: 503 on a connection already open (with OpenAI's error body), /health 503 (a
  // balancer stops sending), and a new connection is refused (once the listener has closed).
  const Raw refused = ask_on(b, post), unhealthy = ask_on(a, health);
  EXPECT_EQ(refused.status, 503) << who << ": " << refused.text.substr(0, 300);
  EXPECT_TRUE(is_error_body(refused) && refused.text.find("shutting down") != std::string::npos) << who << ": " << refused.text;
  EXPECT_EQ(unhealthy.status, 503) << who << ": " << unhealthy.text.substr(0, 300);
  ::close(a), ::close(b);
  bool listening = true;
  for (int i = 0; i < 200 && listening; ++i) {
    const int fd = connect_loopback(port);
    listening = fd >= 0;
    if (fd >= 0) ::close(fd), std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(listening) << who << ": still accepting connections 2 s after drain()";
  // The request in flight goes on to its end: every token, finish_reason, [DONE].
  client.join();
  ASSERT_EQ(streamed.status, 200) << who << ": " << streamed.error;
  EXPECT_LT(seen, 200) << who << ": the request had ended before the drain; the case proves nothing";
  ASSERT_FALSE(streamed.events.empty());
  EXPECT_EQ(streamed.events.back(), "[DONE]") << who;
  std::string reason;
  for (const std::string& e : streamed.events) {
    EXPECT_EQ(e.find("\"error\""), std::string::npos) << who << ": the request in flight was cut: " << e;
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    if (!j["choices"].empty() && !j["choices"][0]["finish_reason"].is_null()) reason = j["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(reason == "length" || reason == "stop") << who << ": finish_reason '" << reason << "'";
  EXPECT_TRUE(server.wait_idle(10)) << who;
  server.stop();
}

TEST(ServerShutdown, ADrainFinishesTheRequestsInAndTakesNoNewOne) {
  // serve's Ctrl-C or SIGTERM: the requests already in finish (for --shutdown-timeout seconds at
  // most), the rest get 503, and the listener closes. The engine, and the naive server.
  auto engine = small_server();
  expect_a_drain_finishes_what_is_in(*engine, "the engine");
  const ModelWeights& m = testing::bundled_model();
  Server naive(m, ApiModel{"tiny-fortunes", m.config}, ServerOptions{.http_threads = 4});
  naive.start();
  expect_a_drain_finishes_what_is_in(naive, "naive");
}

TEST(ServerShutdown, ADrainWaitsForAnswersStillBeingWritten) {
  // A client that reads slowly: 100 streamed answers pipelined on one connection with a 4 KB
  // receive buffer, megabytes, more than the sockets hold. Once they are full, the engine is idle
  // (the next request is not read until this answer is written) and an answer waits to be
  // written; wait_answered() (what serve's drain waits for before stop() drops what is unsent)
  // waits for it, and is true once the client reads.
  auto server = small_server();
  const int port = server->port();
  const int fd = connect_loopback(port, /*receive_buffer=*/4096);
  ASSERT_GE(fd, 0);
  const std::string body = R"({"model": "tiny-fortunes", "prompt": "The ", "max_tokens": 200, "temperature": 0, "stream": true})";
  std::string requests;
  for (int i = 0; i < 100; ++i)
    requests += post_head("/v1/completions", "Content-Type: application/json\r\nContent-Length: " +
                                                 std::to_string(body.size()) + "\r\n") + body;
  std::thread sender([&] { send_all(fd, requests); });  // (the server reads them one by one)
  int stuck = 0;  // checks in a row (10 ms apart) that found the engine idle and an answer unwritten
  for (int i = 0; i < 2000 && stuck < 20; ++i) {
    stuck = server->wait_idle(0) && !server->wait_answered(0) ? stuck + 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(stuck, 20) << "the sockets never filled: no answer left waiting to be written";
  server->drain();
  EXPECT_FALSE(server->wait_answered(0.3)) << "an answer is still being written to a client that does not read";
  std::string text;
  std::thread reader([&] { text = read_until_quiet(fd, 3); });
  EXPECT_TRUE(server->wait_answered(10)) << "the client reads: the answer being written ends";
  server->stop();
  reader.join();
  sender.join();
  ::close(fd);
  EXPECT_NE(text.find("data: [DONE]"), std::string::npos);
}

TEST(ServerLogprobs, EachTokenComesWithTheModelsLogProbabilities) {
  // Greedy: each token is the most likely one, and its log-probability is the log-softmax of the
  // model's logits there (lesson 02's forward_cached, tolerance 1e-3); the top ones come sorted,
  // as many as asked. Completions and chat shapes, on the engine and on the naive server.
  const ModelWeights& m = testing::bundled_model();
  auto engine = small_server();
  Server naive(m, ApiModel{"tiny-fortunes", m.config}, ServerOptions{.http_threads = 8});
  naive.start();
  for (Server* server : {engine.get(), &naive})
    for (const bool chat : {false, true}) {
      json body = {{"model", "tiny-fortunes"}, {"max_tokens", 12}, {"temperature", 0}};
      if (chat) {
        body["messages"] = json::array({{{"role", "user"}, {"content", "The "}}});
        body["logprobs"] = true;
        body["top_logprobs"] = 3;
      } else {
        body["prompt"] = "The ";
        body["logprobs"] = 3;
      }
      const std::string who = std::string(server == &naive ? "naive" : "engine") + (chat ? ", chat" : ", completions");
      const HttpReply r = http_post("127.0.0.1", server->port(), chat ? "/v1/chat/completions" : "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << who << ": " << r.body.substr(0, 300);
      const json j = json::parse(r.body);
      const json& lp = j["choices"][0]["logprobs"];
      std::vector<std::string> tokens;
      std::vector<double> logprob;
      std::vector<std::vector<double>> top;
      for (size_t i = 0; i < (chat ? lp["content"].size() : lp["tokens"].size()); ++i) {
        tokens.push_back(chat ? lp["content"][i]["token"].get<std::string>() : lp["tokens"][i].get<std::string>());
        logprob.push_back(chat ? lp["content"][i]["logprob"].get<double>() : lp["token_logprobs"][i].get<double>());
        top.emplace_back();
        if (chat)
          for (const json& t : lp["content"][i]["top_logprobs"]) top.back().push_back(t["logprob"].get<double>());
        else
          for (const auto& [t, v] : lp["top_logprobs"][i].items()) top.back().push_back(v.get<double>());
        std::sort(top.back().rbegin(), top.back().rend());
      }
      ASSERT_EQ(static_cast<int>(tokens.size()), j["usage"]["completion_tokens"].get<int>()) << who << ": one per token";
      // The model's own numbers, token by token.
      KVCache cache(m.config, m.config.max_position_embeddings);
      std::vector<int> feed = ByteTokenizer::encode("The ");
      for (size_t i = 0; i < tokens.size(); ++i) {
        const Matrix logits = forward_cached(m, feed, cache);
        const Eigen::RowVectorXf row = logits.row(logits.rows() - 1);
        const float best = row.maxCoeff();
        const float log_total = best + std::log((row.array() - best).exp().sum());
        Eigen::Index argmax = 0;
        row.maxCoeff(&argmax);
        const int token = static_cast<int>(argmax);
        EXPECT_EQ(tokens[i], ByteTokenizer::decode(std::vector<int>{token})) << who << ", token " << i;
        EXPECT_NEAR(logprob[i], row(argmax) - log_total, 1e-3) << who << ", token " << i;
        ASSERT_EQ(top[i].size(), 3u) << who << ", token " << i;
        EXPECT_NEAR(top[i][0], logprob[i], 1e-6) << who << ": greedy takes the most likely token";
        EXPECT_LE(top[i][2], top[i][1]);
        feed = {token};
      }
    }
}

TEST(ServerHostile, NoMutatedBodyIsAnsweredWithA500) {
  // Seeded mutations of good requests (fields removed, retyped, nested, set to extremes), each
  // answered 200 or a 4xx with OpenAI's error body. 1,000 requests of at most 2 new tokens.
  auto server = small_server();
  const int port = server->port();
  const std::vector<json> seeds = {
      json::parse(R"({"model": "tiny-fortunes", "prompt": "The ", "max_tokens": 2})"),
      json::parse(R"({"model": "tiny-fortunes", "prompt": [1, 84, 104], "max_tokens": 2, "temperature": 0.5,
                      "top_p": 0.9, "top_k": 5, "seed": 3, "stream": true, "stream_options": {"include_usage": true}})"),
      json::parse(R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                      "response_format": {"type": "text"}, "n": 1})"),
  };
  const std::vector<json> values = {nullptr, true, false, 0, -1, 1, 2, 3.5, -1e300, 1e300, 9223372036854775807LL,
                                    "", "x", "tiny-fortunes", json::array(), json::array({1, 2}),
                                    json::array({json::object()}), json::object(), json::object({{"type", 5}}),
                                    json::object({{"include_usage", "yes"}}),
                                    json::array({json::object({{"role", 7}, {"content", json::array()}})})};
  const std::vector<std::string> fields = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                                           "temperature", "top_p", "top_k", "seed", "n", "stream", "stream_options",
                                           "response_format", "stop", "logprobs", "best_of", "suffix", "echo",
                                           "presence_penalty", "logit_bias", "tools", "user"};
  const std::vector<std::string> keys = {"type", "include_usage", "role", "content", "text"};
  std::mt19937 rng(20261202);
  int answered = 0;
  for (int i = 0; i < 1000; ++i) {
    json body = seeds[rng() % seeds.size()];
    const bool chat = body.contains("messages");
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
      const std::string& f = fields[rng() % fields.size()];
      const json& v = values[rng() % values.size()];
      switch (rng() % 5) {
        case 0: body.erase(f); break;
        case 1: body[f] = v; break;
        case 2: body[f] = json::array({v}); break;
        case 3: body[f] = json::object({{keys[rng() % keys.size()], v}}); break;  // a field inside an object
        default: body[f] = json::array({json::object({{keys[rng() % keys.size()], v}, {"content", "hi"}})}); break;
      }
    }
    if (body.contains("max_tokens") && body["max_tokens"].is_number_integer() && body["max_tokens"].get<long long>() > 2)
      body["max_tokens"] = 2;  // keep the run short; the checks of large values are the API tests'
    if (body.contains("max_completion_tokens") && body["max_completion_tokens"].is_number_integer() &&
        body["max_completion_tokens"].get<long long>() > 2)
      body["max_completion_tokens"] = 2;
    if (chat && !body.contains("max_tokens") && !body.contains("max_completion_tokens")) body["max_tokens"] = 2;
    const HttpReply r = http_post("127.0.0.1", port, chat ? "/v1/chat/completions" : "/v1/completions", body.dump());
    ASSERT_TRUE(r.status == 200 || (r.status >= 400 && r.status < 500)) << r.status << " for " << body.dump() << ": "
                                                                        << r.body.substr(0, 300);
    if (r.status != 200) {
      const json j = json::parse(r.body, nullptr, false);
      ASSERT_TRUE(!j.is_discarded() && j.contains("error") && j["error"].contains("message"))
          << "OpenAI's error body for " << body.dump() << ", got " << r.body.substr(0, 300);
    }
    ++answered;
  }
  EXPECT_EQ(answered, 1000);
}

}  // namespace
}  // namespace infer
