// Lesson 10: the JSON plumbing of the OpenAI-compatible API (given).
#include <climits>
#include <cmath>

#include "lessons/10_serving/api.hpp"

namespace infer {

using nlohmann::json;

ApiError::ApiError(int status, const std::string& message, std::string param, std::string code)
    : Error(message), status_(status), message_(message), param_(std::move(param)), code_(std::move(code)) {}

std::string ApiError::type() const {
  return status_ >= 500 && status_ != 505 ? "server_error" : "invalid_request_error";  // (505: the client's HTTP version)
}

std::string ApiError::body() const {
  json err = {{"message", message_}, {"type", type()}, {"param", nullptr}, {"code", nullptr}};
  if (!param_.empty()) err["param"] = param_;
  if (!code_.empty()) err["code"] = code_;
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

/// `text`, cut after 200 bytes ("...", then its length) and never inside a UTF-8 character.
std::string shown_text(const std::string& text) {
  constexpr size_t kShown = 200;
  if (text.size() <= kShown) return text;
  size_t cut = kShown;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cat(text.substr(0, cut), "... (", text.size(), " bytes)");
}

}  // namespace

json parse_json_object(std::string_view body) {
  const std::string invalid = "We could not parse the JSON body of your request: it is not valid JSON";
  if (const size_t nul = body.find('\0'); nul != std::string_view::npos)
    throw ApiError(400, cat(invalid, " (a NUL byte at byte ", nul, "; inside a string, write it as \\u0000)"));
  // The depth first: the parser itself does not recurse, but printing or copying a value does.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if ((c == '[' || c == '{') && ++depth > kMaxJsonDepth) {
      throw ApiError(400, cat("The JSON body nests arrays and objects more than ", kMaxJsonDepth,
                              " levels deep (at byte ", i, "); this server reads at most ", kMaxJsonDepth));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // a syntax error, or a number beyond a double (1e400)
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ...": the
    // reason, not the tag, and not all of what it quotes of the body (up to a megabyte).
    std::string why = e.what();
    if (const size_t tag = why.find("] "); why.rfind("[json.exception", 0) == 0 && tag != std::string::npos)
      why = why.substr(tag + 2);
    throw ApiError(400, cat(invalid, ": ", shown_text(why)));
  }
  if (!j.is_object())
    throw ApiError(400, cat("The request body must be a JSON object, got ", j.type_name()));
  return j;
}

namespace {

const json* field(const json& obj, const std::string& name) {
  const auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong_type(const std::string& name, const char* expected, const json& got) {
  throw ApiError(400, cat("'", name, "' must be ", expected, ", got ", got.type_name(), " (", shown(got), ")"), name);
}

}  // namespace

std::string shown(const json& value) { return shown_text(value.dump(-1, ' ', false, json::error_handler_t::replace)); }

std::optional<long long> get_integer(const json& obj, const std::string& name) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned() && v->get<unsigned long long>() > static_cast<unsigned long long>(LLONG_MAX))
    throw ApiError(400, cat("'", name, "' is too large: ", shown(*v)), name);
  if (v->is_number_integer()) return v->get<long long>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::trunc(d) == d) {  // 3.0, not 3.5
      if (d > -9e18 && d < 9e18) return static_cast<long long>(d);
      throw ApiError(400, cat("'", name, "' is too large: ", shown(*v)), name);
    }
  }
  wrong_type(name, "an integer", *v);
}

std::optional<double> get_number(const json& obj, const std::string& name) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (v->is_number()) return v->get<double>();
  wrong_type(name, "a number", *v);
}

std::optional<bool> get_bool(const json& obj, const std::string& name) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (v->is_boolean()) return v->get<bool>();
  wrong_type(name, "a boolean", *v);
}

std::optional<std::string> get_string(const json& obj, const std::string& name) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  wrong_type(name, "a string", *v);
}

void refuse_unsupported(const json& body) {
  const auto given = [&](const char* name) -> const json* {
    const auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  const auto refuse = [](const std::string& name, const std::string& what) {
    throw ApiError(400, cat("'", name, "' is not supported by this server (", what, ")"), name);
  };
  for (const char* name : {"logit_bias", "tools", "functions"})
    if (const json* v = given(name); v && !(v->is_array() || v->is_object() ? v->empty() : v->is_string() && v->get<std::string>().empty()))
      refuse(name, "leave it out or null");
  for (const char* name : {"echo"})
    if (const json* v = given(name); v && !(v->is_boolean() && !v->get<bool>()) && !(v->is_number() && v->get<double>() == 0))
      refuse(name, "leave it out, null or false");
  for (const char* name : {"presence_penalty", "frequency_penalty"})
    if (const json* v = given(name); v && !(v->is_number() && v->get<double>() == 0))
      refuse(name, "leave it out, null or 0");
  if (const json* v = given("best_of"); v && !(v->is_number() && v->get<double>() == 1)) refuse("best_of", "only 1");
  if (const json* v = given("suffix"); v && !(v->is_string() && v->get<std::string>().empty())) refuse("suffix", "leave it out or null");
  if (const json* v = given("response_format");
      v && !(v->is_object() && v->contains("type") && (*v)["type"].is_string() && (*v)["type"].get<std::string>() == "text"))
    refuse("response_format", "only {\"type\": \"text\"}");
}

std::string chat_prompt(const std::vector<ChatMessage>& messages) {
  std::string text;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i > 0) text += '\n';
    text += messages[i].content;
  }
  return text;
}

}  // namespace infer
