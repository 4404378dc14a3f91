"""Sweep `parallel`'s window length, branch count and prompt lookup against `draft` and `draft-lookup`, side by
side in one process (greedy, 1 thread, each setting run twice over the prompts, the faster round kept).

    python benchmarks/parallel_sweep.py --model code --prompts 6 --out benchmarks/parallel/sweep-code-latest
    python benchmarks/parallel_sweep.py --model gemma --prompts 4 --max-new-tokens 64 \
        --lengths 2,3 --branches 3,6 --out benchmarks/parallel/sweep-gemma-latest

Per setting: speedup over `ar` (summed wall time), τ, draft and verify milliseconds per step (the loop's own
timers: a draft process that slows the target's verify shows there), and the share of windows served from a
branch. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def settings(lengths: list[int], branches: list[int]) -> list[tuple[str, dict]]:
    out = [("ar", {})] + [(method, {"num_draft_tokens": k}) for method in ("draft", "draft-lookup") for k in lengths]
    for ngram in (0, 5):
        out += [("parallel", {"num_draft_tokens": k, "branches": b, "max_matching_ngram_size": ngram})
                for k in lengths for b in branches]
    return out


def run(generator, prompts, method: str, params: dict, max_new_tokens: int) -> dict:
    wall = draft = verify = steps = tokens = 0.0
    hits = answered = 0
    for prompt in prompts:
        ids = generator.encode(prompt)
        pipeline = generator.pipeline(method, [ids], max_new_tokens=max_new_tokens, params=params)
        started = time.perf_counter()
        result = pipeline.generate([ids])
        wall += time.perf_counter() - started
        stats = result.stats
        draft, verify, steps, tokens = draft + stats["draft_s"], verify + stats["verify_s"], steps + stats["steps"], \
            tokens + stats["committed"]
        hits += stats.get("ahead_hits") or 0
        answered += (stats.get("ahead_hits") or 0) + (stats.get("ahead_misses") or 0)
    return {"wall_s": wall, "tau": tokens / steps, "draft_ms_per_step": 1000 * draft / steps,
            "verify_ms_per_step": 1000 * verify / steps, "hit_rate": hits / answered if answered else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="code", help="'code' (the shipped pair) or 'gemma'")
    parser.add_argument("--prompts", type=int, default=6, help="the first N bench prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lengths", default="6,8")
    parser.add_argument("--branches", default="2,3,4,6")
    parser.add_argument("--out", required=True, help="path without suffix")
    args = parser.parse_args()

    from specgen.modalities.text import gemma
    from specgen.modalities.text.generator import TextGenerator, shipped_code_pair

    target, draft = shipped_code_pair() if args.model == "code" else ("gemma", gemma.shipped_draft())
    generator = TextGenerator(target, str(draft), threads=1)
    rows = [json.loads(line) for line in (ROOT / "benchmarks/prompts/text.jsonl").read_text().splitlines()]
    prompts = [row["prompt"] for row in rows[:args.prompts]]
    grid = settings([int(x) for x in args.lengths.split(",")], [int(x) for x in args.branches.split(",")])
    results: dict[str, dict] = {}
    for _ in range(2):
        for method, params in grid:
            key = method + (" " + json.dumps(params) if params else "")
            measured = run(generator, prompts, method, params, args.max_new_tokens)
            if key not in results or measured["wall_s"] < results[key]["wall_s"]:
                results[key] = {"method": method, "params": params, **measured}
    base = results["ar"]["wall_s"]
    for entry in results.values():
        entry["speedup_vs_ar"] = base / entry["wall_s"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"model": args.model, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
              "command": "python benchmarks/parallel_sweep.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": list(results.values())}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    lines = [f"# `parallel` sweep — {args.model}", "", f"```\n{record['command']}\n```", "",
             f"Greedy, {args.max_new_tokens} new tokens, the first {args.prompts} bench prompts, 1 thread, best of "
             "two rounds; draft and verify are the loop's per-step timers.", "",
             "| method | γ | branches | lookup | speedup vs ar | τ | draft ms/step | verify ms/step | hit rate |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in results.values():
        p = e["params"]
        hit = "–" if e["hit_rate"] is None else f"{e['hit_rate']:.2f}"
        lookup = "yes" if e["method"] == "draft-lookup" or p.get("max_matching_ngram_size") else "–"
        lines.append(f"| `{e['method']}` | {p.get('num_draft_tokens', '–')} | {p.get('branches', '–')} | {lookup} | "
                     f"{e['speedup_vs_ar']:.2f}× | {e['tau']:.2f} | {e['draft_ms_per_step']:.2f} | "
                     f"{e['verify_ms_per_step']:.2f} | {hit} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
