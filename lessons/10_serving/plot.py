#!/usr/bin/env python3
"""Plot lesson 10's bench: inter-token latency and throughput against the token budget.

    lessons/10_serving/plot.py DIR
    (reads DIR/serving.csv; writes DIR/serving.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "serving.csv")) as f:
    rows = list(csv.DictReader(f))
labels = ["whole" if int(r["budget"]) >= 4096 else r["budget"] for r in rows]
x = range(len(rows))
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
for key, name in [("itl_p50_s", "p50"), ("itl_p99_s", "p99"), ("itl_max_s", "max")]:
    a.plot(x, [1e3 * float(r[key]) for r in rows], "o-", label=f"inter-token latency, {name}")
a.plot(x, [1e3 * float(r["ttft_p50_s"]) for r in rows], "s--", label="long prompts' TTFT, p50")
a.set_yscale("log")
a.set_ylabel("ms")
a.set_title("latency while 200-token prompts arrive")
b.bar(x, [float(r["tokens_per_s"]) for r in rows])
b.set_ylabel("tokens/s, all requests")
b.set_title("throughput")
for ax in (a, b):
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("token budget per step")
a.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(out, "serving.png"), dpi=110)
print(f"wrote {os.path.join(out, 'serving.png')}")
