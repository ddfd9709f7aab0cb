#!/usr/bin/env python3
"""What the grader deletes between two gradings in one build tree, and what a failed build's row
says (ctest label `grader`).

    grader_outputs_test.py

tools/grader.py keeps the objects of the student's files whose text did not change since the last
grading in the tree, and deletes the rest: the objects of the changed files, and, where the kernels
are emulated, the host rewrite of a changed .cu file. Both checked on a made-up build tree: ninja
rebuilds an object only when its source is newer, so a file put back as it was before (a copy that
keeps its time, as tools/known_wrong.py makes between two entries) must lose its outputs here.
A build stopped by the memory cap (--build-memory-mb) says why it most likely grew, as one stopped
by the timeout does.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
import grader  # noqa: E402


def touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("x")


def main():
    with tempfile.TemporaryDirectory(prefix="grader-outputs-") as root:
        return check(root)


def check(root):
    failures = []
    student, build = os.path.join(root, "student"), os.path.join(root, "build")
    lesson = os.path.join(student, "08_topic")
    cpp, cu, hpp = (os.path.join(lesson, f) for f in ("cpu_side.cpp", "kernels.cu", "mine.hpp"))
    for p in (cpp, cu, hpp):
        touch(p)
    mine = grader.student_files(student, "08_topic")

    # changed_files: which files lose their objects (None: all of them).
    now = grader.file_digests(mine)
    edited = dict(now, **{cu: "0" * 64})
    cases = [
        ("no record of the last grading", now, None, None),
        ("nothing changed", now, now, []),
        ("the .cu file changed", edited, now, [cu]),
        ("a header changed", dict(now, **{hpp: "0" * 64}), now, None),
        ("a file added", dict(now, **{os.path.join(lesson, "more.cpp"): "0" * 64}), now, None),
        ("a file removed", {cpp: now[cpp]}, now, None),
    ]
    for what, a, b, expected in cases:
        got = grader.changed_files(a, b)
        if got != expected:
            failures.append(f"changed_files, {what}: {got}, expected {expected}")

    # remove_outputs: the objects of the changed files, the rewrite of a changed .cu file, the
    # library and the programs go; the given code's objects and the precompiled header stay.
    objects = os.path.join(build, "CMakeFiles", "lesson08_exercise.dir")
    rel = student.lstrip("/")
    files = {
        "given": os.path.join(objects, "lessons", "08_topic", "given.cpp.o"),
        "pch": os.path.join(objects, "cmake_pch.hxx.gch"),
        "cpp object": os.path.join(objects, rel, "08_topic", "cpu_side.cpp.o"),
        "cu object": os.path.join(objects, "emulated", rel, "08_topic", "kernels.cu.cpp.o"),
        "rewrite": os.path.join(build, "emulated", rel, "08_topic", "kernels.cu.cpp"),
        "library": os.path.join(build, "liblesson08_exercise.a"),
        "program": os.path.join(build, "bin", "lesson08_tests"),
    }
    rewrites = {cu: files["rewrite"]}
    for changed, gone in (([cu], {"cu object", "rewrite", "library", "program"}),
                          ([cpp], {"cpp object", "library", "program"}),
                          ([], {"library", "program"}),
                          (None, {"cpp object", "cu object", "rewrite", "library", "program"})):
        for p in files.values():
            touch(p)
        grader.remove_outputs(build, "08", [files["program"]], mine, changed, rewrites)
        left = {k for k, p in files.items() if os.path.exists(p)}
        if left != set(files) - gone:
            failures.append(f"remove_outputs, changed {changed}: deleted {sorted(set(files) - left)}, "
                            f"expected {sorted(gone)}")

    # build_error: a compiler stopped by the memory cap hears what most likely made it grow; any
    # other first error is the compiler's own words, the student's folder taken out of its path.
    oom = f"g++ -c {lesson}/forever.cpp\ncc1plus: out of memory allocating 65536 bytes after a total of 8589869056 bytes\n"
    plain = f"{lesson}/cpu_side.cpp:5:3: error: 'x' was not declared in this scope\n"
    for what, log, expected in (
            ("out of memory", oom, f"the compiler used up this build's 8192 MB (--build-memory-mb): {grader.NEVER_ENDS}\n"
             "cc1plus: out of memory allocating 65536 bytes after a total of 8589869056 bytes"),
            ("an error", plain, "08_topic/cpu_side.cpp:5:3: error: 'x' was not declared in this scope")):
        got = grader.build_error(log, student, 8192)
        if got != expected:
            failures.append(f"build_error, {what}: {got!r}, expected {expected!r}")

    if failures:
        print("\n".join(failures))
        return 1
    print(f"{len(cases)} changed_files cases, 4 remove_outputs cases and 2 build_error cases as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
