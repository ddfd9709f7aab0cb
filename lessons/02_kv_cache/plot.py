#!/usr/bin/env python3
"""Plot lesson 02's bench: step time with and without the KV cache, and the cache's memory.

    lessons/02_kv_cache/plot.py DIR    (reads DIR/kv_step_time.csv and DIR/kv_memory.csv, writes DIR/kv_cache.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "kv_step_time.csv")) as f:
    steps = list(csv.DictReader(f))
with open(os.path.join(out, "kv_memory.csv")) as f:
    mem = list(csv.DictReader(f))

fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
n = [int(r["length"]) for r in steps]
a.plot(n, [float(r["naive_ms"]) for r in steps], "o-", label="naive (lesson 00): whole sequence")
a.plot(n, [float(r["cached_ms"]) for r in steps], "s-", label="KV cache, float32: one token")
a.plot(n, [float(r["int8_ms"]) for r in steps], "^-", label="KV cache, INT8: one token")
a.set_xlabel("sequence length n")
a.set_ylabel("ms per decode step")
a.set_yscale("log")
a.set_title("Time per generated token")
a.grid(alpha=0.3, which="both")
a.legend(fontsize=8)

m = [int(r["length"]) for r in mem]
b.plot(m, [int(r["f32_bytes"]) / 1024 for r in mem], "s-", label="float32")
b.plot(m, [int(r["int8_bytes"]) / 1024 for r in mem], "^-", label="INT8 + scales")
b.set_xlabel("tokens cached")
b.set_ylabel("KiB")
b.set_title("KV-cache memory (bundled model)")
b.grid(alpha=0.3)
b.legend(fontsize=8)
fig.suptitle("Lesson 02: the KV cache trades memory for compute")
fig.tight_layout()
path = os.path.join(out, "kv_cache.png")
fig.savefig(path, dpi=120)
print(f"wrote {path}")
