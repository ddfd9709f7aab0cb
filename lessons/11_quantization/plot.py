#!/usr/bin/env python3
"""Plot lesson 11's bench: decode tokens/s per weight format against each format's two roofs (its
memory roof and its compute roof, measured in cache) and the time they take one after the other,
and what each format costs in bits per byte.

    lessons/11_quantization/plot.py DIR    (reads DIR/speed.csv and DIR/quality.csv, writes DIR/quantization.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "speed.csv")) as f:
    speed = list(csv.DictReader(f))
with open(os.path.join(out, "quality.csv")) as f:
    quality = list(csv.DictReader(f))

models = list(dict.fromkeys(r["model"] for r in speed))
fig, axes = plt.subplots(1, len(models) + 1, figsize=(5 * (len(models) + 1), 4.4))
for ax, model in zip(axes, models):
    formats = list(dict.fromkeys(r["format"] for r in speed if r["model"] == model))
    for i, batch in enumerate(("1", "8")):
        rows = {r["format"]: r for r in speed if r["model"] == model and r["batch"] == batch}
        xs = [j + (i - 0.5) * 0.38 for j in range(len(formats))]
        ax.bar(xs, [float(rows[f]["tokens_per_s"]) for f in formats], width=0.36, label=f"batch {batch}: measured")
        ax.scatter(xs, [float(rows[f]["roof_tokens_per_s"]) for f in formats], marker="_", s=300, color="black",
                   zorder=3, label="its memory roof" if i == 0 else None)
        ax.scatter(xs, [float(rows[f]["ceiling_tokens_per_s"]) for f in formats], marker="x", s=40, color="tab:red",
                   zorder=3, label="its compute roof (in cache)" if i == 0 else None)
        ax.scatter(xs, [float(rows[f]["serial_tokens_per_s"]) for f in formats], marker=".", s=60, color="tab:green",
                   zorder=3, label="no overlap (bytes, then instructions, then the rest)" if i == 0 else None)
    ax.set_xticks(range(len(formats)))
    ax.set_xticklabels([f.replace(" a8", "\na8") for f in formats], fontsize=8)  # a8: 8-bit activations
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"{model}: decode against each format's roofs", fontsize=10)
    ax.grid(alpha=0.3, axis="y", which="both")
q = axes[-1]
q.bar([r["format"].replace(" a8", "\na8") for r in quality], [float(r["delta"]) for r in quality], color="tab:red")
q.tick_params(axis="x", labelsize=8)
for i, r in enumerate(quality):
    q.annotate(f"{float(r['delta']):+.5f}", (i, float(r["delta"])), ha="center", va="bottom", fontsize=8)
q.set_ylabel("bits per byte, minus float32's")
q.set_title("what the rounding costs (bundled model, held-out text)", fontsize=10)
q.grid(alpha=0.3, axis="y")
handles, labels = axes[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)  # once, below: none hides a bar
fig.tight_layout(rect=(0, 0.07, 1, 1))
fig.savefig(os.path.join(out, "quantization.png"), dpi=110)
print(f"wrote {os.path.join(out, 'quantization.png')}")
