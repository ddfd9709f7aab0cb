#!/usr/bin/env python3
"""Draws lessons 07 and 08's GPU figures from the GPU report, for the walkthrough.

    tools/gpu_report_plots.py [docs/gpu-report.md] [OUT_DIR]
    (writes OUT_DIR/lesson07_gpu.png and lesson08_gpu.png; OUT_DIR defaults to docs/images)

The lesson texts quote their GPU figures from docs/gpu-report.md and from nowhere else; these plots
draw the same figures, with the GPU and the commit that produced them in each title. The report
keeps the latest `./course gpu-check` first and earlier runs below it: each lesson's figures are
taken from the first run that has its bench. Run it again after committing a new report.
"""
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_targets  # noqa: E402  (the report's reading of a shape's batch)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs", "gpu-report.md")
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "docs", "images")


def runs(text):
    """The report's runs, each {gpu, commit, copy: {bench: GB/s}, kernels: {bench: rows}, lines: {bench: [...]}}."""
    found, cur, bench, header = [], None, None, None
    for line in text.splitlines():
        in_table = line.startswith("| ")
        if not in_table:
            header = None  # the next table's first line is its header
        if line.startswith("- GPU: "):
            cur = {"gpu": line[7:].split(",")[0], "commit": "", "copy": {}, "kernels": {}, "lines": {}}
            found.append(cur)
        elif cur is None:
            continue
        elif line.startswith("- commit: "):
            cur["commit"] = line[10:].strip()[:7]
        elif re.match(r"^#+ (lesson\d\d_cuda_bench)\s*$", line):
            bench = line.split()[-1]
            cur["kernels"][bench], cur["lines"][bench] = [], []
        elif line.startswith("## "):
            bench = None
        elif bench and line.startswith("Measured device-to-device copy:"):
            cur["copy"][bench] = float(re.search(r"([\d.]+) GB/s", line).group(1))
        elif bench and in_table:
            if header is None:
                header = line
            elif header.startswith("| kernel") and not line.startswith("| ---"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                cur["kernels"][bench].append({"name": cells[0], "shape": cells[1], "ms": float(cells[2]),
                                              "gbps": float(cells[3])})
        elif bench and line.startswith("- decode"):
            cur["lines"][bench].append(line[2:])
    return found


def first_with(all_runs, bench):
    for r in all_runs:
        if r["kernels"].get(bench):
            return r
    sys.exit(f"{src}: no run has {bench}'s figures")


def bandwidth_bars(ax, names, gbps, colors, copy, xlabel, title):
    """A kernel per bar, against the device's copy bandwidth."""
    ax.barh(names, gbps, color=colors)
    ax.axvline(copy, color="black", linestyle="--", label=f"device copy, {copy:.0f} GB/s")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.invert_yaxis()
    ax.legend(fontsize=8)


def log_axes(ax, xlabel, ylabel, title):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


def save(fig, r, lesson):
    fig.suptitle(f"Lesson {lesson} on an {r['gpu']} (commit {r['commit']}, docs/gpu-report.md)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"lesson{lesson}_gpu.png"), dpi=100)


all_runs = runs(open(src, encoding="utf-8").read())
os.makedirs(out, exist_ok=True)

# Lesson 07: the GEMV ladder against the copy bandwidth, and decode against its roofline.
r = first_with(all_runs, "lesson07_cuda_bench")
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
def batch_of(k):
    return gpu_targets.batch_of(k["shape"])


# The largest square matrix (16,384 on a GPU), one row and batch 8 (the bench also has 2 to 64);
# of the given tensor-core GEMM's variants, the fastest at batch 8.
n = max(int(m.group(1)) for k in r["kernels"]["lesson07_cuda_bench"] if (m := re.match(r"(\d+) x \1 ", k["shape"])))
big = [k for k in r["kernels"]["lesson07_cuda_bench"]
       if k["shape"].startswith(f"{n} x {n} ") and batch_of(k) in (1, 8)]
tensor = [k for k in big if k["name"].startswith("tensor_gemm")]
big = [k for k in big if not k["name"].startswith("tensor_gemm")] + sorted(tensor, key=lambda k: -k["gbps"])[:1]
bandwidth_bars(a, [k["name"] + ("" if batch_of(k) == 1 else " (batch 8)") for k in big],
               [k["gbps"] for k in big], ["tab:gray" if "cuBLAS" in k["name"] else "tab:blue" for k in big],
               r["copy"]["lesson07_cuda_bench"], f"GB/s of weights read ({n:,} x {n:,})", "The GEMV ladder")
decode, library = [], []
for line in r["lines"]["lesson07_cuda_bench"]:
    # (the bench's --small run-through has a small model in the 1.1B shape's place)
    m = re.match(r"decode, (?:1\.1B shape|small model in the 1\.1B shape's place), bf16(?:, batch (\d+))?"
                 r"(, cuBLAS products)?: (\d+) tokens/s \((\d+)% of its memory roofline\)", line)
    if m:
        (library if m.group(2) else decode).append((int(m.group(1) or 1), int(m.group(3)), int(m.group(4))))
if decode:
    batches = [d[0] for d in decode]
    b.plot(batches, [d[1] for d in decode], "o-", label="measured (lesson 07's products)")
    if library:  # batch 1 is a GEMV either way
        b.plot([1] + [d[0] for d in library], [decode[0][1]] + [d[1] for d in library], "s-", color="tab:gray",
               label="measured, products of 2 rows and more by cuBLAS")
    # The roofline: the weights read once per step, whatever the batch; the batch-1 figure gives
    # it (the report's percentages of the larger batches are rounded to whole ones).
    if decode[0][2] > 0:  # (0% rounded: no roofline to draw, as on the run-through without a GPU)
        roof = decode[0][1] * 100 / decode[0][2] / decode[0][0]
        b.plot(batches, [bb * roof for bb in batches], "k--", label="memory roofline (weights read once per step)")
    log_axes(b, "sequences decoded at once", "tokens/s", "Decode, a 1.1B shape in bf16")
save(fig, r, "07")

# Lesson 08: paged against contiguous decode attention, and split-K against the context.
r = first_with(all_runs, "lesson08_cuda_bench")
rows = r["kernels"]["lesson08_cuda_bench"]
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
# The bench's first section (batch 32 x 2,048 positions on a GPU, Llama-3-8B's heads).
first = next(k["shape"] for k in rows if re.match(r"batch \d+ x \d+ positions$", k["shape"]))
batch = [k for k in rows if k["shape"] == first]
bandwidth_bars(a, [k["name"] for k in batch], [k["gbps"] for k in batch], "tab:blue", r["copy"]["lesson08_cuda_bench"],
               f"GB/s of K/V read ({first})", "Decode attention: contiguous (lesson 07) and paged")
one = {k["shape"]: k["ms"] for k in rows if k["name"] == "paged, one pass" and k["shape"].startswith("batch 1 ")}
split = {k["shape"]: k["ms"] for k in rows if k["name"].startswith("paged, split") and k["shape"].startswith("batch 1 ")}
shapes = [s for s in one if s in split]
positions = [int(re.search(r"x (\d+) positions", s).group(1)) for s in shapes]
b.plot(positions, [one[s] for s in shapes], "o-", label="one block per K/V head")
b.plot(positions, [split[s] for s in shapes], "s-", label="split-K (flash decoding)")
log_axes(b, "context (positions), batch 1", "ms per call", "Split-K at batch 1")
save(fig, r, "08")
print(f"wrote {os.path.join(out, 'lesson07_gpu.png')} and lesson08_gpu.png")
