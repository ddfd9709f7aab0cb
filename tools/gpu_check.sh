#!/usr/bin/env bash
# ./course gpu-check: everything the CUDA lessons need checked, in one command, on a bare GPU
# machine (nvcc, CMake, ninja and compute-sanitizer there; none of the course's Debian packages;
# no network).
#
#   ./course gpu-check [--out DIR] [--commit SHA] [--build-only] [--arch SM] [--lessons NN...]
#                      [--steps tests,sanitizers,benches,catalogue] [--whole-catalogue]
#
#  1. the build's packages: if the system has no Eigen, the .deb files that `./course gpu-deps`
#     fetched into .deb/ are unpacked into build/gpu-deps (GoogleTest is built from source);
#  2. the reference engine with CUDA: build/cuda (kept, so a rerun only rebuilds what changed;
#     without the host stand-in and emulated kernels CI runs, COURSE_STAND_IN=OFF);
#  3. every test but the grader's (it needs bubblewrap), the `cuda` ones among them;
#  4. compute-sanitizer memcheck over every CUDA test program, racecheck over their kernel cases;
#  5. the CUDA benches, each writing JSON, and lesson 10's serving table on the GPU (over HTTP);
#  6. the catalogue of known-wrong kernels, each proven to lose points (CI cannot: no GPU): the
#     entries docs/gpu-proven.txt does not list with their present text (--whole-catalogue: all),
#     the list with this run's proofs added written to DIR/gpu-proven.txt (commit it to docs/);
#  7. one report, DIR/gpu-report.md and DIR/gpu-report.json: the GPU, its driver, nvcc, the
#     commit, each step's result, each test, each kernel's GB/s.
# With --build-only it stops after step 2 (what a machine without a GPU can check). With --lessons
# (say `--lessons 08`), steps 4 to 6 cover those lessons only (every test still runs): a rerun
# after changing one lesson, on a machine whose time is short. With --steps (a comma list of tests,
# sanitizers, benches and catalogue: steps 3 to 6; all by default), only those after the build:
# `--steps tests,benches` first gives every figure and every test's verdict, then `--steps
# sanitizers,catalogue` the slower proofs, each call within a lent GPU's minutes.
# Each step has a time limit, so the whole stays under 8 minutes on an H200. Ctrl-C (or TERM)
# stops the running step at once and still writes the report of the steps that ran, the stopped
# one marked interrupted (exit status 130).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

out="${OUT:-$ROOT/build/gpu-check}" commit="" build_only=0 arch="" only="" whole_catalogue=0
need() { [ $# -ge 2 ] && [ -n "$2" ] || { echo "gpu-check: $1 needs a value" >&2; exit 2; }; }
steps_on="tests sanitizers benches catalogue"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) need "$@"; out=$2; shift 2 ;;
    --commit) need "$@"; commit=$2; shift 2 ;;
    --arch) need "$@"; arch=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --build-only) build_only=1; shift ;;
    --whole-catalogue) whole_catalogue=1; shift ;;
    --steps)
      [ $# -ge 2 ] && [ -n "${2//[, ]/}" ] || { echo "gpu-check: --steps needs a list such as tests,benches" >&2; exit 2; }
      steps_on=${2//,/ }
      for s in $steps_on; do
        [[ " tests sanitizers benches catalogue " == *" $s "* ]] ||
          { echo "gpu-check: unknown step '$s' (expected tests, sanitizers, benches or catalogue)" >&2; exit 2; }
      done
      shift 2 ;;
    --lessons) shift; while [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]{1,2}$ ]]; do only="$only $(printf '%02d' "$((10#$1))")"; shift; done ;;
    *) echo "gpu-check: unknown option '$1'" >&2; exit 2 ;;
  esac
done
# Without a CUDA device every GPU step would skip and the report would read as passed: refused
# (--build-only only builds). Either sign of a device will do: nvidia-smi listing one, or its file.
if [ "$build_only" = 0 ] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; } &&
   ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  echo "gpu-check: no CUDA device here (nvidia-smi lists none, and there is no /dev/nvidia0): its steps would" \
       "skip and read as passed. Run it on a GPU machine; --build-only builds and stops." >&2
  exit 2
