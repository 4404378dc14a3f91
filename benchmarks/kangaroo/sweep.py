"""Kangaroo's settings on a target: exit layer x confidence threshold x most drafted tokens, against plain decoding.

    python benchmarks/kangaroo/sweep.py [--model assets/code/target] [--exit-layers 1,2] [--confidences 0.4,0.6,0.8]
        [--max-draft 4,6,8] [--max-new-tokens 128] [--threads 1] [--out benchmarks/kangaroo/sweep-latest]

Greedy decoding of the bench prompts with `ar` and with `kangaroo` at every setting, interleaved per prompt (one
process, one loaded target). Speedup: the median over prompts of the tokens/s ratio to `ar` on the same prompt in
the same round; τ, acceptance and the draft's seconds per drafted token pooled over prompts. Every output is checked
against `ar`'s. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def timed(generator, prompt: str, method: str, max_new_tokens: int, **knobs):
    """(tokens, seconds, stats summary) of one greedy request through the public stream."""
    from specgen.samplers.stats import SpecStats

    stats = SpecStats()
    began = time.perf_counter()
    tokens = [t for event in generator.stream(prompt, method=method, max_new_tokens=max_new_tokens, stats=stats,
                                              **knobs) for t in event.tokens]
    wall = time.perf_counter() - began
    return tokens, wall, stats.summary(method=method, lossless=True, wall_s=wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "assets" / "code" / "target"))
    parser.add_argument("--exit-layers", type=_ints, default=[1, 2])
    parser.add_argument("--confidences", type=_floats, default=[0.4, 0.6, 0.8])
    parser.add_argument("--max-draft", type=_ints, default=[6])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "text.jsonl")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "kangaroo" / "sweep-latest")
    args = parser.parse_args()

    from specgen.modalities.text.generator import TextGenerator

    generator = TextGenerator(args.model, threads=args.threads)
    prompts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines() if line.strip()]
    settings = [{"exit_layer": e, "confidence": c, "num_draft_tokens": k}
                for e, c, k in itertools.product(args.exit_layers, args.confidences, args.max_draft)]
    timed(generator, prompts[0], "ar", 16)  # warm-up: the compiled step, the adapters
    for knobs in settings:
        timed(generator, prompts[0], "kangaroo", 16, **knobs)
    ratios = {i: [] for i in range(len(settings))}
    pooled = {i: {"committed": 0, "steps": 0, "drafted": 0, "accepted": 0, "draft_s": 0.0, "identical": 0}
              for i in range(len(settings))}
    for p, prompt in enumerate(prompts):
        plain, plain_s, _ = timed(generator, prompt, "ar", args.max_new_tokens)
        order = list(range(len(settings)))
        order = order[p % len(order):] + order[:p % len(order)]  # rotated: no setting always runs first
        for i in order:
            tokens, wall, summary = timed(generator, prompt, "kangaroo", args.max_new_tokens, **settings[i])
            ratios[i].append((len(tokens) / wall) / (len(plain) / plain_s))
            pool = pooled[i]
            for key in ("committed", "steps", "drafted", "accepted"):
                pool[key] += summary[key]
            pool["draft_s"] += summary.get("draft_s", 0.0) or 0.0
            pool["identical"] += tokens == plain
    rows = []
    for i, knobs in enumerate(settings):
        pool = pooled[i]
        rows.append({**knobs, "speedup_median": round(statistics.median(ratios[i]), 3),
                     "tau": round(pool["committed"] / pool["steps"], 3),
                     "acceptance": round(pool["accepted"] / max(1, pool["drafted"]), 3),
                     "drafted_per_step": round(pool["drafted"] / pool["steps"], 2),
                     "identical_to_ar": f"{pool['identical']}/{len(prompts)}"})
    record = {"command": "python benchmarks/kangaroo/sweep.py " + " ".join(
                  f"--{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, list) else v}"
                  for k, v in vars(args).items() if k not in ("prompts", "out", "model")),
              "model": args.model, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "threads": args.threads, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    lines = ["# Kangaroo settings sweep", "", f"`{record['command']}` on `{args.model}`: greedy, "
             f"{args.max_new_tokens} new tokens, {len(prompts)} prompts, {args.threads} thread(s); speedup = median "
             "over prompts of tokens/s over `ar` on the same prompt.", "",
             "| exit layer | confidence | most drafted | speedup vs ar | τ | acceptance | drafted / step | identical |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['exit_layer']} | {r['confidence']} | {r['num_draft_tokens']} | {r['speedup_median']:.2f}× | "
              f"{r['tau']:.2f} | {r['acceptance']:.2f} | {r['drafted_per_step']:.2f} | {r['identical_to_ar']} |"
              for r in rows]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
