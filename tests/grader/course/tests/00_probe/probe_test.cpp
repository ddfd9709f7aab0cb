#include "common/testing/graded.hpp"
#include "lessons/00_probe/probe.hpp"

GRADED_TEST(Probe, AddsSmallNumbers, 3) { EXPECT_EQ(probe::add(2, 3), 5); }
GRADED_TEST(Probe, AddsNegativeNumbers, 2) { EXPECT_EQ(probe::add(-2, -3), -5); }
