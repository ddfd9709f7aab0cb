#!/usr/bin/env python3
"""The grade report: points per lesson, from the tests' sources and a JUnit file.

tools/grader.py (./course grade and check) uses this module for its table, JSON and CSV; run
on its own, it reads ctest's JUnit (the CI check that every graded case fails on the starters).

    tools/grade_report.py --junit build/grade/junit.xml [--extra-tests DIR]
                          [--json FILE] [--csv FILE] [--lesson NN] [--quiet]
                          [--expect-none-pass] [--first-failure]

Points come from the GRADED_TEST(Suite, Name, points) lines of tests/NN_topic/*_test.cpp
(and of an instructor's extra tests), so a lesson whose tests failed to compile still shows
what it was worth. A case earns its points when ctest ran it and it passed; failed, crashed,
timed out, skipped (no GPU) and never built all earn zero.

--expect-none-pass is the check of the exercise set itself: it exits 1 if any graded case
passes (a test that passes on an untouched starter tests nothing).
--first-failure prints the first failing case's message and the README section to read.
"""
import argparse
import base64
import csv
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The states of a case this machine cannot grade, left out of its grade (neither earned nor lost):
# a CUDA case where there is no device ("no gpu"), and on a GPU a case that watches what a kernel
# reads, which only the kernel emulator can see ("emulator only": `./course check NN --emulate`).
UNGRADED = ("no gpu", "emulator only")
GRADED = re.compile(r"^\s*GRADED_TEST\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\d+)\s*\)", re.M)


def lesson_dirs(root=ROOT):
    return sorted(d for d in os.listdir(os.path.join(root, "lessons")) if re.match(r"\d\d_", d))


def graded_cases(extra_dir=None, root=ROOT):
    """{test name: (lesson dir, points, source file)} from the sources."""
    cases = {}
    roots = [os.path.join(root, "tests")] + ([extra_dir] if extra_dir else [])
    for lesson in lesson_dirs(root):
        for root in roots:
            for path in sorted(glob.glob(os.path.join(glob.escape(root), lesson, "*_test.c*"))):
                with open(path, encoding="utf-8") as f:
                    for suite, name, points in GRADED.findall(f.read()):
                        cases[f"{suite}.{name}"] = (lesson, int(points), path)
    return cases


def extra_tests_error(extra_dir, root=ROOT):
    """Why `extra_dir` cannot be an instructor's hidden tests at all (None: it can): not a folder,
    or no folder in it named after a lesson holding a *_test.cpp file (a lesson's own folder given
    in place of its parent, say), which would grade without them and say nothing."""
    if not os.path.isdir(extra_dir):
        return f"--extra-tests {extra_dir}: not a folder (expected one folder per lesson, such as 00_naive_decoder/)"
    lessons = lesson_dirs(root)
    if any(glob.glob(os.path.join(glob.escape(extra_dir), l, "*_test.cpp")) for l in lessons):
        return None
    here = os.path.basename(os.path.normpath(extra_dir))
    hint = (f"; it is {here}/ itself: give the folder that holds it" if here in lessons
            else f"; expected folders named after the lessons, such as {lessons[0]}/, each holding *_test.cpp files")
    return f"--extra-tests {extra_dir}: no lesson folder in it holds a *_test.cpp file{hint}"