fi
# (A folder: every later step writes into it, and clears what an earlier run left there.)
mkdir -p "$out" 2>/dev/null && out=$(cd "$out" && pwd) && [ -n "$out" ] && [ "$out" != / ] ||
  { echo "gpu-check: --out must name a folder it can write (got '$out')" >&2; exit 2; }
steps="$out/steps.tsv"
# A call with --steps adds to the last call's report in DIR when both ran the same commit: its
# steps' lines and outputs are replaced, the others' kept (so `--steps tests,benches`, then
# `--steps sanitizers,catalogue` make one report). Otherwise DIR starts empty of reports.
this_commit=${commit:-$(git rev-parse HEAD 2>/dev/null || cat .gpu-commit 2>/dev/null || echo unknown)}
category() {  # a steps.tsv line's step: tests, sanitizers, benches, catalogue, or build
  case "$1" in
    tests*|"cuda tests"*) echo tests ;; compute-sanitizer*) echo sanitizers ;;
    bench*|"serving table"*) echo benches ;; known-wrong*) echo catalogue ;; *) echo build ;;
  esac
}
kept=""
if [ "$steps_on" != "tests sanitizers benches catalogue" ] && [ -f "$steps" ] &&
   [ "$(cat "$out/commit" 2>/dev/null)" = "$this_commit" ]; then
  while IFS= read -r line; do
    c=$(category "${line%%$'	'*}")
    [ "$c" = build ] || [[ " $steps_on " == *" $c "* ]] || kept+="$line"$'
'
  done <"$steps"
  for s in $steps_on; do
    case "$s" in
      tests) rm -f "$out"/*.junit.xml ;;
      benches) rm -rf "$out"/*_bench.json "$out"/serving ;;
    esac
  done
else
  rm -rf "$out"/*.junit.xml "$out"/*_bench.json "$out"/serving "$out"/gpu-proven.txt
fi
printf '%s' "$kept" >"$steps"
echo "$this_commit" >"$out/commit"
start=$SECONDS
PY=$(command -v python3 || echo /usr/bin/python3)

# record NAME STATUS SECONDS NOTE: one line per step for the report.
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$steps"; echo "== $1: $2 ($3 s) $4"; }

# step_on STEP: whether --steps asked for STEP (tests, sanitizers, benches, catalogue).
step_on() { [[ " $steps_on " == *" $1 "* ]]; }

# wanted NN: whether lesson NN's sanitizer runs, bench and catalogue are part of this run.
wanted() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }

# run_step NAME LIMIT LOG COMMAND...: runs a step with a time limit, its output into LOG. The step
# runs in the background and the script waits for it, so that Ctrl-C stops it at once: `timeout`
# puts the step in a process group of its own, which the terminal's Ctrl-C does not reach, so a
# step run in the foreground would finish before the script heard it.
step_pid="" step_name="" step_t0=0
run_step() {
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$SECONDS status
  step_name=$name step_t0=$t0
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1 &
  step_pid=$!
  wait "$step_pid"
  status=$?
  step_pid=""
  local took=$((SECONDS - t0))
  if [ $status -eq 0 ]; then record "$name" passed "$took" ""
  elif [ $status -eq 124 ] || [ $status -eq 137 ]; then record "$name" "timed out" "$took" "after $limit s"
  else record "$name" failed "$took" "exit $status: $(first_failure "$log" | cut -c1-200)"
  fi
  return $status
}

# write_report: the report of the steps recorded so far (tools/gpu_report.py).
write_report() {
  "$PY" tools/gpu_report.py --out "$out" --commit "$this_commit" --build-only "$build_only" --seconds $((SECONDS - start)) \
    --lessons "$only" --steps "$steps_on" --continued "$([ -n "$kept" ] && echo 1 || echo 0)"
}

# Ctrl-C (or a TERM): stop the running step (`timeout` passes the signal on to its group), record
# it as interrupted, and write the report of what ran, so the figures measured so far are kept.
on_interrupt() {
  trap - INT TERM
  if [ -n "$step_pid" ]; then
    kill -TERM "$step_pid" 2>/dev/null
    wait "$step_pid" 2>/dev/null
    record "$step_name" interrupted $((SECONDS - step_t0)) "stopped by a signal (Ctrl-C or TERM)"
  fi
  echo "gpu-check: interrupted; writing the report of the steps that ran" >&2
  write_report
  exit 130
}
trap on_interrupt INT TERM

# first_failure LOG: what failed, as one line: ctest's list of failed tests where there is one,
# else the first line with the word error or fail (a word: a test named ...ErrorIs... is not one).
first_failure() {
  local failed
  failed=$(sed -n '/The following tests FAILED:/,$p' "$1" | sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\).*/\1/p' | paste -sd, -)
  if [ -n "$failed" ]; then echo "failed: $failed"; else grep -m1 -iwE 'error|errors|fail|failed|failure' "$1"; fi
}

