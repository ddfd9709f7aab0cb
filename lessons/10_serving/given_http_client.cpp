// Lesson 10's server, the client room (given): the small HTTP client the tests and the load
// generator use, and a reader of /metrics pages.
#include <cmath>
#include <sstream>

#include "lessons/10_serving/server.hpp"

// After Eigen: httplib brings in <resolv.h>, whose `_res` macro would rename a parameter of Eigen's.
#include <httplib.h>

namespace infer {

HttpReply http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                    const std::function<bool(const std::string&)>& on_event, double timeout_s,
                    const std::string& api_key) {
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
  if (!api_key.empty()) req.set_header("Authorization", "Bearer " + api_key);
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
