#!/usr/bin/env python3
"""Plot lesson 04's bench: how much reserved KV memory holds tokens, and what that buys.

    lessons/04_paged_attention/plot.py DIR
    (reads DIR/paged_engine.csv, paged_occupancy.csv, paged_scale.csv, paged_arena.csv;
     writes DIR/paged.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."


def read(name):
    with open(os.path.join(out, name)) as f:
        return list(csv.DictReader(f))


engine, occupancy, scale = read("paged_engine.csv"), read("paged_occupancy.csv"), read("paged_scale.csv")
arena = read("paged_arena.csv")
fig, ((a, b), (c, d)) = plt.subplots(2, 2, figsize=(13, 8.4))

# 1. Reserved positions that hold tokens, and the steps the workload took.
names = ["slots" if not r["memory"].startswith("paged") else f"B={r['block_size']}" for r in engine]
held = [100 * float(r["held_fraction"]) for r in engine]
colors = ["C3" if n == "slots" else "C0" for n in names]
bars = a.bar(range(len(engine)), held, color=colors)
for bar, r in zip(bars, engine):
    a.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 1, f"{r['steps']}\nsteps", ha="center", fontsize=7)
a.set_xticks(range(len(engine)), names, fontsize=8)
a.set_ylim(0, 118)
a.set_ylabel("reserved KV positions holding tokens (%)")
a.set_title("tiny-fortunes, same bytes: whole-context slots vs blocks of B", fontsize=9)
a.grid(axis="y", alpha=0.3)

# 2. Sequences running at each step.
for memory, color in dict.fromkeys((r["memory"], "C3" if not r["memory"].startswith("paged") else "C0")
                                   for r in occupancy):
    pts = [r for r in occupancy if r["memory"] == memory]
    b.step([int(r["step"]) for r in pts], [int(r["running"]) for r in pts], where="post", color=color, label=memory,
           lw=1.1)
b.set_xlabel("step")
b.set_ylabel("sequences running")
b.set_title("the same KV bytes run more sequences at once", fontsize=9)
b.legend(fontsize=8)
b.grid(alpha=0.3)

# 3. At scale (arithmetic over a chat workload's lengths).
labels = [r["reservation"].replace(" (", "\n(") for r in scale]
held = [100 * float(r["held_fraction"]) for r in scale]
bars = c.barh(range(len(scale)), held, color=["C3", "C1", "C0"])
for bar, r in zip(bars, scale):
    c.text(bar.get_width() + 1, bar.get_y() + bar.get_height() / 2,
           f"{float(r['held_fraction']) * 100:.0f}%, {float(r['sequences_in_budget']):.0f} seqs in 40 GB",
           va="center", fontsize=8)
c.set_yticks(range(len(scale)), labels, fontsize=8)
c.set_xlim(0, 150)
c.set_xlabel("reserved KV positions holding tokens (%)")
c.set_title("8B-model chat workload, 1000 requests (computed)", fontsize=9)
c.invert_yaxis()
c.grid(axis="x", alpha=0.3)

# 4. Through time: the same workload in one contiguous first-fit arena and in a paged pool.
for memory, label, color in (("contiguous", "contiguous, first fit", "C3"), ("paged", "paged, blocks of 16", "C0")):
    pts = [r for r in arena if r["memory"] == memory]
    d.plot([int(r["step"]) for r in pts], [int(r["running"]) for r in pts], color=color, lw=1.1, label=label)
    held = [int(r["step"]) for r in pts if r["blocked_by_holes"] == "1"]
    if held:
        d.plot(held, [0] * len(held), "|", color=color, ms=6, alpha=0.5,
               label="head of the queue waiting on holes")
d.set_xlabel("step")
d.set_ylabel("sequences running")
d.set_title("8B-model chat workload through time, 40 GB (simulated)", fontsize=9)
d.legend(fontsize=8)
d.grid(alpha=0.3)

fig.suptitle("Lesson 04: PagedAttention", fontsize=11)
fig.tight_layout()
path = os.path.join(out, "paged.png")
fig.savefig(path, dpi=110)
print(f"wrote {path}")
