// Lesson 10: the load generator (./course load).
//
//   build/solutions/bin/lesson10_load [--host H] [--port P] [--model NAME] [--users N]
//       [--duration S] [--think S] [--max-tokens T] [--prompts FILE] [--seed X]
//       [--label TEXT] [--csv FILE] [--api-key KEY]
//   build/solutions/bin/lesson10_load --request-rate R --num-prompts N [the same options]
//
// Closed loop (the default): N users, each in its own thread, each sending streaming requests to
// /v1/completions one after another until --duration seconds have passed, waiting an exponential
// think time (mean --think seconds) after each answer before the next. A user never has two
// requests open, so a slow server slows the load down with it.
//
// Open loop (--request-rate R): N requests (--num-prompts) sent at the times of a Poisson process
// of rate R per second, whether or not earlier ones were answered, as vLLM's benchmark_serving
// sends them: a slow server sees its queue grow.
//
// Prompts come from --prompts (one per line) or from a synthetic mix: one of four shared
// "system prompts" (about 100 bytes each, the prefix cache's case) and a short question.
//
// Reports, over every request: total tokens/s (every completion token over the run's wall time),
// tokens/s per user (each request's tokens over its own time from sending to [DONE], averaged: the
// speed at which a user sees text arrive), time to first token, inter-token latency and whole
// request latency (p50, p99), and the requests that failed (not 200, an error event, no
// `data: [DONE]`) or came back twice. --csv appends one row per run (users 0 and the rate in
// request_rate for an open-loop run). --api-key KEY (or the environment variable COURSE_API_KEY) is
// sent as `Authorization: Bearer KEY`.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/options.hpp"
#include "lessons/10_serving/server.hpp"

using namespace infer;
using Clock = std::chrono::steady_clock;

namespace {

struct Record {
  bool ok = false;
  int events_done = 0;  // data: [DONE] count (exactly 1 when ok)
  int tokens = 0;       // completion tokens, as the server counted them
  double start = 0, ttft = 0, latency = 0;
  std::vector<double> itl;
  std::string id;
  std::string why;  // what went wrong, when not ok
};

std::vector<std::string> synthetic_prompts() {
  const std::vector<std::string> systems = {
      "You are a fortune teller at a night market. You answer every question with one short fortune. ",
      "The following is a collection of proverbs from many lands, each on its own line, old and new. ",
      "Q: What do the stars say about tomorrow? A: They say the road is long but the company is good. ",
      "A fortune cookie says: patience is a virtue, luck is a habit, and tomorrow is another day. Q: ",
  };
  const std::vector<std::string> questions = {"Will I be rich?", "What about love?", "Is today lucky?",
                                              "Should I travel?", "Why the moon?", "Tell me more."};
  std::vector<std::string> prompts;
  for (const auto& s : systems)
    for (const auto& q : questions) prompts.push_back(s + q);
  return prompts;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson10_load",
                       {"--host", "--port", "--model", "--users", "--duration", "--think", "--max-tokens", "--prompts",
                        "--seed", "--label", "--csv", "--api-key", "--request-rate", "--num-prompts"},
                       {"-h", "--help"});
    if (opts.help()) {
      std::cout << "usage: lesson10_load [--host H] [--port P] [--model NAME] [--api-key KEY]\n"
                   "                     [--users N] [--duration S] [--think S] [--max-tokens N] [--prompts FILE]\n"
                   "                     [--request-rate R --num-prompts N] [--seed S] [--label L] [--csv FILE]\n"
                   "  Load against a running server (127.0.0.1:8000): a closed loop of N users, each asking\n"
                   "  again after a think time of mean --think seconds, or with --request-rate an open loop\n"
                   "  of --num-prompts requests arriving at R a second. Each option: lessons/10_serving/README.md, \"How to check\".\n";
      return 0;
    }
    const char* env_key = std::getenv("COURSE_API_KEY");
    const std::string api_key = opts.text("--api-key", env_key ? env_key : "");
    const std::string host = opts.text("--host", "127.0.0.1");
    const int port = static_cast<int>(opts.number("--port", 8000, 1, 65535));
    const std::string model = opts.text("--model", "tiny-fortunes");
    const int users = static_cast<int>(opts.number("--users", 8, 1, 4096));
    const double duration = opts.real("--duration", 10.0);
    const double think = opts.real("--think", 0.05);
    require(duration > 0 && duration <= 86400 && think >= 0 && think <= 3600,
            "lesson10_load: --duration must be in (0, 86400] seconds and --think in [0, 3600], got ", duration, " and ",
            think);
    const int max_tokens = static_cast<int>(opts.number("--max-tokens", 64, 1));
    const uint64_t seed = static_cast<uint64_t>(opts.number("--seed", 1, 0));
    const std::string label = opts.text("--label", "");
    const bool open_loop = opts.has("--request-rate");
    const double rate = opts.real("--request-rate", 0.0);
    const int num_prompts = static_cast<int>(opts.number("--num-prompts", 0, 1, 1000000));
    require(!open_loop || rate > 0, "lesson10_load: --request-rate must be > 0 (requests per second), got ", rate);
    require(open_loop == opts.has("--num-prompts"), "lesson10_load: --request-rate and --num-prompts go together");
    require(!open_loop || !(opts.has("--users") || opts.has("--duration") || opts.has("--think")),
            "lesson10_load: --request-rate sends --num-prompts requests at Poisson times; --users, --duration and "
            "--think are for the closed loop");