def hold_lock(folder):
    """Takes `folder`'s grading lock (folder/.grading.lock) for as long as this process lives, or
    returns False when another process holds it: two gradings writing the same build trees and
    reports would give each other's points."""
    import errno
    import fcntl
    os.makedirs(folder, exist_ok=True)
    f = open(os.path.join(folder, ".grading.lock"), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        f.close()
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise OSError(e.errno, f"cannot lock {folder} for grading ({e.strerror}): a file system without locks?")
    _held_locks.append(f)  # (kept open: closing it would let go of the lock)
    return True


_held_locks = []


def lock_or_refusal(folder, program, holds, instead):
    """Takes `folder`'s grading lock (hold_lock), or says why not: `program`'s message that another
    grading (which `holds` what) is using it and what to do `instead`, or that it cannot be locked
    at all. None when it is taken."""
    try:
        if hold_lock(folder):
            return None
    except OSError as e:
        return f"{program}: cannot grade into {folder}: {e}"
    return f"{program}: another grading is using {folder} ({holds}); wait until it ends, or {instead}"


def extra_tests_warnings(extra_dir, root=ROOT):
    """What in an instructor's hidden-tests folder would silently grade nothing: a folder that
    names no lesson, a test file whose cases are plain TEST()s, a source not named *_test.cpp."""
    out = []
    if not extra_dir or not os.path.isdir(extra_dir):
        return [f"--extra-tests {extra_dir}: not a directory"] if extra_dir else []
    lessons = lesson_dirs(root)
    for d in sorted(os.listdir(extra_dir)):
        full = os.path.join(extra_dir, d)
        if not os.path.isdir(full) or d.startswith("."):
            continue
        if d not in lessons:
            out.append(f"--extra-tests: folder {d}/ names no lesson (expected a lesson's folder name, such as "
                       f"{lessons[0]}): its tests are not graded")
            continue
        for f in sorted(os.listdir(full)):
            path = os.path.join(full, f)
            if f.endswith("_test.cpp"):
                with open(path, encoding="utf-8", errors="replace") as t:
                    text = t.read()
                plain = len(re.findall(r"^\s*TEST(_F|_P)?\s*\(", text, re.M))
                if plain:
                    out.append(f"--extra-tests: {d}/{f} has {plain} TEST() case(s) that are not GRADED_TEST(): "
                               "they earn nothing and are not run")
            elif f.endswith((".cpp", ".cu")):
                out.append(f"--extra-tests: {d}/{f} is not compiled (only files named *_test.cpp are)")
    return out


def junit_results(path):
    """{test name: (status, output)} with status passed / failed / skipped / not run."""
    results = {}
    if not path or not os.path.exists(path):
        return results
    for tc in ET.parse(path).getroot().iter("testcase"):
        name = tc.get("name")
        out = tc.findtext("system-out") or ""
        status = tc.get("status", "")
        if tc.find("failure") is not None or status == "fail":
            state = "failed"
        elif tc.find("skipped") is not None or status in ("notrun", "disabled"):
            state = "skipped"
        elif status == "run":
            state = "passed"
        else:
            state = "not run"
        # gtest prints "[  SKIPPED ]" for GTEST_SKIP; ctest reports those as run.
        if state == "passed" and "[  SKIPPED ]" in out:
            state = "skipped"
        failure = tc.find("failure")
        message = failure.get("message") if failure is not None else None
        results[name] = (state, out, message)
    return results


def failure_message(output, limit=25):
    """The lines of a GoogleTest log that explain the failure."""
    lines = output.splitlines()
    keep, on = [], False
    for line in lines:
        if line.startswith("[ RUN") or line.startswith("Note: Google Test filter"):
            continue
        if line.startswith("[  FAILED") or line.startswith("[==========]") or line.startswith("[----------]"):
            on = False
            continue
        if "Failure" in line or "C++ exception" in line or "Timeout" in line:
            on = True
        if on or "exception" in line:
            keep.append(line)
    if not keep:
        keep = [l for l in lines if l.strip()][-limit:]
    return "\n".join(keep[:limit])


def heading_of(line):
    """A README line's heading as the grader names it (its anchor dropped), or None."""
    if not line.startswith("#"):
        return None
    return re.sub(r"\s*\{#[^}]*\}\s*$", "", line.lstrip("#").strip())


def readme_section(lesson, test_name, root=ROOT):
    """The heading of the README section that mentions the test: by its whole name (Suite.Name),
    where two suites have a case of one name; else by its name; else by its suite. A Step ("Step
    3: ...") that names it comes first, since that is where the student makes it pass (a contract
    or an idea section may name a case that needs several steps)."""
    path = os.path.join(root, "lessons", lesson, "README.md")
    if not os.path.exists(path):
        return None
    suite, short = test_name.split(".")[0], test_name.split(".")[-1]
    heading = None
    found = {}  # what matched -> the headings it matched under, in order
    with open(path, encoding="utf-8") as f:
        for line in f:
            if (h := heading_of(line)) is not None:
                heading = h
            elif heading:
                for key, text in (("whole", test_name), ("name", short), ("suite", suite)):
                    if text in line and heading not in found.setdefault(key, []):
                        found[key].append(heading)
    for key in ("whole", "name"):  # a Step that names the case, by its whole name first
        step = next((h for h in found.get(key, []) if h.startswith("Step ")), None)
        if step:
            return step
    for key in ("whole", "name", "suite"):
        if found.get(key):
            return found[key][0]
    return None


def build_report(cases, results):
    """results: {name: (status, output[, message])}; a case with no result counts as not built."""
    lessons = {}
    # Lesson order, then source order (files sort by name: number them in the order to work).
    for name, (lesson, points, _) in sorted(cases.items(), key=lambda kv: kv[1][0]):
        result = results.get(name, ("not built", ""))
        state = result[0]
        message = result[2] if len(result) > 2 else None
        row = lessons.setdefault(lesson, {"lesson": lesson, "earned": 0, "total": 0, "passed": 0,
                                          "cases": 0, "ungraded": 0, "tests": []})
        earned = points if state == "passed" else 0
        if state in UNGRADED:  # not part of this machine's grade
            row["ungraded"] += points
        else:
            row["earned"] += earned
            row["total"] += points
            row["cases"] += 1
            row["passed"] += state == "passed"
        test = {"name": name, "points": points, "earned": earned, "status": state}
        if message and state != "passed":
            test["message"] = message
        row["tests"].append(test)
    earned = sum(r["earned"] for r in lessons.values())
    total = sum(r["total"] for r in lessons.values())
    ungraded = sum(r["ungraded"] for r in lessons.values())
    return {"lessons": list(lessons.values()), "earned": earned, "total": total, "ungraded": ungraded}


def progress_bar(earned, total, width=20):
    """Full only when everything is earned; otherwise rounded down."""
    filled = width if earned == total else (width * earned) // max(total, 1)
    return "#" * filled + "." * (width - filled)


def points(n):
    return f"{n} point" + ("" if n == 1 else "s")


def print_table(report, colour):
    def paint(text, code):
        return f"\033[{code}m{text}\033[0m" if colour else text
    print(f"{'lesson':<28} {'points':>9} {'cases':>9}  progress")
    for r in report["lessons"]:
        bar = progress_bar(r["earned"], r["total"])
        frac = r["earned"] / r["total"] if r["total"] else 0
        code = "32" if frac == 1 else ("33" if frac > 0 else "31")
        print(f"{r['lesson']:<28} {r['earned']:>4}/{r['total']:<4} {r['passed']:>4}/{r['cases']:<4}  "
              f"{paint(bar, code)}")
    t = report
    print(f"{'total':<28} {t['earned']:>4}/{t['total']:<4}")
    left_out = {state: sum(u["points"] for r in t["lessons"] for u in r["tests"] if u["status"] == state)
                for state in UNGRADED}
    if left_out["no gpu"]:
        print(f"(and {left_out['no gpu']} points of CUDA cases, graded only on a machine with a CUDA device; "
              "without one, ./course check NN --emulate runs them on the processor where the CUDA toolkit is)")
    if left_out["emulator only"]:
        print(f"(and {left_out['emulator only']} points of cases that watch what a kernel reads, which only the "
              "kernel emulator can see: ./course check NN --emulate grades them)")
    print(f"graded: {describe_code(t.get('student_code'))}, against the course at {describe_code(t.get('course_code'))}")


def describe_code(code):
    """'commit 1a2b3c4d5e6f (modified since)', or the sources' digest where there is no commit."""
    if not code:
        return "unknown code"
    if code.get("commit"):
        return f"commit {code['commit'][:12]}" + (" (with changes not committed)" if code.get("modified") else "")
    if code.get("sources_sha256"):
        return f"sources sha256 {code['sources_sha256'][:16]} (not a git repository)"
    return "a tree that is not a git repository"


def write_json(path, report):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


def write_csv(path, report):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["lesson", "test", "points", "earned", "status", "message"])
        for r in report["lessons"]:
            for t in r["tests"]:
                w.writerow([r["lesson"], t["name"], t["points"], t["earned"], t["status"],
                            (t.get("message") or "").splitlines()[0] if t.get("message") else ""])


