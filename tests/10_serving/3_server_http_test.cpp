// Lesson 10: the HTTP server around your engine. Every request comes back with exactly the tokens
// it would get alone, streamed or not, under 100 concurrent clients on a small KV pool; a client
// that hangs up frees its memory; bad requests get a 4xx and the server stays up.
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/runners.hpp"
#include "common/tokenizer.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/10_serving/server.hpp"

namespace infer {
namespace {

using nlohmann::json;

const char* kHost = "127.0.0.1";

std::vector<int> solo(const ModelWeights& m, const std::vector<int>& prompt, int max_new, const SamplingParams& p) {
  KVCache cache(m.config, m.config.max_position_embeddings);
  Sampler s(p);
  return generate_cached(m, prompt, max_new, s, cache);
}

std::unique_ptr<Engine> paged_engine(std::unique_ptr<ModelRunner> forward, int blocks, ServingOptions o) {
  const ModelConfig c = forward->config();
  return serving_engine(std::move(forward), std::make_unique<PagedKVManager>(c, blocks, 16), o);
}

/// What a client made of one reply: the text, how it ended, how many tokens the server counted.
struct Answer {
  int status = 0;
  std::string text, finish_reason, error;
  int completion_tokens = -1;
  int done_events = 0, finish_events = 0;
};

Answer ask(int port, bool chat, const std::string& body, bool stream) {
  const HttpReply r = http_post(kHost, port, chat ? "/v1/chat/completions" : "/v1/completions", body);
  Answer a;
  a.status = r.status;
  if (r.status != 200) {
    a.error = r.status == 0 ? "no answer: " + r.error : r.body;
    return a;
  }
  if (!stream) {
    const json j = json::parse(r.body);
    const json& choice = j.at("choices").at(0);
    a.text = chat ? choice.at("message").at("content").get<std::string>() : choice.at("text").get<std::string>();
    a.finish_reason = choice.at("finish_reason").get<std::string>();
    a.completion_tokens = j.at("usage").at("completion_tokens").get<int>();
    return a;
  }
  for (const std::string& e : r.events) {
    if (e == "[DONE]") {
      ++a.done_events;
      continue;
    }
    const json j = json::parse(e);
    if (j.contains("error")) {
      a.error = e;
      continue;
    }
    if (j.contains("usage") && !j["usage"].is_null()) a.completion_tokens = j["usage"]["completion_tokens"].get<int>();
    if (j.at("choices").empty()) continue;
    const json& choice = j["choices"][0];
    if (chat) {
      if (choice.at("delta").contains("content")) a.text += choice["delta"]["content"].get<std::string>();
    } else {
      a.text += choice.at("text").get<std::string>();
    }
    if (!choice.at("finish_reason").is_null()) {
      ++a.finish_events;
      a.finish_reason = choice["finish_reason"].get<std::string>();
    }
  }
  return a;
}

/// One request of a test: its body, and what generate_cached() makes of it alone.
struct Case {
  bool chat = false, stream = false;
  std::string body, text, finish_reason;
  int tokens = 0;
};

Case make_case(const ModelWeights& m, int i, bool chat, bool stream, bool sampled, int max_tokens) {
  const std::string words[] = {"The ", "A fool", "Love is", "You will", "Why", "Q: What", "Never ", "If you"};
  const std::string content = words[i % 8] + std::string(static_cast<size_t>(i % 5), '.');
  json body = {{"model", "tiny-fortunes"}, {"max_tokens", max_tokens}, {"stream", stream}};
  if (stream) body["stream_options"] = {{"include_usage", true}};
  body["temperature"] = sampled ? 0.8 : 0.0;
  if (sampled) body["seed"] = 1000 + i;
  std::vector<int> prompt;
  if (chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", content}}});
    prompt = ByteTokenizer::encode(chat_prompt({{"user", content}}));
  } else {
    body["prompt"] = content;
    prompt = ByteTokenizer::encode(content);
  }
  SamplingParams p;
  p.temperature = sampled ? 0.8f : 0.0f;
  p.seed = sampled ? static_cast<uint64_t>(1000 + i) : 0;
  const std::vector<int> tokens = solo(m, prompt, max_tokens, p);
  Case c;
  c.chat = chat, c.stream = stream, c.body = body.dump();
  c.text = ByteTokenizer::decode(tokens);
  c.finish_reason = !tokens.empty() && tokens.back() == m.config.eos_token_id ? "stop" : "length";
  c.tokens = static_cast<int>(tokens.size());
  return c;
}

void expect_answer(const Case& c, const Answer& a, const std::string& who) {
  ASSERT_EQ(a.status, 200) << who << ": " << a.error;
  EXPECT_TRUE(a.error.empty()) << who << ": " << a.error;
  EXPECT_EQ(a.text, c.text) << who << ": the text must be what the request gets alone (generate_cached)";
  EXPECT_EQ(a.finish_reason, c.finish_reason) << who;
  EXPECT_EQ(a.completion_tokens, c.tokens) << who << (c.stream ? " (stream_options.include_usage)" : "");
  if (c.stream) {
    EXPECT_EQ(a.done_events, 1) << who << ": a stream ends with exactly one data: [DONE]";
    EXPECT_EQ(a.finish_events, 1) << who << ": exactly one event carries the finish_reason";
  }
}

double metric(const Server& s, const std::string& name) { return metric_value(s.metrics(), name); }

GRADED_TEST(Lesson10Http, HttpAnswersEqualOfflineOutputs, 3) {
  const ModelWeights& m = testing::bundled_model();
  Server server(paged_engine(std::make_unique<CpuRunner>(m), 64, {.max_running = 4, .token_budget = 16}),
                {"tiny-fortunes", m.config}, {.http_threads = 8});
  const int port = server.start();
  int i = 0;
  for (const bool chat : {false, true})
    for (const bool stream : {false, true})
      for (const bool sampled : {false, true}) {
        const Case c = make_case(m, i, chat, stream, sampled, 30 + 5 * i);
        ++i;
        expect_answer(c, ask(port, chat, c.body, stream),
                      cat(chat ? "chat" : "completions", stream ? ", streamed" : "", sampled ? ", sampled" : ", greedy"));
      }
  EXPECT_TRUE(server.wait_idle(10));
}

GRADED_TEST(Lesson10Http, HundredConcurrentClientsOnASmallPool, 4) {
  // 100 clients at once; the pool (20 blocks of 16 positions) holds far fewer sequences than
  // max_running allows, so the engine preempts. Each client must get its own text, once.
  const ModelWeights& m = testing::bundled_model();
  Server server(paged_engine(std::make_unique<CpuRunner>(m), 20, {.max_running = 16, .token_budget = 32}),
                {"tiny-fortunes", m.config}, {.http_threads = 110});  // one per client, and a few more
  const int port = server.start();
  constexpr int kClients = 100;
  std::vector<Case> cases;
  for (int i = 0; i < kClients; ++i) cases.push_back(make_case(m, i, i % 3 == 0, i % 2 == 0, i % 4 == 1, 8 + i % 24));
  std::vector<Answer> answers(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] { answers[i] = ask(port, cases[i].chat, cases[i].body, cases[i].stream); });
  for (auto& t : clients) t.join();
  long tokens = 0;
  for (int i = 0; i < kClients; ++i) {
    expect_answer(cases[i], answers[i], cat("client ", i));
    tokens += cases[i].tokens;
  }
  ASSERT_TRUE(server.wait_idle(10)) << "the server did not settle after every client had its answer";
  // The counters add up: every request ended once, as it should, and every token was counted.
  const double ended = metric(server, R"(course_requests_total{finish_reason="stop"})") +
                       metric(server, R"(course_requests_total{finish_reason="length"})");
  EXPECT_EQ(ended, kClients);
  EXPECT_EQ(metric(server, R"(course_requests_total{finish_reason="error"})"), 0);
  EXPECT_EQ(metric(server, R"(course_requests_total{finish_reason="cancelled"})"), 0);
  EXPECT_EQ(metric(server, "course_generation_tokens_total"), tokens);
  EXPECT_EQ(metric(server, "course_time_to_first_token_seconds_count"), kClients);
  EXPECT_EQ(metric(server, "course_requests_running"), 0);
  EXPECT_EQ(metric(server, "course_requests_waiting"), 0);
  EXPECT_EQ(metric(server, "course_kv_reserved_tokens"), 0) << "every block back in the pool";
  EXPECT_GT(metric(server, "course_preemptions_total"), 0) << "the pool was meant to run dry";
  EXPECT_EQ(http_get(kHost, port, "/health").first, 200);
}

using testing::SlowForward;

GRADED_TEST(Lesson10Http, AClientThatHangsUpFreesItsSequence, 2) {
  const ModelWeights& m = testing::bundled_model();
  Server server(paged_engine(std::make_unique<SlowForward>(m), 32, {.max_running = 4, .token_budget = 16}),
                {"tiny-fortunes", m.config}, {.http_threads = 8});
  const int port = server.start();
  const std::string body = R"({"model": "tiny-fortunes", "prompt": "The", "max_tokens": 240, "stream": true})";
  int seen = 0;
  const HttpReply r = http_post(kHost, port, "/v1/completions", body, [&](const std::string&) { return ++seen < 3; });
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(r.hung_up);
  ASSERT_TRUE(server.wait_idle(20)) << "the server still holds the request of a client that hung up";
  EXPECT_EQ(metric(server, R"(course_requests_total{finish_reason="cancelled"})"), 1);
  EXPECT_LT(metric(server, "course_generation_tokens_total"), 120)
      << "it ran on long after the client left: a stream must be written as the tokens come, and a hang-up cancel it";
  EXPECT_EQ(metric(server, "course_kv_reserved_tokens"), 0) << "its blocks must return to the pool";
  // And the server goes on serving.
  const Answer a = ask(port, false, R"({"model": "tiny-fortunes", "prompt": "The", "max_tokens": 5})", false);
  EXPECT_EQ(a.status, 200) << a.error;
  EXPECT_EQ(a.completion_tokens, 5);
}

GRADED_TEST(Lesson10Http, BadRequestsGet4xxAndTheServerStaysUp, 2) {
  const ModelWeights& m = testing::bundled_model();
  Server server(paged_engine(std::make_unique<CpuRunner>(m), 32, {.max_running = 4, .token_budget = 16}),
                {"tiny-fortunes", m.config}, {.http_threads = 8});
  const int port = server.start();
  struct Bad {
    std::string why, body;
    int status;
  };
  const std::vector<Bad> bad = {
      {"malformed JSON", R"({"model": "tiny-fortunes", "prompt": "hi)", 400},
      {"max_tokens of the wrong type", R"({"model": "tiny-fortunes", "prompt": "hi", "max_tokens": "many"})", 400},
      {"negative max_tokens", R"({"model": "tiny-fortunes", "prompt": "hi", "max_tokens": -1})", 400},
      {"top_p of 0", R"({"model": "tiny-fortunes", "prompt": "hi", "top_p": 0})", 400},
      {"an unknown model", R"({"model": "nope", "prompt": "hi"})", 404},
      {"a body of 3 MB", R"({"model": "tiny-fortunes", "prompt": ")" + std::string(3 << 20, 'x') + R"("})", 413},
      {"echo (not supported)", R"({"model": "tiny-fortunes", "prompt": "hi", "echo": true})", 400},
  };
  for (const Bad& b : bad) {
    const HttpReply r = http_post(kHost, port, "/v1/completions", b.body);
    EXPECT_EQ(r.status, b.status) << b.why << ": " << r.body.substr(0, 300);
    const json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(!j.is_discarded() && j.contains("error") && j["error"].contains("message"))
        << b.why << ": expected OpenAI's JSON error body, got " << r.body.substr(0, 300);
  }
  const Answer a = ask(port, false, R"({"model": "tiny-fortunes", "prompt": "hi", "max_tokens": 4})", false);
  EXPECT_EQ(a.status, 200) << "after the bad requests, a good one: " << a.error;
  EXPECT_EQ(http_get(kHost, port, "/health").first, 200);
}

}  // namespace
}  // namespace infer
