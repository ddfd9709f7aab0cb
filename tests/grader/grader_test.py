#!/usr/bin/env python3
"""The grader against students who would like a better mark (ctest label `grader`).

    grader_test.py [WORKDIR]

Grades each folder of students/ with tools/grader.py on the two-lesson course in course/
(lesson 00 is worth 5 points, lesson 01 4), and checks the exact points and the message each
lesson gets, that the course tree is unchanged afterwards and that no process is left over.
A student folder holds only the lessons it changes; the others come from course/solutions/.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
COURSE = os.path.join(HERE, "course")
GRADER = os.path.join(REPO, "tools", "grader.py")
TIMEOUT = 4  # seconds per case: the hanging students cost this much

GOOD = {"00": (5, None), "01": (4, None)}
# (student, {lesson: (points, words the first failing case's message must contain)}, lessons to leave out)
CASES = [
    ("good", GOOD, ()),
    ("starters", {"00": (0, "lesson 00: add is not implemented yet"),
                  "01": (0, "lesson 01: square is not implemented yet")}, ()),
    ("exit_zero", {"00": (0, "exited with status 0 in the middle of the test"),
                   "01": (0, "exited with status 0 in the middle of the test")}, ()),
    ("underscore_exit", {"00": (0, "exited with status 0 in the middle of the test"), "01": (4, None)}, ()),
    ("quick_exit", {"00": (0, "exited with status 0 in the middle of the test"), "01": (4, None)}, ()),
    ("good", GOOD, ()),  # a clean build first: the next one must not reuse its lesson 01 program
    ("does_not_compile", {"00": (5, None), "01": (0, "01_other/other.cpp:5")}, ()),
    ("writes_repository", GOOD, ()),
    ("good", GOOD, ()),  # nothing planted: still 9 points in all
    ("child_outlives", GOOD, ()),
    ("segfault_constructor", {"00": (0, "before running any test"), "01": (4, None)}, ()),
    ("output_flood", {"00": (0, "printed more than 8 MiB"), "01": (4, None)}, ()),
    # (correct, but a PASS must show in GoogleTest's own output: a closed one backs nothing)
    ("closes_stdout", {"00": (0, "must not close or silence its standard output"), "01": (4, None)}, ()),
    ("child_past_timeout", {"00": (0, f"timed out after {TIMEOUT} s"), "01": (4, None)}, ()),
    ("deletes_build", GOOD, ()),
    ("kills_parent", GOOD, ()),
    ("infinite_loop", {"00": (0, f"timed out after {TIMEOUT} s"), "01": (4, None)}, ()),
    ("aborts", {"00": (0, "SIGABRT"), "01": (4, None)}, ()),
    ("memory_hog", {"00": (0, "bad_alloc"), "01": (4, None)}, ()),
    ("own_main", {"00": (0, "multiple definition of `main'"), "01": (4, None)}, ()),
    ("missing_lesson", {"00": (5, None), "01": (0, "no 01_other/*.cpp")}, ("01",)),
]


def snapshot(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def leftovers(build, patience=5.0):
    """Processes the students started that are still alive after `patience` seconds: their sleeps,
    or their test programs. (A sandbox's inner process dies when the grader kills its outer one, by
    the kernel's parent-death signal, but not at once: under load it was once still there when
    looked for right after the grading. What a student leaves behind on purpose sleeps for hours.)"""
    deadline = time.monotonic() + patience
    while True:
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        left = [l for l in ps.splitlines() if "sleep 9732" in l or os.path.join(build, "bin") + "/" in l]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def prepare(student_dir, name, leave_out):
    shutil.rmtree(student_dir, ignore_errors=True)
    if name == "starters":
        shutil.copytree(os.path.join(COURSE, "exercises"), student_dir)
        return
    shutil.copytree(os.path.join(COURSE, "solutions"), student_dir)
    for nn in leave_out:
        for d in os.listdir(student_dir):
            if d.startswith(nn + "_"):
                shutil.rmtree(os.path.join(student_dir, d))
    if name != "good":
        shutil.copytree(os.path.join(HERE, "students", name), student_dir, dirs_exist_ok=True)


# student: (how to make the folder, {lesson: points}, words its note must contain)
ROSTER = {
    "alice": ("good", {"00": 5, "01": 4}, ""),
    "bob": ("starters", {"00": 0, "01": 0}, "every graded case says not implemented"),
    "carol": ("does_not_compile", {"00": 5, "01": 0}, "01 did not build: 01_other/other.cpp:5"),
    "dave": ("exit_zero", {"00": 0, "01": 0}, "ended the program mid-test"),
    "erin": ("infinite_loop", {"00": 0, "01": 4}, "2 timed out"),
    "frank": ("writes_repository", {"00": 5, "01": 4}, "suspicious line"),
    "grace": ("repository", {"00": 5, "01": 4}, ""),
    "heidi": ("compiles_forever", {"00": 5, "01": 0}, "did not finish within"),
    "ivan": ("empty", {"00": 0, "01": 0}, "no lesson folders found"),
    "judy": ("includes_solution", {"00": 5, "01": 4}, "READ 1 suspicious line (includes the course's reference solution)"),
    "kim": ("nested", {"00": 5, "01": 4}, "graded from course-main/exercises/"),
    "leo.zip": ("file", {}, "a file, not a folder"),
}


def start_roster(work):
    """Starts tools/roster.py over ROSTER in work/roster; check_roster judges it once it ends. It runs
    while main() grades the cases one by one (its own folders and build trees): both spend much of
    their time waiting out timeouts."""
    roster, out = os.path.join(work, "roster"), os.path.join(work, "roster-out")
    shutil.rmtree(roster, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    for student, (how, _, _) in ROSTER.items():
        folder = os.path.join(roster, student)
        if how == "empty":
            os.makedirs(folder)
        elif how == "nested":  # an archive unpacked as it came: NAME/course-main/exercises/
            prepare(os.path.join(folder, "course-main", "exercises"), "good", ())
        elif how == "file":
            with open(folder, "w") as f:
                f.write("PK\x03\x04 (an archive)")
        elif how == "repository":
            prepare(os.path.join(folder, "exercises"), "good", ())
            git = ["git", "-C", folder, "-c", "user.name=s", "-c", "user.email=s@example.org"]
            subprocess.run(git[:3] + ["init", "-q"], check=True)
            subprocess.run(git + ["add", "-A"], check=True)
            subprocess.run(git + ["commit", "-qm", "mine"], check=True)
        else:
            prepare(folder, how, ())
    with open(os.path.join(roster, "README.md"), "w") as f:  # no student's: not a row
        f.write("The class of this term.\n")
    # --build-timeout 40: heidi's build never ends; a lesson's build takes a few seconds alone, but
    # 10 s stopped carol's lesson 00 once, on two cores shared with another build and test run (and
    # now with the cases graded beside it); 40 leaves room for a heavier load than that.
    log = open(os.path.join(work, "roster.log"), "w+")
    command = [sys.executable, os.path.join(REPO, "tools", "roster.py"), roster, "--source", COURSE, "--out", out,
               "--timeout", str(TIMEOUT), "--build-timeout", "40", "--workers", "2", "--sandbox", "require"]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    # While it runs: a second grading into the same folder is refused (it would write the same
    # build trees and reports), and so is a hidden-tests folder that is not one, before anything is
    # written.
    refusals = []
    for _ in range(300):
        log.seek(0)
        if "students in" in log.read() or proc.poll() is not None:
            break
        time.sleep(0.1)
    second = subprocess.run(command, capture_output=True, text=True)
    if second.returncode != 2 or "another grading is using" not in second.stderr:
        refusals.append(f"roster: a second roster into the same --out should be refused (exit 2), got "
                        f"{second.returncode}: {second.stderr[-500:]!r}")
    typo = subprocess.run(command + ["--extra-tests", os.path.join(work, "no-such-hidden-tests")],
                          capture_output=True, text=True)
    if typo.returncode != 2 or "not a folder" not in typo.stderr:
        refusals.append(f"roster: --extra-tests naming no folder should be refused (exit 2), got "
                        f"{typo.returncode}: {typo.stderr[-500:]!r}")
    return proc, log, started, refusals


def check_roster(work, started):
    import csv
    roster, out = os.path.join(work, "roster"), os.path.join(work, "roster-out")
    proc, log, t0, failures = started
    proc.wait()
    seconds = time.monotonic() - t0
    log.seek(0)
    output = log.read()
    log.close()
    print(output[-4000:])
    book = os.path.join(out, "gradebook.csv")
    if proc.returncode not in (0, 1) or not os.path.exists(book):
        return [f"roster: exit {proc.returncode}, no gradebook:\n{output[-6000:]}"]
    with open(book, newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    if sorted(rows) != sorted(ROSTER):
        failures.append(f"roster: the gradebook has rows {sorted(rows)}, expected {sorted(ROSTER)}")
    columns = {c[:2]: c for c in (next(iter(rows.values())) if rows else {}) if c[:2].isdigit()}
    for student, (how, points, words) in ROSTER.items():
        row = rows.get(student)
        if not row:
            continue
        got = {nn: int(row[columns[nn]] or 0) for nn in points if nn in columns}
        if got != points:
            failures.append(f"roster: {student} ({how}) got {got}, expected {points}; note: {row['note']}")
        if words and words not in row["note"]:
            failures.append(f"roster: {student} ({how})'s note should contain {words!r}; it is: {row['note']!r}")
        if how in ("file", "empty") and row["complete"] != "no":
            failures.append(f"roster: {student} ({how}) was not graded, yet its row says complete={row['complete']}")
        if how != "file" and not os.path.exists(os.path.join(out, "students", student + ".json")):
            failures.append(f"roster: no report for {student}")
    head = subprocess.run(["git", "-C", os.path.join(roster, "grace"), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    if rows.get("grace", {}).get("commit") != head:
        failures.append(f"roster: grace's row names commit {rows.get('grace', {}).get('commit')!r}, expected {head}")
    if output.count("] ") < len(ROSTER) - 1:  # (not for the file)
        failures.append("roster: expected a progress line per student")
    print(f"roster of {len(ROSTER)} students graded in {seconds:.1f} s")
    return failures


# Exit status for "skipped" (the test's SKIP_RETURN_CODE in tests/grader/CMakeLists.txt).
SKIPPED = 77


def sandbox_problem(work):
    """Why the grader cannot sandbox student code on this machine (None: it can): the same probe
    as `./course grade`'s, which refuses to grade there."""
    sys.path.insert(0, os.path.dirname(GRADER))
    import grader
    sandbox = grader.Sandbox("auto", COURSE, work, TIMEOUT, 4096, 8)
    return None if sandbox.kind == "bubblewrap" else sandbox.note


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="grader-test-")
    os.makedirs(work, exist_ok=True)
    # Every case here is graded in the sandbox. Where none can start (user namespaces disabled, a
    # container or a chroot), there is nothing to test: skipped, saying why, as `./course grade`
    # refuses there. CI sets COURSE_REQUIRE_SANDBOX, where a missing sandbox is a failure.
    problem = sandbox_problem(work)
    if problem:
        print(f"the grader's sandbox cannot start on this machine: {problem}.")
        if os.environ.get("COURSE_REQUIRE_SANDBOX"):
            print("FAILED: COURSE_REQUIRE_SANDBOX is set (CI): this test must run here")
            return 1
        print("Skipped: these cases grade in the sandbox. `./course grade` refuses to grade here too; "
              "`--unsandboxed` grades code you trust.")
        return SKIPPED
    build, student = os.path.join(work, "build"), os.path.join(work, "student")
    report_path = os.path.join(build, "grade.json")
    before = snapshot(COURSE)
    failures, rows = [], []
    only = [n for n in os.environ.get("GRADER_TEST_ONLY", "").split(",") if n]
    # A class in one command: tools/roster.py over a roster of students, among them every way of
    # failing it has a row for (not compiling, a compile that never ends, exit(0), a hang, writing
    # into the course tree, an empty folder, a student's repository with exercises/ inside).
    roster = start_roster(work) if not only or "roster" in only else None
    for name, expected, leave_out in CASES:
        if only and name not in only:
            continue
        prepare(student, name, leave_out)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, GRADER, "--source", COURSE, "--build", build, "--student", student,
                               "--json", report_path, "--timeout", str(TIMEOUT), "--sandbox", "require", "--quiet"],
                              capture_output=True, text=True)
        seconds = time.monotonic() - t0
        if proc.returncode != 0:
            failures.append(f"{name}: the grader exited {proc.returncode} (grading not complete):\n"
                            f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
            continue
        with open(report_path) as f:
            report = json.load(f)
        got = {l["lesson"][:2]: l for l in report["lessons"]}
        cells = []
        for nn, (points, words) in expected.items():
            lesson = got[nn]
            message = next((t.get("message") or "" for t in lesson["tests"] if t["status"] != "passed"), "")
            cells.append(f"{lesson['earned']}/{lesson['total']}")
            if lesson["earned"] != points:
                failures.append(f"{name}: lesson {nn} earned {lesson['earned']}, expected {points}; message: {message}")
            if words and words not in message:
                failures.append(f"{name}: lesson {nn}'s message should contain {words!r}; it is:\n{message}")
        first = next((t.get("message", "").splitlines()[0] for l in report["lessons"] for t in l["tests"]
                      if t.get("message")), "")
        rows.append(f"| {name} | {' | '.join(cells)} | {report['earned']}/{report['total']} | {seconds:.1f} s | {first[:90]} |")
        if report["sandbox"] != "bubblewrap":
            failures.append(f"{name}: graded without the sandbox ({report.get('sandbox_note')})")
        if name == "child_outlives":
            time.sleep(4)  # the child would have written by now
            with open(report_path) as f:
                if json.load(f).get("earned") != 9:
                    failures.append("child_outlives: a process left behind rewrote the grader's report")
        if name == "deletes_build" and not os.path.exists(os.path.join(build, "bin", "lesson00_tests")):
            failures.append("deletes_build: the build directory lost its test program")
        left = leftovers(build)
        if left:
            failures.append(f"{name}: processes left behind:\n" + "\n".join(left))
        if snapshot(COURSE) != before:
            failures.append(f"{name}: the course tree changed while grading")
            before = snapshot(COURSE)

    # Several lessons, named after one --lessons or after several (./course grade --lessons 00 01
    # passes them the first way): every lesson asked for is graded and reported.
    if not only:
        prepare(student, "good", ())
        for how in (["--lessons", "00", "01"], ["--lessons", "00", "--lessons", "01"]):
            proc = subprocess.run([sys.executable, GRADER, "--source", COURSE, "--build", build, "--student", student,
                                   "--json", report_path, "--timeout", str(TIMEOUT), "--sandbox", "require", "--quiet"]
                                  + how, capture_output=True, text=True)
            with open(report_path) as f:
                graded = [(l["lesson"][:2], l["earned"]) for l in json.load(f)["lessons"]]
            if proc.returncode != 0 or graded != [("00", 5), ("01", 4)]:
                failures.append(f"{' '.join(how)}: graded {graded} (exit {proc.returncode}), expected lessons 00 and 01 "
                                f"with 5 and 4 points")

        # The report names the code it graded: the course at its commit, the student's sources by
        # their digest, and by their commit once the student's folder is a git repository.
        def head(path):
            r = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True)
            return r.stdout.strip() or None
        with open(report_path) as f:
            report = json.load(f)
        code = report.get("student_code") or {}
        if report.get("course_code", {}).get("commit") != head(COURSE):
            failures.append(f"the report's course_code {report.get('course_code')} is not the course's commit {head(COURSE)}")
        if code.get("commit") is not None or not re.fullmatch(r"[0-9a-f]{64}", code.get("sources_sha256") or ""):
            failures.append(f"a student folder outside git: student_code {code}, expected no commit and a sha256")
        git = ["git", "-C", student, "-c", "user.name=s", "-c", "user.email=s@example.org"]
        made = subprocess.run(git[:3] + ["init", "-q"], capture_output=True).returncode == 0 and \
            subprocess.run(git + ["add", "-A"], capture_output=True).returncode == 0 and \
            subprocess.run(git + ["commit", "-qm", "mine"], capture_output=True).returncode == 0
        if made:
            subprocess.run([sys.executable, GRADER, "--source", COURSE, "--build", build, "--student", student,
                            "--json", report_path, "--timeout", str(TIMEOUT), "--sandbox", "require", "--quiet",
                            "--lessons", "00"], capture_output=True, text=True)
            with open(report_path) as f:
                code = json.load(f).get("student_code") or {}
            if code.get("commit") != head(student) or code.get("modified") is not False:
                failures.append(f"a student repository at {head(student)}: the report says {code}")

    if roster:
        failures += check_roster(work, roster)

    # Grading that cannot be done says so with exit status 2, and still writes its report.
    missing = os.path.join(work, "no-such-student")
    proc = subprocess.run([sys.executable, GRADER, "--source", COURSE, "--build", build, "--student", missing,
                           "--json", report_path, "--quiet"], capture_output=True, text=True)
    with open(report_path) as f:
        report = json.load(f)
    if proc.returncode != 2 or report.get("complete") is not False or report["earned"] != 0:
        failures.append(f"a missing student folder: exit {proc.returncode}, report {report.get('complete')}; "
                        "expected exit 2 and a report marked incomplete")

    print("| student | lesson 00 | lesson 01 | total | time | first message |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    if failures:
        print("\n" + "\n\n".join(failures))
        print(f"\n{len(failures)} grader checks failed")
        return 1
    print(f"\nall {len(CASES)} students graded as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
