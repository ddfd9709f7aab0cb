// Lesson 10's server, the client room (given): the small HTTP client the tests and the load
// generator use, on Boost.Beast. Each call is one connection; every wait for bytes has a deadline.
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "lessons/10_serving/server.hpp"

namespace infer {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

/// One connection to host:port whose every operation ends within `timeout_s` (Beast's sync calls
/// have no deadline, so each is an async one run to its end here).
class Connection {
 public:
  explicit Connection(double timeout_s) : stream_(io_), timeout_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s))) {}

  /// Connects; the error, if any.
  beast::error_code connect(const std::string& host, int port) {
    beast::error_code ec;
    const auto endpoints = tcp::resolver(io_).resolve(host, std::to_string(port), ec);
    if (ec) return ec;
    return run([&](auto done) { stream_.async_connect(endpoints, [done](beast::error_code e, const auto&) { done(e); }); });
  }

  beast::error_code write(const http::request<http::string_body>& req) {
    return run([&](auto done) { http::async_write(stream_, req, [done](beast::error_code e, size_t) { done(e); }); });
  }

  template <class Parser>
  beast::error_code read_header(Parser& parser) {
    return run([&](auto done) { http::async_read_header(stream_, buffer_, parser, [done](beast::error_code e, size_t) { done(e); }); });
  }

  template <class Parser>
  beast::error_code read_some(Parser& parser) {
    return run([&](auto done) { http::async_read_some(stream_, buffer_, parser, [done](beast::error_code e, size_t) { done(e); }); });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

 private:
  template <class Start>
  beast::error_code run(Start start) {
    std::optional<beast::error_code> result;
    stream_.expires_after(timeout_);
    start([&result](beast::error_code ec) { result = ec; });
    io_.restart();
    while (!result && io_.run_one() > 0) {
    }
    return result.value_or(net::error::operation_aborted);
  }

  net::io_context io_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::chrono::steady_clock::duration timeout_;
};

http::request<http::string_body> make_request(http::verb verb, const std::string& host, const std::string& path) {
  http::request<http::string_body> req(verb, path, 11);
  req.set(http::field::host, host);
  return req;
}

}  // namespace

HttpReply http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                    const std::function<bool(const std::string&)>& on_event, double timeout_s,
                    const std::string& api_key) {
  HttpReply reply;
  Connection c(timeout_s);
  auto req = make_request(http::verb::post, host, path);
  req.set(http::field::content_type, "application/json");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  req.body() = body;
  req.prepare_payload();
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // (boost::none: refused by Boost 1.74)
  std::string pending;  // bytes of an event not complete yet
  // A chunked answer (a stream) comes here piece by piece, as it arrives: each event is handed to
  // on_event at once; a false from it hangs up.
  auto on_chunk = [&](std::uint64_t, beast::string_view data, beast::error_code& ec) -> size_t {
    reply.body.append(data.data(), data.size());
    pending.append(data.data(), data.size());
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      std::istringstream lines(event);
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind("data: ", 0) != 0) continue;  // comments, other fields
        reply.events.push_back(line.substr(6));
        if (on_event && !on_event(reply.events.back())) {
          reply.hung_up = true;
          ec = net::error::operation_aborted;
          return data.size();
        }
      }
    }
    return data.size();
  };
  parser.on_chunk_body(on_chunk);
  beast::error_code ec = c.connect(host, port);
  if (!ec) ec = c.write(req);
  if (!ec) ec = c.read_header(parser);
  if (!ec) reply.status = static_cast<int>(parser.get().result_int());
  while (!ec && !parser.is_done()) ec = c.read_some(parser);
  if (ec && !reply.hung_up) {
    reply.status = 0;
    reply.error = ec.message();
  }
  if (!parser.chunked()) reply.body = parser.get().body();
  c.close();  // (a hang-up: the server sees the connection close)
  return reply;
}

std::pair<int, std::string> http_get(const std::string& host, int port, const std::string& path, double timeout_s) {
  Connection c(timeout_s);
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // (boost::none: refused by Boost 1.74)
  beast::error_code ec = c.connect(host, port);
  if (!ec) ec = c.write(make_request(http::verb::get, host, path));
  if (!ec) ec = c.read_header(parser);
  while (!ec && !parser.is_done()) ec = c.read_some(parser);
  c.close();
  if (ec) return {0, ""};
  return {static_cast<int>(parser.get().result_int()), parser.get().body()};
}

double metric_value(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 && line[name.size()] == ' ')
      return std::stod(line.substr(name.size() + 1));
  return std::nan("");
}

}  // namespace infer
