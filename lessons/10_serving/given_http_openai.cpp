// Lesson 10's server, the OpenAI format room (given): the bodies of whole and streamed answers.
#include <algorithm>
#include <ctime>

#include "common/tokenizer.hpp"
#include "lessons/10_serving/server_parts.hpp"

namespace infer::server {

using nlohmann::json;

size_t complete_utf8(const std::string& bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;  // a lead byte whose sequence is not complete yet
  }
  return n;
}

size_t find_stop(const std::string& text, size_t from, const std::vector<std::string>& stops) {
  size_t first = std::string::npos;
  for (const std::string& s : stops) {
    const size_t start = from >= s.size() ? from - s.size() + 1 : 0;  // it may begin before `from`
    first = std::min(first, text.find(s, start));
  }
  return first;
}

size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const std::string& s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > held; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        held = n;
        break;
      }
  return held;
}

size_t stop_point(const Job& job, std::span<const TokenEvent> fresh) {
  const std::vector<std::string>& stops = job.request.stop;
  if (stops.empty() || fresh.empty()) return std::string::npos;
  std::vector<int> all = job.tokens;
  for (const TokenEvent& e : fresh) all.push_back(e.token);
  const size_t before = ByteTokenizer::decode(job.tokens).size();
  const size_t at = find_stop(ByteTokenizer::decode(all), before, stops);
  if (at == std::string::npos) return std::string::npos;
  size_t keep = 0, bytes = 0;  // the tokens whose text ends at or before the stop
  while (keep < all.size()) {
    const size_t n = ByteTokenizer::decode(std::span<const int>(&all[keep], 1)).size();
    if (bytes + n > at) break;
    bytes += n, ++keep;
  }
  return keep;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {

/// What every body starts with: its id, object type, time and model.
json envelope(const Job& job, const std::string& model, const char* object, const char* chat_object) {
  const bool chat = job.request.endpoint == Endpoint::ChatCompletions;
  return {{"id", cat(chat ? "chatcmpl-" : "cmpl-", job.id)},
          {"object", chat ? chat_object : object},
          {"created", static_cast<long long>(std::time(nullptr))},
          {"model", model}};
}

json usage(const Job& job, int completion_tokens) {
  const int prompt = static_cast<int>(job.request.prompt.size());
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion_tokens}, {"total_tokens", prompt + completion_tokens}};
}

}  // namespace

/// A job's log-probabilities in OpenAI's shape: for chat, {"content": [{token, logprob, bytes,
/// top_logprobs}]}; for completions, {tokens, token_logprobs, top_logprobs, text_offset}.
json logprobs_body(const Job& job) {
  const bool chat = job.request.endpoint == Endpoint::ChatCompletions;
  const auto text = [](int token) { return ByteTokenizer::decode(std::span<const int>(&token, 1)); };
  const auto bytes = [&](int token) {
    json b = json::array();
    for (const unsigned char c : text(token)) b.push_back(c);
    return b;
  };
  json content = json::array(), tokens = json::array(), token_logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  size_t offset = 0;
  for (const TokenEvent& e : job.logprobs) {
    json top_chat = json::array(), top_completion = json::object();
    for (const auto& [id, lp] : e.top) {
      top_chat.push_back({{"token", text(id)}, {"logprob", lp}, {"bytes", bytes(id)}});
      top_completion[text(id)] = lp;
    }
    content.push_back({{"token", text(e.token)}, {"logprob", e.logprob}, {"bytes", bytes(e.token)}, {"top_logprobs", top_chat}});
    tokens.push_back(text(e.token));
    token_logprobs.push_back(e.logprob);
    tops.push_back(top_completion);
    offsets.push_back(offset);
    offset += text(e.token).size();
  }
  if (chat) return {{"content", content}};
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json completion_body(const Job& job, const std::string& model, const std::string& text, int completion_tokens,
                     const std::string& reason) {
  const bool chat = job.request.endpoint == Endpoint::ChatCompletions;
  json choice = {{"index", 0}, {"finish_reason", reason},
                 {"logprobs", job.request.logprobs >= 0 ? logprobs_body(job) : json(nullptr)}};
  if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  json body = envelope(job, model, "text_completion", "chat.completion");
  body["choices"] = json::array({choice});
  body["usage"] = usage(job, completion_tokens);
  return body;
}

json chunk_body(const Job& job, const std::string& model, const std::string* text, const json& finish_reason,
                bool role) {
  const bool chat = job.request.endpoint == Endpoint::ChatCompletions;
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  if (chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (text) delta["content"] = *text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text ? *text : "";
  }
  json body = envelope(job, model, "text_completion", "chat.completion.chunk");
  body["choices"] = json::array({choice});
  return body;
}

json usage_chunk(const Job& job, const std::string& model, int completion_tokens) {
  json body = envelope(job, model, "text_completion", "chat.completion.chunk");
  body["choices"] = json::array();
  body["usage"] = usage(job, completion_tokens);
  return body;
}

}  // namespace infer::server
