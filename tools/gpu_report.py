#!/usr/bin/env python3
"""The GPU check's report (tools/gpu_check.sh writes the pieces; this joins them).

    gpu_report.py --out DIR --commit SHA [--build-only 0|1] [--seconds N]

Reads DIR/steps.tsv, DIR/*.junit.xml and DIR/*_bench.json; asks nvidia-smi and nvcc what ran;
writes DIR/gpu-report.json and DIR/gpu-report.md. Copy the markdown to docs/gpu-report.md to
publish it: the lesson texts quote that file, and nothing else, for GPU figures.
"""
import argparse
import csv
import glob
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grade_report  # noqa: E402
import gpu_targets  # noqa: E402


def ask(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def junit(path):
    """[{name, status}] of a JUnit file, read as the grade report reads ctest's."""
    return [{"name": name, "status": state if state in ("passed", "failed", "skipped") else "failed"}
            for name, (state, _, _) in grade_report.junit_results(path).items()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--build-only", default="0")
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--lessons", default="", help="the lessons --lessons limited the sanitizers, benches and catalogue to")
    ap.add_argument("--steps", default="tests sanitizers benches catalogue", help="the steps --steps ran after the build")
    ap.add_argument("--continued", default="0", help="1: DIR holds an earlier call's steps too (same commit)")
    a = ap.parse_args()

    gpu = ask(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"])
    nvcc = ask(["nvcc", "--version"]).splitlines()
    report = {
        "commit": a.commit,
        "gpu": gpu or "none found (nvidia-smi gave nothing)",
        "nvcc": nvcc[-1] if nvcc else "not found",
        "seconds": a.seconds,
        "build_only": a.build_only == "1",
        "lessons": a.lessons.split(),
        "steps_run": a.steps.split(),
        "steps": [],
        "tests": {},
        "benches": {},
    }
    steps_path = os.path.join(a.out, "steps.tsv")
    if os.path.exists(steps_path):
        with open(steps_path) as f:
            for line in f:
                name, status, seconds, note = (line.rstrip("\n").split("\t") + ["", "", "", ""])[:4]
                report["steps"].append({"step": name, "status": status, "seconds": seconds, "note": note})
    for path in sorted(glob.glob(os.path.join(a.out, "*.junit.xml"))):
        try:
            report["tests"][os.path.basename(path)[:-len(".junit.xml")]] = junit(path)
        except ET.ParseError:
            report["tests"][os.path.basename(path)] = [{"name": "(unreadable JUnit file)", "status": "failed"}]
    for path in sorted(glob.glob(os.path.join(a.out, "*_bench.json"))):
        with open(path) as f:
            try:
                report["benches"][os.path.basename(path)[:-5]] = json.load(f)
            except ValueError:
                report["benches"][os.path.basename(path)[:-5]] = {"error": "unreadable JSON"}

    serving = os.path.join(a.out, "serving", "load.csv")  # lesson 10's table, both servers on the GPU
    if os.path.exists(serving):
        with open(serving) as f:
            report["serving_table"] = list(csv.DictReader(f))

    with open(os.path.join(a.out, "gpu-report.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")

    # The title says which GPU and which commit: the page the lesson texts quote (docs/gpu-report.md).
    device = report["gpu"].split(",")[0].strip() if gpu else "no GPU"
    md = [f"# GPU check report: {device}, commit {str(report['commit'])[:7]} {{#gpu_report}}", ""]
    md += [f"- GPU: {report['gpu']}", f"- CUDA compiler: {report['nvcc']}", f"- commit: {report['commit']}",
           f"- command: `./course gpu-check`" + (" --build-only" if report["build_only"] else "")
           + (f" --lessons {' '.join(report['lessons'])}" if report["lessons"] else "")
           + (f" --steps {','.join(report['steps_run'])}" if len(report["steps_run"]) < 4 else "")
           + (" (added to an earlier call's report at the same commit: the steps below are both calls')"
              if a.continued == "1" else ""),
           f"- took: {report['seconds']} s" + (" (this call)" if a.continued == "1" else ""), ""]
    md += ["| step | result | seconds | note |", "| --- | --- | --- | --- |"]
    md += [f"| {s['step']} | {s['status']} | {s['seconds']} | {s['note']} |" for s in report["steps"]]
    for name, cases in report["tests"].items():
        counts = {k: sum(1 for c in cases if c["status"] == k) for k in ("passed", "failed", "skipped")}
        md += ["", f"## {name}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"]
        bad = [c["name"] for c in cases if c["status"] == "failed"]
        if bad:
            md += ["", "Failed: " + ", ".join(bad)]
    if report["benches"]:  # the course's GPU targets and the forward's tuning constants, against these figures
        md += ["", "## Targets and tuning", "", "The course's GPU targets (the figures its lesson texts aim at) and the tuning constants the forward uses, "
               "against this run's figures (tools/gpu_targets.py; the picks are for a person to commit).", ""]
        md += gpu_targets.summary(report)
    for name, bench in report["benches"].items():
        md += ["", f"## {name}", ""]
        if "copy_gbps" in bench:
            md += [f"Measured device-to-device copy: {bench['copy_gbps']:.0f} GB/s.", ""]
        kernels = bench.get("kernels", [])
        if kernels:
            md += ["| kernel | shape | ms | GB/s | of copy bandwidth |", "| --- | --- | --- | --- | --- |"]
            for k in kernels:
                md += [f"| {k.get('name')} | {k.get('shape', '')} | {k.get('ms', 0):.4f} | {k.get('gbps', 0):.0f} | "
                       f"{100 * k.get('fraction_of_copy', 0):.0f}% |"]
        notes = bench.get("notes", [])  # lessons 07 and 08: the checks of one kernel against another (07: the failed ones)
        if notes:
            md += [""] + [f"- {n}" for n in notes]
        for d in bench.get("decode", []):
            md += [f"- decode, {d.get('model')}: {d.get('tokens_per_s', 0):.0f} tokens/s "
                   f"({100 * d.get('fraction_of_roofline', 0):.0f}% of its memory roofline)"]
        parts = bench.get("step_parts", [])  # lesson 07's: one decode step, launch by launch
        if parts:
            total = sum(p.get("ms", 0) * p.get("per_step", 0) for p in parts)
            # Older reports timed each launch alone only; "stream_ms" is the same launch among
            # `stream` back to back (what the device spends while the host keeps ahead).
            streamed = all("stream_ms" in p for p in parts)
            step = bench.get("step_ms", 0)
            if streamed:
                n = bench.get("stream", 0)
                in_stream = sum(p["stream_ms"] * p.get("per_step", 0) for p in parts)
                md += ["", f"One decode step of the 1.1B shape (bf16, batch 1), each launch timed alone (one launch "
                           f"between two events) and in a stream of {n} back to back (the device's time while the "
                           f"host keeps ahead):", "",
                       "| launch | per step | ms alone | ms in a stream | ms a step (in a stream) | GB/s (in a stream) |",
                       "| --- | --- | --- | --- | --- | --- |"]
                md += [f"| {p.get('name')} | {p.get('per_step')} | {p.get('ms', 0):.4f} | {p['stream_ms']:.4f} | "
                       f"{p['stream_ms'] * p.get('per_step', 0):.3f} | {p.get('gbps', 0):.0f} |" for p in parts]
                md += ["", f"The parts: {total:.3f} ms timed alone, {in_stream:.3f} ms in a stream; the step: "
                           f"{step:.3f} ms; an empty pair of events reads {bench.get('events_ms', 0):.4f} ms. "
                           + ("Each stream was held until its launches were queued: its figures are the device's."
                              if bench.get("held") else
                              "The streams were not held (or a hold failed): their figures may be the host's "
                              "queueing where it is slower than the device.")]
            else:
                md += ["", "One decode step of the 1.1B shape (bf16, batch 1), each launch timed alone:", "",
                       "| launch | per step | ms each | ms a step | GB/s |", "| --- | --- | --- | --- | --- |"]
                md += [f"| {p.get('name')} | {p.get('per_step')} | {p.get('ms', 0):.4f} | "
                       f"{p.get('ms', 0) * p.get('per_step', 0):.3f} | {p.get('gbps', 0):.0f} |" for p in parts]
                md += ["", f"The parts: {total:.3f} ms; the step: {step:.3f} ms; the rest (the host's launching and "
                       f"waiting): {step - total:.3f} ms."]
        splits = bench.get("splits", [])
        if splits:
            md += ["", "| positions (batch 1) | splits | one pass ms | split ms | speedup |", "| --- | --- | --- | --- | --- |"]
            for p in splits:
                speedup = p.get("one_pass_ms", 0) / p["split_ms"] if p.get("split_ms") else 0
                md += [f"| {p.get('length')} | {p.get('splits')} | {p.get('one_pass_ms', 0):.4f} | "
                       f"{p.get('split_ms', 0):.4f} | {speedup:.1f}x |"]
        prefill = bench.get("prefill", [])
        if prefill:
            md += ["", f"cuBLAS bf16 product on this device: {bench.get('gemm_tflops', 0):.0f} TFLOP/s.", "",
                   "| version | tokens | ms | TFLOP/s | of cuBLAS | workspace MiB |", "| --- | --- | --- | --- | --- | --- |"]
            for p in prefill:
                frac = p.get("tflops", 0) / bench["gemm_tflops"] if bench.get("gemm_tflops") else 0
                md += [f"| {p.get('version')} | {p.get('tokens')} | {p.get('ms', 0):.3f} | {p.get('tflops', 0):.2f} | "
                       f"{100 * frac:.1f}% | {p.get('workspace_bytes', 0) / 2**20:.0f} |"]
        for d in bench.get("steps", []):
            md += [f"- decode step, {d.get('model')}: {d.get('tokens_per_s', 0):.0f} tokens/s"]
        # Lesson 11: the quantized GEMVs, each against lesson 07's bf16 GEMV of its shape at batch 1.
        gemv = bench.get("quantized_gemv", [])
        if gemv:
            md += [""] if md[-1] else []
            md += ["| format | shape | batch | ms | GB/s | of copy bandwidth | bf16 batch 1 time / this |",
                   "| --- | --- | --- | --- | --- | --- | --- |"]
            for g in gemv:
                # (older reports' rows read one matrix over and over: no "copies")
                shape = g.get("shape", "") + (f", {g['copies']} copies" if g.get("copies", 1) > 1 else "")
                md += [f"| {g.get('format')} | {shape} | {g.get('batch')} | {g.get('ms', 0):.4f} | "
                       f"{g.get('gbps', 0):.0f} | {100 * g.get('fraction_of_copy', 0):.0f}% | "
                       f"{g.get('bf16_batch1_over_this', 0):.2f}x |"]
        step = bench.get("quantized_step", [])
        if step:
            md += [""]
        for s in step:
            md += [f"- the 1.1B shape's projections, one decode step, {s.get('format')}, batch {s.get('batch')}: "
                   f"{s.get('ms', 0):.3f} ms (bf16 batch 1 time / this: {s.get('bf16_batch1_over_this', 0):.2f}x)"]
        decode = bench.get("quantized_decode", [])
        if decode:
            md += ["", "Decode through the engine (lesson 07's forward on each format's weights; 4 layers and the "
                   "head of the 1.1B shape), against each format's memory roofline (weight bytes a step reads "
                   "over the copy bandwidth):", "",
                   "| format | batch | tokens/s | MB a step | roof tokens/s | of roof |", "| --- | --- | --- | --- | --- | --- |"]
            for d in decode:
                md += [f"| {d.get('format')} | {d.get('batch')} | {d.get('tokens_per_s', 0):.0f} | "
                       f"{d.get('bytes_per_step', 0) / 1e6:.1f} | {d.get('roof_tokens_per_s', 0):.0f} | "
                       f"{100 * d.get('fraction_of_roof', 0):.0f}% |"]
        # Tables a bench lays out itself (lesson 10's): a title, columns, rows of text, notes.
        for t in bench.get("tables", []):
            md += ["", f"### {t.get('title', '')}", "", "| " + " | ".join(t.get("columns", [])) + " |",
                   "|" + " --- |" * len(t.get("columns", []))]
            md += ["| " + " | ".join(str(c) for c in row) + " |" for row in t.get("rows", [])]
            notes = t.get("notes", [])
            if notes:
                md += [""] + notes
    rows = report.get("serving_table", [])
    if rows:
        md += ["", "## Lesson 10's serving table on the GPU", "",
               "Both servers on the GPU (`lesson10_serve --device cuda`, naive with `--naive`), "
               "`lesson10_load` closed loop, 4 s a row (tools/load_table.sh).", "",
               "| server | users | total tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | requests (failed) |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            ms = lambda k: f"{1000 * float(r.get(k) or 0):.1f}"  # noqa: E731
            md += [f"| {r.get('label')} | {r.get('users')} | {float(r.get('total_tokens_per_s') or 0):.0f} | "
                   f"{ms('ttft_p50_s')} | {ms('ttft_p99_s')} | {ms('itl_p50_s')} | {ms('itl_p99_s')} | "
                   f"{r.get('requests')} ({r.get('failed')}) |"]
        rate = {(r.get("label"), r.get("users")): float(r.get("total_tokens_per_s") or 0) for r in rows}
        ratios = [f"{u} users: {rate[('engine', u)] / rate[('naive', u)]:.1f}x" for (label, u) in rate
                  if label == "engine" and rate.get(("naive", u))]
        if ratios:
            md += ["", "Engine / naive, total tokens/s: " + ", ".join(ratios) + "."]
    with open(os.path.join(a.out, "gpu-report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"wrote {a.out}/gpu-report.md and gpu-report.json")


if __name__ == "__main__":
    main()
