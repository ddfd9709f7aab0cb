#!/usr/bin/env python3
"""Plot lesson 08's GPU bench: GB/s of decode attention, contiguous against paged, and the
split-K speedup at batch 1 against the context length.

    lessons/08_cuda_paged_attention/plot.py FILE.json [OUT.png]
    (FILE.json: what lesson08_cuda_bench --json writes; ./course gpu-check leaves it in its output
     folder as lesson08_cuda_bench.json. OUT.png defaults to paged_attention.png beside it.)
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

if len(sys.argv) < 2:
    sys.exit(__doc__)
src = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(src)), "paged_attention.png")
with open(src) as f:
    bench = json.load(f)
if not bench.get("device"):
    sys.exit(f"{src}: the bench found no CUDA device, so there is nothing to plot")

fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
batch = [k for k in bench["kernels"] if k["shape"].startswith("batch ") and not k["shape"].startswith("batch 1 ")]
batch = [k for k in batch if k["shape"] == batch[0]["shape"]]  # section 1's shape (1b's heads of 64 aside)
a.barh([k["name"] for k in batch], [k["gbps"] for k in batch], color="tab:blue")
a.axvline(bench["copy_gbps"], color="gray", linestyle="--", label=f"device copy, {bench['copy_gbps']:.0f} GB/s")
a.set_xlabel("GB/s of keys and values read")
a.set_title(f"decode attention, {batch[0]['shape'] if batch else ''}")
a.invert_yaxis()
a.legend(loc="lower right")

splits = bench.get("splits", [])
lengths = [p["length"] for p in splits]
b.plot(lengths, [p["one_pass_ms"] / p["split_ms"] for p in splits], "o-", color="tab:green")
for p in splits:
    b.annotate(f"{p['splits']} splits", (p["length"], p["one_pass_ms"] / p["split_ms"]), textcoords="offset points",
               xytext=(4, 6), fontsize=8)
b.set_xscale("log", base=2)
b.set_xlabel("positions cached (batch 1)")
b.set_ylabel("one pass time / split time")
b.set_title("split-K speedup")
b.axhline(1, color="gray", linewidth=0.8)
fig.suptitle(f"Lesson 08 on {bench['device']}")
fig.tight_layout()
fig.savefig(out, dpi=110)
print(f"wrote {out}")
