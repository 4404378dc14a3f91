"""Throughput of `specgen batch` against a plain loop calling `TextGenerator.generate` on the same items.

    python benchmarks/batch_text.py [--model M] [--draft D] [--method M] [--copies 3] [--max-new-tokens 64]
                                    [--repeats 3] [--rows N]

Items: benchmarks/prompts/text.jsonl, each prompt `--copies` times (distinct ids and seeds). One model is loaded
once and shared; both sides run in one process, alternating which goes first, so the ratio compares the runner's
own overhead (validation, JSON lines, flush + fsync per line, progress) with the bare calls. With `--rows N`
the runner serving N items at a time (continuous batching, `specgen batch --rows N`) is compared with the
runner one by one instead (the "loop" side), on the same greedy items. Prints a Markdown table; the results are
recorded in benchmarks/batch-text.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from types import SimpleNamespace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--draft")
    parser.add_argument("--method", help="default: the served model's default text method")
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=0, help="compare the runner at --rows N with it one by one")
    args = parser.parse_args()

    import torch

    from specgen.app.batch import run_batch
    from specgen.modalities.text.generator import TextGenerator

    generator = TextGenerator(args.model, args.draft, threads=args.threads)
    args.method = args.method or generator.default_method
    prompts = [json.loads(line) for line in (ROOT / "benchmarks/prompts/text.jsonl").read_text().splitlines()
               if line.strip()]
    items = [{"id": f"{p['id']}-{c}", "modality": "text", "prompt": p["prompt"], "method": args.method,
              "seed": c, "params": {"max_new_tokens": args.max_new_tokens}}
             for c in range(args.copies) for p in prompts]

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        source.write_text("".join(json.dumps(item) + "\n" for item in items))

        def run_runner(rep, order, rows=args.rows or 1):
            out = Path(tmp) / f"out-{rep}-{order}-{rows}.jsonl"
            run_batch(source, out, generator=generator, progress=False, rows=rows)
            by_id = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
            return [by_id[item["id"]] for item in items]

        def run_loop():
            if args.rows:  # the runner one by one
                return [SimpleNamespace(tokens=r["result"]["tokens"], stats=r["stats"])
                        for r in run_runner(rep, "one", 1)]
            return [generator.generate(item["prompt"], method=item["method"], seed=item["seed"], **item["params"])
                    for item in items]

        rep = -1
        run_loop()  # warm-up
        batch_s, loop_s, same = [], [], True
        for rep in range(args.repeats):
            for side in (("batch", "loop") if rep % 2 == 0 else ("loop", "batch")):
                started = time.perf_counter()
                if side == "batch":
                    records = run_runner(rep, side)
                    batch_s.append(time.perf_counter() - started)
                else:
                    results = run_loop()
                    loop_s.append(time.perf_counter() - started)
            same &= [r["result"]["tokens"] for r in records] == [r.tokens for r in results]
    tokens = sum(len(r.tokens) for r in results)
    ratios = [b / lp for b, lp in zip(batch_s, loop_s)]
    other = "one by one" if args.rows else "loop"
    runner = f"runner --rows {args.rows}" if args.rows else "runner"
    # per item: its own steps (target passes it took part in) and tau, from the last repeat's records
    steps = (sum(r["stats"]["steps"] for r in records), sum(r.stats["steps"] for r in results))
    tau = (statistics.mean(r["stats"]["tau"] for r in records), statistics.mean(r.stats["tau"] for r in results))
    print(f"| items | tokens | method | {runner} s (median) | {other} s (median) | {runner} / {other} | "
          "item steps (runner / other) | mean τ (runner / other) | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {len(items)} | {tokens} | {args.method} | {statistics.median(batch_s):.2f} | "
          f"{statistics.median(loop_s):.2f} | {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}) | {steps[0]} / {steps[1]} | {tau[0]:.2f} / {tau[1]:.2f} | "
          f"{'yes' if same else 'NO'} |")
    print(f"\nmodel {generator.model_path}, draft {generator.draft_path}, torch {torch.__version__}, "
          f"threads {args.threads}, {platform.processor() or platform.machine()}, "
          f"load average {' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}")


if __name__ == "__main__":
    main()
