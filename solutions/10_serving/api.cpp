// Lesson 10, reference: checking an OpenAI-style request before the engine sees it.
#include "common/tokenizer.hpp"
#include "lessons/10_serving/api.hpp"

namespace infer {

using nlohmann::json;

namespace {

std::vector<int> completion_prompt(const json& body, const ApiModel& model) {
  const auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
  if (it->is_string()) return ByteTokenizer::encode(it->get<std::string>());
  if (!it->is_array() || it->empty())
    throw ApiError(400, cat("'prompt' must be a string or a non-empty array of token ids, got ", it->type_name()),
                   "prompt");
  std::vector<int> ids;
  const long long vocab = model.config.vocab_size;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& v = (*it)[i];
    if (!v.is_number_integer())
      throw ApiError(400, cat("'prompt[", i, "]' must be a token id (an integer), got ", v.type_name(), " (", shown(v),
                              "); one prompt per request"),
                     "prompt");
    // (An id above the largest long long is an unsigned number: read as one, it would wrap.)
    const bool inside = v.is_number_unsigned() ? v.get<unsigned long long>() < static_cast<unsigned long long>(vocab)
                                               : v.get<long long>() >= 0 && v.get<long long>() < vocab;
    if (!inside)
      throw ApiError(400, cat("'prompt[", i, "]' is token id ", shown(v), ", outside the vocabulary [0, ", vocab, ")"),
                     "prompt");
    ids.push_back(v.get<int>());
  }
  return ids;
}

std::vector<int> chat_messages_prompt(const json& body) {
  const auto it = body.find("messages");
  if (it == body.end() || it->is_null()) throw ApiError(400, "'messages' is required", "messages");
  if (!it->is_array() || it->empty())
    throw ApiError(400, cat("'messages' must be a non-empty array of messages, got ",
                            it->is_array() ? "an empty array" : it->type_name()),
                   "messages");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = cat("messages[", i, "]");
    if (!m.is_object()) throw ApiError(400, cat("'", where, "' must be an object, got ", m.type_name()), "messages");
    const auto role = m.find("role"), content = m.find("content");
    const auto known = [](const std::string& r) {
      return r == "system" || r == "developer" || r == "user" || r == "assistant";
    };
    if (role == m.end() || !role->is_string() || !known(role->get<std::string>()))
      throw ApiError(400, cat("'", where, ".role' must be \"system\", \"developer\", \"user\" or \"assistant\", got ",
                              role == m.end() ? "none" : shown(*role)),
                     "messages");
    if (content != m.end() && content->is_string()) {
      messages.push_back({role->get<std::string>(), content->get<std::string>()});
      continue;
    }
    // Text parts, as most clients send them: [{"type": "text", "text": "..."}, ...], joined by newlines.
    if (content == m.end() || !content->is_array() || content->empty())
      throw ApiError(400, cat("'", where, ".content' must be a string or a non-empty array of text parts, got ",
                              content == m.end() ? "none" : shown(*content)),
                     "messages");
    std::string text;
    for (size_t j = 0; j < content->size(); ++j) {
      const json& part = (*content)[j];
      const std::string at = cat(where, ".content[", j, "]");
      if (!part.is_object() || !part.contains("type") || part["type"] != "text")
        throw ApiError(400, cat("'", at, "' must be a text part, {\"type\": \"text\", \"text\": ...} (this model reads text only), got ",
                                shown(part)),
                       "messages");
      if (!part.contains("text") || !part["text"].is_string())
        throw ApiError(400, cat("'", at, ".text' must be a string, got ", part.contains("text") ? shown(part["text"]) : "none"),
                       "messages");
      text += (j > 0 ? "\n" : "") + part["text"].get<std::string>();
    }
    messages.push_back({role->get<std::string>(), text});
  }
  return ByteTokenizer::encode(chat_prompt(messages));
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view text, Endpoint endpoint, const ApiModel& model) {
  const json body = parse_json_object(text);
  const bool chat = endpoint == Endpoint::ChatCompletions;

  const auto name = get_string(body, "model");
  if (!name) throw ApiError(400, "'model' is required", "model");
  if (*name != model.name)
    throw ApiError(404, cat("The model ", shown(*name), " does not exist; this server serves '", model.name, "'"), "model",
                   "model_not_found");

  CompletionRequest r;
  r.endpoint = endpoint;
  r.prompt = chat ? chat_messages_prompt(body) : completion_prompt(body, model);

  std::optional<long long> max_tokens = get_integer(body, "max_tokens");
  std::string max_param = "max_tokens";
  if (chat && !max_tokens) {
    max_tokens = get_integer(body, "max_completion_tokens");
    max_param = "max_completion_tokens";
  }
  if (max_tokens && *max_tokens < 1)
    throw ApiError(400, cat("'", max_param, "' must be >= 1, got ", *max_tokens), max_param);
  const long context = model.config.max_position_embeddings;
  const long prompt = static_cast<long>(r.prompt.size());
  const long wanted = max_tokens ? static_cast<long>(std::min<long long>(*max_tokens, 1LL << 40))
                                 : (chat ? context - prompt : 16);
  if (prompt + std::max(wanted, 1L) > context)
    throw ApiError(400,
                   cat("This model's maximum context length is ", context, " tokens. However, you requested ",
                       prompt + std::max(wanted, 1L), " tokens (", prompt, " in the ", chat ? "messages" : "prompt",
                       ", ", std::max(wanted, 1L), " in the completion). Please reduce the length of the ",
                       chat ? "messages" : "prompt", " or completion."),
                   max_tokens ? max_param : (chat ? "messages" : "prompt"), "context_length_exceeded");
  r.max_tokens = static_cast<int>(wanted);

  if (const auto t = get_number(body, "temperature")) {
    const float temperature = static_cast<float>(*t);
    if (!(temperature >= 0.0f && temperature <= 2.0f))
      throw ApiError(400, cat("'temperature' must be in [0, 2], got ", shown(*t)), "temperature");
    r.sampling.temperature = temperature;
  }
  if (const auto p = get_number(body, "top_p")) {
    const float top_p = static_cast<float>(*p);  // checked as the sampler will hold it: 1e-50 is 0 in a float
    if (!(top_p > 0.0f && top_p <= 1.0f)) throw ApiError(400, cat("'top_p' must be in (0, 1], got ", shown(*p)), "top_p");
    r.sampling.top_p = top_p;
  }
  if (const auto k = get_integer(body, "top_k")) {
    if (*k < -1) throw ApiError(400, cat("'top_k' must be >= 0, or -1 (every token), got ", *k), "top_k");
    r.sampling.top_k = *k <= 0 ? 0 : static_cast<int>(std::min<long long>(*k, model.config.vocab_size));
  }
  if (const auto seed = get_integer(body, "seed")) {
    if (*seed < 0) throw ApiError(400, cat("'seed' must be >= 0, got ", *seed), "seed");
    r.sampling.seed = static_cast<uint64_t>(*seed);
  }
  if (const auto n = get_integer(body, "n"); n && *n != 1)
    throw ApiError(400, cat("'n' must be 1 (one choice per request), got ", *n), "n");
  r.stream = get_bool(body, "stream").value_or(false);
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw ApiError(400, cat("'stream_options' must be an object, got ", it->type_name()), "stream_options");
    try {
      r.include_usage = get_bool(*it, "include_usage").value_or(false);
    } catch (const ApiError& e) {  // named by the top-level field, as every mistake inside one
      throw ApiError(400, e.message(), "stream_options");
    }
  }
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (!it->is_string() && !it->is_array())
      throw ApiError(400, cat("'stop' must be a string or an array of strings, got ", it->type_name()), "stop");
    const json list = it->is_string() ? json::array({*it}) : *it;
    if (list.size() > 4) throw ApiError(400, cat("'stop' holds at most 4 sequences, got ", list.size()), "stop");
    for (const json& s : list) {
      if (!s.is_string() || s.get<std::string>().empty())
        throw ApiError(400, cat("'stop' sequences must be non-empty strings, got ", shown(s)), "stop");
      r.stop.push_back(s.get<std::string>());
    }
  }
  if (!chat) {
    if (const auto n = get_integer(body, "logprobs")) {
      if (*n < 0 || *n > 5) throw ApiError(400, cat("'logprobs' must be in [0, 5], got ", *n), "logprobs");
      r.logprobs = static_cast<int>(*n);
    }
  } else {
    const bool wanted = get_bool(body, "logprobs").value_or(false);
    const auto top = get_integer(body, "top_logprobs");
    if (top && (*top < 0 || *top > 20)) throw ApiError(400, cat("'top_logprobs' must be in [0, 20], got ", *top), "top_logprobs");
    if (top && !wanted) throw ApiError(400, "'top_logprobs' needs \"logprobs\": true", "top_logprobs");
    if (wanted) r.logprobs = static_cast<int>(top.value_or(0));
  }
  if (r.logprobs >= 0 && r.stream)
    throw ApiError(400, "'logprobs' is not supported with \"stream\": true on this server", "logprobs");
  return r;
}

}  // namespace infer
