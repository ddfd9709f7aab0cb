// An example of an instructor's hidden test for lesson 00 (docs: the instructors' page).
//
// Hidden tests live outside the students' repository (a private one of the instructor's), in
// the course's layout: DIR/NN_topic/*_test.cpp, here DIR/00_naive_decoder/hidden_test.cpp. They
// are graded against the student's lesson exactly like the course's own tests:
//
//   ./course grade --roster class/ --extra-tests DIR
//
// Each GRADED_TEST(Suite, Name, points) is a GoogleTest case worth `points`; keep it on one line
// with literal arguments (the grade report reads the points from the source). Name suites after
// the lesson and the word Hidden, so a report shows at a glance which cases the students never
// saw. A good hidden test checks a property the visible tests imply but do not spell out: an
// implementation tuned to the visible cases fails it; a correct one cannot.
#include <vector>

#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"

namespace infer {
namespace {

// Causality: the logits of a prompt's first n positions do not depend on what follows them.
// The forward of a prefix must equal the first rows of the forward of the whole prompt.
GRADED_TEST(Lesson00Hidden, ForwardOfAPrefixIsThePrefixOfTheForward, 2) {
  const ModelWeights& model = testing::small_model();
  const std::vector<int> tokens = {1, 7, 3, 22, 9, 14, 30, 5, 11};
  const Matrix whole = forward(model, tokens);
  for (int n : {1, 4, 8}) {
    const Matrix prefix = forward(model, std::span<const int>(tokens).first(n));
    // The same arithmetic on the same rows, up to the order of float32 sums: 1e-5 + 1e-4 |x|.
    EXPECT_TRUE(testing::all_close(whole.topRows(n), prefix, 1e-5, 1e-4, "the first rows of the whole prompt"));
  }
}

}  // namespace
}  // namespace infer
