#!/usr/bin/env python3
"""Plot lesson 01's bench: this machine's roofline with the measured prefill and decode steps.

    lessons/01_roofline/plot.py DIR    (reads DIR/roofs.csv and DIR/roofline_points.csv, writes DIR/roofline.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "roofs.csv")) as f:
    roof = next(csv.DictReader(f))
peak, bw = float(roof["peak_flops"]) / 1e9, float(roof["bandwidth"]) / 1e9  # GFLOP/s, GB/s
with open(os.path.join(out, "roofline_points.csv")) as f:
    points = list(csv.DictReader(f))

fig, ax = plt.subplots(figsize=(7, 4.5))
xs = [10 ** (k / 20) for k in range(-30, 81)]
ax.plot(xs, [min(peak, bw * x) for x in xs], "k-", lw=2, label=f"roofline: {bw:.0f} GB/s, {peak:.0f} GFLOP/s")
ax.axvline(peak / bw, color="k", ls=":", lw=1)
ax.text(peak / bw * 1.1, peak * 0.05, f"ridge\n{peak / bw:.0f} FLOP/B", fontsize=8)

styles = {"decode": "o", "prefill": "s"}
colours = {}
for p in points:
    c = colours.setdefault(p["model"], f"C{len(colours)}")
    x, y = float(p["intensity"]), float(p["flops_per_s"]) / 1e9
    ax.plot(x, y, styles[p["kind"]], color=c, ms=7)
    ax.annotate(p["label"], (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7, color=c)
for model, c in colours.items():
    ax.plot([], [], "o", color=c, label=model)
ax.plot([], [], "ko", mfc="none", label="decode-like step (B tokens)")
ax.plot([], [], "ks", mfc="none", label="prefill (T tokens)")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("arithmetic intensity (FLOP per byte of DRAM traffic)")
ax.set_ylabel("achieved GFLOP/s")
ax.set_title("Lesson 01: prefill and decode on this machine's roofline")
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=7, loc="lower right")
fig.tight_layout()
path = os.path.join(out, "roofline.png")
fig.savefig(path, dpi=120)
print(f"wrote {path}")
