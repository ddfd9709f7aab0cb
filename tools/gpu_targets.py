#!/usr/bin/env python3
"""The GPU targets the course set itself, and the forward's tuning constants, read from a GPU report.

    tools/gpu_targets.py DIR/gpu-report.json     (tools/gpu_report.py also puts this in the report)

Each target (the GPU lessons at the H200's limits, and the whole engine on CUDA, as the lesson
texts quote them) is printed with the report's figure and met / not met; each tuning
constant the forward uses (kTensorGemmVariant, kTensorGemmMinBatch, kQuantTensorGemmMinBatch,
kFuseOneRowStep, kFusedGemvWarps, kSkinnySplitWarps, kSkinnySplitMaxBatch, kChunkTensorCores,
kChunkTensorMinRows, kChunkSplitMinPositions, kChunkKernelMinTokens, kEngineTiledWarps, kMinSplitPositions: guesses
until a report) with the value in the source and the value the report's rows pick, and the rows
that pick it. A figure the report does not have is said so,
never guessed. Nothing is changed: the picks are for a person to commit, with the report.
"""
import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def constant(path, name):
    """The value of `inline constexpr ... name = value;` in a source file (None if absent)."""
    try:
        text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    except OSError:
        return None
    m = re.search(rf"constexpr\s+\w+\s+{name}\s*=\s*([^;]+);", text)
    return m.group(1).strip() if m else None


def batch_of(shape):
    m = re.search(r"batch (\d+)", shape)
    return int(m.group(1)) if m else 1


def square(shape):
    """n of an "n x n ..." shape (None otherwise)."""
    m = re.match(r"(\d+) x (\d+)\b", shape)
    return int(m.group(1)) if m and m.group(1) == m.group(2) else None


def verdict(ok):
    return "met" if ok else "**not met**"


def cell(rows, title_start, first_cell_start, column):
    """A lesson 10 table's cell: the first table whose title starts so, its first row whose first
    cell starts so, the named column's text (None if any is missing)."""
    for t in rows:
        if t.get("title", "").startswith(title_start) and column in t.get("columns", []):
            i = t["columns"].index(column)
            for r in t.get("rows", []):
                if str(r[0]).startswith(first_cell_start) and i < len(r):
                    return str(r[i])
    return None


def number(text, pattern=r"([\d.]+)"):
    m = re.search(pattern, text or "")
    return float(m.group(1)) if m else None


