/// @file api.hpp
/// @brief Lesson 10's OpenAI-compatible request contract: what a JSON body must hold before the
/// engine sees it, and the error a client gets when it does not.
///
/// A server's first job is to say no, clearly. Every field a client sends is checked before a
/// request reaches the engine: a wrong type, a value out of range, a model this server does not
/// serve, a prompt longer than the context. Each gets an HTTP 4xx with OpenAI's error body, which
/// names the offending field, so that existing clients (and their users) see what went wrong.
/// Nothing is clamped or truncated in silence: a prompt that does not fit is refused, not cut.
///
/// You write parse_completion_request(). The JSON parsing and the typed field readers are given.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"

namespace infer {

/// A request the server refuses: an HTTP status and OpenAI's error body.
///
///     {"error": {"message": "...", "type": "invalid_request_error", "param": "top_p", "code": null}}
class ApiError : public Error {
 public:
  /// `status`: 400 (bad request), 401 (no or wrong API key), 404 (unknown model or route), 405
  /// (wrong method), 408 (the request did not arrive within the server's deadline), 411 (no
  /// length), 413 (body too large), 415 (not JSON, or encoded), 431
  /// (headers too large), 500 (the server failed), 503 (shutting down, or full), 505 (not
  /// HTTP/1.1).
  /// `param`: the offending field ("" when none); `code`: a machine-readable reason ("" when none).
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "");
  /// The HTTP status.
  int status() const { return status_; }
  /// The whole message, as given (what() stops at a NUL byte a client's value may hold).
  const std::string& message() const { return message_; }
  /// The offending field, or "".
  const std::string& param() const { return param_; }
  /// The machine-readable reason, or "".
  const std::string& code() const { return code_; }
  /// OpenAI's error type: "invalid_request_error" below 500, "server_error" from 500.
  std::string type() const;
  /// The JSON error body.
  std::string body() const;

 private:
  int status_;
  std::string message_, param_, code_;
};

/// The two endpoints that generate text.
enum class Endpoint {
  Completions,      ///< POST /v1/completions: "prompt"
  ChatCompletions,  ///< POST /v1/chat/completions: "messages"
};

/// What the server serves: the model's name (the "model" field must equal it) and shape.
struct ApiModel {
  std::string name;    ///< e.g. "tiny-fortunes"
  ModelConfig config;  ///< context length, vocabulary, BOS
};

/// A request that passed every check, ready for the engine.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::Completions;  ///< where it came
  std::vector<int> prompt;                    ///< token ids, BOS first, every id in the vocabulary
  int max_tokens = 16;                        ///< new tokens at most; prompt.size() + max_tokens <= the context
  SamplingParams sampling;                    ///< temperature, top_p, top_k, seed
  bool stream = false;                        ///< answer with server-sent events
  bool include_usage = false;                 ///< stream_options.include_usage: a last event with token counts
  /// Stop sequences: the text ends just before the first place one of them appears (not
  /// included), with finish_reason "stop", and the sequence leaves the engine at once.
  std::vector<std::string> stop;
  /// Log-probabilities with each token (not streamed): -1 none; N >= 0 the sampled token's and
  /// the N most likely tokens' (GenerationRequest::logprobs).
  int logprobs = -1;
};

