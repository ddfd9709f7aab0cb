#!/usr/bin/env python3
"""Grades a class: every student folder in a directory, in one command, into one gradebook.

    tools/roster.py ROSTER [--extra-tests DIR] [--lessons NN ...] [--out DIR] [--workers N]
                    [--timeout S] [--build-timeout S] [--student-timeout S]
                    [--sandbox require|auto|off]

ROSTER holds one folder per student, named after them: either a copy of exercises/, or the
student's repository (a clone of the course, with exercises/ inside). Each student is graded by
tools/grader.py exactly as `./course grade --student` grades one: their lessons built on their
own, every graded case run in the sandbox, with the instructor's hidden tests (--extra-tests).

What it writes (--out, default build/roster):

* gradebook.csv: one row per student, one column per lesson (points earned; the header says
  each lesson's total), the total, whether grading was complete, a note saying why a student
  lost whole lessons (did not build, timed out, stopped, suspicious lines), their commit (where
  their folder is a git repository) and the digest of their sources;
* students/NAME.json, .csv, .junit.xml: each student's full report, as ./course grade writes it.

How: N workers (default: one per core where ccache is installed, else one), each with its own
build tree (the first student is graded alone, so that the course's own objects are compiled
once and the other trees take them from ccache); a worker copies the next student's files into its tree's student folder (regular
files only: no symbolic links, no .git) and grades them, rebuilding only the lessons whose files
differ from the student before (ccache gives back any object it compiled before). A student
whose build fails, hangs or cheats gets their row with the reason, and the roster goes on: each
grading is its own process, stopped after --student-timeout seconds. A line is printed as each
student is done. Exit status: 0 when every student was graded completely, 1 when some row says
why not, 2 when the roster could not be read.
"""
import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import grade_report  # noqa: E402
from grader import kill_tree  # noqa: E402


def student_folder(path, lessons):
    """The folder of the student's exercises: path/exercises in a clone of the course, else path;
    where path holds no lesson folder and a single folder (an archive unpacked one level deep:
    NAME/course-main/exercises; a macOS archive's __MACOSX/ beside it is not counted), the same
    within that folder. A symbolic link is never followed (it could name any folder of this
    machine, the reference solutions among them): path itself then."""
    here = path
    for _ in range(3):
        inner = os.path.join(here, "exercises")
        if os.path.isdir(inner) and not os.path.islink(inner):
            return inner
        entries = [e for e in os.listdir(here) if not e.startswith(".") and e != "__MACOSX"]
        if any(e in lessons for e in entries):
            return here
        folders = [e for e in entries if os.path.isdir(os.path.join(here, e))]
        if len(folders) != 1 or os.path.islink(os.path.join(here, folders[0])):
            break
        here = os.path.join(here, folders[0])
    return path


def copy_regular_files(src, dst):
    """Copies src into a fresh dst, regular files only; returns the paths it left out."""
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    left_out = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        keep = []
        for d in dirnames:
            if d == ".git" or os.path.islink(os.path.join(dirpath, d)):
                left_out.append(os.path.normpath(os.path.join(rel, d)))
            else:
                keep.append(d)
        dirnames[:] = keep
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if os.path.islink(p) or not os.path.isfile(p):
                left_out.append(os.path.normpath(os.path.join(rel, f)))
                continue
            shutil.copyfile(p, os.path.join(dst, rel, f))
    return [p for p in left_out if os.path.basename(p) != ".git"]


