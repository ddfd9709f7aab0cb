#!/usr/bin/env python3
"""Proves that each lesson's catalogue of known-wrong implementations loses points.

    tools/known_wrong.py [--lessons NN ...] [--build DIR] [--workers N] [--all-cases] [--list]
                         [--record-caught-by]

tests/NN_topic/known_wrong/*.patch are small, readable changes to the reference solution
(solutions/NN_topic/), each one a mistake students make; the lines before the diff say which.
For each, this applies the patch to a copy of the solutions, grades that lesson with
tools/grader.py, and expects fewer points than the total. The grading of an entry stops at its
first lost case (that proves it loses points, in about a third of the time of all its cases; CI
runs it so); --all-cases runs every case and shows each entry's points and every case that caught
it. Each patch names the case that catches it ("Caught by: Suite.Case" above the diff), which runs
first, so an entry is usually graded by one case; --record-caught-by rewrites those lines after
the graded tests change. It prints which graded cases caught each one, and exits 1 if any earns full marks (the tests miss that mistake) or no longer applies
(the reference changed under it: update the patch). The lesson's student files are compiled at
-O0 (STUDENT_FLAGS; the rest of the build as a student's), after the course headers they include,
precompiled once per lesson and tree (COURSE_STUDENT_PCH: a third off lessons 05 and 06); where a
lesson has two student files, the one an entry leaves alone keeps its object (the grader rebuilds
only the files whose text changed, and the entries that change the same file are graded one after
another).

An entry that changes a CUDA kernel (.cu) is graded on this machine's GPU, or, without one, with
the kernels emulated on the host (COURSE_CUDA=EMULATE: every CUDA thread a fiber, the same graded
tests); a line "Not emulated: why" above its diff keeps it for a GPU (a mistake only a GPU shows:
a race the emulator's one-lane-at-a-time order hides, a speed); a line "Emulated only: why" keeps
it from a GPU (a mistake only the emulator shows: what a kernel reads, counted by watching the
host memory the emulated device's buffers are; on a GPU its catching case is not graded).

Write one by changing the reference, then `git diff solutions/ > tests/NN_topic/known_wrong/NAME.patch`,
`git checkout solutions/`, and put the mistake in a line or two above the diff.
"""
import argparse
import collections
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from grade_report import UNGRADED  # the states a machine leaves out of its grade

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


CAUGHT_BY = "Caught by: "

# How the catalogue compiles the student's files: an entry only has to lose a case, and its
# catching case, run first, took 0.06 s at the median (2.7 s at most) with them at -O0. At -O0
# after headers precompiled at -O0, the entries of lessons 00, 06, 09 and 10 took 542
# worker-seconds against 690 at -O1 (-O3 for 09), and lesson 07's took 98 against 139 with its
# kernels' host rewrite at -O0 too (5.0 s to compile at -O3, 2.8 s at -O0). The emulated kernels of
# the lessons in KERNELS_FULL_SPEED stay at -O3: at -O0, lesson 09's emulated cases took 11 s
# longer in all (one 9.0 s against 2.7 s) than its eight rewrites' compiles saved, and the rewrites
# of 08 and 11 compile in 2.2 and 2.4 s at -O0 against 2.0 and 3.0 s (CONTRIBUTING.md).
STUDENT_FLAGS = "-O0"
KERNELS_FULL_SPEED = ("08", "09", "11")


def header(path):
    """The lines above the diff, stripped: what mistake the patch stands for, and its Caught-by line."""
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith(("diff --git", "--- ")):
                break
            if line.strip():
                lines.append(line.strip())
    return lines


NOT_EMULATED = "Not emulated: "
EMULATED_ONLY = "Emulated only: "


def describe(path):
    """What mistake the patch stands for (the lines above the diff, but its Caught-by, Not-emulated
    and Emulated-only lines)."""
    return " ".join(l for l in header(path) if not l.startswith((CAUGHT_BY, NOT_EMULATED, EMULATED_ONLY)))


