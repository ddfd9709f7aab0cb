// Lesson 01 of the grader's test course: one function, worth 4 points.
#pragma once

namespace probe {
/// x * x.
int square(int x);
}  // namespace probe
