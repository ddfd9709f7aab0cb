#!/usr/bin/env python3
"""Makes a roster of 20 students to try `./course grade --roster` on (the instructors' page).

    tools/make_roster.py ROSTER

8 finish with the reference solution (repo01 as a git repository with exercises/ inside), 3 are
the untouched starters, and 9 are broken the ways the grader refuses: a lesson that does not
compile (nocompile03, nocompile05), exit(0) inside a lesson's function (exit02, exit04), a
function that never returns (hang00, hang06), a lesson that tries to append to the course's own
tests when its program starts (writes01, writes05), and a file that includes itself twice per
level, a compile that never ends (forever10). ROSTER must not exist, or be a roster this script
made (it is replaced then): a class's real folder is never emptied.
"""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANG = "  for (volatile int spin = 1; spin;) {\n  }\n"
EXIT = "  std::exit(0);\n"


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    roster = os.path.abspath(sys.argv[1])
    mark = os.path.join(roster, ".made-by-make_roster")
    if os.path.exists(roster) and os.listdir(roster) and not os.path.exists(mark):
        sys.exit(f"make_roster.py: {roster} exists and is not a roster this script made: it replaces the folder it "
                 "is given, so give it a new one (a class's folder is never emptied)")
    shutil.rmtree(roster, ignore_errors=True)
    os.makedirs(roster)
    open(mark, "w").close()

    def finished(name):
        d = os.path.join(roster, name)
        shutil.copytree(os.path.join(ROOT, "solutions"), d)
        return d

    def edit(d, rel, after, insert, header=None):
        p = os.path.join(d, rel)
        with open(p) as f:
            s = f.read()
        if after not in s:
            sys.exit(f"make_roster: {rel} no longer has {after!r}: update this script")
        s = s.replace(after, after + insert, 1)
        if header:
            s = header + s
        with open(p, "w") as f:
            f.write(s)

    for i in range(1, 8):
        finished(f"ref{i:02d}")
    repo = os.path.join(roster, "repo01")
    shutil.copytree(os.path.join(ROOT, "solutions"), os.path.join(repo, "exercises"))
    git = ["git", "-C", repo, "-c", "user.name=student", "-c", "user.email=student@example.org"]
    for argv in (git[:3] + ["init", "-q"], git + ["add", "-A"], git + ["commit", "-qm", "lessons done"]):
        subprocess.run(argv, check=True)
    for i in range(1, 4):
        shutil.copytree(os.path.join(ROOT, "exercises"), os.path.join(roster, f"start{i:02d}"))

    edit(finished("nocompile03"), "03_batching/batching.cpp", "\nnamespace infer {\n", "int broken = ;\n")
    edit(finished("nocompile05"), "05_prefix_caching/prefix_cache.cpp", "\nnamespace infer {\n", "int broken = ;\n")
    edit(finished("exit02"), "02_kv_cache/kv_cache.cpp",
         "void KVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {\n", EXIT, "#include <cstdlib>\n")
    edit(finished("exit04"), "04_paged_attention/paged_attention.cpp", "int BlockAllocator::allocate() {\n", EXIT,
         "#include <cstdlib>\n")
    edit(finished("hang00"), "00_naive_decoder/naive_decoder.cpp", "int argmax(const Vector& logits) {\n", HANG)
    edit(finished("hang06"), "06_speculative_decoding/speculative.cpp",
         "Verdict verify_greedy(ConstMatrixRef target_logits, std::span<const int> proposal) {\n", HANG)
    target = os.path.join(ROOT, "tests", "00_naive_decoder", "1_ops_test.cpp")
    for name, rel in (("writes01", "01_roofline/roofline.cpp"), ("writes05", "05_prefix_caching/prefix_cache.cpp")):
        d = finished(name)
        with open(os.path.join(d, rel), "a") as f:
            f.write(f'''
#include <cstdio>
namespace {{
// Tries to change the course's own tests, once, when the program starts.
const bool planted = [] {{
  if (std::FILE* f = std::fopen("{target}", "a")) {{
    std::fputs("// changed\\n", f);
    std::fclose(f);
  }}
  return true;
}}();
}}  // namespace
''')
    with open(os.path.join(finished("forever10"), "10_serving", "forever.cpp"), "w") as f:
        f.write("// Includes itself twice per level, 40 levels: 2^40 inclusions.\n"
                "#if __INCLUDE_LEVEL__ < 40\n#include __FILE__\n#include __FILE__\n#endif\n")
    print(f"{roster}: {len(os.listdir(roster))} students")


if __name__ == "__main__":
    main()