/// Yours. Checks a request body and turns it into a CompletionRequest, or throws ApiError.
///
/// Fields (OpenAI's names; absent and null mean "the default"; fields not listed are ignored,
/// after the server's refuse_unsupported() has refused those that ask for something it lacks):
///
/// | field | type | rule | default |
/// | --- | --- | --- | --- |
/// | model | string | required; must equal model.name (else 404, code "model_not_found") | |
/// | prompt (completions) | string, or array of token ids | required; a string is encoded with BOS first (ByteTokenizer::encode: id 1, ByteTokenizer::kBos; an empty string is just BOS); ids are JSON integers (1.0 is refused), taken as they are, each in [0, vocab), at least one | |
/// | messages (chat) | array of {role, content} | required, non-empty; role is "system", "developer" (OpenAI's newer name for system), "user" or "assistant"; content a string, or a non-empty array of text parts (null is refused) {"type": "text", "text": string} joined by newlines (any other part, an image say, is refused); rendered by chat_prompt() | |
/// | max_tokens | integer | >= 1 (chat also accepts max_completion_tokens; if both come, max_tokens counts and the other is not read; a context error names whichever counted) | completions: 16; chat: what the context leaves (a prompt that leaves nothing is refused) |
/// | temperature | number | in [0, 2], checked as the float SamplingParams holds | 1 |
/// | top_p | number | in (0, 1], checked as the float SamplingParams holds (1e-50 is 0 there, and refused) | 1 |
/// | top_k | integer | >= 0, or -1 (both 0 and -1 keep every token; so does any k >= the vocabulary: a k past int's range too, so narrow it only after bounding it by the vocabulary) | 0 |
/// | seed | integer | >= 0 | 0 (for this parse; the server looks at the body itself, and gives a request that names no seed one of its own: a fresh sample each time, as OpenAI's API; "seed": 0 repeats like any seed) |
/// | n | integer | must be 1 | 1 |
/// | stream | boolean | | false |
/// | stream_options | object | {"include_usage": boolean}, other keys ignored; checked whether or not "stream" is true (ignored when it is not) | |
/// | stop | string, or array of strings | at most 4, each non-empty (a bare "" too is refused; an empty array: none) | none |
/// | logprobs (completions) | integer | in [0, 5]: the sampled token's log-probability and the N most likely tokens'; not with "stream": true | none |
/// | logprobs (chat) | boolean | true: each token's log-probability; not with "stream": true | false |
/// | top_logprobs (chat) | integer | in [0, 20]; any value without "logprobs": true is refused | 0 |
///
/// Every error is an ApiError with status 400 and `param` set to the top-level field's name (also
/// for a mistake inside it: a message's role is "messages", include_usage is "stream_options"),
/// except:
/// the body is not a JSON object (400, param ""); an unknown model (404, "model"); a prompt
/// and max_tokens that do not fit in the context together (400, param "max_tokens" when
/// max_tokens was given, else "prompt" or "messages", code "context_length_exceeded"). A
/// completions request's default of 16 does not shrink to fit: the request is refused like any other.
/// A body with several mistakes may be refused for any one of them.
CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint, const ApiModel& model);

// ------------------------------------------------------------------ given --

/// At most this many arrays and objects inside one another in a request body (OpenAI's requests
/// nest a few levels; reading or printing a value recurses once per level).
constexpr int kMaxJsonDepth = 64;

/// Parses `body` as a JSON object. Throws ApiError 400 (param "") for invalid JSON (saying where
/// and why), a NUL byte anywhere (JSON has none, and the parser would end the input there),
/// nesting deeper than kMaxJsonDepth, or a value that is not an object. Given.
nlohmann::json parse_json_object(std::string_view body);

/// Typed readers of `obj[name]` (given): std::nullopt when the field is absent or null; ApiError
/// 400 with param `name` when it has another type ("expected an integer, got a string").
/// get_integer() accepts only whole numbers (3, not 3.5 and not true); get_number() any number.
std::optional<long long> get_integer(const nlohmann::json& obj, const std::string& name);
/// Any number (an integer too).
std::optional<double> get_number(const nlohmann::json& obj, const std::string& name);
/// true or false.
std::optional<bool> get_bool(const nlohmann::json& obj, const std::string& name);
/// A string.
std::optional<std::string> get_string(const nlohmann::json& obj, const std::string& name);

/// A client's value as an error message quotes it (given): its JSON, cut after 200 bytes
/// ("...", then its length), so that a message says what was sent without sending it all back.
std::string shown(const nlohmann::json& value);

/// Refuses (ApiError 400, param the field) the OpenAI fields this server does not implement when
/// they ask for something: `echo`, `suffix`, `best_of` above 1, penalties, `logit_bias`,
/// `tools`, a `response_format` other than text. A client that sends `"echo": true` would
/// otherwise get no prompt back, in silence. Absent, null and default values pass. The server calls it before parse_completion_request(). Given.
void refuse_unsupported(const nlohmann::json& body);

/// One message of a chat.
struct ChatMessage {
  std::string role;     ///< "system", "developer", "user" or "assistant"
  std::string content;  ///< its text (text parts joined by newlines)
};

/// The prompt text of a chat (given). The bundled models were trained on plain text and know no
/// roles, so the template is plain too: the messages' contents in order, joined by newlines.
/// Real chat models each have their own template.
std::string chat_prompt(const std::vector<ChatMessage>& messages);

}  // namespace infer
