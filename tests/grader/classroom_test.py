#!/usr/bin/env python3
"""The classroom CI files run what they say (ctest label `grader`).

    classroom_test.py [WORKDIR]

Reads classroom/github-classroom.yml and classroom/gitlab-ci.yml as the services would, checks
what each service needs from them (GitHub Classroom's reporter: one runner per lesson, each with
its results; GitLab: a JUnit report where the job writes it), then runs their commands, as
written, in the course's own tree as it stands (its exercises: on a first push, the starters), with
`--lessons 00` added so that one lesson is built and graded, not every lesson. They write where a
student's push writes, build/grade/ (left holding a grade of lesson 00), and their build takes the
objects the course's own builds compiled from ccache (a copy of the course elsewhere compiled its
lesson 00 from nothing: the slowest of the course's tests, with the grader's):

* the GitHub job's grade step, with $GITHUB_OUTPUT: the results the reporter would read decode to
  lesson 00's cases, each with the points the grade's own report (build/grade/grade.json) gives it
  (none, on the starters; a student who has done lesson 00 runs this too, in `./course test`, and
  the copy holds their work), and the reporter's sum of scores is the grade's;
* the GitLab job's script: its JUnit report is where the job's artifacts say, with lesson 00's
  cases;
* the instructors' example hidden test (classroom/hidden-tests) with the reference solution:
  graded with its points, and passing.
"""
import base64
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tools"))
import grade_report  # noqa: E402

LESSONS = grade_report.lesson_dirs(REPO)
CASES = grade_report.graded_cases(root=REPO)
EXPR = re.compile(r"^\$\{\{\s*steps\.([\w-]+)\.outputs\.([\w-]+)\s*\}\}$")


