#!/usr/bin/env python3
"""Plot lesson 00's bench: ms per naive decoding step against sequence length.

    lessons/00_naive_decoder/plot.py DIR     (reads DIR/naive_step_time.csv, writes DIR/naive_step_time.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "naive_step_time.csv")) as f:
    rows = list(csv.DictReader(f))
n = [int(r["length"]) for r in rows]
ms = [float(r["ms_per_step"]) for r in rows]

fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(n, ms, "o-", label="naive step: forward() over the whole sequence")
ax.set_xlabel("sequence length (tokens)")
ax.set_ylabel("ms per generated token")
ax.set_title("Lesson 00: each new token costs more than the last")
ax.grid(alpha=0.3)
ax.set_xlim(0, max(n) * 1.05)
ax.set_ylim(0, max(ms) * 1.1)
ax.legend()
fig.tight_layout()
path = os.path.join(out, "naive_step_time.png")
fig.savefig(path, dpi=120)
print(f"wrote {path}")