    std::vector<std::string> prompts;
    if (opts.has("--prompts")) {
      const std::string path = opts.text("--prompts", "");
      std::ifstream in(path);
      require(in.good(), "lesson10_load: cannot read ", path);
      int number = 0;
      for (std::string line; std::getline(in, line);) {
        ++number;
        if (!line.empty() && line.back() == '\r') line.pop_back();  // a file written with CRLF line endings
        if (line.empty()) continue;
        try {
          (void)nlohmann::json(line).dump();  // a request body is JSON: its text must be UTF-8
        } catch (const nlohmann::json::exception&) {
          throw Error(cat("lesson10_load: line ", number, " of ", path, " is not UTF-8 text"));
        }
        prompts.push_back(line);
      }
      require(!prompts.empty(), "lesson10_load: no prompts in ", path);
    } else {
      prompts = synthetic_prompts();
    }
    if (opts.has("--csv")) {  // said now, not after the run
      std::ofstream csv(opts.text("--csv", ""), std::ios::app);
      require(csv.good(), "lesson10_load: cannot write --csv ", opts.text("--csv", ""));
    }
    {
      const auto [status, body] = http_get(host, port, "/health");
      require(status == 200, "lesson10_load: no healthy server at http://", host, ":", port,
              " (start one with ./course serve): ",
              status == 0 ? std::string("could not connect") : cat("/health answered ", status, " ", body));
    }

