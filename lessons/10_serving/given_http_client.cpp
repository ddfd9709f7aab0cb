// Lesson 10's server, the client room (given): the small HTTP/1.1 client the tests and the load
// generator use. Plain POSIX sockets: one connection per call, every wait for bytes bounded by the
// caller's timeout, a body read by its Content-Length, as chunks, or to the connection's end.
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "lessons/10_serving/server.hpp"

namespace infer {

namespace {

/// One connection; every read and write waits at most `timeout_ms` for the socket.
class Connection {
 public:
  explicit Connection(double timeout_s) : timeout_ms_(static_cast<int>(std::max(1.0, timeout_s * 1000))) {}
  ~Connection() {
    if (fd_ >= 0) ::close(fd_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// Connects to host:port; false (and error()) if it cannot.
  bool connect(const std::string& host, int port) {
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
      return fail(cat("cannot resolve ", host, ": ", ::gai_strerror(rc)));
    for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
      fd_ = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
      if (fd_ < 0) continue;
      if (::connect(fd_, a->ai_addr, a->ai_addrlen) != 0 && !(errno == EINPROGRESS && wait(POLLOUT) && connected())) {
        ::close(fd_);
        fd_ = -1;
      }
    }
    ::freeaddrinfo(found);
    return fd_ >= 0 || fail(error_.empty() ? cat("cannot connect to ", host, ":", port) : error_);
  }

  /// Sends all of `bytes`; false if the connection broke or stalled.
  bool send(const std::string& bytes) {
    for (size_t sent = 0; sent < bytes.size();) {
      if (!wait(POLLOUT)) return false;
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN) return fail(cat("send failed: ", std::strerror(errno)));
      if (n > 0) sent += static_cast<size_t>(n);
    }
    return true;
  }

  /// Appends what arrives to `buffer`; false at the connection's end (eof() then), an error or a timeout.
  bool receive(std::string& buffer) {
    if (!wait(POLLIN)) return false;
    char chunk[16384];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n == 0) {
      eof_ = true;
      return false;
    }
    if (n < 0) return errno == EAGAIN || fail(cat("recv failed: ", std::strerror(errno)));
    buffer.append(chunk, static_cast<size_t>(n));
    return true;
  }

  bool eof() const { return eof_; }
  const std::string& error() const { return error_; }

 private:
  bool fail(const std::string& why) {
    if (error_.empty()) error_ = why;
    return false;
  }
  bool wait(short events) {
    pollfd p{fd_, events, 0};
    const int rc = ::poll(&p, 1, timeout_ms_);
    if (rc == 0) return fail(cat("timed out after ", timeout_ms_, " ms"));
    return rc > 0 || fail(cat("poll failed: ", std::strerror(errno)));
  }
  bool connected() {
    int err = 0;
    socklen_t len = sizeof err;
    return ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && (err == 0 || fail(std::strerror(err)));
  }

  int fd_ = -1;
  int timeout_ms_;
  bool eof_ = false;
  std::string error_;
};

/// Reads an answer from `c`: the status, then the body by its framing, each piece of it handed to
/// `on_data` as it arrives (false from it stops reading). The status, or 0 (`error` says why).
int read_answer(Connection& c, const std::function<bool(const std::string&)>& on_data, std::string& error) {
  std::string in;
  size_t head_end;
  int status = 0;
  std::string head;
  for (;;) {  // the headers (an interim 1xx answer, if any, skipped)
    while ((head_end = in.find("\r\n\r\n")) == std::string::npos)
      if (!c.receive(in)) return error = c.eof() ? "the connection closed before an answer" : c.error(), 0;
    head = in.substr(0, head_end);
    in.erase(0, head_end + 4);
    if (head.rfind("HTTP/1.", 0) != 0 || head.size() < 12) return error = "not an HTTP answer", 0;
    status = std::atoi(head.c_str() + 9);
    if (status >= 200) break;
  }
  std::transform(head.begin(), head.end(), head.begin(), [](unsigned char ch) { return std::tolower(ch); });
  const auto header = [&](const std::string& name) -> std::string {
    const size_t at = head.find("\r\n" + name + ":");
    if (at == std::string::npos) return "";
    const size_t from = head.find_first_not_of(' ', at + name.size() + 3), to = head.find("\r\n", at + 2);
    return from >= to ? "" : head.substr(from, to - from);
  };
  if (header("transfer-encoding").find("chunked") != std::string::npos) {
    for (;;) {
      size_t line_end;
      while ((line_end = in.find("\r\n")) == std::string::npos)
        if (!c.receive(in)) return error = c.error().empty() ? "the answer ended inside a chunk" : c.error(), 0;
      const size_t size = std::strtoul(in.c_str(), nullptr, 16);
      if (size == 0) return status;  // (trailers, if any, are not read)
      while (in.size() < line_end + 2 + size + 2)
        if (!c.receive(in)) return error = c.error().empty() ? "the answer ended inside a chunk" : c.error(), 0;
      const bool go_on = on_data(in.substr(line_end + 2, size));
      in.erase(0, line_end + 2 + size + 2);
      if (!go_on) return status;
    }
  }
  const std::string length = header("content-length");
  if (!length.empty()) {
    const size_t n = std::stoul(length);
    while (in.size() < n)
      if (!c.receive(in)) return error = c.error().empty() ? "the answer ended before its Content-Length" : c.error(), 0;
    on_data(in.substr(0, n));
    return status;
  }
  while (c.receive(in)) {  // neither: the body ends with the connection
  }
  if (!c.eof()) return error = c.error(), 0;
  on_data(in);
  return status;
}

std::string request_head(const std::string& method, const std::string& host, int port, const std::string& path) {
  return cat(method, " ", path, " HTTP/1.1\r\nHost: ", host, ":", port, "\r\nConnection: close\r\n");
}

}  // namespace

HttpReply http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                    const std::function<bool(const std::string&)>& on_event, double timeout_s,
                    const std::string& api_key) {
  HttpReply reply;
  Connection c(timeout_s);
  std::string request = request_head("POST", host, port, path) + "Content-Type: application/json\r\n";
  if (!api_key.empty()) request += "Authorization: Bearer " + api_key + "\r\n";
  request += cat("Content-Length: ", body.size(), "\r\n\r\n") + body;
  if (!c.connect(host, port) || !c.send(request)) {
    reply.error = c.error();
    return reply;
  }
  std::string pending;  // bytes of an event not complete yet
  // Server-sent events are handed to on_event the moment each is complete; a false from it hangs up.
  reply.status = read_answer(
      c,
      [&](const std::string& data) {
        reply.body += data;
        pending += data;
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
              return false;
            }
          }
        }
        return true;
      },
      reply.error);
  return reply;  // (the connection closes here: to a server, a hang-up)
}

std::pair<int, std::string> http_get(const std::string& host, int port, const std::string& path, double timeout_s) {
  Connection c(timeout_s);
  std::string body, error;
  if (!c.connect(host, port) || !c.send(request_head("GET", host, port, path) + "\r\n")) return {0, ""};
  const int status = read_answer(
      c,
      [&](const std::string& data) {
        body += data;
        return true;
      },
      error);
  return {status, status ? body : ""};
}

double metric_value(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 && line[name.size()] == ' ')
      return std::stod(line.substr(name.size() + 1));
  return std::nan("");
}

}  // namespace infer
