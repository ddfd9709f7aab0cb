#!/usr/bin/env python3
"""What `./course check NN` prints after its table (grade_report.print_first_failure; ctest label
`grader`).

    first_failure_test.py

A lesson that does not compile: its first error, once, and no case named as the first failure
(the error may lie anywhere; a case's README section would point away from it). A case whose
numbers differ: the checked build named, where the check passes one (`./course check NN --debug`).
A case that failed one of Eigen's checks (the checked build): the gdb line that shows where.
"""
import contextlib
import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import grade_report  # noqa: E402

LESSON = "00_naive_decoder"
CASES = {"Lesson00Ops.RmsNormMatchesReference": (LESSON, 2, "1_ops_test.cpp"),
         "Lesson00Ops.SwigluMatchesReference": (LESSON, 2, "1_ops_test.cpp")}
DIFFER = ("rms_norm of a [5, 48] input: 235 of 240 values differ by more than atol 1e-05 + rtol 0.0001 * "
          "|expected| (largest difference 4.9412)")
EIGEN = ("C++ exception with description \"Eigen's check failed: aLhs.rows() == aRhs.rows() (two operands of "
         "different shapes: a row where a column was meant, or the other way?)\" thrown in the test body.")


def printed(results, **kwargs):
    """What print_first_failure prints for `results` ({name: dict}), and what it returned."""
    report = grade_report.build_report(CASES, {n: (r["status"], r.get("output", ""), r.get("message"))
                                               for n, r in results.items()})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        shown = grade_report.print_first_failure(report, results, ROOT, None, **kwargs)
    return out.getvalue(), shown


def main():
    failures = []
    error = "00_naive_decoder/naive_decoder.cpp:49:48: error: 'const struct LayerWeights' has no member named 'up'"
    not_built = {n: {"status": "not built", "message": f"lesson 00 did not build:\n{error}"} for n in CASES}
    text, shown = printed(not_built, checked_build="./course check 00 --debug")
    if not shown or text.count(error) != 1 or "does not compile" not in text or "First failing case" in text \
            or "Read:" in text:
        failures.append(f"a lesson that does not compile should print its first error once, no case:\n{text}")

    failed = {n: {"status": "failed", "message": DIFFER, "output": ""} for n in CASES}
    text, _ = printed(failed, checked_build="./course check 00 --debug")
    if "`./course check 00 --debug`" not in text or "First failing case: Lesson00Ops.RmsNormMatchesReference" not in text:
        failures.append(f"numbers that differ should name the checked build:\n{text}")
    text, _ = printed(failed)
    if "--debug" in text:
        failures.append(f"without a checked build to name (the checked build itself), none is named:\n{text}")
    other = {n: {"status": "failed", "message": "lesson 00: rms_norm is not implemented yet", "output": ""}
             for n in CASES}
    text, _ = printed(other, checked_build="./course check 00 --debug")
    if "--debug" in text:
        failures.append(f"a failure that is not about numbers names no checked build:\n{text}")

    program = os.path.join("build", "debug", "bin", "lesson00_tests")
    eigen = {n: {"status": "failed", "message": EIGEN, "output": "", "program": program} for n in CASES}
    text, _ = printed(eigen)
    gdb = (f"gdb -q -batch -ex 'catch throw' -ex run -ex bt --args {program} "
           "--gtest_filter=Lesson00Ops.RmsNormMatchesReference")
    if gdb not in text:
        failures.append(f"a failed Eigen check should give the gdb line that shows where:\n{text}")

    print("\n".join(failures) or "a lesson that does not compile shows its first error once; numbers that differ "
          "name the checked build; a failed Eigen check gives its gdb line")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
