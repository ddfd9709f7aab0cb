#!/usr/bin/env python3
"""The grade report's cases that a machine cannot grade (ctest label `grader`).

    grade_report_test.py

A CUDA case where there is no device ("no gpu") and, on a GPU, a case that watches what a kernel
reads, which only the kernel emulator can ("emulator only"), are left out of a grade: neither
earned nor lost, in the points, the table, GitHub Classroom's results and the roster's note.
"""
import contextlib
import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))
import grade_report  # noqa: E402
import roster  # noqa: E402


def main():
    cases = {"L.Passes": ("08_x", 3, "a.cpp"), "L.Fails": ("08_x", 2, "a.cpp"),
             "L.NoGpu": ("08_x", 4, "b_cuda_test.cpp"), "L.Reads": ("08_x", 5, "b_cuda_test.cpp")}
    results = {"L.Passes": ("passed", ""), "L.Fails": ("failed", "", "wrong"),
               "L.NoGpu": ("no gpu", "", "not graded here"), "L.Reads": ("emulator only", "", "not graded here")}
    report = grade_report.build_report(cases, results)
    failures = []
    if (report["earned"], report["total"], report["ungraded"]) != (3, 5, 9):
        failures.append(f"earned/total/ungraded {report['earned']}/{report['total']}/{report['ungraded']}, "
                        "expected 3/5/9")
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        grade_report.print_table(report, False)
    for words in ("4 points of CUDA cases", "5 points of cases that watch what a kernel reads"):
        if words not in table.getvalue():
            failures.append(f"the table should say {words!r}:\n{table.getvalue()}")
    names = [t["name"] for t in grade_report.classroom_results(report)["lesson08"]["tests"]]
    if names != ["L.Passes", "L.Fails"]:
        failures.append(f"GitHub Classroom's results list {names}, expected the graded cases alone")
    note = roster.summarize(report)
    if "1 of 2 cases lost" not in note:
        failures.append(f"the roster's note counts the graded cases alone: {note!r}")
    failures += roster_note_and_hidden_tests()
    print("\n".join(failures) or "ungraded cases are left out of the points, the table, the classroom results "
          "and the roster's note; the note reads suspicious lines first and the lessons not started last; "
          "hidden tests that cannot be are refused")
    return 1 if failures else 0


def roster_note_and_hidden_tests():
    """The roster's note: suspicious lines first, then lost cases, then the lessons not started in one
    item; and grade_report.extra_tests_error() for folders that would grade without hidden tests."""
    failures = []
    cases = {"A.Done": ("00_a", 3, "a.cpp"), "B.One": ("01_b", 2, "b.cpp"), "B.Two": ("01_b", 2, "b.cpp"),
             "C.One": ("02_c", 2, "c.cpp"), "D.One": ("03_d", 2, "d.cpp")}
    todo = "lesson: x is not implemented yet"
    results = {"A.Done": ("passed", ""), "B.One": ("failed", "", "wrong"), "B.Two": ("passed", ""),
               "C.One": ("failed", "", todo), "D.One": ("failed", "", todo)}
    report = grade_report.build_report(cases, results)
    report["suspicious"] = {"00_a": ["a.cpp (compiled): includes the course's reference solution: solutions/00_a/a.cpp"]}
    note = roster.summarize(report)
    want = ("00: READ 1 suspicious line (includes the course's reference solution); 01: 1 of 2 cases lost; "
            "not started (every case not implemented): 02 03")
    if note != want:
        failures.append(f"the roster's note is {note!r}, expected {want!r}")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        root = os.path.dirname(os.path.dirname(HERE))
        lesson = grade_report.lesson_dirs(root)[0]
        os.makedirs(os.path.join(d, "hidden", lesson))
        with open(os.path.join(d, "hidden", lesson, "extra_test.cpp"), "w") as f:
            f.write("// a hidden test\n")
        for folder, words in ((os.path.join(d, "nowhere"), "not a folder"),
                              (os.path.join(d, "hidden", lesson), f"it is {lesson}/ itself"),
                              (d, "no lesson folder in it holds a *_test.cpp file"),
                              (os.path.join(d, "hidden"), None)):
            why = grade_report.extra_tests_error(folder, root)
            if (why is None) != (words is None) or (words and words not in why):
                failures.append(f"extra_tests_error({folder!r}) = {why!r}, expected {words!r}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
