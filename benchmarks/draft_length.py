"""The draft length for a target/draft pair: the cost model's choice, checked against a sweep of fixed lengths.

    python benchmarks/draft_length.py [--model gemma] [--draft D] [--methods draft,draft-lookup]
        [--lengths 2,3,4,6,8] [--max-new-tokens 128] [--prompts benchmarks/prompts/text.jsonl] [--threads 1]
        [--out benchmarks/draft-length-gemma-latest]

Greedy decoding of the bench prompts with `ar` and with each method at every length, interleaved per prompt in
rotated order (one process, the same loaded models). From the pooled measurements of the sweep itself, the cost
model (core.md section 6) predicts each length's speedup, E(α, γ) · T_ar / (γ · T_draft + T_verify(γ + 1)),
with α the method's pooled acceptance, T_draft its seconds per drafted token, T_verify(n) the mean verification
time of a window of n and T_ar plain decoding's step time; its choice is the argmax. The sweep's measured
speedup (median over prompts of the tokens/s ratio to `ar` in the same round) says whether that choice is right.
Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """The sweep, start to end (a script's main, read top to bottom: options, runs, record)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--draft")
    parser.add_argument("--methods", default="draft")
    parser.add_argument("--lengths", default="2,3,4,5,6,8")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "text.jsonl")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="default: benchmarks/draft-length-{gemma,code}-latest, by target")
    args = parser.parse_args()

    from tqdm import tqdm

    from specgen.app.bench.prompts import load_prompts
    from specgen.app.bench.runner import rotated
    from specgen.app.bench.text import pool_stats as _pool
    from specgen.modalities.text.generator import TextGenerator
    from specgen.samplers.stats import SpecStats, expected_tokens_per_step

    lengths, methods = [int(x) for x in args.lengths.split(",")], args.methods.split(",")
    generator = TextGenerator(args.model, args.draft, threads=args.threads)
    if args.out is None:  # one latest record per target
        kind = "gemma" if "gemma" in str(generator.model_path).lower() else "code"
        args.out = ROOT / "benchmarks" / f"draft-length-{kind}-latest"
    prompts = load_prompts(args.prompts)
    variants = ["ar", *(f"{m}[{g}]" for m in methods for g in lengths)]

    def run(name: str, prompt: str) -> tuple[list[int], float, SpecStats]:
        stats, tokens = SpecStats(), []
        method, _, length = name.partition("[")
        knobs = {"num_draft_tokens": int(length[:-1])} if length else {}
        started = time.perf_counter()
        for event in generator.stream(prompt, method=method, max_new_tokens=args.max_new_tokens, stats=stats,
                                      **knobs):
            tokens.extend(event.tokens)
        return tokens, time.perf_counter() - started, stats

    run(variants[-1], prompts[0].prompt)  # warm-up: loads the draft, builds the kernels
    pooled = {name: SpecStats() for name in variants}
    rows, identical = {name: [] for name in variants}, {name: 0 for name in variants}
    walls = {name: 0.0 for name in variants}
    bar = tqdm(total=len(prompts) * len(variants), desc="draft lengths", file=sys.stderr, dynamic_ncols=True)
    for round_index, prompt in enumerate(prompts):
        outcomes = {}
        for _, name in rotated(variants, round_index):
            outcomes[name] = run(name, prompt.prompt)
            bar.update(1)
        ar_tokens, ar_wall, _ = outcomes["ar"]
        for name, (tokens, wall, stats) in outcomes.items():
            _pool(pooled[name], stats)
            rows[name].append((len(tokens) / wall) / (len(ar_tokens) / ar_wall))  # tokens/s ratio in this round
            identical[name] += tokens == ar_tokens
            walls[name] += wall
    bar.close()

    ar_step_s = pooled["ar"].verify_s / pooled["ar"].steps
    # T_verify(n) pooled over every method that verified windows of n
    windows = {}
    for name in variants[1:]:
        n = int(name.partition("[")[2][:-1]) + 1
        seconds, steps = windows.get(n, (0.0, 0))
        windows[n] = (seconds + pooled[name].verify_s, steps + pooled[name].steps)
    verify_s = {n: seconds / steps for n, (seconds, steps) in windows.items()}
    per_method = {}
    for method in methods:
        drafted = [pooled[f"{method}[{g}]"] for g in lengths]
        accepted = sum(s.accepted for s in drafted)
        alpha = accepted / max(accepted + sum(s.rejections for s in drafted), 1)
        draft_token_s = sum(s.draft_s for s in drafted) / max(sum(s.drafted for s in drafted), 1)
        predicted = {g: expected_tokens_per_step(alpha, g) * ar_step_s / (g * draft_token_s + verify_s[g + 1])
                     for g in lengths}
        table = {}
        for g in lengths:
            stats = pooled[f"{method}[{g}]"]
            table[g] = {"tau": stats.committed / stats.row_steps, "steps": stats.steps,
                        "alpha_hat": stats.accepted / max(stats.accepted + stats.rejections, 1),
                        "per_position": [a / t if t else None for a, t in zip(stats.accepted_at, stats.tested_at)],
                        "verify_s": verify_s[g + 1], "predicted_speedup": predicted[g],
                        "measured_speedup": statistics.median(rows[f"{method}[{g}]"]),
                        "identical_to_ar": f"{identical[f'{method}[{g}]']}/{len(prompts)}"}
        chosen = max(predicted, key=lambda g: (predicted[g], -g))
        best = max(table, key=lambda g: table[g]["measured_speedup"])
        within = table[chosen]["measured_speedup"] / table[best]["measured_speedup"]
        per_method[method] = {"alpha": alpha, "draft_token_s": draft_token_s, "lengths": table,
                              "cost_model_choice": chosen, "sweep_best": best, "choice_within_of_best": within}
    result = {"command": "python benchmarks/draft_length.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "out"),
              "model": generator.model_path, "draft": generator.draft_path, "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "threads": args.threads, "ar_step_s": ar_step_s,
              "verify_s": verify_s, "tokens_per_s": {name: pooled[name].committed / walls[name] for name in variants},
              "methods": per_method}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(render(result) + "\n")
    print(render(result))


def render(result: dict) -> str:
    lines = [f"# Draft length: `{Path(result['model']).name}` with `{result['draft']}`", "",
             f"`{result['command']}`", "",
             f"{result['prompts']} prompts, greedy, {result['max_new_tokens']} new tokens, {result['threads']} "
             f"thread(s); T_ar = {result['ar_step_s'] * 1e3:.1f} ms per plain step."]
    for method, m in result["methods"].items():
        lines += ["", f"## `{method}`", "",
                  f"Pooled α = {m['alpha']:.3f}; T_draft = {m['draft_token_s'] * 1e3:.2f} ms per drafted token.", "",
                  "| γ | τ | α̂ | acceptance by drafted position | T_verify(γ+1) ms | predicted speedup | "
                  "measured speedup (median) | identical to ar |", "|---|---|---|---|---|---|---|---|"]
        for g, row in m["lengths"].items():
            positions = " / ".join("–" if a is None else f"{a:.2f}" for a in row.get("per_position", []))
            lines.append(f"| {g} | {row['tau']:.2f} | {row['alpha_hat']:.3f} | {positions} | "
                         f"{row['verify_s'] * 1e3:.1f} | {row['predicted_speedup']:.2f}× | "
                         f"{row['measured_speedup']:.2f}× | {row['identical_to_ar']} |")
        lines += ["", f"The cost model picks γ = {m['cost_model_choice']}; the sweep's fastest is γ = "
                  f"{m['sweep_best']} (the choice reaches {m['choice_within_of_best']:.2f} of it)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