    std::mutex mutex;
    std::vector<Record> records;
    std::atomic<int> sent{0};
    const auto t0 = Clock::now();
    const auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
    // One streaming request, recorded when its answer has ended.
    const auto send_one = [&](std::mt19937_64& rng) {
      const int n = sent++;
      const nlohmann::json body = {{"model", model},
                                   {"prompt", prompts[rng() % prompts.size()]},
                                   {"max_tokens", max_tokens},
                                   {"temperature", 0.8},
                                   {"seed", n},
                                   {"stream", true},
                                   {"stream_options", {{"include_usage", true}}}};
      Record r;
      const auto start = Clock::now();
      r.start = since(start);
      Clock::time_point last = start;
      bool error = false;
      const HttpReply reply = http_post(host, port, "/v1/completions", body.dump(), [&](const std::string& e) {
        const auto now = Clock::now();
        if (e == "[DONE]") {
          ++r.events_done;
          return true;
        }
        const auto j = nlohmann::json::parse(e, nullptr, false);
        if (j.is_discarded() || !j.is_object() || j.contains("error")) {
          if (!error) r.why = cat("an error event: ", e.substr(0, 300));
          error = true;
          return true;
        }
        if (r.id.empty() && j.value("id", nlohmann::json()).is_string()) r.id = j["id"].get<std::string>();
        if (j.contains("usage") && j["usage"].is_object()) r.tokens = j["usage"].value("completion_tokens", 0);
        const nlohmann::json choices = j.value("choices", nlohmann::json::array());
        if (choices.is_array() && !choices.empty() && choices[0].is_object() &&
            choices[0].value("text", nlohmann::json()).is_string() && !choices[0]["text"].get<std::string>().empty()) {
          if (r.ttft == 0) {
            r.ttft = std::chrono::duration<double>(now - start).count();
          } else {
            r.itl.push_back(std::chrono::duration<double>(now - last).count());
          }
          last = now;
        }
        return true;
      }, 60, api_key);
      r.latency = std::chrono::duration<double>(Clock::now() - start).count();
      r.ok = reply.status == 200 && !error && r.events_done == 1;
      if (!r.ok && r.why.empty())
        r.why = reply.status == 0 ? cat("no answer: ", reply.error)
                : reply.status != 200 ? cat("HTTP ", reply.status, ": ", reply.body.substr(0, 300))
                                      : cat("the stream ended with ", r.events_done, " [DONE] events, not 1");
      std::lock_guard lock(mutex);
      records.push_back(std::move(r));
    };
    std::vector<std::thread> threads;
    if (open_loop) {
      // Open loop: the n-th request leaves at the n-th time of a Poisson process of rate R,
      // each on its own thread, answered or not.
      std::mt19937_64 rng(seed);
      std::exponential_distribution<double> gap(rate);
      double at = 0;
      for (int i = 0; i < num_prompts; ++i) {
        at += gap(rng);
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)));
        threads.emplace_back([&, i] {
          std::mt19937_64 own(seed * 1000003u + static_cast<uint64_t>(i));
          send_one(own);
        });
      }
    } else {
      for (int u = 0; u < users; ++u)
        threads.emplace_back([&, u] {
          std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(u));
          std::exponential_distribution<double> wait(think > 0 ? 1.0 / think : 1.0);
          while (true) {
            if (think > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait(rng)));
            if (since(Clock::now()) >= duration) break;
            send_one(rng);
          }
        });
    }
    for (auto& t : threads) t.join();

    double end = 0;
    long tokens = 0;
    int failed = 0, duplicated = 0;
    std::string first_failure;
    std::vector<double> ttft, itl, latency;
    std::set<std::string> ids;
    for (const Record& r : records) {
      end = std::max(end, r.start + r.latency);
      if (!r.ok) {
        if (failed++ == 0) first_failure = r.why;
        continue;
      }
      if (!ids.insert(r.id).second) ++duplicated;
      tokens += r.tokens;
      ttft.push_back(r.ttft);
      latency.push_back(r.latency);
      itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    }
    const double total_rate = end > 0 ? static_cast<double>(tokens) / end : 0.0;
    double user_rate = 0;  // the speed a user watches a stream come in: tokens over the request's time
    for (const Record& r : records)
      if (r.ok && r.latency > 0) user_rate += r.tokens / r.latency / static_cast<double>(latency.size());
    const auto p = [](std::vector<double> v, double q) { return v.empty() ? 0.0 : percentile(v, q); };
    const std::string who = open_loop ? cat("open loop at ", rate, " requests/s")
                                      : cat(users, " user", users == 1 ? "" : "s");
    std::printf("%s%s, %.1f s: %zu requests (%d failed, %d duplicated), %ld tokens\n",
                label.empty() ? "" : (label + ": ").c_str(), who.c_str(), end, records.size(), failed, duplicated, tokens);
    std::printf("  total %.0f tokens/s, per user %.1f tokens/s\n", total_rate, user_rate);
    std::printf("  TTFT p50 %.1f ms, p99 %.1f ms; inter-token p50 %.2f ms, p99 %.2f ms; request p50 %.0f ms, p99 %.0f ms\n",
                1e3 * p(ttft, 50), 1e3 * p(ttft, 99), 1e3 * p(itl, 50), 1e3 * p(itl, 99), 1e3 * p(latency, 50),
                1e3 * p(latency, 99));
    if (failed > 0) std::fprintf(stderr, "the first failed request: %s\n", first_failure.c_str());
    if (opts.has("--csv")) {
      const std::string path = opts.text("--csv", "");
      std::ifstream old(path, std::ios::ate);
      const bool fresh = !old.good() || old.tellg() <= 0;  // (the check above may have made it, empty)
      std::ofstream csv(path, std::ios::app);
      if (fresh)
        csv << "label,users,seconds,requests,failed,duplicated,tokens,total_tokens_per_s,user_tokens_per_s,"
               "ttft_p50_s,ttft_p99_s,itl_p50_s,itl_p99_s,latency_p50_s,latency_p99_s,request_rate\n";
      csv << label << "," << (open_loop ? 0 : users) << "," << end << "," << records.size() << "," << failed << "," << duplicated << ","
          << tokens << "," << total_rate << "," << user_rate << "," << p(ttft, 50) << "," << p(ttft, 99) << ","
          << p(itl, 50) << "," << p(itl, 99) << "," << p(latency, 50) << "," << p(latency, 99) << ","
          << (open_loop ? rate : 0.0) << "\n";
    }
    return failed == 0 && duplicated == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
