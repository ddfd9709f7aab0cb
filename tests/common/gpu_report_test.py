#!/usr/bin/env python3
"""The GPU report reads what the GPU benches write: tools/gpu_report.py over the JSON of the
benches' --small run-through (lessons 07, 08, 09 and 11 over the emulated kernels, CI's
Emulated.Lesson*CudaBenchRunsThrough), then tools/gpu_report_plots.py over its markdown. Each
bench's section must be there with its rows (the tensor-core ones among them) and its checks
(every one "within"), the targets and tuning section must pick every constant
(tools/gpu_targets.py), and both plots must be drawn, so that a GPU's minutes never end in the
report's bug.

    gpu_report_test.py REPOSITORY_ROOT BENCH_JSON_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile

root, benches = sys.argv[1], sys.argv[2]
wanted = {  # bench: lines its section must have
    "lesson07_cuda_bench": ["| gemv_bf16 v", "| skinny_gemm_bf16 |", "| tensor_gemm_bf16 v4 |", "| cuBLAS bf16 GEMM |",
                            "| skinny_gemm_bf16_split, split 2 (given) |",
                            "- decode, small model in the 1.1B shape's place, bf16, batch 16, split skinny products (",
                            "| cuBLAS sgemv |", "- decode, small model in the 1.1B shape's place, bf16, batch 16:",
                            "- decode, small model in the 1.1B shape's place, bf16, batch 16, cuBLAS products:",
                            "| q, k, v GEMV [", "| logits to the host (cudaMemcpy; the host waits for each) | 1 |", "| ms in a stream |",
                            "ms in a stream; the step: "],
    "lesson08_cuda_bench": ["| chunk kernel on tensor cores (tiles of 32 rows) |", "| paged, split ",
                            "| chunk kernel (tiles of 32 rows), split 3 ways |",
                            "| chunk rows through your decode kernel, split 3 ways |",
                            "- decode step, small model in the 1.1B shape's place"],
    "lesson09_cuda_bench": ["cuBLAS bf16 product on this device", "- version 3 against version 2, 64 tokens"],
    "lesson11_cuda_bench": ["| int4, groups of 32 on tensor cores |", "| int8 |"],
}

with tempfile.TemporaryDirectory() as out:
    for bench in wanted:
        shutil.copy(os.path.join(benches, bench + ".json"), out)
    with open(os.path.join(out, "steps.tsv"), "w") as f:
        f.write("bench run-through\tpassed\t1\t\n")
    run = subprocess.run([sys.executable, os.path.join(root, "tools", "gpu_report.py"), "--out", out, "--commit",
                          "run-through"], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.exit(f"gpu_report.py failed ({run.returncode}): {run.stderr}")
    md = open(os.path.join(out, "gpu-report.md"), encoding="utf-8").read()
    sections = md.split("\n## ")
    for bench, lines in wanted.items():
        section = next((s for s in sections if s.startswith(bench + "\n")), None)
        if section is None:
            sys.exit(f"the report has no section for {bench}:\n{md}")
        missing = [line for line in lines if line not in section]
        if missing:
            sys.exit(f"{bench}'s section lacks {missing}:\n{section}")
    # tools/gpu_targets.py's section: every tuning constant picked from the benches' rows.
    for name in ("kTensorGemmVariant", "kTensorGemmMinBatch", "kFuseOneRowStep", "kSkinnySplitMaxBatch",
                 "kChunkTensorCores", "kChunkTensorMinRows", "kChunkSplitMinPositions", "kChunkKernelMinTokens"):
        row = next((line for line in md.splitlines() if line.startswith(f"| `{name}`")), "")
        if not row or "not in this report" in row:
            sys.exit(f"the report's tuning table has no pick for {name}: {row!r}")
    if "| batch 8 over one GEMV (256 x 256 bf16): at most 1.5x | " not in md:
        sys.exit("the report's targets table lacks the batch 8 product's figure")
    # The batch-64 target reads both engines' rows (the run-through's batches stop short of 64):
    # lesson 07's contiguous decode and lesson 10's paged graphs table, the best of them judged.
    sys.path.insert(0, os.path.join(root, "tools"))
    import gpu_targets
    graphs = {"title": "Decode with and without CUDA graphs (paged memory, 100 positions cached; tokens/s)",
              "columns": ["model", "batch", "launched", "from graphs"],
              "rows": [["1.1B shape (bf16)", "1", "100", "110"], ["1.1B shape (bf16)", "64", "1600", "1540"]]}
    decode = [{"model": "1.1B shape, bf16", "batch": 1, "tokens_per_s": 100},
              {"model": "1.1B shape, bf16, batch 64", "batch": 64, "tokens_per_s": 350}]
    row = next(line for line in gpu_targets.summary({"benches": {
        "lesson07_cuda_bench": {"decode": decode}, "lesson10_cuda_bench": {"tables": [graphs]}}})
        if line.startswith("| decode at batch 64"))
    if "3.5x (lesson 07's contiguous caches)" not in row or "16.0x launched, 14.0x from graphs" not in row \
            or not row.endswith("| met |"):
        sys.exit(f"the batch-64 target misreads the two engines' rows: {row}")
    # The fused one-row step beside the plain one at batch 1: both shown, the faster picked.
    decode = [{"model": "1.1B shape, bf16", "batch": 1, "tokens_per_s": 100, "fraction_of_roofline": 0.2},
              {"model": "1.1B shape, bf16, fused one-row step", "batch": 1, "tokens_per_s": 120,
               "fraction_of_roofline": 0.24}]
    lines = gpu_targets.summary({"benches": {"lesson07_cuda_bench": {"decode": decode}}})
    one = next(line for line in lines if line.startswith("| decode of the 1.1B shape at batch 1"))
    fuse = next(line for line in lines if line.startswith("| `kFuseOneRowStep`"))
    if "| 20% (the fused one-row step: 24%) |" not in one or "| true | decode of the 1.1B shape at batch 1, fused / not: 120 / 100" not in fuse:
        sys.exit(f"the fused one-row step's decode is misread: {one} / {fuse}")
    # The fused GEMV's warps: o (2048 rows, 1024 pairs) fastest at split 4, the head (32000 rows)
    # at split 1: 4096 warps gives o split 4 and the head split 1 (22 x 0.004 + 0.030).
    kernels = []
    for split, o_ms, head_ms in ((1, 0.008, 0.030), (2, 0.006, 0.031), (4, 0.004, 0.032), (8, 0.005, 0.033)):
        kernels.append({"name": f"gemv_bf16_fused, the residual add in it, split {split} (given)",
                        "shape": "1.1B o: 2048 x 2048 bf16, in a stream of 20, 22 copies", "ms": o_ms})
        kernels.append({"name": f"gemv_bf16_fused, the norm in it, split {split} (given)",
                        "shape": "1.1B lm_head: 32000 x 2048 bf16, in a stream of 20, 1 copies", "ms": head_ms})
    lines = gpu_targets.summary({"benches": {"lesson07_cuda_bench": {"kernels": kernels}}})
    warps = next(line for line in lines if line.startswith("| `kFusedGemvWarps`"))
    if "| 4096 | " not in warps or "4096 warps 0.118" not in warps:
        sys.exit(f"the fused GEMV's warps are misread: {warps}")
    # The skinny GEMM without staging: its warps from the 1.1B step's products of 8 rows (q and o
    # fastest at split 4, k and v at 8, the rest the same at every split: 2048 warps gives q and o
    # split 4, k and v split 8); then its most rows, from the square shape at that warps' split (2:
    # 1024 groups of 4 rows), beating your skinny GEMM and the tensor-core GEMM at 2, 4 and 8 rows,
    # losing to the tensor-core GEMM at 16; the step's products at 8 rows faster too: 8.
    kernels = []
    step = {"1.1B q, o: 2048 x 2048": {1: 0.010, 2: 0.008, 4: 0.006, 8: 0.007},
            "1.1B k, v: 256 x 2048": {1: 0.006, 2: 0.005, 4: 0.004, 8: 0.003},
            "1.1B gate, up: 5632 x 2048": {s: 0.020 for s in (1, 2, 4, 8)},
            "1.1B down: 2048 x 5632": {s: 0.015 for s in (1, 2, 4, 8)},
            "1.1B lm_head: 32000 x 2048": {s: 0.080 for s in (1, 2, 4, 8)}}
    for name, by in step.items():
        shape = f"{name} bf16, batch 8, in a stream of 20, 4 copies"
        kernels += [{"name": f"skinny_gemm_bf16_split, split {sp} (given)", "shape": shape, "ms": ms} for sp, ms in by.items()]
        kernels += [{"name": "skinny_gemm_bf16", "shape": shape, "ms": 0.1},
                    {"name": "tensor_gemm_bf16 v4", "shape": shape, "ms": 0.05}]
    for batch, (split_ms, skinny_ms, tensor_ms) in {2: (0.014, 0.028, 0.026), 4: (0.015, 0.037, 0.025),
                                                    8: (0.017, 0.058, 0.026), 16: (0.031, 0.106, 0.029)}.items():
        shape = f"4096 x 4096 bf16, batch {batch}"
        kernels += [{"name": "skinny_gemm_bf16_split, split 2 (given)", "shape": shape, "ms": split_ms},
                    {"name": "skinny_gemm_bf16_split, split 1 (given)", "shape": shape, "ms": split_ms / 2},  # not the one used
                    {"name": "skinny_gemm_bf16", "shape": shape, "ms": skinny_ms},
                    {"name": "tensor_gemm_bf16 v4", "shape": shape, "ms": tensor_ms}]
    lines = gpu_targets.summary({"benches": {"lesson07_cuda_bench": {"kernels": kernels}}})
    warps = next(line for line in lines if line.startswith("| `kSkinnySplitWarps`"))
    most = next(line for line in lines if line.startswith("| `kSkinnySplitMaxBatch`"))
    if "| 2048 | " not in warps or "1024 warps" not in warps:
        sys.exit(f"the split skinny GEMM's warps are misread: {warps}")
    if "| 8 | " not in most or "4096 batch 16: 0.0310 / 0.0290 ms" not in most:
        sys.exit(f"the split skinny GEMM's most rows are misread: {most}")
    # The engine's decode kernel and choose_splits()'s shortest split, from lesson 10's tables: the
    # tiled rows win by a geometric mean of 1.2x; at 100 positions 4 ways beat the chosen 1 by far
    # (a shortest split of 25), at 400 positions the best is within 3% of the chosen (a tie).
    tiled = {"title": graphs["title"], "columns": graphs["columns"],
             "rows": graphs["rows"] + [["1.1B shape (bf16), tiled attention (8 warps)", "1", "130", "140"],
                                       ["1.1B shape (bf16), tiled attention (8 warps)", "64", "1700", "1750"]]}
    splits = {"title": "Batch 1 decode by the attention's split count (1.1B shape, bf16, paged memory, from graphs; tokens/s)",
              "columns": ["positions cached", "chosen (choose_splits)", "1", "2", "4", "8"],
              "rows": [["100", "300", "300", "380", "420", "410"], ["400", "400", "300", "350", "390", "408"]]}
    lines = gpu_targets.summary({"benches": {"lesson10_cuda_bench": {"tables": [tiled, splits]}}})
    warps = next(line for line in lines if line.startswith("| `kEngineTiledWarps`"))
    shortest = next(line for line in lines if line.startswith("| `kMinSplitPositions`"))
    if "| 8 | tokens/s from graphs, tiled (8 warps) / yours: batch 1 140 / 110, batch 64 1750 / 1540" not in warps:
        sys.exit(f"the engine's decode kernel is misread from the graphs table: {warps}")
    if "| 25 | " not in shortest or "400 positions: best 8 ways, 408 tokens/s (chosen: 400)" not in shortest:
        sys.exit(f"choose_splits()'s shortest split is misread from the split table: {shortest}")
    # The chunk kernel's split (CUDA cores chosen: tensor cores slower at 32 tokens): at 8 and 32
    # tokens, split as the engine splits it beats whole, and twice as many ways beats that at both
    # (half of 256: 128); twice as many losing at one (256 stays); the engine's split losing at one
    # (0: off). The decode kernel's rows as the engine runs them (split) against the chunk kernel's.
    def chunk_rows(twice_8, rule_32, tc_32=3.0):
        rows = []
        for n, whole, rule, twice_ms, tc_ms in ((8, 0.77, 0.10, twice_8, 3.0), (32, 2.1, rule_32, 0.2, tc_32)):
            shape = f"chunk of {n} after {2048 - n}"
            rows += [{"name": "chunk kernel (tiles of 32 rows)", "shape": shape, "ms": whole},
                     {"name": "chunk kernel (tiles of 32 rows), split 8 ways", "shape": shape, "ms": rule},
                     {"name": "chunk kernel (tiles of 32 rows), split 16 ways (twice the engine's)", "shape": shape,
                      "ms": twice_ms},
                     {"name": "chunk kernel on tensor cores (tiles of 32 rows)", "shape": shape, "ms": tc_ms},
                     {"name": "chunk rows through your decode kernel", "shape": shape, "ms": 1.3},
                     {"name": "chunk rows through your decode kernel, split 9 ways", "shape": shape, "ms": 0.01 * n}]
        lines = gpu_targets.summary({"benches": {"lesson08_cuda_bench": {"kernels": rows}}})
        return [next(line for line in lines if line.startswith(f"| `{k}`"))
                for k in ("kChunkTensorCores", "kChunkSplitMinPositions", "kChunkKernelMinTokens",
                          "kChunkTensorMinRows")]
    tc, split, least, tc_rows = chunk_rows(0.08, 0.3)
    if "| none (the CUDA cores win at every size) |" not in tc_rows:
        sys.exit(f"the tensor cores' fewest rows are misread: {tc_rows}")
    _, _, least_tc, tc_rows = chunk_rows(0.08, 0.3, tc_32=0.25)  # tensor cores (unsplit) beat CUDA cores split at 32
    if "| 32 (somewhere in 9 to 32: the sizes between were not measured) |" not in tc_rows:
        sys.exit(f"the tensor cores' fewest rows are misread: {tc_rows}")
    if "8: 0.1000 / 0.0800 ms, 32: 0.2500 / 0.3200 ms" not in least_tc:  # CUDA cores at 8 rows, tensor at 32
        sys.exit(f"the chunk kernel's least tokens take the wrong design by size: {least_tc}")
    if "| false | " not in tc or "| 128 | " not in split or "8: 0.7700 / 0.1000 / 0.0800 ms" not in split:
        sys.exit(f"the chunk kernel's split is misread: {tc} / {split}")
    if "| 32 | " not in least or "8: 0.1000 / 0.0800 ms, 32: 0.3000 / 0.3200 ms" not in least:
        sys.exit(f"the chunk kernel's least tokens are misread against the decode kernel split: {least}")
    if "| 256 | " not in chunk_rows(0.12, 0.3)[1] or "| 0 | " not in chunk_rows(0.08, 2.5)[1]:
        sys.exit(f"the chunk kernel's split is misread: {chunk_rows(0.12, 0.3)[1]} / {chunk_rows(0.08, 2.5)[1]}")
    # Draft speculation against lesson 06's formula: judged on the prediction from the run's own
    # steps (k = 1 within 10%, k = 2 within 5%), the one from the costs alone shown beside it.
    spec = {"title": "Speculative decoding on the GPU: bundled pair, greedy, one request at a time",
            "columns": ["proposer", "k", "tokens/s", "speedup", "guesses kept", "tokens per step", "predicted speedup",
                        "predicted from the run's steps", "ms a step: draft, target, the rest"],
            "rows": [["none (plain)", "0", "3000", "1", "", "1", "", "", "0, 0.21, 0.08"],
                     ["draft", "1", "2700", "0.9", "67%", "1.66", "0.75", "1.0", "0.1, 0.25, 0.08"],
                     ["draft", "2", "2900", "0.95", "57%", "2.1", "0.6", "1.0", "0.2, 0.3, 0.08"]]}
    line = next(line for line in gpu_targets.summary({"benches": {"lesson10_cuda_bench": {"tables": [spec]}}})
                if line.startswith("| draft speculation"))
    if "k = 1: 1.20, 0.90, k = 2: 1.58, 0.95" not in line or not line.endswith("| met |"):
        sys.exit(f"the draft speculation target misreads its table: {line}")
    if "OUTSIDE" in md or " within" not in md:
        sys.exit(f"a check of one kernel against another is missing or failed:\n{md}")
    # (matplotlib is Debian's python3-matplotlib: /usr/bin/python3's, as ./course runs the plots)
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    plots = subprocess.run([python, os.path.join(root, "tools", "gpu_report_plots.py"),
                            os.path.join(out, "gpu-report.md"), os.path.join(out, "images")],
                           capture_output=True, text=True, check=False)
    if plots.returncode != 0:
        sys.exit(f"gpu_report_plots.py failed ({plots.returncode}): {plots.stderr}")
    for png in ("lesson07_gpu.png", "lesson08_gpu.png"):
        if os.path.getsize(os.path.join(out, "images", png)) < 10000:
            sys.exit(f"{png} is nearly empty")
    print(f"gpu_report.py: {len(wanted)} benches' sections with their rows and checks; both plots drawn")
