#!/usr/bin/env python3
"""Plot the engine bench: each decode point on this machine's roofline.

    tools/engine_plot.py DIR
    (reads DIR/engine_roofs.csv and DIR/engine.csv; writes DIR/engine.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "engine_roofs.csv")) as f:
    roof = next(csv.DictReader(f))
peak, bandwidth = float(roof["peak_flops"]), float(roof["bandwidth"])
with open(os.path.join(out, "engine.csv")) as f:
    rows = list(csv.DictReader(f))

fig, ax = plt.subplots(figsize=(8, 5.5))
lo, hi = 0.05, 1000.0
xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
ax.plot(xs, [min(peak, bandwidth * x) / 1e9 for x in xs], color="black", linewidth=1.5,
        label=f"roof: {bandwidth / 1e9:.0f} GB/s (from memory), {peak / 1e9:.0f} GFLOP/s")
markers = {}
# A model that fits in a cache is read at that cache's speed: its own roof, dashed.
for name in dict.fromkeys(r["model"] for r in rows):
    bw = float(next(r for r in rows if r["model"] == name)["bandwidth"])
    if abs(bw - bandwidth) > 0.1 * bandwidth:
        ax.plot(xs, [min(peak, bw * x) / 1e9 for x in xs], linestyle="--", linewidth=1,
                label=f"{name}: {bw / 1e9:.0f} GB/s over a buffer of its weights' size")
for r in rows:
    steps_per_s = float(r["tokens_per_s"]) / int(r["batch"])
    intensity = float(r["flops_per_step"]) / float(r["bytes_per_step"])
    achieved = steps_per_s * float(r["flops_per_step"]) / 1e9
    m = markers.setdefault(r["model"], "os^vD"[len(markers) % 5])
    ax.scatter([intensity], [achieved], marker=m, s=60, zorder=3)
    frac = float(r["tokens_per_s"]) / float(r["attainable_tokens_per_s"])
    threads = r.get("threads", "")
    on = f", {threads} thread{'s' if threads != '1' else ''}" if threads else ""
    ax.annotate(f"{r['model']}, batch {r['batch']}{on}: {100 * frac:.0f}%", (intensity, achieved),
                textcoords="offset points", xytext=(6, -4), fontsize=8)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("FLOPs per byte of a decode step")
ax.set_ylabel("GFLOP/s achieved")
ax.set_title("the reference engine's decode on this machine")
ax.legend(loc="lower right")
fig.tight_layout()
fig.savefig(os.path.join(out, "engine.png"), dpi=110)
print(f"wrote {os.path.join(out, 'engine.png')}")
