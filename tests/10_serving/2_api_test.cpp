// Lesson 10: checking requests before the engine sees them (parse_completion_request). Each bad
// request must be refused with OpenAI's error: the right status and the offending field named.
#include <string>
#include <vector>

#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/tokenizer.hpp"
#include "lessons/10_serving/api.hpp"

namespace infer {
namespace {

ApiModel tiny() { return {"tiny-fortunes", testing::bundled_model().config}; }

struct Bad {
  const char* why;
  Endpoint endpoint;
  std::string body;
  int status;
  const char* param;
  const char* code = "";
};

std::string long_prompt(size_t bytes) { return std::string(bytes, 'a'); }

/// A user message whose chat prompt takes every position of the context (256), BOS included.
std::string filling_chat_content() {
  const size_t frame = ByteTokenizer::encode(chat_prompt({{"user", ""}})).size();
  return long_prompt(256 - frame);
}

std::vector<Bad> bad_requests() {
  const auto C = Endpoint::Completions, Chat = Endpoint::ChatCompletions;
  return {
      {"not JSON", C, R"({"model": "tiny-fortunes", "prompt": )", 400, ""},
      {"JSON, not an object", C, R"(["tiny-fortunes"])", 400, ""},
      {"no model", C, R"({"prompt": "hi"})", 400, "model"},
      {"model of the wrong type", C, R"({"model": 7, "prompt": "hi"})", 400, "model"},
      {"an unknown model", C, R"({"model": "gpt-4", "prompt": "hi"})", 404, "model", "model_not_found"},
      {"no prompt", C, R"({"model": "tiny-fortunes"})", 400, "prompt"},
      {"prompt of the wrong type", C, R"({"model": "tiny-fortunes", "prompt": 12})", 400, "prompt"},
      {"an empty array of ids", C, R"({"model": "tiny-fortunes", "prompt": []})", 400, "prompt"},
      {"an id outside the vocabulary", C, R"({"model": "tiny-fortunes", "prompt": [1, 300]})", 400, "prompt"},
      {"a negative id", C, R"({"model": "tiny-fortunes", "prompt": [1, -4]})", 400, "prompt"},
      {"an id equal to the vocabulary's size", C, R"({"model": "tiny-fortunes", "prompt": [1, 259]})", 400, "prompt"},
      {"a fractional id", C, R"({"model": "tiny-fortunes", "prompt": [1, 66.5]})", 400, "prompt"},
      {"an id written 66.0", C, R"({"model": "tiny-fortunes", "prompt": [1, 66.0]})", 400, "prompt"},
      {"several prompts", C, R"({"model": "tiny-fortunes", "prompt": ["a", "b"]})", 400, "prompt"},
      {"negative max_tokens", C, R"({"model": "tiny-fortunes", "prompt": "hi", "max_tokens": -5})", 400, "max_tokens"},
      {"zero max_tokens", C, R"({"model": "tiny-fortunes", "prompt": "hi", "max_tokens": 0})", 400, "max_tokens"},
      {"max_tokens as a string", C, R"({"model": "tiny-fortunes", "prompt": "hi", "max_tokens": "10"})", 400, "max_tokens"},
      {"fractional max_tokens", C, R"({"model": "tiny-fortunes", "prompt": "hi", "max_tokens": 2.5})", 400, "max_tokens"},
      {"top_p of 0", C, R"({"model": "tiny-fortunes", "prompt": "hi", "top_p": 0})", 400, "top_p"},
      {"top_p above 1", C, R"({"model": "tiny-fortunes", "prompt": "hi", "top_p": 1.5})", 400, "top_p"},
      {"top_p as a string", C, R"({"model": "tiny-fortunes", "prompt": "hi", "top_p": "0.9"})", 400, "top_p"},
      {"top_p of 1e-50 (0 as the sampler's float)", C, R"({"model": "tiny-fortunes", "prompt": "hi", "top_p": 1e-50})",
       400, "top_p"},
      {"negative temperature", C, R"({"model": "tiny-fortunes", "prompt": "hi", "temperature": -0.1})", 400, "temperature"},
      {"temperature above 2", C, R"({"model": "tiny-fortunes", "prompt": "hi", "temperature": 2.5})", 400, "temperature"},
      {"top_k below -1", C, R"({"model": "tiny-fortunes", "prompt": "hi", "top_k": -2})", 400, "top_k"},
      {"a negative seed", C, R"({"model": "tiny-fortunes", "prompt": "hi", "seed": -1})", 400, "seed"},
      {"n of 2", C, R"({"model": "tiny-fortunes", "prompt": "hi", "n": 2})", 400, "n"},
      {"stream as a string", C, R"({"model": "tiny-fortunes", "prompt": "hi", "stream": "yes"})", 400, "stream"},
      {"include_usage as a string", C,
       R"({"model": "tiny-fortunes", "prompt": "hi", "stream": true, "stream_options": {"include_usage": "yes"}})", 400,
       "stream_options"},
      {"a prompt longer than the context", C,
       R"({"model": "tiny-fortunes", "prompt": ")" + long_prompt(300) + R"("})", 400, "prompt", "context_length_exceeded"},
      {"a prompt and the default 16 over the context", C,
       R"({"model": "tiny-fortunes", "prompt": ")" + long_prompt(245) + R"("})", 400, "prompt", "context_length_exceeded"},
      {"max_tokens over what the context leaves", C,
       R"({"model": "tiny-fortunes", "prompt": "hi", "max_tokens": 1000})", 400, "max_tokens", "context_length_exceeded"},
      {"chat: no messages", Chat, R"({"model": "tiny-fortunes"})", 400, "messages"},
      {"chat: empty messages", Chat, R"({"model": "tiny-fortunes", "messages": []})", 400, "messages"},
      {"chat: messages not an array", Chat, R"({"model": "tiny-fortunes", "messages": "hi"})", 400, "messages"},
      {"chat: a message without content", Chat, R"({"model": "tiny-fortunes", "messages": [{"role": "user"}]})", 400,
       "messages"},
      {"chat: an unknown role", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "wizard", "content": "hi"}]})", 400, "messages"},
      {"chat: a prompt longer than the context", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": ")" + long_prompt(400) + R"("}]})", 400,
       "messages", "context_length_exceeded"},
      {"stop as a number", C, R"({"model": "tiny-fortunes", "prompt": "hi", "stop": 5})", 400, "stop"},
      {"an empty stop sequence", C, R"({"model": "tiny-fortunes", "prompt": "hi", "stop": [""]})", 400, "stop"},
      {"a stop sequence that is not a string", C, R"({"model": "tiny-fortunes", "prompt": "hi", "stop": ["a", 1]})", 400,
       "stop"},
      {"five stop sequences", C, R"({"model": "tiny-fortunes", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]})",
       400, "stop"},
      {"logprobs above 5", C, R"({"model": "tiny-fortunes", "prompt": "hi", "logprobs": 6})", 400, "logprobs"},
      {"logprobs as a boolean (completions)", C, R"({"model": "tiny-fortunes", "prompt": "hi", "logprobs": true})", 400,
       "logprobs"},
      {"logprobs with a stream", C, R"({"model": "tiny-fortunes", "prompt": "hi", "logprobs": 2, "stream": true})", 400,
       "logprobs"},
      {"chat: top_logprobs without logprobs", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", 400,
       "top_logprobs"},
      {"chat: top_logprobs above 20", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}], "logprobs": true,
           "top_logprobs": 21})", 400, "top_logprobs"},
      {"chat: logprobs as a number", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}], "logprobs": 1})", 400, "logprobs"},
      {"chat: an image part (this model reads text only)", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": [{"type": "image_url",
           "image_url": {"url": "http://x/y.png"}}]}]})", 400, "messages"},
      {"chat: a text part without its text", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": [{"type": "text"}]}]})", 400, "messages"},
      {"chat: an empty array of parts", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": []}]})", 400, "messages"},
      {"chat: content of the wrong type", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": 5}]})", 400, "messages"},
      {"chat: a role that is not a string (named as the messages' mistake)", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": 5, "content": "hi"}]})", 400, "messages"},
      {"n of 0", C, R"({"model": "tiny-fortunes", "prompt": "hi", "n": 0})", 400, "n"},
      {"an empty stop string", C, R"({"model": "tiny-fortunes", "prompt": "hi", "stop": ""})", 400, "stop"},
      {"stream_options not an object", C,
       R"({"model": "tiny-fortunes", "prompt": "hi", "stream": true, "stream_options": true})", 400, "stream_options"},
      {"negative logprobs", C, R"({"model": "tiny-fortunes", "prompt": "hi", "logprobs": -1})", 400, "logprobs"},
      {"chat: negative top_logprobs", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}], "logprobs": true,
           "top_logprobs": -3})", 400, "top_logprobs"},
      {"chat: logprobs with a stream", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}], "logprobs": true,
           "stream": true})", 400, "logprobs"},
      {"chat: a prompt that fills the context exactly (nothing left to write)", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": ")" + filling_chat_content() + R"("}]})",
       400, "messages", "context_length_exceeded"},
      {"chat: max_completion_tokens over what the context leaves (named as sent)", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 1000})",
       400, "max_completion_tokens", "context_length_exceeded"},
      {"chat: negative max_completion_tokens", Chat,
       R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1})",
       400, "max_completion_tokens"},
  };
}

