// Lesson 10, your turn: saying no, clearly. Check a request body before the engine sees it.
//
// Replace the `throw NotImplemented(...)`. The contract (every field, its type, its range, its
// default, and which error each mistake gets) is the table in lessons/10_serving/api.hpp; the
// lesson text is lessons/10_serving/README.md, Step 3. Check your work with `./course check 10`.
// Given in lessons/10_serving/given_api.cpp: parse_json_object(), the typed readers
// get_integer/get_number/get_bool/get_string (they refuse a wrong type for you) and chat_prompt().
// Stuck? `./course hint 10 parse_completion_request`.
#include "common/tokenizer.hpp"
#include "lessons/10_serving/api.hpp"

namespace infer {

CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint, const ApiModel& model) {
  (void)body, (void)endpoint, (void)model;
  throw NotImplemented("10", "parse_completion_request");
}

}  // namespace infer
