#!/usr/bin/env python3
"""Plot lesson 05's bench: TTFT cold and warm, a prefill's cost against its length, hit rate
against cache capacity, a chat's prefill.

    lessons/05_prefix_caching/plot.py DIR
    (reads DIR/prefix_ttft.csv, prefix_prefill.csv, prefix_capacity.csv, prefix_chat.csv;
     writes DIR/prefix.png)
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


ttft, capacity, chat = read("prefix_ttft.csv"), read("prefix_capacity.csv"), read("prefix_chat.csv")
prefill = read("prefix_prefill.csv")
fig, ((a, d), (b, c)) = plt.subplots(2, 2, figsize=(12, 8.4))

# 1. Time to first token of a long shared prompt.
names = [r["cache"] for r in ttft]
values = [float(r["ttft_ms"]) for r in ttft]
bars = a.bar(names, values, color=["#999999", "#d62728", "#2ca02c"][: len(names)])
for bar, r in zip(bars, ttft):
    a.annotate(f"{float(r['ttft_ms']):.1f} ms\n{r['computed_positions']} computed",
               (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
if "predicted_ms" in ttft[0]:
    a.scatter(names, [float(r["predicted_ms"]) for r in ttft], marker="_", s=900, color="black", zorder=3,
              label="step-cost model's prediction")
    a.legend(fontsize=8, loc="upper right")
a.set_ylim(0, 1.3 * max(values))
a.set_ylabel("time to first token (ms)")
a.set_title("TTFT with a shared system prompt")

# 2. A lone prefill's time against its length, and the step-cost model's line.
xs = [float(r["positions"]) for r in prefill]
d.plot(xs, [float(r["measured_ms"]) for r in prefill], "o-", label="measured")
d.plot(xs, [float(r["model_ms"]) for r in prefill], "--", color="black", lw=1,
       label="model: fixed + positions x per position")
d.set_xlabel("prompt positions computed")
d.set_ylabel("step time (ms)")
d.set_title("What a prefill costs")
d.legend(fontsize=8)

# 3. Hit rate against capacity (the unbounded cache as a line).
bounded = [r for r in capacity if int(r["capacity_blocks"]) > 0]
unbounded = [r for r in capacity if int(r["capacity_blocks"]) == 0]
xs = [int(r["capacity_blocks"]) for r in bounded]
b.plot(xs, [100 * float(r["request_hit_rate"]) for r in bounded], "o-", label="requests that hit")
b.plot(xs, [100 * float(r["token_hit_rate"]) for r in bounded], "s-", label="prompt tokens matched")
if unbounded:
    b.axhline(100 * float(unbounded[0]["request_hit_rate"]), ls="--", color="C0", lw=0.8, label="unbounded")
    b.axhline(100 * float(unbounded[0]["token_hit_rate"]), ls="--", color="C1", lw=0.8)
b.axhline(55, ls=":", color="gray", lw=0.8, label="the test's 55%")
b.set_xscale("log", base=2)
b.set_xlabel("cache capacity (blocks of 16 tokens)")
b.set_ylabel("%")
b.set_title("Shared prefixes: LRU hit rate against capacity")
b.legend(fontsize=8)

# 4. A multi-turn chat: prefill positions computed per turn.
turns = [int(r["turn"]) for r in chat]
width = 0.4
c.bar([t - width / 2 for t in turns], [int(r["computed_without"]) for r in chat], width, label="cache off")
c.bar([t + width / 2 for t in turns], [int(r["computed_with_cache"]) for r in chat], width, label="cache on")
c.set_xlabel("turn")
c.set_ylabel("prefill positions computed")
c.set_title("A chat: each turn re-sends the conversation")
c.set_xticks(turns)
c.legend(fontsize=8)

fig.tight_layout()
fig.savefig(os.path.join(out, "prefix.png"), dpi=110)
print(f"wrote {os.path.join(out, 'prefix.png')}")