# ------------------------------------------------------------ 1. packages --
cmake_args=()
if [ ! -f /usr/include/eigen3/Eigen/Core ] || [ ! -d /usr/include/gtest ]; then
  prefix="$ROOT/build/gpu-deps"
  if [ ! -f "$prefix/usr/share/eigen3/cmake/Eigen3Config.cmake" ]; then
    run_step "unpack .deb/" 60 "$out/deps.log" "$PY" tools/unpack_debs.py .deb "$prefix" || {
      echo "gpu-check: no packages to build with (run ./course gpu-deps where apt works, and carry .deb/)" >&2
      cat "$out/deps.log" >&2
    }
  fi
  cmake_args+=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DCOURSE_GTEST_SOURCE="$prefix/usr/src/googletest")
fi

# Lesson 10's HTTP server needs Boost.Beast's headers (libboost1.74-dev, among the .deb files
# `./course gpu-deps` fetches); without them it is left out there, and its tests run on every CPU machine.
[ -f /usr/include/boost/beast.hpp ] || [ -f "${prefix:-/nonexistent}/usr/include/boost/beast.hpp" ] || cmake_args+=(-DCOURSE_HTTP=OFF)

# ---------------------------------------------------------------- 2. build --
if [ -z "$arch" ] && command -v nvidia-smi >/dev/null; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
fi
[ -n "$arch" ] && cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$arch")
build="$ROOT/build/cuda"
run_step configure 120 "$out/configure.log" \
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOURSE_TRACK=solutions -DCOURSE_CUDA=ON -DCOURSE_STAND_IN=OFF \
  "${cmake_args[@]}"
configured=$?
built=1
if [ $configured -eq 0 ]; then
  run_step build 300 "$out/build.log" cmake --build "$build" -j "$(nproc)"
  built=$?
fi

