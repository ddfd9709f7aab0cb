#!/usr/bin/env python3
"""Plot lesson 09's bench: prefill attention time and scratch memory against the prompt's length.

    lessons/09_flash_attention/plot.py DIR
    (reads DIR/flash.csv; writes DIR/flash.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "flash.csv")) as f:
    rows = list(csv.DictReader(f))
methods = list(dict.fromkeys(r["method"] for r in rows))
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
for m in methods:
    pts = [r for r in rows if r["method"] == m]
    n = [int(r["tokens"]) for r in pts]
    a.plot(n, [float(r["gflops"]) for r in pts], "o-", label=m)
    b.plot(n, [float(r["scratch_bytes"]) / 1024 for r in pts], "o-", label=m)
for ax in (a, b):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens (T = S)")
    ax.legend()
a.set_ylabel("GFLOP/s (one thread)")
a.set_title("causal prefill attention, 8/2 heads of 64")
b.set_yscale("log")
b.set_ylabel("scratch beyond the result (KiB)")
b.set_title("memory each needs")
fig.tight_layout()
fig.savefig(os.path.join(out, "flash.png"), dpi=110)
print(f"wrote {os.path.join(out, 'flash.png')}")