def marked(path, mark):
    """The rest of the patch's line that starts with `mark` (NOT_EMULATED: why only a GPU shows the
    mistake; EMULATED_ONLY: why only the kernel emulator does), or None."""
    for line in header(path):
        if line.startswith(mark):
            return line[len(mark):]
    return None


def caught_by(path):
    """The graded cases the catalogue says catch the patch (its "Caught by: A, B" line), run first."""
    for line in header(path):
        if line.startswith(CAUGHT_BY):
            return [c.strip() for c in line[len(CAUGHT_BY):].split(",") if c.strip()]
    return []


def record_caught_by(path, case):
    """Writes (or rewrites) the patch's Caught-by line, just above its diff."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    lines = [l for l in lines if not l.startswith(CAUGHT_BY)]
    at = next(i for i, l in enumerate(lines) if l.startswith(("diff --git", "--- ")))
    while at > 0 and not lines[at - 1].strip():
        at -= 1
    lines[at:at] = [f"{CAUGHT_BY}{case}\n"]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)


def diff_hash(text):
    """The SHA-1 of a patch's diff: its text from the first "diff --git" or "--- " line on. The
    lines above it (the mistake, its Caught-by line) can change without undoing a proof."""
    lines = text.splitlines(keepends=True)
    at = next((i for i, l in enumerate(lines) if l.startswith((b"diff --git", b"--- "))), len(lines))
    return hashlib.sha1(b"".join(lines[at:])).hexdigest()


def patch_hash(path):
    """The SHA-1 of a patch's diff (diff_hash): what a proof on a GPU is good for."""
    with open(path, "rb") as f:
        return diff_hash(f.read())


def patched_files(path):
    """The files a patch changes (their "+++ " lines), in its order."""
    with open(path, encoding="utf-8") as f:
        return [line[4:].strip() for line in f if line.startswith("+++ ")]


def touches(path):
    """Whether a patch changes a CUDA kernel (a .cu file)."""
    return any(f.endswith(".cu") for f in patched_files(path))


def read_proven(path):
    """{patch path: (sha1, commit)} from a --skip-proven file (missing: none proven)."""
    proven = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and not line.startswith("#"):
                    proven[parts[0]] = (parts[1], parts[2])
    return proven


def cuda_headers():
    """Whether the CUDA Toolkit's headers are here (COURSE_CUDA=EMULATE needs them, not a GPU)."""
    roots = [os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]  # where CMake's FindCUDAToolkit looks
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    return any(r and os.path.exists(os.path.join(r, "include", "cuda_runtime.h")) for r in roots)