if [ $build_only -eq 0 ] && [ $built -eq 0 ]; then
  # -------------------------------------------------------------- 3. tests --
  step_on tests && run_step "tests (all but the grader's)" 180 "$out/tests.log" \
    ctest --test-dir "$build" -LE grader -j "$(nproc)" --timeout 120 --output-junit "$out/tests.junit.xml"
  step_on tests && run_step "cuda tests" 120 "$out/cuda-tests.log" \
    ctest --test-dir "$build" -L cuda -j 4 --timeout 60 --output-junit "$out/cuda-tests.junit.xml"

  # --------------------------------------------------------- 4. sanitizers --
  if ! step_on sanitizers; then
    :
  elif command -v compute-sanitizer >/dev/null; then
    for prog in "$build"/bin/*cuda_tests; do
      [ -x "$prog" ] || continue
      # engine_cuda_tests: the whole engine on the GPU, lesson 10's.
      wanted "$(basename "$prog" | sed -E 's/^lesson([0-9]+).*/\1/; s/^engine_cuda_tests$/10/')" || continue
      # memcheck over every case; racecheck (shared-memory hazards, about 100 times slower) over
      # the kernel cases only: the whole-model and engine cases run the same kernels, and one of
      # them alone took 130 s under racecheck on an H200.
      # The engine's cases (hundreds of steps, no kernel of their own): memcheck
      # over the ones that move device blocks around (a mixed step, the prefix cache's copies,
      # cancellation), no racecheck.
      if [ "$(basename "$prog")" = engine_cuda_tests ]; then
        run_step "compute-sanitizer memcheck $(basename "$prog") (step, prefix cache, cancellation, cuBLAS)" 150 \
          "$out/sanitizer-memcheck-$(basename "$prog").log" \
          compute-sanitizer --tool memcheck --error-exitcode 3 "$prog" --gtest_filter='*MixedStep*:*PrefixCache*:*Cancelling*:*Cublas*'
        continue
      fi
      run_step "compute-sanitizer memcheck $(basename "$prog")" 150 "$out/sanitizer-memcheck-$(basename "$prog").log" \
        compute-sanitizer --tool memcheck --error-exitcode 3 "$prog"
      run_step "compute-sanitizer racecheck $(basename "$prog") (kernel cases)" 150 \
        "$out/sanitizer-racecheck-$(basename "$prog").log" \
        compute-sanitizer --tool racecheck --error-exitcode 3 "$prog" --gtest_filter='-*Model.*:*Engine.*'

    done
  else
    record "compute-sanitizer" skipped 0 "not installed on this machine"
  fi

  # -------------------------------------------------------------- 5. benches --
  for bench in "$build"/bin/lesson*_cuda_bench; do
    step_on benches && [ -x "$bench" ] || continue
    wanted "$(basename "$bench" | sed -E 's/^lesson([0-9]+).*/\1/')" || continue
    name=$(basename "$bench")
    run_step "bench $name" 150 "$out/$name.log" "$bench" --json "$out/$name.json"
  done

  # Lesson 10's table with both servers on the GPU (naive one request at a time, no cache, against
  # the engine), over HTTP as `./course load --table --device cuda` runs it: where the HTTP server
  # was built (Boost.Beast among the carried .deb files).
  if step_on benches && wanted 10 && [ -x "$build/bin/lesson10_serve" ] && [ -x "$build/bin/lesson10_load" ]; then
    run_step "serving table on the GPU (lesson 10)" 240 "$out/serving-table.log" \
      bash tools/load_table.sh "$build/bin" "$out/serving" 4 "1 8 32 128" --device cuda
  fi

  # ------------------------------------- 6. the kernels' known-wrong catalogue --
  # CI has no GPU, so the catalogued kernel mistakes are proven to lose points here.
  kw_args=()
  for a in "${cmake_args[@]}"; do kw_args+=("--cmake-arg=$a"); done
  cuda_lessons=$(ls tests/*/known_wrong/*.patch 2>/dev/null | xargs -r grep -l '^+++ .*\.cu$' | cut -d/ -f2 | cut -c1-2 | sort -u)
  cuda_lessons=$(for nn in $cuda_lessons; do wanted "$nn" && echo "$nn"; done)
  # About 10 s an entry on an H200 (lesson 07's six took 59 s); lesson 11's entries also wait for
  # its CPU cases (the model's among them), which the grader runs beside the kernel cases.
  if step_on catalogue && [ -n "$cuda_lessons" ]; then
    proven=(--proven-out "$out/gpu-proven.txt")
    [ $whole_catalogue -eq 1 ] || proven+=(--skip-proven docs/gpu-proven.txt)
    run_step "known-wrong kernels (lessons $(echo $cuda_lessons))" 360 "$out/known-wrong.log" \
      "$PY" tools/known_wrong.py --kernels-only --workers 1 --lessons $cuda_lessons --build "$ROOT/build/known-wrong-cuda" \
      --cmake-arg=-DCOURSE_CUDA=ON "${proven[@]}" "${kw_args[@]}"
  fi
fi

# --------------------------------------------------------------- 7. report --
write_report
! grep -qP '\t(failed|timed out|interrupted)\t' "$steps"
