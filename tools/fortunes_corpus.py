"""The fortunes corpus the bundled models were trained on, and its held-out split (no torch here).

    python3 tools/fortunes_corpus.py --write-heldout models/heldout-fortunes.txt

tools/train_models.py trains on every quote but the held-out ones and measures bits per byte on
the first 300 of those; the same 300, written once to models/heldout-fortunes.txt (quotes
separated by lines holding a single %, the fortune format), are what lesson 11 measures its
quantized models on, with no Debian fortunes package needed.
"""
import argparse
import glob
import os
import random

HELDOUT_EVAL = 300


def load_fortunes(directory="/usr/share/games/fortunes"):
    """Every quote of the fortunes database, one string each (Debian package fortunes)."""
    quotes = []
    for path in sorted(glob.glob(os.path.join(directory, "*"))):
        if path.endswith((".dat", ".u8", "ascii-art")) or os.path.isdir(path):
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        for chunk in text.split("\n%\n"):
            chunk = chunk.strip("%\n ")
            if 8 <= len(chunk) <= 2000:
                quotes.append(chunk)
    return quotes


def split(quotes, seed):
    """(held-out, training) quotes: shuffled with `seed`, the first 1/40 (at least 200) held out."""
    quotes = list(quotes)
    random.Random(seed).shuffle(quotes)
    n_val = max(200, len(quotes) // 40)
    return quotes[:n_val], quotes[n_val:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-heldout", required=True, metavar="FILE")
    ap.add_argument("--seed", type=int, default=1234, help="the trainer's seed (tools/train_models.py)")
    args = ap.parse_args()
    quotes = load_fortunes()
    if not quotes:
        raise SystemExit("no quotes found: install Debian's fortunes package")
    held, _ = split(quotes, args.seed)
    with open(args.write_heldout, "w", encoding="utf-8") as f:
        f.write("\n%\n".join(held[:HELDOUT_EVAL]) + "\n")
    print(f"{args.write_heldout}: {HELDOUT_EVAL} held-out quotes of {len(quotes)}")


if __name__ == "__main__":
    main()
