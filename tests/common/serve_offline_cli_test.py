#!/usr/bin/env python3
"""The serve-offline program end to end: one bad request is reported with its line and the rest
are served (exit status 1 at the end); CRLF prompt files lose their carriage returns; a directory
as the prompts file and KV memory beyond the machine are refused with a message; on 2 MPI ranks
(lesson 12) the texts and the exit status are the same, and mpirun says nothing of it.

    serve_offline_cli_test.py SERVE_OFFLINE_BINARY REPOSITORY_ROOT
"""
import os
import subprocess
import sys
import tempfile

binary, root = sys.argv[1], sys.argv[2]
model = os.path.join(root, "models", "tiny-fortunes")


def serve(prompts_path, *extra):
    return subprocess.run([binary, "--model", model, "--prompts", prompts_path, "--max-new-tokens", "6",
                           "--temperature", "0"] + list(extra), capture_output=True, text=True, check=False)


with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "prompts.txt")
    with open(path, "wb") as f:  # CRLF line endings, and a second line longer than the context
        f.write(b"Hello there\r\n" + b"x" * 300 + b"\r\n\r\nThe end\r\n")
    run = serve(path)
    if run.returncode != 1:
        sys.exit(f"a refused request must make the exit status 1, got {run.returncode}: {run.stderr}")
    if "line 2: not served" not in run.stderr or "exceed the model's context" not in run.stderr:
        sys.exit(f"the over-long prompt must be reported with its line and reason, got {run.stderr!r}")
    if "--- request 0, line 1" not in run.stdout or "--- request 2, line 4" not in run.stdout:
        sys.exit(f"the other requests must be served, with their lines, got {run.stdout!r}")
    if "\r" in run.stdout:
        sys.exit("a CRLF prompt file's carriage returns reached the output")
    if "1 of 3 prompts were not served" not in run.stderr:
        sys.exit(f"the summary must count the refused prompts, got {run.stderr!r}")
    print("serve_offline: one over-long prompt (line 2) refused with its line, the other two served, exit 1")

    # Lesson 12: on 2 MPI ranks (mpirun started by the program) rank 0 serves the same greedy
    # texts, the refused line included; without MPI in the build the option says what to install.
    tp = serve(path, "--tensor-parallel-size", "2")
    if "needs MPI" in tp.stderr:
        print(f"serve_offline --tensor-parallel-size 2: refused, this build has no MPI")
    elif (tp.returncode != 1 or tp.stdout != run.stdout or "tensor parallel over 2 MPI ranks" not in tp.stderr
          or "-----" in tp.stderr):
        sys.exit(f"serve_offline --tensor-parallel-size 2 (exit {tp.returncode}) printed {tp.stdout!r} and "
                 f"{tp.stderr!r}; expected {run.stdout!r}, exit 1 and no box of mpirun's (the job was not aborted)")
    else:
        print("serve_offline --tensor-parallel-size 2: the same texts from rank 0 of 2 MPI ranks, exit 1, no box "
              "of mpirun's")
        # Over paged blocks with lesson 05's prefix cache: rank 0's memory decides the blocks,
        # every rank holds its heads of them.
        paged = ["--paged", "--block-size", "4", "--prefix-cache"]
        one, tp = serve(path, *paged), serve(path, "--tensor-parallel-size", "2", *paged)
        if tp.returncode != 1 or tp.stdout != one.stdout:
            sys.exit(f"serve_offline --tensor-parallel-size 2 {' '.join(paged)} (exit {tp.returncode}) printed "
                     f"{tp.stdout!r} and {tp.stderr!r}; expected {one.stdout!r}")
        print(f"serve_offline --tensor-parallel-size 2 {' '.join(paged)}: the same texts as one process")

    for extra, path_arg, says in [([], tmp, "is a directory"),
                                  (["--paged", "--num-blocks", "2000000000"], path, "GB of KV memory; this machine has")]:
        run = serve(path_arg, *extra)
        if run.returncode == 0 or says not in run.stderr:
            sys.exit(f"{extra} {path_arg}: expected a non-zero exit mentioning {says!r}, got {run.returncode}: {run.stderr!r}")
    print("serve_offline: a directory of prompts and a pool beyond the machine are refused")

    # Lesson 11's weights: the same engine on INT8 and INT4 projections; bad values refused.
    ok = os.path.join(tmp, "ok.txt")
    with open(ok, "w") as f:
        f.write("The \nLove is\n")
    for weights in ("int8", "int4"):
        run = serve(ok, "--weights", weights)
        if run.returncode != 0 or f"{weights} weights" not in run.stderr or "--- request 1, line 2" not in run.stdout:
            sys.exit(f"--weights {weights}: exit {run.returncode}, {run.stderr!r}")
    for extra, says in [(["--weights", "int9"], "f32, int8 or int4"), (["--weights", "int8", "--group", "32"], "--group needs"),
                        (["--weights", "int4", "--group", "48"], "a group of 48 columns"),
                        (["--cublas"], "it needs --device cuda and --weights bf16"),
                        (["--top-p", "0"], "--temperature or --top-p"),
                        (["--max-batch", "2", "--max-batch", "3"], "--max-batch is given twice"),
                        (["--paged", "--num-blocks", "2000000000"], "GB available (lower --num-blocks"),
                        (["--speculative", ""], "got ''")]:
        run = serve(ok, *extra)
        if run.returncode == 0 or says not in run.stderr:
            sys.exit(f"{extra}: expected a non-zero exit mentioning {says!r}, got {run.returncode}: {run.stderr!r}")
    print("serve_offline: --weights int8 and int4 serve every prompt; bad --weights and --group refused")
