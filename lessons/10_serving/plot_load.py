#!/usr/bin/env python3
"""Lesson 10's table: naive serving against the engine, from ./course load --table.

    lessons/10_serving/plot_load.py DIR
    (reads DIR/load.csv; prints the table; writes DIR/load.md and DIR/load.png)
"""
import csv
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "load.csv")) as f:
    rows = list(csv.DictReader(f))
if not rows:
    sys.exit("no runs in load.csv")

by = {(r["label"], int(r["users"])): r for r in rows}
lines = [
    "| serving | users | total tokens/s | tokens/s per user | TTFT p50 | TTFT p99 | inter-token p99 | requests (failed, duplicated) |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
]
for r in rows:
    lines.append(
        f"| {r['label']} | {r['users']} | {float(r['total_tokens_per_s']):,.0f} | {float(r['user_tokens_per_s']):,.1f} "
        f"| {1e3 * float(r['ttft_p50_s']):,.1f} ms | {1e3 * float(r['ttft_p99_s']):,.1f} ms "
        f"| {1e3 * float(r['itl_p99_s']):,.2f} ms | {r['requests']} ({r['failed']}, {r['duplicated']}) |"
    )
ratios = []
for (label, users), r in sorted(by.items()):
    if label == "engine" and ("naive", users) in by:
        naive = float(by[("naive", users)]["total_tokens_per_s"])
        if naive > 0:
            ratios.append(f"{users} user{'s' if users != 1 else ''}: {float(r['total_tokens_per_s']) / naive:.1f}x")
text = "\n".join(lines)
if ratios:
    text += "\n\nengine / naive, total tokens/s: " + ", ".join(ratios)
print(text)
with open(os.path.join(out, "load.md"), "w") as f:
    f.write(text + "\n")

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
for label, style, color in [("naive", "s--", "tab:blue"), ("engine", "o-", "tab:orange")]:
    pts = sorted((int(r["users"]), r) for r in rows if r["label"] == label)
    if not pts:
        continue
    users = [u for u, _ in pts]
    a.plot(users, [float(r["total_tokens_per_s"]) for _, r in pts], style, color=color, label=label)
    b.plot(users, [1e3 * float(r["ttft_p99_s"]) for _, r in pts], style, color=color, label=f"{label}, TTFT p99")
    b.plot(users, [1e3 * float(r["latency_p99_s"]) for _, r in pts], style, color=color, alpha=0.35,
           label=f"{label}, whole request p99")
for ax in (a, b):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent users")
    ax.legend(fontsize=8)
a.set_ylabel("tokens/s, all users")
a.set_title("throughput")
b.set_ylabel("ms")
b.set_title("p99 latency")
fig.tight_layout()
fig.savefig(os.path.join(out, "load.png"), dpi=110)
print(f"wrote {os.path.join(out, 'load.png')}")