def summary(report):
    """Markdown lines: the targets, then the tuning constants."""
    benches = report.get("benches", {})
    b07, b08, b09 = (benches.get(f"lesson0{n}_cuda_bench") or {} for n in (7, 8, 9))
    b10 = benches.get("lesson10_cuda_bench") or {}
    k07, k08 = b07.get("kernels", []), b08.get("kernels", [])
    targets, picks = [], []

    def target(what, figure, ok):
        targets.append(f"| {what} | {figure if figure is not None else 'not in this report'} | "
                       f"{verdict(ok) if figure is not None else '-'} |")

    # ---- lesson 07: the batched product and decode against the roofline
    n = max((square(k["shape"]) or 0 for k in k07), default=0)
    gemv1 = [k["ms"] for k in k07 if k["name"].startswith("gemv_bf16 v") and square(k["shape"]) == n]
    at8 = {k["name"]: k["ms"] for k in k07 if square(k["shape"]) == n and batch_of(k["shape"]) == 8 and "bf16" in k["shape"]}
    ours = {name: ms for name, ms in at8.items() if "cuBLAS" not in name}  # the course's kernels
    if gemv1 and ours:
        best = min(ours, key=ours.get)
        r = ours[best] / min(gemv1)
        theirs = f"; cuBLAS {at8['cuBLAS bf16 GEMM'] / min(gemv1):.2f}x" if "cuBLAS bf16 GEMM" in at8 else ""
        target(f"batch 8 over one GEMV ({n} x {n} bf16): at most 1.5x", f"{r:.2f}x ({best}{theirs})", r <= 1.5)
    else:
        target("batch 8 over one GEMV (bf16): at most 1.5x", None, False)
    big = [d for d in b07.get("decode", []) if re.match(r"(1\.1B shape|small model)", d.get("model", ""))]
    dec = {d.get("batch", 1): d for d in big if not re.search(r"cuBLAS|fused|split", d["model"])}
    lib = {d.get("batch", 1): d for d in big if "cuBLAS" in d["model"]}
    fused1 = next((d for d in big if "fused one-row step" in d["model"]), None)
    if 1 in dec:
        f = dec[1].get("fraction_of_roofline", 0)
        ff = fused1.get("fraction_of_roofline", 0) if fused1 else None
        shown = f"{100 * f:.0f}%" + (f" (the fused one-row step: {100 * ff:.0f}%)" if ff is not None else "")
        target("decode of the 1.1B shape at batch 1: at least 70% of its memory roofline", shown,
               max(f, ff or 0) >= 0.7)
    else:
        target("decode of the 1.1B shape at batch 1: at least 70% of its memory roofline", None, False)
    # Batch 64 against batch 1: lesson 07's forward over its contiguous caches (one attention launch
    # and two copies per sequence a layer), and the engine's paged memory (lesson 08: one attention
    # launch for the whole batch; lesson 10's graphs table, launched and from graphs).
    engines = {}  # the 1.1B shape's rows by their name (your attention, the tiled design): batch: (launched, from graphs)
    for t in b10.get("tables", []):
        if t.get("title", "").startswith("Decode with and without CUDA graphs"):
            cols = t.get("columns", [])
            if {"batch", "launched", "from graphs"} <= set(cols):
                for r in t.get("rows", []):
                    if str(r[0]).startswith("1.1B shape"):
                        engines.setdefault(str(r[0]), {})[int(r[cols.index("batch")])] = (
                            float(r[cols.index("launched")]), float(r[cols.index("from graphs")]))
    ratios, shown = [], []
    if 1 in dec and 64 in dec:
        ratios.append(dec[64]["tokens_per_s"] / dec[1]["tokens_per_s"])
        shown.append(f"{ratios[-1]:.1f}x (lesson 07's contiguous caches")
        # The engine may call the best of the course's products and cuBLAS's (CudaForward::use_cublas).
        if 64 in lib:
            ratios.append(lib[64]["tokens_per_s"] / dec[1]["tokens_per_s"])
            shown[-1] += f"; cuBLAS products: {ratios[-1]:.1f}x"
        shown[-1] += ")"
    for name, paged in engines.items():
        if 1 in paged and 64 in paged and paged[1][0] > 0 and paged[1][1] > 0:
            ratios += [paged[64][0] / paged[1][0], paged[64][1] / paged[1][1]]
            which = name.partition(", ")[2]
            shown.append(f"{ratios[-2]:.1f}x launched, {ratios[-1]:.1f}x from graphs (the paged engine"
                         + (f", {which}" if which else "") + ")")
    target("decode at batch 64: at least 15x batch 1's tokens/s", "; ".join(shown) or None,
           bool(ratios) and max(ratios) >= 15)

    # ---- lesson 08: attention against the copy bandwidth
    # (over shuffled tables: what a pool's block tables look like once sequences come and go)
    paged = [k for k in k08 if k["name"].startswith("paged") and "shuffled" in k["name"]
             and re.match(r"batch 32 x 2048 positions$", k["shape"])]
    if paged:
        best = max(paged, key=lambda k: k["fraction_of_copy"])
        target("paged decode attention, batch 32 x 2,048: at least 60% of copy bandwidth",
               f"{100 * best['fraction_of_copy']:.0f}% ({best['name']})", best["fraction_of_copy"] >= 0.6)
    else:
        target("paged decode attention, batch 32 x 2,048: at least 60% of copy bandwidth", None, False)
    split = [k for k in k08 if "split" in k["name"] and k["shape"] == "batch 1 x 32768 positions"]
    if split:  # yours, and the second design split as many ways
        best = max(split, key=lambda k: k["fraction_of_copy"])
        target("split-K, batch 1 x 32K positions: at least 50% of copy bandwidth",
               f"{100 * best['fraction_of_copy']:.0f}% ({best['name']})", best["fraction_of_copy"] >= 0.5)
    else:
        target("split-K, batch 1 x 32K positions: at least 50% of copy bandwidth", None, False)

    # ---- lesson 09: version 3 against version 1 at the longest prompt
    pre = b09.get("prefill", [])
    if pre:
        t = max(p["tokens"] for p in pre)
        ms = {p["version"]: p["ms"] for p in pre if p["tokens"] == t}
        if 1 in ms and 3 in ms:
            r = ms[1] / ms[3]
            target(f"lesson 09, version 3 over version 1 at {t:,} tokens: at least 5x", f"{r:.1f}x", r >= 5)
        else:
            target(f"lesson 09, version 3 over version 1 at {t:,} tokens: at least 5x", None, False)
    else:
        target("lesson 09, version 3 over version 1 at 4,096 tokens: at least 5x", None, False)

    # ---- lesson 10: the whole engine on the GPU
    tables = b10.get("tables", [])
    v = number(cell(tables, "What a step costs", "1.1B shape (bf16)", "m = 5"), r"\(([\d.]+)x\)")
    others = [(label, number(cell(tables, "What a step costs", f"1.1B shape (bf16), {label}", "m = 5"), r"\(([\d.]+)x\)"))
              for label in ("cuBLAS products", "split skinny products")]
    others = [(label, x) for label, x in others if x is not None]
    target("verifying 5 tokens in one step (1.1B shape): at most 1.2x one decode step",
           None if v is None else f"{v:.2f}x" + "".join(f" ({label}: {x:.2f}x)" for label, x in others),
           v is not None and min([v] + [x for _, x in others]) <= 1.2)
    # Every 1.1B row of prompt lookup (its own greedy text; a prompt holding it; either product).
    looks = []
    for t in tables:
        if t.get("title", "").startswith("Speculative decoding") and "speedup" in t.get("columns", []):
            i = t["columns"].index("speedup")
            looks = [(str(r[0]), number(str(r[i]))) for r in t.get("rows", [])
                     if str(r[0]).startswith("1.1B shape") and "prompt lookup" in str(r[0]) and i < len(r)]
            break
    looks = [(name, v) for name, v in looks if v is not None]
    best = max(looks, key=lambda x: x[1]) if looks else None
    target("prompt lookup at k = 4 (1.1B shape): at least 1.5x plain greedy",
           None if best is None else ", ".join(f"{v:.2f}x ({name.removeprefix('1.1B shape')})" for name, v in looks),
           best is not None and best[1] >= 1.5)
    # Draft speculation with the bundled pair: each k's speedup over the formula's prediction, from
    # the step costs measured alone and from the run's own step times (judged on the latter: the
    # costs a run pays; the rest of its steps, the engine's own work, is the formula's to leave out).
    ratios = []
    for t in tables:
        cols = t.get("columns", [])
        if t.get("title", "").startswith("Speculative decoding") and "predicted from the run's steps" in cols:
            at = {c: cols.index(c) for c in ("k", "speedup", "predicted speedup", "predicted from the run's steps")}
            for r in t.get("rows", []):
                vals = {c: number(str(r[i])) if i < len(r) else None for c, i in at.items()}
                if str(r[0]) == "draft" and None not in vals.values() and vals["predicted speedup"] > 0 \
                        and vals["predicted from the run's steps"] > 0:
                    ratios.append((int(vals["k"]), vals["speedup"] / vals["predicted speedup"],
                                   vals["speedup"] / vals["predicted from the run's steps"]))
            break
    target("draft speculation (bundled pair): the measured speedup within 15% of the formula's prediction",
           None if not ratios else "measured / predicted from the step costs alone, then from the run's own steps: "
           + ", ".join(f"k = {k}: {alone:.2f}, {run:.2f}" for k, alone, run in ratios),
           bool(ratios) and all(abs(run - 1) <= 0.15 for _, _, run in ratios))
    warm = number(cell(tables, "Time to first token", "1.1B shape", "cold / warm"))
    target("warm time to first token: at least 5x faster than cold (1.1B shape)",
           None if warm is None else f"{warm:.1f}x", warm is not None and warm >= 5)
    rows = report.get("serving_table", [])
    rate = {(r.get("label"), str(r.get("users"))): float(r.get("total_tokens_per_s") or 0) for r in rows}
    if rate.get(("engine", "32")) and rate.get(("naive", "32")):
        r = rate[("engine", "32")] / rate[("naive", "32")]
        target("the engine at 32 users: at least 10x naive serving's tokens/s", f"{r:.1f}x", r >= 10)
    else:
        target("the engine at 32 users: at least 10x naive serving's tokens/s", None, False)

    # ---- the tuning constants
    def pick(name, path, value, why):
        now = constant(path, name)
        picks.append(f"| `{name}` ({path}) | {now} | {value if value is not None else 'not in this report'} | {why} |")

    tensor = {}  # variant: [ms over every (n, batch) it ran from the forward's present minimum batch]
    least = int(constant("lessons/07_cuda_decoder/fused_kernels.hpp", "kTensorGemmMinBatch") or 1)
    for k in k07:
        m = re.match(r"tensor_gemm_bf16 v(\d+)$", k["name"])
        if m and batch_of(k["shape"]) >= least and square(k["shape"]):  # (not the 1.1B step's rows: the compiled variant alone has them)
            tensor.setdefault(int(m.group(1)), []).append(k["ms"])
    variant = None
    if tensor:
        geo = {v: math.exp(sum(math.log(x) for x in ms) / len(ms)) for v, ms in tensor.items()}
        variant = min(geo, key=geo.get)
        why = f"geometric mean ms over its rows of batch {least} and more: " + ", ".join(f"v{v} {geo[v]:.4f}" for v in sorted(geo))
    else:
        why = "lesson 07's tensor_gemm_bf16 rows"
    pick("kTensorGemmVariant", "lessons/07_cuda_decoder/fused_kernels.hpp", variant, why)

    min_batch, notes = None, []
    if variant is not None:
        for size in sorted({square(k["shape"]) for k in k07 if k["name"] == f"tensor_gemm_bf16 v{variant}"} - {None}):
            t = {batch_of(k["shape"]): k["ms"] for k in k07 if k["name"] == f"tensor_gemm_bf16 v{variant}" and square(k["shape"]) == size}
            s = {batch_of(k["shape"]): k["ms"] for k in k07 if k["name"] == "skinny_gemm_bf16" and square(k["shape"]) == size}
            batches = sorted(b for b in t if b in s)
            wins = [b for b in batches if all(t[c] < s[c] for c in batches if c >= b)]
            first = min(wins) if wins else None
            notes.append(f"{size}: " + ", ".join(f"batch {b} {t[b]:.4f} / {s[b]:.4f} ms" for b in batches))
            if first is None:
                min_batch = "none (the skinny GEMM wins at every batch)"
            elif not isinstance(min_batch, str):
                min_batch = max(min_batch or 0, first)
    pick("kTensorGemmMinBatch", "lessons/07_cuda_decoder/fused_kernels.hpp", min_batch,
         "the smallest batch from which the chosen variant beats your skinny GEMM at every larger one (tensor / skinny: "
         + "; ".join(notes) + ")" if notes else "lesson 07's tensor and skinny rows")

    # Lesson 11's quantized products: the smallest batch from which the tensor-core GEMM makes the
    # 1.1B step's projections faster than the GEMVs at every larger batch, for every quantized format.
    b11 = benches.get("lesson11_cuda_bench") or {}
    qsteps = {}  # format: {batch: {"gemv": ms, "tensor": ms}}
    for r in b11.get("quantized_step", []):
        name = r.get("format", "")
        if name.startswith("bf16"):
            continue
        tc = name.endswith(" on tensor cores")
        qsteps.setdefault(name.removesuffix(" on tensor cores"), {}).setdefault(r["batch"], {})["tensor" if tc else "gemv"] = r["ms"]
    qmin, qnotes = None, []
    for name, by in sorted(qsteps.items()):
        both = sorted(b for b, d in by.items() if "gemv" in d and "tensor" in d)
        if not both:
            continue
        wins = [b for b in both if all(by[c]["tensor"] < by[c]["gemv"] for c in both if c >= b)]
        qnotes.append(f"{name}: " + ", ".join(f"batch {b} {by[b]['tensor']:.2f} / {by[b]['gemv']:.2f} ms" for b in both))
        if not wins:
            qmin = "none (the GEMVs win at every batch)"
        elif not isinstance(qmin, str):
            # The batches measured bound the crossing: the tensor GEMM wins from `first`, loses just below.
            first = min(wins)
            below = [b for b in both if b < first]
            qmin = max(qmin or 0, first)
            if below and qmin == first:
                qnotes[-1] += f" (between {max(below) + 1} and {first})"
    pick("kQuantTensorGemmMinBatch", "lessons/07_cuda_decoder/fused_kernels.hpp", qmin,
         "the smallest batch from which the tensor-core GEMM beats the GEMVs over the 1.1B step's projections "
         "at every larger one, for every quantized format (tensor / GEMVs: " + "; ".join(qnotes) + ")"
         if qnotes else "lesson 11's step rows")

    # The fused one-row step: on where lesson 07's decode at batch 1 is faster with it (more than 3%:
    # within that, the rows' noise, the present value stands).
    fuse_pick, fuse_why = None, "lesson 07's decode rows (batch 1, with and without the fused one-row step)"
    if 1 in dec and fused1:
        plain, fast = dec[1]["tokens_per_s"], fused1["tokens_per_s"]
        present = constant("lessons/07_cuda_decoder/fused_kernels.hpp", "kFuseOneRowStep")
        fuse_pick = "true" if fast > 1.03 * plain else "false" if plain > 1.03 * fast else present
        fuse_why = f"decode of the 1.1B shape at batch 1, fused / not: {fast:.0f} / {plain:.0f} tokens/s"
    pick("kFuseOneRowStep", "lessons/07_cuda_decoder/fused_kernels.hpp", fuse_pick, fuse_why)

    # The fused GEMV's warps (fused_gemv_split): the value that makes one step's fused products
    # fastest, from lesson 07's rows of each 1.1B matrix at splits 1 to 8 (a step runs each
    # layer's matrices 22 times, the head once).
    fused = {}  # (matrix name, rows): {split: ms}
    for k in k07:
        m = re.match(r"gemv_bf16_fused, .*, split (\d+) \(given\)$", k["name"])
        shape = re.match(r"(1\.1B [^:]+): (\d+) x \d+", k["shape"])
        if m and shape:
            fused.setdefault((shape.group(1), int(shape.group(2))), {})[int(m.group(1))] = k["ms"]

    def split_for(groups, warps):  # split_to_reach (fused_kernels.hpp)
        for s in (1, 2, 4):
            if groups * s >= warps:
                return s
        return 8

    totals = {}
    for warps in (0, 1024, 2048, 4096, 8192, 16384):
        parts = [(22 if "lm_head" not in name else 1) * by.get(split_for((rows + 1) // 2, warps), math.nan)
                 for (name, rows), by in fused.items()]
        if parts and not any(math.isnan(p) for p in parts):
            totals[warps] = sum(parts)
    warps_pick2, warps_why2 = None, "lesson 07's gemv_bf16_fused rows at each split"
    if totals:
        present = int(constant("lessons/07_cuda_decoder/fused_kernels.hpp", "kFusedGemvWarps") or 0)
        best = min(totals, key=totals.get)
        warps_pick2 = present if present in totals and totals[present] <= 1.01 * totals[best] else best
        warps_why2 = ("one step's fused products (ms; within 1% of the best, the present value stands): "
                      + ", ".join(f"{w} warps {t:.3f}" for w, t in totals.items()))
    pick("kFusedGemvWarps", "lessons/07_cuda_decoder/fused_kernels.hpp", warps_pick2, warps_why2)

    # The given skinny GEMM without staging. Its warps (split_to_reach's): the value that makes one
    # step's products of 8 rows fastest, from lesson 07's rows of the 1.1B matrices a step of
    # several rows multiplies by (q and o, k and v, gate and up: two of each a layer; down one;
    # the head once). Then the most rows it takes: the largest batch up to which it beats the
    # products the forward would otherwise call (your skinny GEMM, and the chosen tensor-core
    # variant from kTensorGemmMinBatch rows) at every batch measured, on the largest square shape,
    # and, from 8 rows, over that step's products too. Batches between two measured ones are assumed
    # to go as their neighbours do.
    def skinny_split_for(rows, warps):
        return split_for((rows + 3) // 4, warps)

    def per_step(name):
        return 1 if "lm_head" in name else 22 * len(name.split(", "))

    step8 = {}  # (matrix name, rows): {"split S" or "skinny" or "tensor": ms}
    # The step's rows time the variant the bench was built with; the square rows, every variant.
    chosen = variant or int(constant("lessons/07_cuda_decoder/fused_kernels.hpp", "kTensorGemmVariant") or 1)
    for k in k07:
        shape = re.match(r"(1\.1B [^:]+): (\d+) x \d+", k["shape"])
        if not shape or batch_of(k["shape"]) != 8:
            continue
        m = re.match(r"skinny_gemm_bf16_split, split (\d+) \(given\)$", k["name"])
        what = (f"split {m.group(1)}" if m else "skinny" if k["name"] == "skinny_gemm_bf16"
                else "tensor" if re.match(r"tensor_gemm_bf16 v\d+$", k["name"]) else None)
        if what:
            step8.setdefault((shape.group(1), int(shape.group(2))), {})[what] = k["ms"]
    totals = {}
    for warps in (0, 512, 1024, 2048, 4096, 8192):
        parts = [per_step(name) * by.get(f"split {skinny_split_for(rows, warps)}", math.nan) for (name, rows), by in step8.items()]
        if parts and not any(math.isnan(p) for p in parts):
            totals[warps] = sum(parts)
    split_warps, split_warps_why = None, "lesson 07's skinny_gemm_bf16_split rows of the 1.1B matrices at batch 8"
    present = int(constant("lessons/07_cuda_decoder/fused_kernels.hpp", "kSkinnySplitWarps") or 0)
    if totals:
        best = min(totals, key=totals.get)
        split_warps = present if present in totals and totals[present] <= 1.01 * totals[best] else best
        split_warps_why = ("one step's products of 8 rows (ms; within 1% of the best, the present value stands): "
                           + ", ".join(f"{w} warps {t:.3f}" for w, t in totals.items()))
    pick("kSkinnySplitWarps", "lessons/07_cuda_decoder/fused_kernels.hpp", split_warps, split_warps_why)

    warps = split_warps if split_warps is not None else present
    max_batch, max_notes, wins_at = None, [], {}  # wins_at: batch: whether it wins there everywhere
    # The largest square shape only: the smaller one's W stays in the L2, where nothing is read
    # from memory and the split kernel's streaming loads (evict first) are no help.
    sizes = {square(k["shape"]) for k in k07 if k["name"].startswith("skinny_gemm_bf16_split")} - {None}
    for size in sorted(sizes)[-1:]:
        mine = f"skinny_gemm_bf16_split, split {skinny_split_for(size, warps)} (given)"
        at = lambda name: {batch_of(k["shape"]): k["ms"] for k in k07  # noqa: E731
                           if k["name"] == name and square(k["shape"]) == size and "bf16" in k["shape"]}
        t, sk, tc = at(mine), at("skinny_gemm_bf16"), at(f"tensor_gemm_bf16 v{chosen}")
        for b in sorted(b for b in t if b in sk):
            other = min([sk[b]] + ([tc[b]] if b >= least and b in tc else []))
            wins_at[b] = wins_at.get(b, True) and t[b] < other
            max_notes.append(f"{size} batch {b}: {t[b]:.4f} / {other:.4f} ms")
    if step8 and all(f"split {skinny_split_for(r, warps)}" in by and "skinny" in by for (_, r), by in step8.items()):
        split_ms = sum(per_step(n) * by[f"split {skinny_split_for(r, warps)}"] for (n, r), by in step8.items())
        other_ms = sum(per_step(n) * min([by["skinny"]] + ([by["tensor"]] if 8 >= least and "tensor" in by else []))
                       for (n, r), by in step8.items())
        wins_at[8] = wins_at.get(8, True) and split_ms < other_ms
        max_notes.append(f"the 1.1B step's products at 8 rows: {split_ms:.3f} / {other_ms:.3f} ms")
    if wins_at:
        max_batch = 0
        for b in sorted(wins_at):
            if not wins_at[b]:
                break
            max_batch = b
    pick("kSkinnySplitMaxBatch", "lessons/07_cuda_decoder/fused_kernels.hpp", max_batch,
         "the largest batch up to which the split kernel (at the warps above) beats your skinny GEMM and the "
         "tensor-core GEMM at every batch measured on the largest square and the step (split / the other's best: " + "; ".join(max_notes) + ")"
         if max_notes else "lesson 07's skinny_gemm_bf16_split rows")

    chunks = {}  # chunk shape: {design: ms}
    for k in k08:
        if k["shape"].startswith("chunk of "):
            chunks.setdefault(k["shape"], {})[k["name"]] = k["ms"]
    decode_name, cuda_name, tc_name = ("chunk rows through your decode kernel", "chunk kernel (tiles of 32 rows)",
                                       "chunk kernel on tensor cores (tiles of 32 rows)")
    size = lambda shape: int(re.match(r"chunk of (\d+)", shape).group(1))  # noqa: E731

    def as_run(d, name):
        """A design's ms as the engine runs it on a shape: split where the bench split it as the
        engine would (the row ", split N ways"), else whole; None where the bench has neither."""
        split = [ms for n, ms in d.items() if n.startswith(name + ", split ") and "twice" not in n]
        return split[0] if split else d.get(name)

    def twice(d, name):
        """The design's ms split twice as many ways as the engine splits it (None where not run)."""
        return next((ms for n, ms in d.items() if n.startswith(name + ", split ") and "twice" in n), None)

    tc_rows = [(s, d) for s, d in chunks.items() if tc_name in d and cuda_name in d and size(s) >= 32]
    use_tc = all(as_run(d, tc_name) < as_run(d, cuda_name) for _, d in tc_rows) if tc_rows else None
    pick("kChunkTensorCores", "lessons/08_cuda_paged_attention/chunk_attention.hpp",
         None if use_tc is None else str(use_tc).lower(),
         "tensor cores / CUDA cores, chunks of 32 tokens and more, each split as the engine splits it: "
         + ", ".join(f"{size(s)}: {as_run(d, tc_name):.4f} / {as_run(d, cuda_name):.4f} ms"
                     for s, d in sorted(tc_rows, key=lambda x: size(x[0]))))
    # The fewest rows a step's longest tile needs for tensor cores: the smallest chunk from which
    # they beat the CUDA cores at every larger one, each split as the engine splits it (a chunk of
    # n tokens is tiles of min(n, 32) rows).
    both = sorted(((size(s), d) for s, d in chunks.items() if tc_name in d and cuda_name in d), key=lambda x: x[0])
    tc_wins = [n for n, _ in both if all(as_run(d, tc_name) < as_run(d, cuda_name) for m, d in both if m >= n)]
    tc_least = None if not both else (min(min(tc_wins), 32) if tc_wins else "none (the CUDA cores win at every size)")
    if tc_wins and min(tc_wins) == both[0][0]:
        tc_least = f"{tc_least} or fewer (the smallest chunk measured)"
    elif tc_wins:
        below = max(n for n, _ in both if n < min(tc_wins))
        tc_least = (f"{tc_least} (somewhere in {below + 1} to {min(min(tc_wins), 32)}: "
                    "the sizes between were not measured)")
    pick("kChunkTensorMinRows", "lessons/08_cuda_paged_attention/chunk_attention.hpp", tc_least,
         "tensor cores / CUDA cores by chunk, each split as the engine splits it: "
         + ", ".join(f"{n}: {as_run(d, tc_name):.4f} / {as_run(d, cuda_name):.4f} ms" for n, d in both))
    design = tc_name if use_tc else cuda_name
    # The tiles' split: halved where twice the splits beat the engine's at every shape the bench
    # split, kept where the engine's beat the whole kernel, else 0 (off).
    split_rows = [(size(s), d[design], as_run(d, design), twice(d, design)) for s, d in chunks.items()
                  if design in d and as_run(d, design) != d[design]]
    present = int(constant("lessons/08_cuda_paged_attention/chunk_attention.hpp", "kChunkSplitMinPositions") or 0)
    if not split_rows:
        split_pick = None
    elif all(x is not None and x < t < w for _, w, t, x in split_rows):
        split_pick = present // 2
    else:
        split_pick = present if all(t < w for _, w, t, _ in split_rows) else 0
    pick("kChunkSplitMinPositions", "lessons/08_cuda_paged_attention/chunk_attention.hpp", split_pick,
         "the chunk kernel whole / split as chunk_splits() splits it / twice as many ways (half the present value "
         "where twice wins everywhere, 0 turns the split off where the engine's loses): "
         + ", ".join(f"{n}: {w:.4f} / {t:.4f} / " + (f"{x:.4f}" if x is not None else "-") + " ms"
                     for n, w, t, x in sorted(split_rows)))
    # The chunk kernel in the design the engine takes for a chunk of n tokens (tiles of min(n, 32)
    # rows: tensor cores from kChunkTensorMinRows rows, where they are chosen).
    min_rows = int(constant("lessons/08_cuda_paged_attention/chunk_attention.hpp", "kChunkTensorMinRows") or 0)
    at_n = lambda n: tc_name if use_tc and min(n, 32) >= min_rows else cuda_name  # noqa: E731
    rows_ = sorted(((size(s), d) for s, d in chunks.items() if at_n(size(s)) in d and decode_name in d),
                   key=lambda x: x[0])
    wins = [n for n, _ in rows_ if all(as_run(d, at_n(m)) < as_run(d, decode_name) for m, d in rows_ if m >= n)]
    first = None if not rows_ else (min(wins) if wins else "none (the decode kernel wins at every size)")
    if isinstance(first, int) and first == rows_[0][0]:
        first = f"{first} or fewer (the smallest chunk measured)"
    pick("kChunkKernelMinTokens", "lessons/08_cuda_paged_attention/cuda_paged.hpp", first,
         "the chunk kernel / your decode kernel over a chunk's rows, each in the design and split the engine "
         "takes: " + ", ".join(f"{n}: {as_run(d, at_n(n)):.4f} / {as_run(d, decode_name):.4f} ms" for n, d in rows_))

    # The serving engine's decode kernel: lesson 10's graphs table, the 1.1B shape with your attention
    # and with the tiled design, from graphs, at every batch the table has.
    yours = engines.get("1.1B shape (bf16)", {})
    tiled = {name: rows for name, rows in engines.items() if "tiled attention" in name}
    warps_pick, warps_why, best, whys = None, "lesson 10's graphs table (its tiled rows)", 1.0, []
    for name, rows in tiled.items():
        common = sorted(b for b in rows if b in yours and yours[b][1] > 0 and rows[b][1] > 0)
        if not common:
            continue
        w = int(re.search(r"\((\d+) warps\)", name).group(1))
        ratio = math.exp(sum(math.log(rows[b][1] / yours[b][1]) for b in common) / len(common))
        if warps_pick is None:
            warps_pick = 0
        if ratio > best:  # the variant with the best geometric mean over yours, if any beats yours
            warps_pick, best = w, ratio
        whys.append(f"tiled ({w} warps) / yours: "
                    + ", ".join(f"batch {b} {rows[b][1]:.0f} / {yours[b][1]:.0f}" for b in common)
                    + f", geometric mean {ratio:.2f}x")
    if whys:
        warps_why = "tokens/s from graphs, " + "; ".join(whys)
    pick("kEngineTiledWarps", "lessons/08_cuda_paged_attention/cuda_paged.hpp", warps_pick, warps_why)

    # choose_splits()'s shortest split: lesson 10's batch-1 table by split count. The best fixed
    # count at each context length implies a shortest split of about length / count.
    split_pick, split_notes = None, []
    for t in b10.get("tables", []):
        if not t.get("title", "").startswith("Batch 1 decode by the attention's split count"):
            continue
        cols = t.get("columns", [])
        counts = [(i, int(c)) for i, c in enumerate(cols) if c.isdigit()]
        chosen = cols.index("chosen (choose_splits)") if "chosen (choose_splits)" in cols else None
        for r in t.get("rows", []):
            length = int(r[0])
            best_i, best_n = max(counts, key=lambda ic: float(r[ic[0]]))
            split_notes.append(f"{length} positions: best {best_n} ways, {float(r[best_i]):.0f} tokens/s"
                               + (f" (chosen: {float(r[chosen]):.0f})" if chosen is not None else ""))
            # Within 3% of the chosen count's rate is a tie (the rows' noise): the present value stands.
            present = int(constant("lessons/08_cuda_paged_attention/flash_decoding.hpp", "kMinSplitPositions") or 64)
            tie = chosen is not None and float(r[best_i]) <= 1.03 * float(r[chosen])
            implied = present if tie else max(1, length // best_n)
            split_pick = implied if split_pick is None else min(split_pick, implied)
    pick("kMinSplitPositions", "lessons/08_cuda_paged_attention/flash_decoding.hpp", split_pick,
         "the shortest split the best fixed count implies (length / count, the least over the rows; "
         "the present value where the best is within 3% of the chosen count): "
         + "; ".join(split_notes) if split_notes else "lesson 10's batch-1 table by split count")

    return (["| target | this report | |", "| --- | --- | --- |"] + targets + ["",
            "| tuning constant | in the source | this report picks | from |", "| --- | --- | --- | --- |"] + picks)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "gpu-check", "gpu-report.json")
    with open(path, encoding="utf-8") as f:
        print("\n".join(summary(json.load(f))))


if __name__ == "__main__":
    main()