def run(cmd, cwd, env=None):
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))
    return proc.returncode, proc.stdout[-3000:] + proc.stderr[-3000:]


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="classroom-test-")
    failures = []
    with open(os.path.join(REPO, "classroom", "github-classroom.yml")) as f:
        gh = yaml.safe_load(f)
    with open(os.path.join(REPO, "classroom", "gitlab-ci.yml")) as f:
        gl = yaml.safe_load(f)

    # ---- GitHub Classroom: what the service and its reporter read
    triggers = gh.get("on", gh.get(True))  # YAML 1.1 reads a bare `on` as true
    if "push" not in (triggers or []):
        failures.append(f"github: the workflow must run on push, it runs on {triggers}")
    if (gh.get("permissions") or {}).get("checks") != "write":
        failures.append("github: the reporter needs permissions: checks: write")
    (job,) = gh["jobs"].values()
    steps = job["steps"]
    grade = [s for s in steps if "./course grade" in (s.get("run") or "")]
    reporter = [s for s in steps if "autograding-grading-reporter" in (s.get("uses") or "")]
    if len(grade) != 1 or len(reporter) != 1 or not grade[0].get("id"):
        return print("github: expected one step running ./course grade (with an id) and one reporter step") or 1
    grade, reporter = grade[0], reporter[0]
    runners = [r.strip() for r in reporter["with"]["runners"].split(",")]
    expected = ["lesson" + l[:2] for l in LESSONS]
    if runners != expected:
        failures.append(f"github: the reporter's runners are {runners}; the course's lessons need {expected}")
    wiring = {}  # runner -> the output of the grade step its results come from
    for runner in runners:
        value = (reporter.get("env") or {}).get(runner.upper() + "_RESULTS", "")
        m = EXPR.match(str(value))
        if not m or m.group(1) != grade["id"]:
            failures.append(f"github: {runner.upper()}_RESULTS must be ${{{{ steps.{grade['id']}.outputs.{runner} }}}}, "
                            f"it is {value!r}")
        else:
            wiring[runner] = m.group(2)
    if reporter.get("if") is None:
        failures.append("github: the reporter must run even when grading fails (if: ${{ !cancelled() }})")

    # ---- GitLab: a JUnit report where the job writes it
    (gl_job,) = [j for k, j in gl.items() if isinstance(j, dict) and "script" in j]
    artifacts = gl_job.get("artifacts") or {}
    junit = (artifacts.get("reports") or {}).get("junit")
    if artifacts.get("when") != "always" or not junit:
        failures.append("gitlab: artifacts need when: always and reports: junit")

    # ---- their commands, in the course's tree as it stands (on a first push, the starters). The
    # reports they are checked by are removed first: none may be left from an earlier grade.
    repo = REPO
    os.makedirs(work, exist_ok=True)
    for report in ("grade.json", "grade.csv", "junit.xml", "hidden.json"):
        if os.path.exists(os.path.join(repo, "build", "grade", report)):
            os.remove(os.path.join(repo, "build", "grade", report))
    for s in steps:
        if s.get("run") and s is not grade:
            rc, out = run(s["run"], repo)
            if rc != 0:
                failures.append(f"github: step {s.get('name')!r} ({s['run']}) exited {rc}:\n{out}")
    outputs_file = os.path.join(work, "github-output")
    open(outputs_file, "w").close()
    rc, out = run(grade["run"] + " --lessons 00", repo, {"GITHUB_OUTPUT": outputs_file})
    if rc != 0:
        failures.append(f"github: `{grade['run']} --lessons 00` exited {rc}:\n{out}")
    outputs = dict(line.split("=", 1) for line in open(outputs_file).read().splitlines() if "=" in line)
    lesson00 = [n for n, (l, _, _) in CASES.items() if l == LESSONS[0]]
    points00 = sum(p for l, p, _ in CASES.values() if l == LESSONS[0])
    # What the grade itself reported for lesson 00, case by case: the reporter must show the same.
    graded = os.path.join(repo, "build", "grade", "grade.json")
    report00 = next((l for l in json.load(open(graded))["lessons"] if l["lesson"] == LESSONS[0]), None) \
        if os.path.exists(graded) else None
    if report00 is None:
        failures.append(f"github: the grade step wrote no report of lesson 00 in {graded}")
        report00 = {"earned": 0, "total": points00, "tests": []}
    earned00 = {t["name"]: t["earned"] for t in report00["tests"]}
    status00 = "pass" if report00["earned"] == report00["total"] else "fail"
    total_score = total_max = 0
    for runner, key in wiring.items():
        if key not in outputs:
            failures.append(f"github: the grade step wrote no output {key!r} for runner {runner}")
            continue
        results = json.loads(base64.b64decode(outputs[key]))
        # The reporter's sum (its notify-classroom step): the scores of runners with a max_score.
        if results.get("max_score"):
            total_max += results["max_score"]
            total_score += sum(t["score"] for t in results["tests"])
        if runner == "lesson00":
            names = sorted(t["name"] for t in results["tests"])
            if (results.get("version"), results.get("status"), results.get("max_score")) != (1, status00, points00) \
                    or names != sorted(lesson00) or any(t["score"] != earned00.get(t["name"]) for t in results["tests"]):
                failures.append(f"github: lesson 00's results should be version 1, {status00}, max_score {points00}, "
                                f"its {len(lesson00)} cases with the grade's points {earned00}; got {results}")
        elif results.get("status") != "error":
            failures.append(f"github: {runner} was not graded in this run; its results say {results.get('status')}")
    if (total_score, total_max) != (report00["earned"], points00):
        failures.append(f"github: the reporter would sum {total_score}/{total_max}, expected the grade's "
                        f"{report00['earned']}/{points00}")

    script = [line for line in gl_job["script"] if "./course grade" in line]
    for line in gl_job["script"]:
        rc, out = run(line + (" --lessons 00" if line in script else ""), repo)
        if rc != 0:
            failures.append(f"gitlab: `{line}` exited {rc}:\n{out}")
    path = os.path.join(repo, junit or "missing")
    if not os.path.exists(path):
        failures.append(f"gitlab: no JUnit report at {junit}")
    else:
        cases = sorted(tc.get("name") for tc in ET.parse(path).getroot().iter("testcase"))
        if cases != sorted(lesson00):
            failures.append(f"gitlab: the JUnit report has {len(cases)} cases, expected lesson 00's {len(lesson00)}")
    for p in artifacts.get("paths", []):
        if not glob.glob(os.path.join(repo, p)):
            failures.append(f"gitlab: the artifact {p} was not written")

    # ---- the example hidden test, with the reference solution
    hidden = os.path.join("classroom", "hidden-tests")
    rc, out = run(f"./course grade --unsandboxed --student solutions --lessons 00 --extra-tests {hidden} "
                  "--json build/grade/hidden.json", repo)
    report = json.load(open(os.path.join(repo, "build", "grade", "hidden.json"))) if rc == 0 else {}
    tests = {t["name"]: t for l in report.get("lessons", []) for t in l["tests"]}
    extra = grade_report.graded_cases(os.path.join(repo, hidden), root=repo)
    mine = [n for n in extra if n not in CASES]
    if rc != 0 or not mine or any(tests.get(n, {}).get("status") != "passed" for n in mine) \
            or report.get("earned") != report.get("total"):
        failures.append(f"hidden tests: the reference should pass {mine} and earn full marks (exit {rc}); "
                        f"got {[(n, tests.get(n, {}).get('status')) for n in mine]}, "
                        f"{report.get('earned')}/{report.get('total')}\n{out}")

    if failures:
        print("\n\n".join(failures))
        print(f"\n{len(failures)} classroom checks failed (the grades are in {os.path.join(repo, 'build', 'grade')})")
        return 1
    print(f"classroom files: GitHub's {len(runners)} runners and GitLab's JUnit report checked; their commands ran "
          f"(lesson 00: {report00['earned']}/{points00}, as graded), and the example hidden test passes on the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
