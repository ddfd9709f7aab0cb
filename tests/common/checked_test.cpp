// The checked build's header (common/checked.hpp, `./course check NN --debug`): compiled here
// as that build compiles every file (the header first, NDEBUG left out), whatever this build's
// flags. A shape mistake that an optimized build runs into silently, reading past a vector's end,
// throws with the check's name; so does an index out of range; a right expression passes.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include <Eigen/Dense>

#ifdef NDEBUG
#error "checked_test.cpp is compiled without NDEBUG (tests/common/CMakeLists.txt): Eigen's checks must be on"
#endif

namespace {

/// The message of the std::logic_error `f` throws, or "" if it throws none.
template <typename F>
std::string thrown(F f) {
  try {
    f();
  } catch (const std::logic_error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckedBuild, ARowTimesAColumnElementByElementNamesTheShapes) {
  // RMSNorm's slip: a row of x scaled element by element by a column of weights.
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(3, 8);
  const Eigen::VectorXf w = Eigen::VectorXf::Random(8);
  const std::string said = thrown([&] {
    const Eigen::RowVectorXf y = x.row(1).cwiseProduct(w);
    (void)y;
  });
  EXPECT_NE(said.find("Eigen's check failed"), std::string::npos) << said;
  EXPECT_NE(said.find("different shapes"), std::string::npos) << said;
  const Eigen::RowVectorXf right = x.row(1).cwiseProduct(w.transpose());  // what was meant: no throw
  EXPECT_FLOAT_EQ(right(2), x(1, 2) * w(2));
}

TEST(CheckedBuild, AnIndexPastTheEndNamesTheIndex) {
  const Eigen::VectorXf v = Eigen::VectorXf::Zero(4);
  const std::string said = thrown([&] { return v(4); });
  EXPECT_NE(said.find("index out of range"), std::string::npos) << said;
  EXPECT_EQ(thrown([&] { return v(3); }), "");
}

TEST(CheckedBuild, AProductOfMismatchedInnerSizesIsCaught) {
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(2, 3), b = Eigen::MatrixXf::Random(4, 5);
  EXPECT_NE(thrown([&] {
              const Eigen::MatrixXf c = a * b;
              (void)c;
            }).find("Eigen's check failed"),
            std::string::npos);
}

}  // namespace
