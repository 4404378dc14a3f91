"""Methods at chosen knobs, side by side with plain decoding: for comparisons `bench text` does not make (one method
at several settings, e.g. FastMTP's draft vocabularies or EAGLE-2's tree over a head).

    python benchmarks/variants.py --model gemma --variants 'mtp' 'mtp:vocabulary=full' 'eagle2:head=mtp,tree_budget=4'
        [--prompts benchmarks/prompts/text.jsonl,...] [--max-new-tokens 96] [--threads 1] [--out OUT]

A variant is `method` or `method:knob=value,knob=value` (the model's defaults for the rest). Greedy decoding of every
prompt with plain decoding and each variant, interleaved per prompt in rotated order (one process, the same loaded
models; one warm-up run per variant first). Per variant: accepted / drafted, milliseconds of drafting per
drafted token, τ, steps, and the speedup over plain decoding (median over prompts of the tokens/s ratio in the same
round) with the worst prompt; every output is checked equal to plain decoding's. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_variant(text: str) -> tuple[str, dict]:
    """'method:knob=value,...' -> (method, {knob: value as int, float or text})."""
    method, _, settings = text.partition(":")
    knobs = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        for kind in (int, float, str):
            try:
                knobs[key.strip()] = kind(value)
                break
            except ValueError:
                continue
    return method.strip(), knobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma")
    parser.add_argument("--draft")
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--prompts", default="benchmarks/prompts/text.jsonl")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from tqdm import tqdm

    from specgen.app.bench.prompts import load_prompts
    from specgen.app.bench.runner import rotated
    from specgen.modalities.text.generator import TextGenerator

    generator = TextGenerator(args.model, args.draft, threads=args.threads)
    variants = {"ar": ("ar", {}), **{text: parse_variant(text) for text in args.variants}}
    prompts = [p for path in args.prompts.split(",") for p in load_prompts(ROOT / path)]

    def run(name: str, prompt: str) -> tuple[list[int], float, dict]:
        method, knobs = variants[name]
        began = time.perf_counter()
        result = generator.generate(prompt, method=method, max_new_tokens=args.max_new_tokens, **knobs)
        return result.tokens, time.perf_counter() - began, result.stats

    for name in variants:  # warm-up: compiled steps, output layers' rows, heads
        run(name, prompts[0].prompt)
    rows = []
    for index, prompt in enumerate(tqdm(prompts, desc="prompts")):
        measured = {name: run(name, prompt.prompt) for _, name in rotated(list(variants), index)}
        plain_tokens, plain_wall, _ = measured["ar"]
        for name in args.variants:
            tokens, wall, stats = measured[name]
            if tokens != plain_tokens:
                sys.exit(f"{name} differs from plain decoding on {prompt.id}")
            rows.append({"prompt": prompt.id, "category": prompt.category, "variant": name,
                         "speedup": plain_wall / wall, "drafted": stats["drafted"], "accepted": stats["accepted"],
                         "steps": stats["steps"], "draft_s": stats["draft_s"], "tokens": len(tokens),
                         "output_rows": stats.get("output_rows"), "vocabulary": stats.get("vocabulary")})
    summary = {}
    for name in args.variants:
        mine = [r for r in rows if r["variant"] == name]
        drafted, accepted = sum(r["drafted"] for r in mine), sum(r["accepted"] for r in mine)
        summary[name] = {"acceptance": accepted / max(drafted, 1),
                         "draft_ms_per_token": 1000 * sum(r["draft_s"] for r in mine) / max(drafted, 1),
                         "tau": sum(r["tokens"] for r in mine) / sum(r["steps"] for r in mine),
                         "steps": sum(r["steps"] for r in mine),
                         "speedup_median": statistics.median(r["speedup"] for r in mine),
                         "speedup_worst": min(r["speedup"] for r in mine)}
    record = {"command": "python benchmarks/variants.py " + " ".join(f"'{a}'" if " " in a or ":" in a else a
                                                                    for a in sys.argv[1:]),
              "model": str(generator.model_path), "prompts": len(prompts), "summary": summary, "rows": rows,
              "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    lines = [f"# Variants on {args.model}", "", f"`{record['command']}`", "",
             f"{record['when']} UTC; {len(prompts)} prompts, greedy, {args.max_new_tokens} new tokens, {args.threads} "
             "thread; every output equal to plain decoding's.", "",
             "| variant | speedup (median) | worst | τ | steps | accepted / drafted | drafting ms per drafted token |",
             "|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| `{name}` | {s['speedup_median']:.2f}× | {s['speedup_worst']:.2f}× | {s['tau']:.2f} | "
                     f"{s['steps']} | {s['acceptance']:.3f} | {s['draft_ms_per_token']:.2f} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