def current_commit():
    """HEAD's short hash, or the .gpu-commit file a copied tree carries."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        try:
            with open(os.path.join(ROOT, ".gpu-commit")) as f:
                return f.read().strip()[:7]
        except OSError:
            return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lessons", nargs="*")
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "known-wrong"))
    ap.add_argument("--list", action="store_true", help="list the catalogue and exit")
    # Each worker's build tree compiles every lesson it grades once: cheap where ccache is
    # installed (the objects come from the first tree), a whole build each where it is not.
    ap.add_argument("--workers", type=int, default=(os.cpu_count() or 1) if shutil.which("ccache") else 1,
                    help="entries graded at once, each in its own build tree (default: one per core "
                         "where ccache is installed, else one)")
    ap.add_argument("--all-cases", action="store_true",
                    help="run every graded case of each entry (its points, every case that catches it), "
                         "not only up to the first lost one")
    ap.add_argument("--record-caught-by", action="store_true",
                    help="write each entry's first catching case into its Caught-by line (after the "
                         "graded tests changed); CI then runs that case first")
    ap.add_argument("--kernels-only", action="store_true",
                    help="only the patches that change a CUDA kernel (.cu): what ./course gpu-check proves")
    ap.add_argument("--skip-proven", metavar="FILE",
                    help="skip the entries FILE lists as proven on a GPU with their patch's present diff "
                         "(docs/gpu-proven.txt: ./course gpu-check spends a GPU's minutes on what is new)")
    ap.add_argument("--proven-out", metavar="FILE",
                    help="write FILE: the --skip-proven list with every entry caught in this run added")
    ap.add_argument("--cmake-arg", action="append", default=[],
                    help="passed to the grader's CMake configure (a bare GPU machine's package prefix)")
    ap.add_argument("--kernels", choices=["auto", "device", "emulate", "skip"], default="auto",
                    help="how the entries that change a CUDA kernel are graded: on this machine's GPU, "
                         "emulated on the host (COURSE_CUDA=EMULATE: the kernels run thread by thread), or "
                         "not at all; auto: the GPU where there is one, else emulated where the CUDA "
                         "headers are, else skipped")
    args = ap.parse_args()

    patches = sorted(glob.glob(os.path.join(ROOT, "tests", "*", "known_wrong", "*.patch")))
    if args.lessons:
        wanted = tuple(f"{int(n):02d}_" for n in args.lessons)
        patches = [p for p in patches if os.path.basename(os.path.dirname(os.path.dirname(p))).startswith(wanted)]
    if not patches:
        print("known_wrong: no catalogued wrong implementations found", file=sys.stderr)
        return 2
    if args.list:
        for p in patches:
            print(f"{os.path.relpath(p, ROOT)}: {describe(p)}")
        return 0

    todo = []  # (index, lesson, name, patch)
    rows = {}  # index -> (lesson, name, points, what)
    bad = {}  # index -> why the catalogue fails there
    counts = {}
    has_gpu = bool(glob.glob("/dev/nvidia[0-9]*"))
    kernels = args.kernels
    if kernels == "auto":
        kernels = "device" if has_gpu else "emulate" if cuda_headers() else "skip"
    if kernels == "device" and not has_gpu:
        kernels = "skip"
    if kernels == "emulate":
        args.cmake_arg.append("-DCOURSE_CUDA=EMULATE")
    # The files an entry changes are compiled anew for it, at STUDENT_FLAGS, after the course
    # headers they include, precompiled once per lesson and tree: parsing them was more than half
    # of such a compile (CMakeLists.txt, COURSE_STUDENT_PCH).
    args.cmake_arg.append("-DCOURSE_STUDENT_FLAGS=" + STUDENT_FLAGS)
    args.cmake_arg.append("-DCOURSE_STUDENT_FLAGS_SKIP_KERNELS=" + ";".join(KERNELS_FULL_SPEED))
    args.cmake_arg.append("-DCOURSE_STUDENT_PCH=ON")
    lock = threading.Lock()
    to_record = {}  # patch -> the case that caught it first (--record-caught-by)

    def record(i, lesson, name, points, what, shown, failure=None):
        """One entry's row of the table and its progress line; failure: why the catalogue fails there."""
        with lock:
            rows[i] = (lesson, name, points, what)
            if failure:
                bad[i] = failure
            print(f"  {lesson}/{name}: {shown}", flush=True)

    proven = read_proven(args.skip_proven) if args.skip_proven else {}
    for i, patch in enumerate(patches):
        lesson = os.path.basename(os.path.dirname(os.path.dirname(patch)))
        name = os.path.splitext(os.path.basename(patch))[0]
        touches_kernels = touches(patch)
        if args.kernels_only and not touches_kernels:
            continue
        rel = os.path.relpath(patch, ROOT)
        if rel in proven and proven[rel][0] == patch_hash(patch):
            record(i, lesson, name, "-", f"proven on a GPU before (commit {proven[rel][1]})",
                   f"proven before (commit {proven[rel][1]}), skipped")
            continue
        if touches_kernels and kernels == "emulate" and marked(patch, NOT_EMULATED):
            record(i, lesson, name, "-", f"needs a CUDA device ({marked(patch, NOT_EMULATED)}): checked by ./course gpu-check",
                   "not emulated, needs a CUDA device")
            continue
        if touches_kernels and kernels == "device" and marked(patch, EMULATED_ONLY):
            record(i, lesson, name, "-", f"shown only with the kernels emulated ({marked(patch, EMULATED_ONLY)}): checked by CI",
                   "emulated only, not graded on a GPU")
            continue
        if touches_kernels and kernels == "skip":
            # A mistake in a kernel shows only where the kernel runs: ./course gpu-check checks it.
            record(i, lesson, name, "-", "needs a CUDA device or the CUDA headers: checked by ./course gpu-check",
                   "needs a CUDA device or the CUDA headers, not checked here")
            continue
        todo.append((i, lesson, name, patch))

    # Each worker owns a copy of the solutions and a grading build tree, and takes the next entry
    # when it is done with one: a patch rebuilds one file (the others come from ccache where it is
    # installed), so one entry is mostly one compiler on one core, and the workers keep every core
    # busy. Every entry is still graded alone, on a lesson with only its own patch applied.
    # The even workers take the entries in the catalogue's order, the odd ones from its end: a
    # tree's first entry of a lesson compiles what the lesson's entries share (its other student
    # files, the kernels' host rewrites, its CUDA tests), and with two workers only the lesson
    # where they meet is compiled in both trees.
    # Within a lesson, the entries that change the same file follow one another: a student file
    # compiled after its precompiled headers never comes back from ccache, so the entry after one
    # that changed another file compiles that file again, put back as the reference (lesson 10's
    # api.cpp, 4.7 s; lesson 09's flash_attention.cpp). In the catalogue's alphabetical
    # order, that happened 24 times in lessons 07-11.
    todo.sort(key=lambda t: (t[1], patched_files(t[3]), t[2]))
    workers = max(1, min(args.workers, len(todo)))
    jobs = max(1, (os.cpu_count() or 1) // workers)
    queue = collections.deque(todo)

    def worker(w):
        try:
            grade_entries(w)
        except Exception as e:  # a worker that dies must not make its entries vanish from the table
            with lock:
                bad[-1 - w] = f"worker {w} stopped: {type(e).__name__}: {e}"

    def grade_entries(w):
        base = os.path.join(args.build, f"w{w}") if workers > 1 else args.build
        work = os.path.join(base, "work")
        student = os.path.join(work, "solutions")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(os.path.join(ROOT, "solutions"), student)
        configured = False
        last = None

        def drop_pch(lesson):
            """A worker grades a lesson's entries one after another: the headers precompiled for the
            lesson it leaves (100-200 MB) are not needed again in its tree."""
            gch = os.path.join(base, "CMakeFiles", f"lesson{lesson[:2]}_exercise.dir", "cmake_pch.hxx.gch")
            if os.path.exists(gch):
                os.remove(gch)

        while True:
            with lock:
                if not queue:
                    break
                i, lesson, name, patch = queue.popleft() if w % 2 == 0 else queue.pop()
            if last and last != lesson:
                drop_pch(last)
            last = lesson
            shutil.rmtree(os.path.join(student, lesson))
            shutil.copytree(os.path.join(ROOT, "solutions", lesson), os.path.join(student, lesson))
            # GIT_CEILING_DIRECTORIES: git apply works on the copy as on a plain directory, never
            # on the repository the build directory sits in.
            applied = subprocess.run(["git", "apply", patch], cwd=work, capture_output=True, text=True,
                                     env=dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(work)))
            if applied.returncode != 0:
                record(i, lesson, name, "-", "does not apply", "does not apply",
                       f"{lesson}/{name}: the patch no longer applies to the reference:\n{applied.stderr.strip()}")
                continue
            report = os.path.join(base, f"{lesson}-{name}.json")
            t0 = time.monotonic()
            cmd = [sys.executable, os.path.join(ROOT, "tools", "grader.py"), "--student", student, "--build", base,
                   "--lessons", lesson[:2], "--json", report, "--csv", report[:-5] + ".csv",
                   "--junit", report[:-5] + ".junit.xml", "--sandbox", "auto", "--quiet", "--timeout", "60",
                   "--jobs", str(jobs)]
            if configured:
                cmd.append("--no-configure")
            if not args.all_cases:
                cmd.append("--stop-at-first-loss")
            expected = [] if args.record_caught_by else caught_by(patch)
            cmd += [f"--first={c}" for c in expected]
            cmd += [f"--cmake-arg={a}" for a in args.cmake_arg]
            graded = subprocess.run(cmd, capture_output=True, text=True)
            configured = True
            seconds = time.monotonic() - t0
            if graded.returncode != 0:
                record(i, lesson, name, "-", "grading failed", "grading did not complete",
                       f"{lesson}/{name}: grading did not complete:\n{graded.stdout[-2000:]}{graded.stderr[-2000:]}")
                continue
            with open(report) as f:
                r = json.load(f)
            # The cases that lost it points, in the report's order ("not run": stopped before them).
            lost_cases = [t for l in r["lessons"] for t in l["tests"]
                          if t["status"] not in ("passed", "skipped", "not run") and t["status"] not in UNGRADED]
            caught = [t["name"].split(".", 1)[1] + (" (did not build)" if t["status"] == "not built" else "")
                      for t in lost_cases]
            # Stopped at the first lost case, the points earned say nothing more than "fewer".
            points = f"{r['earned']}/{r['total']}" if args.all_cases else f"< {r['total']}"
            lost = r["earned"] < r["total"]
            with lock:
                tally = counts.setdefault(lesson, [0, 0])
                tally[0] += lost
                tally[1] += 1
            # The catalogue says which case catches the entry; that case must still catch it (it
            # ran first: an entry caught only later costs CI every case before).
            stale = expected and not any(t["name"] in expected for t in lost_cases)
            if args.record_caught_by and lost_cases:
                with lock:  # written once every entry is graded: the grader sees the tree change
                    to_record[patch] = lost_cases[0]["name"]
            if lost and stale:
                record(i, lesson, name, points, f"caught, but not by {', '.join(expected)}",
                       f"{points}, but not by its Caught-by case",
                       f"{lesson}/{name} is no longer caught by {', '.join(expected)} (its Caught-by line) but by "
                       f"{', '.join(caught) or 'a case that did not run'}: run tools/known_wrong.py --lessons "
                       f"{lesson[:2]} --record-caught-by")
            elif lost:
                if args.proven_out and touches(patch) and kernels == "device":
                    with lock:
                        proven[os.path.relpath(patch, ROOT)] = (patch_hash(patch), current_commit())
                shown = (", ".join(caught[:3]) + (f" and {len(caught) - 3} more" if len(caught) > 3 else "")
                         or "a case that did not run")
                how = " (kernels emulated)" if kernels == "emulate" and touches(patch) else ""
                record(i, lesson, name, points, f"caught by {shown}{how}", f"{points} ({seconds:.0f} s){how}")
            else:
                record(i, lesson, name, points, "NOT CAUGHT", f"{points}, NOT CAUGHT",
                       f"{lesson}/{name} earns full marks: no graded test catches this mistake: {describe(patch)}")
        if last:
            drop_pch(last)
        shutil.rmtree(work, ignore_errors=True)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for patch, case in sorted(to_record.items()):
        record_caught_by(patch, case)
    if args.proven_out:
        with open(args.proven_out, "w") as f:
            f.write("# Catalogue entries that change a CUDA kernel, proven to lose points on a GPU: the patch,\n"
                    "# the SHA-1 of its diff when it was (the lines from its first 'diff --git' on: the header\n"
                    "# above may change), and the commit. ./course gpu-check skips an entry whose diff is\n"
                    "# unchanged (tools/known_wrong.py --skip-proven); edit the diff and it runs again.\n")
            for rel, (digest, commit) in sorted(proven.items()):
                f.write(f"{rel} {digest} {commit}\n")
    for i, lesson, name, _ in todo:
        if i not in rows:
            rows[i] = (lesson, name, "-", "not graded")
            bad[i] = f"{lesson}/{name}: not graded (a worker stopped before it)"
    rows = [rows[i] for i in sorted(rows)]
    bad = [bad[i] for i in sorted(bad)]

    print("\n| lesson | wrong implementation | points | |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    for lesson, (caught, total) in sorted(counts.items()):
        print(f"{lesson}: {caught} of {total} known-wrong implementations lose points")
    if bad:
        print("\n" + "\n\n".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