def classroom_results(report):
    """{lessonNN: results} in the format GitHub Classroom's grading reporter reads from a runner
    (its version 1: a status, max_score, and per test a name, status and score). A lesson's points
    are its graded cases' points; CUDA cases on a machine without a device are left out, as in
    the table (a lesson left with none gets one line saying so, worth 0)."""
    out = {}
    for r in report["lessons"]:
        tests = []
        for t in r["tests"]:
            if t["status"] in UNGRADED:
                continue
            tests.append({"name": t["name"], "status": "pass" if t["status"] == "passed" else "fail",
                          "score": t["earned"], "message": (t.get("message") or "").splitlines()[0]
                          if t.get("message") else ""})
        if not tests:
            tests.append({"name": f"{r['lesson']}: its cases need a CUDA device, none here", "status": "pass",
                          "score": 0, "message": ""})
        status = "pass" if r["earned"] == r["total"] else "fail"
        if not report.get("complete", True):
            status = "error"
        out["lesson" + r["lesson"][:2]] = {"version": 1, "status": status, "max_score": r["total"],
                                           "tests": tests}
    return out


def write_classroom_outputs(path, report, lessons):
    """Appends `lessonNN=<base64 of its results>` for each lesson to path ($GITHUB_OUTPUT), the
    lessons of `lessons` the report does not have (not graded this time) as errors worth 0."""
    results = classroom_results(report)
    with open(path, "a") as f:
        for lesson in lessons:
            key = "lesson" + lesson[:2]
            r = results.get(key, {"version": 1, "status": "error", "max_score": 0,
                                  "tests": [{"name": f"{lesson}: not graded", "status": "error", "score": 0,
                                             "message": "this lesson was not graded in this run"}]})
            f.write(f"{key}={base64.b64encode(json.dumps(r).encode()).decode()}\n")


