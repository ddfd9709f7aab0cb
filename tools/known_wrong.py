#!/usr/bin/env python3
"""Proves that each lesson's catalogue of known-wrong implementations loses points.

    tools/known_wrong.py [--lessons NN ...] [--build DIR] [--list]

tests/NN_topic/known_wrong/*.patch are small, readable changes to the reference solution
(solutions/NN_topic/), each one a mistake students make; the lines before the diff say which.
For each, this applies the patch to a copy of the solutions, grades that lesson with
tools/grader.py, and expects fewer points than the total. It prints which graded cases caught
each one, and exits 1 if any earns full marks (the tests miss that mistake) or no longer applies
(the reference changed under it: update the patch).

Write one by changing the reference, then `git diff solutions/ > tests/NN_topic/known_wrong/NAME.patch`,
`git checkout solutions/`, and put the mistake in a line or two above the diff.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def describe(path):
    """The lines above the diff: what mistake the patch stands for."""
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith(("diff --git", "--- ")):
                break
            if line.strip():
                lines.append(line.strip())
    return " ".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lessons", nargs="*")
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "known-wrong"))
    ap.add_argument("--list", action="store_true", help="list the catalogue and exit")
    ap.add_argument("--kernels-only", action="store_true",
                    help="only the patches that change a CUDA kernel (.cu): what ./course gpu-check proves")
    ap.add_argument("--cmake-arg", action="append", default=[],
                    help="passed to the grader's CMake configure (a bare GPU machine's package prefix)")
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

    work = os.path.join(args.build, "work")
    student = os.path.join(work, "solutions")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "solutions"), student)
    configured = False
    rows, bad = [], []
    counts = {}
    has_gpu = bool(glob.glob("/dev/nvidia[0-9]*"))
    for patch in patches:
        lesson = os.path.basename(os.path.dirname(os.path.dirname(patch)))
        name = os.path.splitext(os.path.basename(patch))[0]
        with open(patch, encoding="utf-8") as f:
            touches_kernels = any(line.startswith("+++ ") and line.rstrip().endswith(".cu") for line in f)
        if args.kernels_only and not touches_kernels:
            continue
        if touches_kernels and not has_gpu:
            # A mistake in a kernel shows only where the kernel runs: ./course gpu-check checks it.
            rows.append((lesson, name, "-", "needs a CUDA device: checked by ./course gpu-check"))
            print(f"  {lesson}/{name}: needs a CUDA device, not checked here", flush=True)
            continue
        shutil.rmtree(os.path.join(student, lesson))
        shutil.copytree(os.path.join(ROOT, "solutions", lesson), os.path.join(student, lesson))
        # GIT_CEILING_DIRECTORIES: git apply works on the copy as on a plain directory, never on
        # the repository the build directory sits in.
        applied = subprocess.run(["git", "apply", patch], cwd=work, capture_output=True, text=True,
                                 env=dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(work)))
        if applied.returncode != 0:
            bad.append(f"{lesson}/{name}: the patch no longer applies to the reference:\n{applied.stderr.strip()}")
            rows.append((lesson, name, "-", "does not apply"))
            print(f"  {lesson}/{name}: does not apply", flush=True)
            continue
        report = os.path.join(args.build, f"{lesson}-{name}.json")
        t0 = time.monotonic()
        cmd = [sys.executable, os.path.join(ROOT, "tools", "grader.py"), "--student", student, "--build", args.build,
               "--lessons", lesson[:2], "--json", report, "--csv", report[:-5] + ".csv",
               "--junit", report[:-5] + ".junit.xml", "--sandbox", "auto", "--quiet", "--timeout", "60"]
        if configured:
            cmd.append("--no-configure")
        cmd += [f"--cmake-arg={a}" for a in args.cmake_arg]
        graded = subprocess.run(cmd, capture_output=True, text=True)
        configured = True
        if graded.returncode != 0:
            bad.append(f"{lesson}/{name}: grading did not complete:\n{graded.stdout[-2000:]}{graded.stderr[-2000:]}")
            rows.append((lesson, name, "-", "grading failed"))
            print(f"  {lesson}/{name}: grading did not complete", flush=True)
            continue
        with open(report) as f:
            r = json.load(f)
        caught = [t["name"].split(".", 1)[1] + ("" if t["status"] != "not built" else " (did not build)")
                  for l in r["lessons"] for t in l["tests"] if t["status"] not in ("passed", "no gpu")]
        points = f"{r['earned']}/{r['total']}"
        counts.setdefault(lesson, [0, 0])
        counts[lesson][1] += 1
        if r["earned"] < r["total"]:
            counts[lesson][0] += 1
            shown = ", ".join(caught[:3]) + (f" and {len(caught) - 3} more" if len(caught) > 3 else "")
            rows.append((lesson, name, points, f"caught by {shown}"))
        else:
            bad.append(f"{lesson}/{name} earns full marks: no graded test catches this mistake: {describe(patch)}")
            rows.append((lesson, name, points, "NOT CAUGHT"))
            print(f"  {lesson}/{name}: {points}, NOT CAUGHT", flush=True)
            continue
        print(f"  {lesson}/{name}: {points} ({time.monotonic() - t0:.0f} s)", flush=True)

    print("\n| lesson | wrong implementation | points | |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    for lesson, (caught, total) in sorted(counts.items()):
        print(f"{lesson}: {caught} of {total} known-wrong implementations lose points")
    shutil.rmtree(work, ignore_errors=True)
    if bad:
        print("\n" + "\n\n".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
