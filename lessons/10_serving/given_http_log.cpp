// Lesson 10's server, given: its log (server_parts.hpp's ServerLog), written on a thread of its
// own so that the HTTP threads never wait on stderr.
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "lessons/10_serving/server_parts.hpp"

namespace infer::server {

ServerLog::ServerLog() : writer_([this] { run(); }) {}

ServerLog::~ServerLog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  writer_.join();
}

std::string ServerLog::printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte <= 0x7e && byte != '\\') {
      out += c;
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", byte);
      out += hex;
    }
  }
  return out;
}

void ServerLog::add(const std::string& line) {
  {
    std::lock_guard lock(mutex_);
    if (queued_.size() >= kMaxQueued) {
      ++dropped_;
      return;
    }
    queued_.push_back(printable(line) + "\n");
  }
  wake_.notify_one();
}

void ServerLog::run() {
  // Waits until stderr can take a line (poll: a pipe says so when a page of it is free, and a
  // line is shorter), for as long as the server runs, and for a second once it stops.
  const auto writable = [this] {
    for (int waited = 0;; waited += 100) {
      pollfd out{STDERR_FILENO, POLLOUT, 0};
      const int ready = ::poll(&out, 1, 100);
      if (ready > 0) return (out.revents & POLLOUT) != 0;
      if (ready < 0 && errno != EINTR) return false;
      std::lock_guard lock(mutex_);
      if (stopping_ && waited >= 1000) return false;
    }
  };
  for (;;) {
    std::deque<std::string> lines;
    size_t dropped = 0;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queued_.empty(); });
      if (queued_.empty() && stopping_) return;
      lines.swap(queued_);
      dropped = std::exchange(dropped_, 0);
    }
    if (dropped > 0)
      lines.push_front(cat("serve: ", dropped, " lines of this log were dropped: stderr took them too slowly\n"));
    for (const std::string& line : lines) {
      if (!writable()) return;  // (stopping, and stderr takes nothing more)
      for (size_t done = 0; done < line.size();) {
        const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // (stderr closed: nothing to say it to)
        done += static_cast<size_t>(n);
      }
    }
  }
}

}  // namespace infer::server