def section_order(lesson, root=ROOT):
    """{heading: its place in the lesson's README}, headings named as readme_section() names them."""
    path = os.path.join(root, "lessons", lesson, "README.md")
    order = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if (h := heading_of(line)) is not None:
                    order.setdefault(h, len(order))
    return order


def print_first_failure(report, results, root=ROOT, json_path=None, checked_build=None):
    """Prints the first case that does not pass, what it said and where to read; True if any.
    "First" in the order the lesson's README takes its steps (the test files' order among cases
    of one section, and after every section for a case the README does not name). `json_path`,
    the report with every case's message, is named when more than one case fails.
    `checked_build`, a command: named where the case got wrong numbers (values that differ),
    which a shape mistake reading past a vector's end gives unseen in a build without checks."""
    for r in report["lessons"]:
        failing = [u for u in r["tests"] if u["status"] != "passed" and u["status"] not in UNGRADED]
        if failing and all(u["status"] == "not built" for u in failing):
            # No case ran: the compiler's first error is the one thing to read (not a case's name
            # and its README section, which the error may have nothing to do with).
            said = (failing[0].get("message") or "").split("\n", 1)
            print(f"\nlesson {r['lesson'][:2]} does not compile: fix its first error"
                  + (f" (the build's whole output is above):\n{said[1]}" if len(said) > 1 else ", above."))
            return True
        if failing:
            order = section_order(r["lesson"], root)
            t = min(failing, key=lambda u: order.get(readme_section(r["lesson"], u["name"], root), len(order)))
            names = [u["name"].split(".")[-1] for u in failing]
            print(f"\n{len(failing)} of {r['cases']} cases do not pass yet: " + ", ".join(names[:6])
                  + (f" and {len(names) - 6} more" if len(names) > 6 else ""))
            print(f"\nFirst failing case: {t['name']} ({t['status']}, {points(t['points'])})")
            res = results.get(t["name"])
            out = (res.get("output") if isinstance(res, dict) else res[1]) if res else ""
            said = ""
            if t.get("message") and not (out and t["message"] in out):
                said = t["message"]
                print(said)
                if out and "read the output for where" in t["message"]:  # a crash: its last words
                    lines = [line for line in out.splitlines() if line.strip()]
                    print("Its output ended:\n" + "\n".join("  " + line for line in lines[-8:]))
            elif out:
                said = failure_message(out)
                print(said)
            elif t["status"] == "not built":
                print("The test program did not build: see the compiler errors above.")
            program = res.get("program") if isinstance(res, dict) else None
            if program and "Eigen's check failed" in (said + out):
                shown = os.path.relpath(program)
                print(f"\nWhich line of yours: run the case under gdb (Debian package gdb); the first frame in "
                      f"exercises/ is it:\n  gdb -q -batch -ex 'catch throw' -ex run -ex bt --args {shown} "
                      f"--gtest_filter={t['name']}")
            if checked_build and re.search(r"\bdiffer", said):
                print(f"\n(Wrong numbers can also come from a shape mistake, a row where a column was meant, "
                      f"that reads past a vector's end: this fast build does not check. `{checked_build}` runs "
                      f"the same cases with every shape and index checked.)")
            section = readme_section(r["lesson"], t["name"], root)
            where = f"lessons/{r['lesson']}/README.md"
            print(f"\nRead: {where}" + (f', section "{section}"' if section else ""))
            if json_path and len(failing) > 1:
                shown = os.path.relpath(json_path)
                shown = json_path if shown.startswith("..") else shown
                print(f"Every failing case's message: {shown} (each case's \"message\", in \"lessons\" > \"tests\")")
            return True
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--junit", required=True)
    ap.add_argument("--extra-tests")
    ap.add_argument("--json")
    ap.add_argument("--csv")
    ap.add_argument("--lesson", help="only this lesson (NN)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--expect-none-pass", action="store_true")
    ap.add_argument("--first-failure", action="store_true")
    args = ap.parse_args()

    cases = graded_cases(args.extra_tests)
    if args.lesson:
        cases = {k: v for k, v in cases.items() if v[0].startswith(args.lesson + "_")}
    if not cases:
        print("grade_report: no GRADED_TEST cases found" + (f" for lesson {args.lesson}" if args.lesson else ""),
              file=sys.stderr)
        return 2
    results = junit_results(args.junit)
    report = build_report(cases, results)

    if args.json:
        write_json(args.json, report)
    if args.csv:
        write_csv(args.csv, report)
    if not args.quiet:
        print_table(report, sys.stdout.isatty() and not os.environ.get("NO_COLOR"))

    if args.first_failure and print_first_failure(report, results, json_path=args.json):
        return 1
    if args.expect_none_pass:
        passing = [t["name"] for r in report["lessons"] for t in r["tests"] if t["status"] == "passed"]
        if passing:
            print("These graded cases pass on the untouched starters, so they test nothing:", file=sys.stderr)
            for n in passing:
                print(f"  {n}", file=sys.stderr)
            return 1
        missing = [t["name"] for r in report["lessons"] for t in r["tests"] if t["status"] in ("not built", "not run")]
        if missing:
            print("These graded cases did not run on the starters (they must build and fail):", file=sys.stderr)
            for n in missing:
                print(f"  {n}", file=sys.stderr)
            return 1
        print(f"exercise set: all {sum(r['cases'] for r in report['lessons'])} graded cases fail on the starters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
