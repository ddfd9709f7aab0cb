#!/usr/bin/env python3
"""Rewrites a .cu file of the course as C++ that runs its kernels on the host (emulated_cuda.hpp).

    emulate_cu.py IN.cu OUT.cpp

Only what the course's kernels use: the CUDA headers become emulated_cuda.hpp (WMMA included);
`__CUDA_ARCH__` the emulated device's 900; `extern
__shared__ T name[];` a pointer to the block's dynamic shared memory; other `__shared__` arrays
statics (one block runs at a time; several names in one declaration, each its own), refilled with 0xFF for each block; `kernel<<<grid, block[,
shared]>>>(args);` a call of emu::launch() (of emu::launch_deduced() for a kernel template of the file
launched without its template arguments, which the compiler then deduces as nvcc does). A launch with a stream, or a __shared__ declaration
outside a function, is refused with a message. Everything else compiles as it is, with the header's definitions. Line numbers are
kept (#line), so that a compiler error or a failed check names the .cu file's own line.
"""
import os
import re
import sys


def split_top_level(text):
    """The comma-separated parts of `text`, ignoring commas inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def template_kernels(src):
    """The names of the kernel templates defined in `src` (template <...> __global__ ... void name(...)."""
    names, bounds = set(), r"(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?"
    for start in re.finditer(r"\btemplate\s*<", src):
        i, depth = start.end(), 1
        while i < len(src) and depth:
            depth += {"<": 1, ">": -1}.get(src[i], 0)
            i += 1
        kernel = re.match(r"\s*(?:static\s+)?__global__\s+" + bounds + r"void\s+" + bounds + r"(\w+)\s*\(", src[i:])
        if kernel:
            names.add(kernel.group(1))
    return names


def launch(match, templates=frozenset()):
    kernel, config, args = match.group(1), match.group(2), match.group(3)
    cfg = split_top_level(config)
    if len(cfg) == 2:
        cfg.append("0")
    if len(cfg) != 3:
        raise SystemExit(f"emulate_cu.py: a launch with a stream is not emulated: {match.group(0)}")
    name = '"' + " ".join(kernel.split()).replace("\\", "\\\\").replace('"', '\\"') + '"'  # for messages
    if kernel in templates:
        # A kernel template without its template arguments: nvcc deduces them from the arguments,
        # and a generic lambda that names the kernel lets the compiler deduce them in the same way.
        target = f"[](const auto&... a) {{ {kernel}(a...); }}"
        call = f"::emu::launch_deduced({name}, {cfg[0]}, {cfg[1]}, {cfg[2]}, {target}"
    else:
        call = f"::emu::launch({name}, {cfg[0]}, {cfg[1]}, {cfg[2]}, {kernel}"
    call += (f", {args}" if args.strip() else "") + ");"
    # The lines that follow stay where they were (#line): as many newlines as the launch had.
    return call + "\n" * (match.group(0).count("\n") - call.count("\n"))


def rewrite(src, path):
    src = re.sub(r"#include <(cuda_runtime|cuda_bf16|cuda_fp16|mma)\.h>", "", src)
    # The emulated device's architecture (9.0), in this file only: the headers it includes keep
    # their host code.
    src = re.sub(r"\b__CUDA_ARCH__\b", "COURSE_EMULATED_CUDA_ARCH", src)
    # extern __shared__ T name[];: the block's dynamic shared memory.
    src = re.sub(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:][\w: ]*?)\s+(\w+)\[\];",
                 r"\1* \2 = reinterpret_cast<\1*>(::emu::dynamic_shared());", src)
    # __shared__ T name[...];: a static of the function, one per host thread, refilled with 0xFF for
    # each block (a GPU's shared memory starts as garbage, not zeros).
    # Several names in one declaration (__shared__ float a[4], b[4];) become one static each.
    def shared(match):
        align, type_, names = match.group(1) or "", match.group(2), split_top_level(match.group(3))
        out = []
        for decl in names:
            name = re.match(r"\w+", decl).group(0)
            out.append(f"{align}static thread_local {type_} {decl}; ::emu::fresh_shared(&{name}, sizeof({name}));")
        return " ".join(out)

    src = re.sub(r"\b__shared__\s+(__align__\(\d+\)\s+)?([\w:][\w: ]*?)\s+"
                 r"(\w+(?:\[[^\]]*\])*(?:\s*,\s*\w+(?:\[[^\]]*\])*)*)\s*;", shared, src)
    for number, line in enumerate(src.splitlines(), 1):
        if "__shared__" in line.split("//")[0]:
            raise SystemExit(f"{path}:{number}: error: emulate_cu.py cannot rewrite this __shared__ declaration for the "
                             f"emulator: {line.strip()}\n  (it takes `__shared__ T name[N]...;`, several names in one, "
                             f"and `extern __shared__ T name[];`, each on one line, inside a function; an initializer "
                             f"is not allowed in CUDA either)")
    templates = template_kernels(src)
    src = re.sub(r"([\w:]+(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\);", lambda m: launch(m, templates), src,
                 flags=re.S)
    if any("<<<" in line.split("//")[0] for line in src.splitlines()):
        raise SystemExit(f"emulate_cu.py: {path}: a launch it could not rewrite")
    return f'#include "tests/common/host_device/emulated_cuda.hpp"\n#line 1 "{path}"\n' + src


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        out = rewrite(f.read(), sys.argv[1])
    # Written whole, then renamed into place: build trees that share the output rewrite it at once.
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[2])), exist_ok=True)
    part = f"{sys.argv[2]}.{os.getpid()}"
    with open(part, "w") as f:
        f.write(out)
    os.replace(part, sys.argv[2])
