"""Resident memory over many consecutive text generations: RSS after 200 must stay within 2% of after 20.

    python benchmarks/memory_text.py [--model M] [--draft D] [--method draft] [--runs 200] [--max-new-tokens 32]

Writes benchmarks/memory-text.json and prints one line per checkpoint.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time


def rss_mb() -> float:
    from specgen.modalities.memory import resident_mb

    try:
        return resident_mb()
    except OSError:  # no /proc: the peak instead
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--draft")
    parser.add_argument("--method", default="draft")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", default="benchmarks/memory-text.json")
    args = parser.parse_args()
    from specgen.modalities.text.generator import TextGenerator

    generator = TextGenerator(args.model, args.draft, threads=1)
    prompts = ["def main(", "import os\n\n", "class Parser:\n    def __init__(self", "for i in range("]
    marks, started = {}, time.perf_counter()
    for run in range(1, args.runs + 1):
        generator.generate(prompts[run % len(prompts)], method=args.method, max_new_tokens=args.max_new_tokens,
                           temperature=1.0, seed=run)
        if run in (20, 50, 100, 150, 200) or run == args.runs:
            gc.collect()
            marks[run] = rss_mb()
            print(f"after {run:4d} generations: RSS {marks[run]:.1f} MB ({time.perf_counter() - started:.0f} s)")
    growth = marks[args.runs] / marks[20] - 1 if 20 in marks else None
    result = {"command": "python benchmarks/memory_text.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "out"),
        "rss_mb": marks, "growth_after_20": growth, "within_2_percent": growth is not None and growth <= 0.02}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
