#include "common/testing/graded.hpp"
#include "lessons/01_other/other.hpp"

GRADED_TEST(Other, SquaresThree, 4) { EXPECT_EQ(probe::square(3), 9); }
