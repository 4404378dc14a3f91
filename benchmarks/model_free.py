"""Model-free drafting benchmark: `ar`, `ngram`, `stand`, `rest`, `dresd`, `draft-lookup`, `hf-prompt-lookup` and
`consensus`, per prompt category, greedy and at temperature 1, side by side in one process.

    python benchmarks/model_free.py corpus --out DIR [--prompts N]       # datastore text: Gemma's own answers
    python benchmarks/model_free.py bench --model M [--draft D] --datastore-rest P --datastore-dresd P
                                    [--prompts FILE] [--max-new-tokens N] [--consensus-samples 8] --out NAME

`corpus` writes Gemma 3 270M's continuations (greedy and one sample at temperature 1) of templated prompts in the
benchmark's categories (story, question answering over a passage, summaries, arithmetic word problems): text
aligned with the target's own output, as DReSD recommends; the templates never produce a benchmark prompt.
`bench` rotates the method order per prompt, checks greedy outputs against `ar` token for token, and writes
benchmarks/model-free-NAME-latest.md and .json (tokens/s ratios inside one process; the load average is recorded).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this folder holds a kernels.py: off the import path, or it would shadow Hugging Face's `kernels`
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]

ANIMALS = ["fox", "bear", "owl", "turtle", "rabbit", "whale", "cat", "goat", "mouse", "penguin"]
FEARS = ["afraid of the dark", "too shy to sing", "lost in the snow", "looking for a friend", "unable to swim"]
THINGS = ["a lighthouse", "a bakery", "a museum", "a school garden", "a train station", "a castle", "a farm"]
NAMES = ["Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas"]


def corpus_prompts(limit: int) -> list[str]:
    prompts = []
    for animal, fear in itertools.product(ANIMALS, FEARS):
        prompts.append(f"Write a short story for children.\n\nOnce upon a time, there lived a little {animal} who "
                       f"was {fear}.")
    for name, thing, n in zip(itertools.cycle(NAMES), THINGS * 3, range(3, 24)):
        prompts.append(f"Question: {name} has {n * 2} coins. {name} spends {n} coins at {thing} and then finds "
                       f"{n + 4} more. How many coins does {name} have now?\nLet's think step by step.\nAnswer:")
        prompts.append(f"Context: {thing.capitalize()} in the town of Millbrook was built in {1850 + 7 * n}. It is "
                       f"run by {name}, who opens it at {n % 5 + 6} a.m. every day. Visitors come to see its "
                       f"{['old clock', 'red door', 'tall tower', 'quiet garden'][n % 4]}.\n\nQuestion: When was "
                       f"{thing} built, and who runs it?\nAnswer:")
        prompts.append(f"Summarise the following paragraph in two sentences.\n\n{name} moved to a small town to "
                       f"work at {thing}. At first the work was hard and the days were long, but the people were "
                       f"kind. After {n} months {name} knew everyone by name and had started a weekly evening "
                       f"class.\n\nSummary:")
    return prompts[:limit]


def make_corpus(args) -> None:
    from specgen.modalities.text.generator import TextGenerator

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    generator = TextGenerator(args.model, threads=1)
    prompts = corpus_prompts(args.prompts)
    started = time.perf_counter()
    for temperature in (0.0, 1.0):
        todo = [i for i in range(len(prompts)) if not (out / f"t{temperature:g}-{i:04d}.txt").exists()]
        for i, result in generator.serve([prompts[i] for i in todo], rows=8, method="ar", temperature=temperature,
                                         max_new_tokens=args.max_new_tokens, seed=1):
            index = todo[i]
            (out / f"t{temperature:g}-{index:04d}.txt").write_text(prompts[index] + result.text)
            print(f"{temperature} {index} {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)


# ---- the benchmark ----------------------------------------------------------------------------------------------

def load_prompts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_ours(generator, method: str, prompt: str, temperature: float, max_new_tokens: int, params: dict,
             num_samples: int = 1, seed: int = 0) -> dict:
    started = time.perf_counter()
    result = generator.generate(prompt, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                                seed=seed, num_samples=num_samples, **params)
    wall = time.perf_counter() - started
    committed = sum(len(s["tokens"]) for s in result.samples)
    stats = result.stats
    extra = {k: v for k, v in stats.items() if k.endswith("_per_step") or k.endswith("per_row_step")
             or k in ("matched_steps", "mean_match_tokens", "rows_with_candidates")}
    return {"tokens": [s["tokens"] for s in result.samples], "wall_s": wall, "committed": committed,
            "tau": stats["tau"], "steps": stats["steps"], **extra}


def run_hf_prompt_lookup(generator, prompt: str, max_new_tokens: int) -> dict:
    import torch

    ids = generator.encode(prompt)[None]
    model = generator.model
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                             prompt_lookup_num_tokens=10, pad_token_id=generator.tokenizer.eos_token_id)
    wall = time.perf_counter() - started
    tokens = out[0, ids.shape[1]:].tolist()
    return {"tokens": [tokens], "wall_s": wall, "committed": len(tokens), "tau": float("nan"), "steps": 0}


def bench(args) -> None:
    from specgen.modalities.text.generator import TextGenerator

    generator = TextGenerator(args.model, args.draft, threads=1)
    prompts = load_prompts(Path(args.prompts))
    methods = args.methods.split(",")
    params = {"rest": {"datastore": args.datastore_rest} if args.datastore_rest else {},
              "dresd": {"datastore": args.datastore_dresd} if args.datastore_dresd else {}}
    rows = []
    generator.generate("warm up", method="ar", max_new_tokens=8)
    for t_index, temperature in enumerate((0.0, 1.0)):
        for p_index, item in enumerate(prompts):
            order = methods[(p_index + t_index) % len(methods):] + methods[:(p_index + t_index) % len(methods)]
            results = {}
            for method in order:
                if method == "hf-prompt-lookup":
                    if temperature > 0:
                        continue
                    results[method] = run_hf_prompt_lookup(generator, item["prompt"], args.max_new_tokens)
                else:
                    results[method] = run_ours(generator, method, item["prompt"], temperature, args.max_new_tokens,
                                               params.get(method, {}))
            reference = results["ar"]["tokens"][0]
            for method, r in results.items():
                rows.append({"id": item["id"], "category": item["category"], "temperature": temperature,
                             "method": method, "tokens_per_s": r["committed"] / r["wall_s"], "tau": r["tau"],
                             "wall_s": r["wall_s"], "speedup_vs_ar": (r["committed"] / r["wall_s"]) /
                             (results["ar"]["committed"] / results["ar"]["wall_s"]),
                             "identical_to_ar": r["tokens"][0] == reference if temperature == 0 else None,
                             **{k: v for k, v in r.items() if k not in ("tokens", "wall_s", "committed", "tau")}})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    consensus = []
    if args.consensus_samples:
        for item in [p for p in prompts if p["category"] == "math"]:
            for method in ("ar", "consensus", "stand"):
                r = run_ours(generator, method, item["prompt"], 1.0, args.max_new_tokens, {},
                             num_samples=args.consensus_samples, seed=3)
                consensus.append({"id": item["id"], "method": method, "tau": r["tau"],
                                  "tokens_per_s": r["committed"] / r["wall_s"], "wall_s": r["wall_s"]})
                print(json.dumps(consensus[-1]), file=sys.stderr, flush=True)
    write(args, rows, consensus, methods)


def write(args, rows, consensus, methods) -> None:
    env = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
           "threads": 1, "load_average": os.getloadavg(), "model": args.model, "draft": args.draft,
           "datastore_rest": args.datastore_rest, "datastore_dresd": args.datastore_dresd,
           "max_new_tokens": args.max_new_tokens, "prompts": args.prompts}
    for store in (args.datastore_rest, args.datastore_dresd):
        if store and (Path(store) / "meta.json").exists():
            env[f"meta_{Path(store).name}"] = json.loads((Path(store) / "meta.json").read_text())
    out = ROOT / "benchmarks" / f"model-free-{args.out}-latest"
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "consensus": consensus, "env": env}, indent=1))
    lines = [f"# Model-free drafting: {args.out}", "", "Command: `python benchmarks/model_free.py " +
             " ".join(sys.argv[1:]) + "`", "",
             f"One process, 1 thread, load average at the end {env['load_average'][0]:.2f} (2 cores shared with "
             "other work: ratios inside one prompt are what to read, not absolute tokens/s).", ""]
    categories = sorted({r["category"] for r in rows})
    for temperature in (0.0, 1.0):
        lines += [f"## temperature {temperature:g}: speedup vs ar (median over the category's prompts), tau", "",
                  "| method | " + " | ".join(categories) + " | median | worst | identical to ar |",
                  "|---|" + "---|" * (len(categories) + 3)]
        for method in methods:
            mine = [r for r in rows if r["method"] == method and r["temperature"] == temperature]
            if not mine:
                continue
            cells = []
            for c in categories:
                here = [r for r in mine if r["category"] == c]
                sp = statistics.median(r["speedup_vs_ar"] for r in here)
                tau = statistics.median(r["tau"] for r in here)
                cells.append(f"{sp:.2f}x (τ {tau:.2f})" if tau == tau else f"{sp:.2f}x")
            speedups = [r["speedup_vs_ar"] for r in mine]
            same = [r["identical_to_ar"] for r in mine if r["identical_to_ar"] is not None]
            lines.append(f"| `{method}` | " + " | ".join(cells) + f" | {statistics.median(speedups):.2f}x | "
                         f"{min(speedups):.2f}x | {f'{sum(same)}/{len(same)}' if same else '—'} |")
        lines.append("")
    retrieval = [r for r in rows if r["method"] in ("rest", "dresd")]
    if retrieval:
        lines += ["## rest vs dresd (retrieval cost per step, ms; matched steps)", "",
                  "| method | temperature | retrieval ms/step (median) | tau (median) |", "|---|---|---|---|"]
        for method in ("rest", "dresd"):
            for temperature in (0.0, 1.0):
                mine = [r for r in retrieval if r["method"] == method and r["temperature"] == temperature]
                if mine:
                    cost = statistics.median(r.get("retrieval_ms_per_step", float("nan")) for r in mine)
                    lines.append(f"| `{method}` | {temperature:g} | {cost:.2f} | "
                                 f"{statistics.median(r['tau'] for r in mine):.2f} |")
        lines.append("")
    if consensus:
        lines += [f"## {args.consensus_samples} samples at temperature 1 on math (tokens/s of all samples together)",
                  "", "| prompt | method | tokens/s | vs ar | tau |", "|---|---|---|---|---|"]
        for item in sorted({c["id"] for c in consensus}):
            base = next(c for c in consensus if c["id"] == item and c["method"] == "ar")["tokens_per_s"]
            for c in (c for c in consensus if c["id"] == item):
                lines.append(f"| {item} | `{c['method']}` | {c['tokens_per_s']:.1f} | {c['tokens_per_s'] / base:.2f}x "
                             f"| {c['tau']:.2f} |")
        lines.append("")
    lines += ["Environment: `" + json.dumps({k: v for k, v in env.items() if not k.startswith("meta_")}) + "`", ""]
    for key, meta in env.items():
        if key.startswith("meta_"):
            lines.append(f"Datastore {key[5:]}: " + ", ".join(f"{k} {v}" for k, v in meta.items()
                                                               if k not in ("tokenizer_sha256", "corpus")))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(out.with_suffix(".md"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--out", required=True)
    c.add_argument("--model", default="gemma")
    c.add_argument("--prompts", type=int, default=120)
    c.add_argument("--max-new-tokens", type=int, default=160)
    b = sub.add_parser("bench")
    b.add_argument("--model", default=None)
    b.add_argument("--draft", default=None)
    b.add_argument("--prompts", default=str(ROOT / "benchmarks" / "prompts" / "text-model-free.jsonl"))
    b.add_argument("--methods", default="ar,ngram,stand,rest,dresd,draft-lookup,hf-prompt-lookup")
    b.add_argument("--datastore-rest", default="")
    b.add_argument("--datastore-dresd", default="")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--consensus-samples", type=int, default=8)
    b.add_argument("--out", required=True)
    args = parser.parse_args()
    make_corpus(args) if args.command == "corpus" else bench(args)


if __name__ == "__main__":
    main()
