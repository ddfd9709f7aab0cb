// Lesson 00 of the grader's test course: one function, worth 5 points.
#pragma once

namespace probe {
/// a + b.
int add(int a, int b);
}  // namespace probe
