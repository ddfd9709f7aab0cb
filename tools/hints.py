#!/usr/bin/env python3
"""Tiered hints, one tier at a time: `./course hint NN [NAME] [--again | --reset]`.

    lessons/NN_topic/hints.md holds, for each function a student writes, a section
    `## Name` with tiers `### 1. A nudge`, `### 2. The approach`, `### 3. The steps`.

`./course hint NN` lists the functions that have hints and how many tiers you have seen;
`./course hint NN NAME` shows the tiers seen so far and reveals the next one; `--again` shows
what you have seen without revealing more; `--reset` forgets what you have seen. NAME matches a
section by its last word (`append` finds `PagedKVCache::append`), or by any part of it.
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(path):
    """[(title, [(tier title, text)])] in file order."""
    sections, tier = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                sections.append((line[3:].strip(), []))
                tier = None
            elif line.startswith("### ") and sections:
                tier = [line[4:].strip(), ""]
                sections[-1][1].append(tier)
            elif tier is not None:
                tier[1] += line
    return [(title, [(t, text.strip("\n")) for t, text in tiers]) for title, tiers in sections if tiers]


def find(sections, name):
    key = name.lower()
    exact = [s for s in sections if s[0].lower().split("::")[-1] == key or s[0].lower() == key]
    if exact:
        return exact
    found = [s for s in sections if key in s[0].lower()]
    if not found and "::" in key:  # Class::function where the section is titled by the function
        return find(sections, key.split("::")[-1])
    return found


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    flags = {a for a in argv if a.startswith("--")}
    unknown = flags - {"--again", "--reset"}
    if flags & {"-h", "--help"} or {a for a in argv if a in ("-h",)}:
        print("usage: ./course hint NN [NAME] [--again | --reset]")
        return 0
    problem = (f"unknown option {sorted(unknown)[0]}" if unknown
               else "--again and --reset: give one" if {"--again", "--reset"} <= flags
               else "a lesson number is missing" if not args
               else f"one NAME at a time, got {' '.join(args[1:])}" if len(args) > 2 else None)
    if problem:
        print(f"hint: {problem}\nusage: ./course hint NN [NAME] [--again | --reset]", file=sys.stderr)
        return 2
    nn = args[0]
    if not re.fullmatch(r"\d{1,2}", nn):
        print(f"hint: expected a lesson number like 04, got '{nn}'", file=sys.stderr)
        return 2
    nn = f"{int(nn):02d}"
    lessons = [d for d in sorted(os.listdir(os.path.join(ROOT, "lessons"))) if d.startswith(nn + "_")]
    if not lessons:
        print(f"hint: there is no lesson {nn}", file=sys.stderr)
        return 2
    lesson = lessons[0]
    path = os.path.join(ROOT, "lessons", lesson, "hints.md")
    if not os.path.exists(path):
        print(f"lesson {nn} has no hints yet: its README's steps are all there is.")
        return 0
    sections = parse(path)
    state_path = os.path.join(ROOT, "build", "exercises", ".course", "hints", f"lesson{nn}.json")
    try:
        with open(state_path) as f:
            seen = json.load(f)
    except (OSError, ValueError):
        seen = {}

    if len(args) == 1:
        if "--reset" in flags:
            seen = {}
        else:
            print(f"Hints for lesson {nn} ({lesson}): ./course hint {nn} NAME reveals the next tier.\n")
            for title, tiers in sections:
                n = seen.get(title, 0)
                print(f"  {title:<40} {n} of {len(tiers)} seen")
            return 0
    else:
        matches = find(sections, args[1])
        if not matches:
            print(f"hint: lesson {nn} has no hints for '{args[1]}'. These have hints:", file=sys.stderr)
            for title, _ in sections:
                print(f"  {title}", file=sys.stderr)
            return 2
        if len(matches) > 1:
            print(f"hint: '{args[1]}' could be any of these; name one:", file=sys.stderr)
            for title, _ in matches:
                print(f"  {title}", file=sys.stderr)
            return 2
        title, tiers = matches[0]
        if "--reset" in flags:
            seen.pop(title, None)
        else:
            n = seen.get(title, 0)
            if "--again" not in flags:
                n = min(n + 1, len(tiers))
            if n == 0:
                print(f"No tier of {title} seen yet: ./course hint {nn} {args[1]} shows the first.")
            for i, (tier_title, text) in enumerate(tiers[:n], 1):
                shown = re.sub(r"^\d+\.\s*", "", tier_title)  # ("1. A nudge": the number is said already)
                print(f"\n{title}, hint {i} of {len(tiers)}: {shown}\n\n{text}")
            if n < len(tiers) and n > 0:
                print(f"\n(Stuck still? ./course hint {nn} {args[1]} once more shows hint {n + 1} of {len(tiers)}.)")
            elif n == len(tiers):
                print("\n(That was the last hint. The lesson text and the contract header say the rest.)")
            seen[title] = n
    os.makedirs(os.path.dirname(state_path), exist_ok=True)
    with open(state_path, "w") as f:
        json.dump(seen, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