GRADED_TEST(Lesson10Api, BadRequestsAreRefusedWithTheirField, 4) {
  const ApiModel model = tiny();
  for (const Bad& b : bad_requests()) {
    try {
      parse_completion_request(b.body, b.endpoint, model);
      ADD_FAILURE() << b.why << ": accepted; expected HTTP " << b.status << " naming '" << b.param << "'";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), b.status) << b.why << ": " << e.what();
      EXPECT_EQ(e.param(), b.param) << b.why << ": the error must name the offending field (" << e.what() << ")";
      if (*b.code) {
        EXPECT_EQ(e.code(), b.code) << b.why << ": " << e.what();
      }
    } catch (const NotImplemented&) {
      throw;
    } catch (const std::exception& e) {
      ADD_FAILURE() << b.why << ": threw something other than ApiError: " << e.what();
    }
  }
}

GRADED_TEST(Lesson10Api, GoodRequestsBecomeEngineRequests, 3) {
  const ApiModel model = tiny();
  const CompletionRequest a = parse_completion_request(
      R"({"model": "tiny-fortunes", "prompt": "Hi!", "max_tokens": 40, "temperature": 0.5, "top_p": 0.9,
          "top_k": 20, "seed": 7, "stream": true, "stream_options": {"include_usage": true}, "user": "ignored"})",
      Endpoint::Completions, model);
  EXPECT_EQ(a.prompt, ByteTokenizer::encode("Hi!")) << "a string prompt is encoded with BOS first";
  EXPECT_EQ(a.max_tokens, 40);
  EXPECT_FLOAT_EQ(a.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(a.sampling.top_p, 0.9f);
  EXPECT_EQ(a.sampling.top_k, 20);
  EXPECT_EQ(a.sampling.seed, 7u);
  EXPECT_TRUE(a.stream);
  EXPECT_TRUE(a.include_usage);
  EXPECT_EQ(a.endpoint, Endpoint::Completions);
  EXPECT_TRUE(a.stop.empty()) << "no stop sequences unless asked";
  EXPECT_EQ(a.logprobs, -1) << "no log-probabilities unless asked";
  EXPECT_EQ(parse_completion_request(R"({"model": "tiny-fortunes", "prompt": "Hi", "logprobs": 3})", Endpoint::Completions,
                                     model).logprobs, 3);
  EXPECT_EQ(parse_completion_request(R"({"model": "tiny-fortunes", "prompt": "Hi", "logprobs": 0})", Endpoint::Completions,
                                     model).logprobs, 0) << "0: the sampled token's log-probability alone";
  const std::string chat_hi = R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "Hi"}])";
  EXPECT_EQ(parse_completion_request(chat_hi + R"(, "logprobs": true, "top_logprobs": 4})", Endpoint::ChatCompletions,
                                     model).logprobs, 4);
  EXPECT_EQ(parse_completion_request(chat_hi + R"(, "logprobs": true})", Endpoint::ChatCompletions, model).logprobs, 0);
  EXPECT_EQ(parse_completion_request(chat_hi + R"(, "logprobs": false})", Endpoint::ChatCompletions, model).logprobs, -1);
  const CompletionRequest stops = parse_completion_request(
      R"({"model": "tiny-fortunes", "prompt": "Hi", "stop": ["\n", "Q:"]})", Endpoint::Completions, model);
  EXPECT_EQ(stops.stop, (std::vector<std::string>{"\n", "Q:"}));
  const CompletionRequest one = parse_completion_request(R"({"model": "tiny-fortunes", "prompt": "Hi", "stop": "."})",
                                                         Endpoint::Completions, model);
  EXPECT_EQ(one.stop, (std::vector<std::string>{"."})) << "a single string is one stop sequence";

  const CompletionRequest d = parse_completion_request(R"({"model": "tiny-fortunes", "prompt": "Hi", "top_k": -1,
      "temperature": null})", Endpoint::Completions, model);
  EXPECT_EQ(d.max_tokens, 16) << "completions: max_tokens defaults to 16";
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f) << "absent or null: the default";
  EXPECT_FLOAT_EQ(d.sampling.top_p, 1.0f);
  EXPECT_EQ(d.sampling.top_k, 0) << "top_k -1 keeps every token, as 0 does";
  EXPECT_EQ(d.sampling.seed, 0u);
  EXPECT_FALSE(d.stream);

  const CompletionRequest ids =
      parse_completion_request(R"({"model": "tiny-fortunes", "prompt": [1, 80, 90], "max_tokens": 253})",
                               Endpoint::Completions, model);
  EXPECT_EQ(ids.prompt, (std::vector<int>{1, 80, 90})) << "token ids are taken as they are";
  EXPECT_EQ(ids.max_tokens, 253) << "3 + 253 = 256 positions: exactly the context fits";

  const CompletionRequest chat = parse_completion_request(
      R"({"model": "tiny-fortunes", "messages": [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Why?"}], "max_completion_tokens": 5})",
      Endpoint::ChatCompletions, model);
  EXPECT_EQ(chat.prompt, ByteTokenizer::encode(chat_prompt({{"system", "Be brief."}, {"user", "Why?"}})))
      << "a chat's prompt is chat_prompt() of its messages, encoded with BOS";
  EXPECT_EQ(chat.max_tokens, 5) << "chat accepts max_completion_tokens";
  EXPECT_EQ(chat.endpoint, Endpoint::ChatCompletions);

  const CompletionRequest parts = parse_completion_request(
      R"({"model": "tiny-fortunes", "messages": [{"role": "developer", "content": "Be brief."},
          {"role": "user", "content": [{"type": "text", "text": "Why"}, {"type": "text", "text": "not?"}]}],
          "max_tokens": 5})",
      Endpoint::ChatCompletions, model);
  EXPECT_EQ(parts.prompt, ByteTokenizer::encode(chat_prompt({{"developer", "Be brief."}, {"user", "Why\nnot?"}})))
      << "the developer role is accepted (OpenAI's newer name for system), and text parts are joined by newlines";

  const CompletionRequest rest = parse_completion_request(
      R"({"model": "tiny-fortunes", "messages": [{"role": "user", "content": "Why?"}]})", Endpoint::ChatCompletions, model);
  EXPECT_EQ(rest.max_tokens, 256 - static_cast<int>(rest.prompt.size())) << "chat: max_tokens defaults to what the context leaves";

  EXPECT_EQ(parse_completion_request(chat_hi + R"(, "max_tokens": 3, "max_completion_tokens": 7})",
                                     Endpoint::ChatCompletions, model).max_tokens, 3)
      << "max_tokens and max_completion_tokens both given: max_tokens counts";
  const int huge_k = parse_completion_request(R"({"model": "tiny-fortunes", "prompt": "Hi", "top_k": 4294967297})",
                                              Endpoint::Completions, model).sampling.top_k;
  EXPECT_TRUE(huge_k == 0 || huge_k >= model.config.vocab_size)
      << "top_k 4294967297, above the vocabulary, keeps every token (0, or the vocabulary's size), got " << huge_k
      << " (an int it wrapped to? 1 is greedy)";
  EXPECT_FLOAT_EQ(parse_completion_request(R"({"model": "tiny-fortunes", "prompt": "Hi", "temperature": 2.00000001})",
                                           Endpoint::Completions, model).sampling.temperature, 2.0f)
      << "temperature 2.00000001 is 2 as the sampler's float: accepted";
}

}  // namespace
}  // namespace infer