def summarize(report):
    """Why a student lost points, in a few words per lesson ('' when nothing stands out): first the
    lines an instructor should read (suspicious code, grading not complete), then lessons that did
    not build or lost cases, then, in one item, the lessons not started (every case not implemented)."""
    notes = []
    for lesson, lines in (report.get("suspicious") or {}).items():
        kinds = sorted({l.split(": ")[1] for l in lines if l.count(": ") >= 2})
        notes.append(f"{lesson[:2]}: READ {len(lines)} suspicious line{'s' if len(lines) != 1 else ''} "
                     f"({', '.join(kinds)})")
    for p in report.get("problems", []):
        notes.append("grading not complete: " + p.splitlines()[0][:200])
    graded = [t for r in report["lessons"] for t in r["tests"] if t["status"] not in grade_report.UNGRADED]
    if graded and all("not implemented" in (t.get("message") or "") for t in graded):
        return "; ".join(notes + ["every graded case says not implemented (the starters as given)"])
    not_started = []
    for r in report["lessons"]:
        nn = r["lesson"][:2]
        states = [t for t in r["tests"] if t["status"] != "passed" and t["status"] not in grade_report.UNGRADED]
        if not states:
            continue
        if len(states) == sum(t["status"] not in grade_report.UNGRADED for t in r["tests"]) and all(
                "not implemented" in (t.get("message") or "") for t in states):
            not_started.append(nn)
            continue
        if any(t["status"] == "not built" for t in states):
            first = next(t.get("message", "") for t in states if t["status"] == "not built")
            lines = [l for l in first.splitlines()[1:] if l.strip()] or first.splitlines()
            notes.append(f"{nn} did not build: {(lines[0] if lines else '').strip()[:160]}")
            continue
        timed = sum("timed out" in (t.get("message") or "") for t in states)
        ended = sum("in the middle of the test" in (t.get("message") or "") for t in states)
        what = [f"{len(states)} of {sum(t['status'] not in grade_report.UNGRADED for t in r['tests'])} cases lost"]
        if timed:
            what.append(f"{timed} timed out")
        if ended:
            what.append(f"{ended} ended the program mid-test")
        unwritten = sum("not implemented" in (t.get("message") or "") for t in states)
        if unwritten:
            what.append(f"{unwritten} not implemented")
        notes.append(f"{nn}: " + ", ".join(what))
    if not_started:
        notes.append("not started (every case not implemented): " + " ".join(not_started))
    return "; ".join(notes)


