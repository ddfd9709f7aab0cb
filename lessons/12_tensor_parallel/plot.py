#!/usr/bin/env python3
"""Plot lesson 12's bench: measured decode tokens/s over 1, 2 and 4 ranks of a thread group (the
share of rank 0's step spent in the collectives annotated), and the modelled Llama-3-70B decode
over 2, 4 and 8 A100s, NVLink against PCIe.

    lessons/12_tensor_parallel/plot.py DIR    (reads DIR/ranks.csv and DIR/model70b.csv, writes DIR/tensor_parallel.png)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out, "ranks.csv")) as f:
    ranks = list(csv.DictReader(f))
with open(os.path.join(out, "model70b.csv")) as f:
    model = list(csv.DictReader(f))

fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.6))

# ---- measured: tokens/s against ranks, one line per (model, batch)
group = [r for r in ranks if r["setup"] == "thread group"]
hardware = int(group[0]["hardware_threads"]) if group else 0
colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
series = list(dict.fromkeys((r["model"], r["batch"]) for r in group))
for i, (name, batch) in enumerate(series):
    color = colors[i % len(colors)]
    rows = sorted((r for r in group if r["model"] == name and r["batch"] == batch), key=lambda r: int(r["ranks"]))
    xs = [int(r["ranks"]) for r in rows]
    ys = [float(r["tokens_per_s"]) for r in rows]
    left.plot(xs, ys, marker="o", color=color, label=f"{name}, batch {batch}")
    for x, y, r in zip(xs, ys, rows):
        left.annotate(f"{100 * float(r['collective_share']):.0f}%", (x, y), textcoords="offset points", xytext=(6, 4),
                      fontsize=7, color=color)
    for r in ranks:  # the single-process engine on every core, for reference
        if r["setup"] == "engine" and r["model"] == name and r["batch"] == batch:
            left.scatter([1], [float(r["tokens_per_s"])], marker="*", s=90, color=color, zorder=3)
left.scatter([], [], marker="*", s=90, color="gray", label="one process, all cores (no ranks)")
if hardware and group and max(int(r["ranks"]) for r in group) > hardware:
    left.axvspan(hardware + 0.5, max(int(r["ranks"]) for r in group) + 0.5, color="gray", alpha=0.12)
    left.text(hardware + 0.6, 0.02, f"more ranks than\nthe {hardware} hardware threads", transform=left.get_xaxis_transform(),
              fontsize=7, color="dimgray")
left.set_xscale("log", base=2)
left.set_xticks(sorted({int(r["ranks"]) for r in group}))
left.set_xticklabels([str(x) for x in sorted({int(r["ranks"]) for r in group})])
left.set_yscale("log")
left.set_xlabel("ranks (one thread each)")
left.set_ylabel("decode tokens/s")
left.set_title("measured on this CPU (labels: rank 0's step time in all-reduces)", fontsize=10)
left.grid(alpha=0.3, which="both")
left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)

# ---- modelled: Llama-3-70B on A100s
links = [l for l in dict.fromkeys(r["link"] for r in model) if l != "none"]
styles = {links[0]: "-", links[1]: "--"} if len(links) == 2 else {l: "-" for l in links}
for j, batch in enumerate(dict.fromkeys(r["batch"] for r in model)):
    for link in links:
        rows = sorted((r for r in model if r["link"] == link and r["batch"] == batch and r["fits"] == "1"),
                      key=lambda r: int(r["gpus"]))
        xs = [int(r["gpus"]) for r in rows]
        ys = [float(r["tokens_per_s"]) for r in rows]
        right.plot(xs, ys, marker="o", linestyle=styles[link], color=colors[j], label=f"batch {batch}, {link}")
        for x, y, r in zip(xs, ys, rows):
            right.annotate(f"{100 * float(r['allreduce_share']):.0f}%", (x, y), textcoords="offset points",
                           xytext=(6, -10 if link == links[-1] else 4), fontsize=7, color=colors[j])
unfit = sorted({int(r["gpus"]) for r in model if r["fits"] == "0"})
if unfit:
    right.text(0.02, 0.5, f"{', '.join(map(str, unfit))} GPU{'s' if unfit != [1] else ''}: does not fit\n(141 GB of bf16 weights)",
               transform=right.transAxes, fontsize=8, color="dimgray")
gpus = sorted({int(r["gpus"]) for r in model})
right.set_xscale("log", base=2)
right.set_xticks(gpus)
right.set_xlim(min(gpus) / 1.25, max(gpus) * 1.4)
right.set_xticklabels([str(g) for g in gpus])
right.set_yscale("log")
right.set_xlabel("A100 80GB GPUs (tensor parallel)")
right.set_ylabel("decode tokens/s (all sequences)")
if model:
    r0 = next(r for r in model if r["link"] != "none")
    right.set_title(
        f"Llama-3-70B bf16, modelled (HBM {float(r0['assumed_hbm_bytes_per_s']) / 1e12:.1f} TB/s; "
        f"labels: all-reduce share)", fontsize=10)
right.grid(alpha=0.3, which="both")
right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=4, handlelength=3.5)  # long enough to tell dashed from solid

fig.tight_layout()
fig.savefig(os.path.join(out, "tensor_parallel.png"), dpi=110)
print(f"wrote {os.path.join(out, 'tensor_parallel.png')}")
