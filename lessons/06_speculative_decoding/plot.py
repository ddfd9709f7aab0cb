#!/usr/bin/env python3
"""Plot lesson 06's bench: what a verification costs, speedup against k (measured and
predicted), tokens per round, prompt lookup on ordinary against repetitive text, chain against
tree, and prompt lookup on a target too big for the caches.

    lessons/06_speculative_decoding/plot.py DIR
    (reads DIR/spec_costs.csv, spec_costs_big.csv, spec_speedup.csv, spec_lookup.csv, spec_tree.csv,
     spec_big.csv; writes DIR/speculative.png)
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


def labelled_bars(ax, names, heights, labels, color, title, ylabel, headroom, baseline=True):
    """A bar per name, each with its label above it."""
    bars = ax.bar(names, heights, color=color)
    for bar, label in zip(bars, labels):
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=8)
    if baseline:
        ax.axhline(1, color="gray", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(0, headroom * max(heights))


costs, speed, lookup = read("spec_costs.csv"), read("spec_speedup.csv"), read("spec_lookup.csv")
big, tree, decoded = read("spec_costs_big.csv"), read("spec_tree.csv"), read("spec_big.csv")
fig, ((a, b, e), (c, d, f)) = plt.subplots(2, 3, figsize=(17, 8.4))

# 1. A forward over m new tokens, in target steps: flat would be the memory-bound ideal.
m = [int(r["new_tokens"]) for r in costs]
t1 = float(costs[0]["target_ms"])
a.plot(m, [float(r["target_ms"]) / t1 for r in costs], "o-", label="target forward over m tokens")
a.plot(m, [float(r["draft_ms"]) / t1 for r in costs], "s-", label="draft forward over m tokens")
b1 = float(big[0]["big_ms"])
a.plot([int(r["new_tokens"]) for r in big], [float(r["big_ms"]) / b1 for r in big], "^-",
       label="the 75.9M-parameter model (its own steps)")
a.axhline(1, ls=":", color="gray", lw=0.8, label="one target step (the formula's assumption)")
a.set_xlabel("new tokens in the forward (m)")
a.set_ylabel("time, in target steps")
a.set_title("What verifying k + 1 tokens costs on this machine")
a.legend(fontsize=8)

# 2. Speedup against k: measured, and the two predictions.
k = [int(r["k"]) for r in speed]
b.plot(k, [float(r["draft_speedup"]) for r in speed], "o-", label="draft: measured")
b.plot(k, [float(r["formula_speedup"]) for r in speed], "--", label="draft: formula (verify = 1 step)")
b.plot(k, [float(r["cost_model_speedup"]) for r in speed], ":", marker="x", label="draft: formula with measured t_v")
b.plot(k, [float(r["lookup_speedup"]) for r in speed], "s-", label="prompt lookup: measured")
b.axhline(1, color="gray", lw=0.8)
b.set_xlabel("guesses per round (k)")
b.set_ylabel("speedup over plain decoding")
b.set_title("Greedy decoding: speedup against k")
b.legend(fontsize=8)

# 3. Tokens per round.
c.plot(k, [float(r["draft_tokens_per_round"]) for r in speed], "o-", label="draft model")
c.plot(k, [float(r["lookup_tokens_per_round"]) for r in speed], "s-", label="prompt lookup")
c.plot(k, [kk + 1 for kk in k], ":", color="gray", label="k + 1 (every guess kept)")
c.set_xlabel("guesses per round (k)")
c.set_ylabel("tokens per target forward")
c.set_title("Tokens per round")
c.legend(fontsize=8)

# 4. Prompt lookup: ordinary against repetitive text.
labelled_bars(d, [r["text"] for r in lookup], [float(r["speedup"]) for r in lookup],
              [f"{float(r['speedup']):.2f}x\n{100 * float(r['acceptance']):.0f}% kept" for r in lookup],
              ["#999999", "#2ca02c"][: len(lookup)], "Prompt lookup needs text that repeats",
              "speedup over plain decoding (k = 4)", 1.3)

# 5. Chain against tree: tokens per round, and what they cost.
labelled_bars(e, [r["shape"] for r in tree], [float(r["tokens_per_round"]) for r in tree],
              [f"{int(r['guesses_per_round'])} guesses\n{float(r['speedup']):.2f}x" for r in tree], "#1f77b4",
              "Chain against tree (greedy, the draft)", "tokens per target forward", 1.35, baseline=False)

# 6. The big target: a step waits for memory, so a round of k + 1 tokens costs little more than one step.
labelled_bars(f, [f"k = {int(r['k'])}" for r in decoded], [float(r["speedup"]) for r in decoded],
              [f"{float(r['speedup']):.2f}x\n{float(r['tokens_per_round']):.2f} tok/round" for r in decoded],
              "#ff7f0e", "Prompt lookup on the 75.9M model (greedy)", "speedup over plain decoding", 1.3)

fig.tight_layout()
fig.savefig(os.path.join(out, "speculative.png"), dpi=110)
print(f"wrote {os.path.join(out, 'speculative.png')}")