def interrupted(signum, frame):
    """SIGTERM's handler: KeyboardInterrupt, so that a TERM (a scheduler's, `kill`'s) stops every
    grader and all it started, as Ctrl-C does, instead of leaving their builds running."""
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roster", help="a folder with one folder (or git repository) per student")
    ap.add_argument("--extra-tests", help="the instructor's hidden tests (NN_topic/*_test.cpp)")
    ap.add_argument("--lessons", nargs="*", action="extend", help="the lessons to grade (default: all)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "roster"))
    ap.add_argument("--source", default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=None,
                    help="students graded at once, each in its own build tree (default: one per core where "
                         "ccache is installed, else one)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per graded case")
    ap.add_argument("--build-timeout", type=float, default=1200, help="seconds to build one lesson")
    ap.add_argument("--student-timeout", type=float, default=3600, help="seconds to grade one student")
    ap.add_argument("--sandbox", choices=("require", "auto", "off"), default="require")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, interrupted)  # a TERM stops the class as Ctrl-C does (below)
    source = os.path.abspath(args.source)
    roster = os.path.abspath(args.roster)
    out = os.path.abspath(args.out)
    if not os.path.isdir(roster):
        print(f"roster: {args.roster} is not a directory (expected one folder per student)", file=sys.stderr)
        return 2
    names = sorted(d for d in os.listdir(roster) if not d.startswith(".") and os.path.isdir(os.path.join(roster, d)))
    # Archives beside the folders (a student's, not unpacked): a row each, saying so. Other files
    # (a README, last term's gradebook) are no student's: named once, and left out.
    files = sorted(d for d in os.listdir(roster) if not d.startswith(".") and not os.path.isdir(os.path.join(roster, d)))
    archive = (".zip", ".tar", ".tgz", ".tar.gz", ".tar.xz", ".tar.bz2", ".7z", ".rar")
    not_folders = [f for f in files if f.lower().endswith(archive)]
    if len(not_folders) < len(files):
        print(f"roster: not a student's (a file, not an archive), left out: "
              f"{', '.join(f for f in files if f not in not_folders)}", file=sys.stderr)
    if not names:
        print(f"roster: {args.roster} has no student folders", file=sys.stderr)
        return 2
    # Mistakes that would grade the whole class wrongly are refused before anything is written.
    if args.extra_tests and (why := grade_report.extra_tests_error(os.path.abspath(args.extra_tests), source)):
        print(f"roster: {why}", file=sys.stderr)
        return 2
    if refusal := grade_report.lock_or_refusal(out, "roster", "its build trees, reports and gradebook",
                                               "give this one another folder (--out DIR)"):
        print(refusal, file=sys.stderr)
        return 2
    for w in grade_report.extra_tests_warnings(args.extra_tests and os.path.abspath(args.extra_tests), source):
        print(f"roster: WARNING: {w}", file=sys.stderr)
    lessons = all_lessons = grade_report.lesson_dirs(source)
    if args.lessons:
        wanted = tuple(f"{int(n):02d}_" for n in args.lessons)
        lessons = [l for l in lessons if l.startswith(wanted)]
    cores = os.cpu_count() or 1
    workers = args.workers or (cores if shutil.which("ccache") else 1)
    workers = max(1, min(workers, len(names)))
    jobs = max(1, cores // workers)
    # This run's reports only: another class's, or an earlier run's, would sit beside them.
    shutil.rmtree(os.path.join(out, "students"), ignore_errors=True)
    os.makedirs(os.path.join(out, "students"), exist_ok=True)
    hidden = f"; hidden tests from {os.path.abspath(args.extra_tests)}" if args.extra_tests else "; no hidden tests"

    queue = list(reversed(names))
    rows, lock = {}, threading.Lock()
    running = set()  # the graders at work, to stop them all on Ctrl-C
    started = time.monotonic()
    print(f"roster: {len(names)} students in {roster}, {workers} at a time, {jobs} case(s) at once each; "
          f"reports in {out}{hidden}", flush=True)

    def done(name, row):
        with lock:
            rows[name] = row
            n = len(rows)
            elapsed = time.monotonic() - started
            # The first student built the course: the others' mean says what is left.
            later = [r["seconds"] for r in list(rows.values())[1:]]
            eta = ""
            if later and n < len(names):
                eta = f", about {sum(later) / len(later) * (len(names) - n) / workers / 60:.1f} min to go at this pace"
            print(f"[{n:>{len(str(len(names)))}}/{len(names)}] {name}: {row['earned']}/{row['total']} "
                  f"({row['seconds']:.0f} s){'; ' + row['note'] if row['note'] else ''} | "
                  f"{elapsed / 60:.1f} min so far{eta}", flush=True)

    def grade_one(w, name, configured):
        base = os.path.join(out, "build", f"w{w}")
        copy = os.path.join(base, "student")
        origin = os.path.join(roster, name)
        folder = student_folder(origin, all_lessons)
        left_out = copy_regular_files(folder, copy)
        stem = os.path.join(out, "students", name)
        cmd = [sys.executable, os.path.join(HERE, "grader.py"), "--source", source, "--student", copy,
               "--report-student", folder, "--build", base, "--json", stem + ".json", "--csv", stem + ".csv",
               "--junit", stem + ".junit.xml", "--sandbox", args.sandbox, "--quiet", "--timeout", str(args.timeout),
               "--build-timeout", str(args.build_timeout), "--jobs", str(jobs)]
        if configured:
            cmd.append("--no-configure")
        if args.extra_tests:
            cmd += ["--extra-tests", os.path.abspath(args.extra_tests)]
        if args.lessons:
            cmd += ["--lessons", *args.lessons]
        t0 = time.monotonic()
        for stale in (stem + ".json",):
            if os.path.exists(stale):
                os.remove(stale)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with lock:
            running.add(proc)
        try:
            output, _ = proc.communicate(timeout=args.student_timeout)
            stopped = False
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            output, _ = proc.communicate()
            stopped = True
        finally:
            with lock:
                running.discard(proc)
        seconds = time.monotonic() - t0
        row = {"student": name, "earned": 0, "total": 0, "ungraded": 0, "lessons": {}, "complete": False, "note": "",
               "commit": "", "sources_sha256": "", "seconds": seconds}
        report = None
        if not stopped and os.path.exists(stem + ".json"):
            with open(stem + ".json") as f:
                report = json.load(f)
        if report is None:
            why = (f"grading stopped after {args.student_timeout:g} s" if stopped
                   else f"the grader ended with status {proc.returncode} without a report: "
                        + (output.strip().splitlines() or [""])[-1][:200])
            row["note"] = why
            return row, False
        row.update(earned=report["earned"], total=report["total"], complete=bool(report.get("complete")),
                   ungraded=report.get("ungraded", 0),
                   lessons={r["lesson"]: (r["earned"], r["total"]) for r in report["lessons"]})
        code = report.get("student_code") or {}
        row["commit"] = (code.get("commit") or "") + ("+changes" if code.get("commit") and code.get("modified") else "")
        row["sources_sha256"] = code.get("sources_sha256") or ""
        note = summarize(report).replace(copy, folder)  # messages name the student's folder, not the copy
        if left_out:
            note = "; ".join(filter(None, [note, "not graded (links or .git): " + ", ".join(left_out[:5])]))
        if not any(os.path.isdir(os.path.join(folder, l)) for l in all_lessons):
            note = ("no lesson folders found (expected a copy of exercises/, or the course's repository with "
                    "exercises/ inside)")
            row["complete"] = False
        elif folder not in (origin, os.path.join(origin, "exercises")):
            note = "; ".join(filter(None, [f"graded from {os.path.relpath(folder, origin)}/", note]))
        row["note"] = note
        # A build tree whose configure failed is configured again for the next student.
        return row, os.path.exists(os.path.join(base, "build.ninja"))

    # The first student builds the whole course once; the other workers wait for it, then take
    # every object not built from a student's file from ccache instead of compiling it again.
    primed = threading.Event()

    def worker(w):
        configured = False
        if w > 0:
            primed.wait()
        while True:
            with lock:
                if not queue:
                    return
                name = queue.pop()
            try:
                row, configured = grade_one(w, name, configured)
            except Exception as e:  # the roster goes on: this student's row says what happened
                row = {"student": name, "earned": 0, "total": 0, "ungraded": 0, "lessons": {}, "complete": False,
                       "note": f"grading failed: {type(e).__name__}: {e}", "commit": "", "sources_sha256": "",
                       "seconds": 0.0}
                configured = False
            done(name, row)
            primed.set()

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.5)
    except KeyboardInterrupt:  # stop every grader and what it started; no gradebook
        with lock:
            queue.clear()
            for proc in running:
                kill_tree(proc.pid)
        print("\nroster: stopped; no gradebook written (the students' reports so far are in "
              f"{os.path.join(out, 'students')})", file=sys.stderr)
        return 130

    for name in not_folders:
        rows[name] = {"student": name, "earned": 0, "total": 0, "ungraded": 0, "lessons": {}, "complete": False,
                      "note": "a file, not a folder: not graded (unpack it into a folder named after the student)",
                      "commit": "", "sources_sha256": "", "seconds": 0.0}
    names = sorted(names + not_folders)
    totals = {}
    for row in rows.values():
        for lesson, (_, total) in row["lessons"].items():
            totals[lesson] = max(totals.get(lesson, 0), total)
    columns = [l for l in lessons if l in totals] or lessons
    book = os.path.join(out, "gradebook.csv")
    with open(book, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "earned", "total"] + [f"{l} (/{totals.get(l, 0)})" for l in columns]
                   + ["not graded here (GPU cases)", "complete", "note", "commit", "sources_sha256", "seconds"])
        for name in names:
            r = rows[name]
            w.writerow([name, r["earned"], r["total"]] + [r["lessons"].get(l, ("", ""))[0] for l in columns]
                       + [r["ungraded"], "yes" if r["complete"] else "no", r["note"], r["commit"], r["sources_sha256"],
                          f"{r['seconds']:.0f}"])
    wall = time.monotonic() - started
    width = max(len(n) for n in names)
    print(f"\n{'student':<{width}}  points   note")
    for name in names:
        r = rows[name]
        print(f"{name:<{width}}  {r['earned']:>4}/{r['total']:<4} {r['note'] or ('' if r['complete'] else 'incomplete')}")
    print(f"\n{len(names)} students graded in {wall / 60:.1f} min ({workers} at a time{hidden}); gradebook: {book}")
    return 0 if all(r["complete"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
