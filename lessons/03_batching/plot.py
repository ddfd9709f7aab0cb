#!/usr/bin/env python3
"""Plot lesson 03's bench: batch utilization over time, static against continuous.

    lessons/03_batching/plot.py DIR    (reads DIR/batching_utilization.csv, writes DIR/batching.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "batching_utilization.csv")) as f:
    rows = list(csv.DictReader(f))
with open(os.path.join(out, "batching_summary.csv")) as f:
    summary = {(r["model"], r["policy"]): r for r in csv.DictReader(f)}
models = list(dict.fromkeys(r["model"] for r in rows))

fig, axes = plt.subplots(len(models), 1, figsize=(8, 3.2 * len(models)), squeeze=False)
for ax, model in zip(axes[:, 0], models):
    for policy, style in (("static", "C3"), ("continuous", "C0")):
        pts = [r for r in rows if r["model"] == model and r["policy"] == policy]
        t = [float(r["seconds"]) for r in pts]
        u = [100 * int(r["working"]) / int(r["batch"]) for r in pts]
        s = summary[(model, policy)]
        label = (f"{policy}: {float(s['tokens_per_s']):.0f} tokens/s, {s['steps']} steps, "
                 f"utilization {100 * float(s['utilization']):.0f}%")
        ax.step(t, u, where="post", color=style, label=label, lw=1.2)
    ax.set_title(model, fontsize=10)
    ax.set_xlabel("seconds since the requests arrived")
    ax.set_ylabel("slots working (%)")
    ax.set_ylim(0, 132)  # (room above 100% for the legend, which would hide a drain below)
    ax.set_yticks(range(0, 101, 25))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
fig.suptitle("Lesson 03: static vs continuous batching, 48 Pareto-length requests, batch 8")
fig.tight_layout()
path = os.path.join(out, "batching.png")
fig.savefig(path, dpi=120)
print(f"wrote {path}")
