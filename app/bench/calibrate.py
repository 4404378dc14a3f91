"""Measure Sequoia's acceptance-by-rank vector for a target/draft pair (the `accept_probs` knob of `sequoia`),
or sweep the tree methods over node budgets.

    specgen bench calibrate [--model M] [--draft D] [--width 8] [--temperature 0] [--prompts 8]
        [--max-new-tokens 64] [--threads 1] [--json]        (default pair: the shipped code pair)
    specgen bench calibrate --sweep [--budgets 4,8,16,32] [--methods sequoia,dyspec,eagle2]
        [--max-new-tokens 128] [--threads 1] [--out-dir DIR]

(`python -m specgen.app.bench.calibrate ARGS` is the same command.) Calibration prompts are the openings (first
400 characters) of held-out corpus files (the code model's validation split), so the benchmark prompts stay
unseen. It prints the vector as the knob value and the Sequoia trees it implies. The sweep runs greedy decoding
of the benchmark prompts (benchmarks/prompts/text.jsonl) with `ar`, `draft` and every tree method at every
budget, interleaved per prompt in rotated order, and writes trees-sweep-<time>.{json,md,png}: τ, steps and the
median per-prompt speedup over `ar` (tokens/s ratio within a round, bootstrap 95 % CI) per budget, and whether
every output equals `ar`'s.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from specgen.app.bench.prompts import load_prompts
from specgen.app.bench.records import benchmarks_dir, record_dirs, run_env, start_run
from specgen.app.bench.report import command_line, font, write_record
from specgen.app.bench.runner import rounds
from specgen.app.bench.stats import median_ci

DEFAULT_BUDGETS = (4, 8, 16, 32)
DEFAULT_METHODS = ("sequoia", "dyspec", "eagle2")


def main(argv: list[str] | None = None) -> int:
    """`python -m specgen.app.bench.calibrate ARGS` is `specgen bench calibrate ARGS`."""
    from specgen.app.cli import main as specgen

    return specgen(["bench", "calibrate", *(sys.argv[1:] if argv is None else argv)])


def bench_calibrate(args) -> int:
    """`specgen bench calibrate`: the acceptance-by-rank vector, or with --sweep the budget sweep."""
    if args.sweep:
        return sweep(args)
    from specgen.modalities.text.training.stdlib_corpus import load_corpus
    from specgen.modalities.text.generator import TextGenerator
    from specgen.modalities.drafters.tree import acceptance_by_rank
    from specgen.samplers import trees

    generator = TextGenerator(*_pair(args), threads=args.threads)
    texts = load_corpus().texts("val")[:args.prompts]
    prompts = [generator.encode(text[:400]) for text in texts]
    result = acceptance_by_rank(generator.model, generator.draft_model, prompts, width=args.width,
                                temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    probs = result["accept_probs"]
    result["knob"] = ",".join(f"{p:.4f}" for p in probs)
    result["trees"] = {str(n): {"parents": trees.sequoia_tree(probs, n, 6),
                                "expected_tau": trees.expected_accepted(trees.sequoia_tree(probs, n, 6), probs)}
                       for n in (4, 8, 16, 32)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"accept_probs={result['knob']}  ({result['steps']} steps)")
        for n, tree in result["trees"].items():
            print(f"budget {n:>2}: expected tau {tree['expected_tau']:.3f}  parents {tree['parents']}")
    return 0


def _pair(args) -> tuple[str | None, str | None]:
    """The target and draft to measure: as given, else the shipped code pair (not the default text model: tree
    drafts need a draft over the target's full vocabulary, which the Gemma draft is not)."""
    from specgen.modalities.text.generator import shipped_code_pair

    return (args.model, args.draft) if args.model or args.draft else shipped_code_pair()


def sweep(args) -> int:
    """`ar`, `draft` and every tree method at every budget on the benchmark prompts, rotated per prompt."""
    from specgen.modalities.text.generator import TextGenerator

    runs_dir, latest_dir = record_dirs(args.out_dir)  # checked before any work
    start = start_run()
    generator = TextGenerator(*_pair(args), threads=args.threads)
    prompts = load_prompts(benchmarks_dir() / "prompts" / "text.jsonl")
    budgets = list(args.budgets or DEFAULT_BUDGETS)
    variants = [("ar", "ar", {}), ("draft", "draft", {})]
    variants += [(f"{m}[{b}]", m, {"tree_budget": b}) for m in args.methods or DEFAULT_METHODS for b in budgets]
    for _, method, params in variants:  # warm-up
        for _ in generator.stream(prompts[0].prompt, method=method, max_new_tokens=16, **params):
            pass
    rows = []
    for round_ in rounds(prompts, variants, 1):
        rows += _sweep_round(generator, round_, variants, args.max_new_tokens)
    summary = {name: _sweep_summary(method, params, [r for r in rows if r["name"] == name])
               for name, method, params in variants}
    result = {"summary": summary, "items": rows,
              "env": run_env(start, command=command_line(args), max_new_tokens=args.max_new_tokens, greedy=True,
                             prompts=len(prompts), model=generator.model_path, draft=generator.draft_path)}
    written = write_record(result, runs_dir, f"trees-sweep-{start.timestamp}",
                           lambda names: sweep_markdown(result, names["png"]),
                           {"png": lambda path: sweep_png(path, summary, budgets)}, "trees-sweep-latest", latest_dir)
    print(json.dumps({"files": [str(written.latest[k]) for k in ("json", "md", "png")], "summary": summary}))
    return 0


def _sweep_round(generator, round_, variants, max_new_tokens: int) -> list[dict]:
    """One prompt: every variant once in the round's order; rows carry the speedup over `ar` in this round."""
    from specgen.samplers.stats import SpecStats

    outcome = {}
    for name, method, params in round_.order:
        stats, tokens = SpecStats(), []
        started = time.perf_counter()
        for event in generator.stream(round_.prompt.prompt, method=method, max_new_tokens=max_new_tokens,
                                      stats=stats, **params):
            tokens.extend(event.tokens)
        outcome[name] = (tokens, time.perf_counter() - started, stats)
        print(f"{round_.prompt.id} {name}", file=sys.stderr, flush=True)
    ar_tokens, ar_s, _ = outcome["ar"]
    rows = []
    for name, method, params in variants:
        tokens, wall_s, stats = outcome[name]
        rows.append({"prompt_id": round_.prompt.id, "name": name, "method": method, **params,
                     "new_tokens": len(tokens), "steps": stats.steps, "tau": stats.committed / max(stats.steps, 1),
                     "drafted_per_step": stats.drafted / max(stats.row_steps, 1), "wall_s": wall_s,
                     "draft_s": stats.draft_s, "verify_s": stats.verify_s,
                     "speedup_vs_ar": (len(tokens) / wall_s) / (len(ar_tokens) / ar_s),
                     "identical_to_ar": tokens == ar_tokens})
    return rows


def _sweep_summary(method: str, params: dict, mine: list[dict]) -> dict:
    """One variant over the prompts: τ and per-step costs pooled, the median speedup with its interval."""
    median, ci = median_ci([r["speedup_vs_ar"] for r in mine], single=True)
    steps = sum(r["steps"] for r in mine)
    return {"method": method, "tree_budget": params.get("tree_budget"),
            "tau": sum(r["new_tokens"] for r in mine) / steps, "steps": steps,
            "drafted_per_step": sum(r["drafted_per_step"] * r["steps"] for r in mine) / steps,
            "draft_s_per_step": sum(r["draft_s"] for r in mine) / steps,
            "verify_s_per_step": sum(r["verify_s"] for r in mine) / steps,
            "speedup_vs_ar": median, "speedup_vs_ar_ci95": ci,
            "identical_to_ar": all(r["identical_to_ar"] for r in mine)}


def sweep_markdown(result: dict, png: str) -> str:
    env = result["env"]
    lines = ["# Draft trees: τ and speedup against the node budget", "",
             f"`{env['command']}` — greedy, {env['prompts']} prompts, {env['max_new_tokens']} new tokens, "
             f"{env['threads']} thread(s), {env['cpu_model']}, load average before {env['load_before']} / after "
             f"{env['load_after']}, commit {env['git_commit']} (dirty: {env['git_dirty']}). Speedup = tokens/s over "
             "`ar` in the same round, median over prompts [bootstrap 95 % CI]. The machine was shared: read the "
             "ratios and τ, not the absolute times.", "",
             "| variant | budget | τ | steps | drafted nodes / step | draft s / step | verify s / step | "
             "speedup vs ar [95 % CI] | identical to ar |", "|---|---|---|---|---|---|---|---|---|"]
    for name, m in result["summary"].items():
        low, high = m["speedup_vs_ar_ci95"]
        lines.append(f"| `{name}` | {m['tree_budget'] or '—'} | {m['tau']:.2f} | {m['steps']} | "
                     f"{m['drafted_per_step']:.1f} | {m['draft_s_per_step'] * 1e3:.1f} ms | "
                     f"{m['verify_s_per_step'] * 1e3:.1f} ms | {m['speedup_vs_ar']:.2f}× [{low:.2f}, {high:.2f}] | "
                     f"{'yes' if m['identical_to_ar'] else 'NO'} |")
    lines += ["", f"![τ and speedup against the budget]({png})", ""]
    return "\n".join(lines)


def sweep_png(path: Path, summary: dict, budgets: list[int]) -> None:
    """Two panels (τ, speedup) against the budget, one line per tree method; Pillow only."""
    from PIL import Image, ImageDraw

    label_font = font(14)
    width, height, pad = 1100, 420, 60
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    colours = {"sequoia": (31, 119, 180), "dyspec": (214, 39, 40), "eagle2": (44, 160, 44)}
    methods = sorted({m["method"] for m in summary.values() if m["tree_budget"]})
    panels = [("tau (committed tokens per step)", "tau"), ("speedup vs ar (tokens/s ratio, median over prompts)", "speedup_vs_ar")]
    for p, (title, key) in enumerate(panels):
        left, right = pad + p * width // 2, (p + 1) * width // 2 - 20
        top, bottom = 40, height - pad
        values = [m[key] for m in summary.values()]
        high = max(values) * 1.1
        low = min(0.0, min(values))
        draw.text((left, 10), title, fill="black", font=label_font)
        draw.line([(left, bottom), (right, bottom)], fill="black")
        draw.line([(left, top), (left, bottom)], fill="black")
        x = lambda i: left + 20 + i * (right - left - 40) / max(len(budgets) - 1, 1)
        y = lambda v: bottom - (v - low) / (high - low) * (bottom - top)
        for tick in (low, (low + high) / 2, high):
            draw.line([(left - 4, y(tick)), (left, y(tick))], fill="black")
            draw.text((left - 45, y(tick) - 8), f"{tick:.2f}", fill="black", font=label_font)
        for i, b in enumerate(budgets):
            draw.text((x(i) - 6, bottom + 5), str(b), fill="black", font=label_font)
        draw.text((left + (right - left) // 2 - 40, bottom + 25), "tree budget (nodes)", fill="black", font=label_font)
        for base, colour in (("ar", (120, 120, 120)), ("draft", (255, 127, 14))):
            v = summary[base][key]
            draw.line([(left, y(v)), (right, y(v))], fill=colour, width=1)
            draw.text((right - 45, y(v) - 16), base, fill=colour, font=label_font)
        for method in methods:
            points = [(x(i), y(summary[f"{method}[{b}]"][key])) for i, b in enumerate(budgets)]
            draw.line(points, fill=colours.get(method, (0, 0, 0)), width=3)
            draw.text((points[-1][0] - 60, points[-1][1] - 18), method, fill=colours.get(method, (0, 0, 0)),
                      font=label_font)
    image.save(path)


if __name__ == "__main__":
    sys.exit(main())
