"""TETRIS against fixed-length drafting for a batch of different requests, under the same verification budget.

    python -m specgen.app.bench.tetris [--batch-size 8] [--capacity 16] [--max-draft 6] [--max-new-tokens 96]
                                       [--steps N | --requests N]

One batch of `--batch-size` text prompts (from benchmarks/prompts/text.jsonl, cycled) is decoded to the same
number of new tokens by: plain decoding (`ar`); a chain of fixed length γ = capacity / batch per row (`fixed`: the
budget spread evenly); and TETRIS (`tetris`: every row drafts up to `--max-draft`, then the batch keeps the
`capacity` drafted tokens with the largest cumulative acceptance estimates, so confident rows verify long drafts
and unsure rows short ones). Both speculative runs verify at most `capacity` drafted tokens per step. Drafts come
from the code draft model (`--drafter model`, estimate: its confidence) or from prompt lookup (`--drafter ngram`,
estimate: each row's acceptance so far). `--slot-cost` (default: measured on the batch) lets TETRIS leave a draft
unverified when its estimate does not pay for its slot.
Three settings: a static batch (every row to --max-new-tokens, the slowest sets the steps), a steady state
(--steps: rows never finish), and a served queue (--requests: that many requests, the prompts cycled, through
--batch-size rows by continuous batching, a finished request's row taking the next one).
Reported per run: throughput (committed tokens per second over the whole batch; in the steady state, over steps
1 onwards, the prefill left out), steps, drafted and accepted tokens, and, at temperature 0, whether every row
equals plain greedy decoding. Written to
benchmarks/tetris-{static,steady,serve}-<timestamp>.{json,md} and tetris-<setting>-latest.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from specgen import settings
from specgen.settings import use_threads
from specgen.errors import InvalidRequest


def _decode(generator, prompts, drafter, policy, *, max_new_tokens: int, temperature: float, seed: int,
            steps: int = 0, batch_size: int = 0) -> dict:
    """Every request to max_new_tokens (stop tokens ignored so every run does the same work). `batch_size` > 0:
    continuous batching, that many rows serving `prompts` as a queue (a finished request's row takes the next
    one), throughput over the whole run. Else one batch of all `prompts`; with `steps` > 0, only that many
    verification steps (rows never run out: a server that always has work), and the throughput is that of steps
    1 onwards (the prompts' prefill and step 0, the same work for every run, left out: a steady state has no
    prefill). Tokens are returned per request."""
    from specgen.samplers.acceptance import make_rule
    from specgen.samplers.loop import speculative_generate
    from specgen.samplers.processing import Processing
    from specgen.samplers.stats import SpecStats

    processing = Processing(temperature=temperature)
    prompt_ids = [generator.encode(p) for p in prompts]
    capacity = max(len(p) for p in prompt_ids) + max_new_tokens + 64
    first = len(prompt_ids) if not batch_size else batch_size
    queue = None if not batch_size else iter(list(enumerate(prompt_ids))[first:])
    stats = SpecStats()
    tokens: list[list[int]] = [[] for _ in prompts]
    started = time.perf_counter()
    steady_from, steady_tokens = None, 0  # the end of step 0, and the tokens committed after it
    for event in speculative_generate(generator.target(capacity), drafter,
                                      make_rule("chain", processing), prompt_ids[:first], processing=processing,
                                      max_new_tokens=max_new_tokens, policy=policy, seed=seed, stats=stats,
                                      queue=queue):
        if steps and event.step >= steps:
            break
        if event.step == 0 and steady_from is None:
            steady_from = time.perf_counter()
        tokens[event.sample].extend(event.tokens)
        steady_tokens += len(event.tokens) if event.step > 0 else 0
    finished = time.perf_counter()
    wall_s = finished - started
    summary = stats.summary(method="tetris", lossless=True, wall_s=wall_s)
    committed = sum(len(t) for t in tokens)
    throughput = steady_tokens / (finished - steady_from) if steps else committed / wall_s
    return {"tokens": tokens, "wall_s": wall_s, "tokens_per_s": throughput, "steps": summary["steps"],
            "drafted": summary["drafted"], "accepted": summary["accepted"], "tau": summary["tau"],
            "draft_s": summary["draft_s"], "verify_s": summary["verify_s"]}


def run_bench_tetris(generator=None, *, prompts_path: Path | None = None, batch_size: int = 8, capacity: int = 16,
                     max_draft: int = 6, max_new_tokens: int = 96, temperature: float = 0.0, repeats: int = 3,
                     seed: int = 0, steps: int = 0, drafter: str = "model", estimate: str | None = None,
                     slot_cost: float | None = None, requests: int = 0) -> dict:
    import torch
    from tqdm import tqdm

    from specgen.app.bench.text import _cpu_model, _load, benchmarks_dir, load_prompts, source_state
    from specgen.modalities.drafters.model import ModelDrafter
    from specgen.modalities.text.generator import TextGenerator, shipped_code_pair
    from specgen.modalities.text.ngram import PromptLookupDrafter
    from specgen.samplers.length_policies import TetrisDrafter
    from specgen.samplers.policies import FixedLength
    from specgen.samplers.processing import Processing

    if batch_size < 2 or capacity < batch_size or max_draft < 1:
        raise InvalidRequest("TETRIS needs batch_size >= 2, capacity >= batch_size and max_draft >= 1")
    if capacity % batch_size:
        raise InvalidRequest(f"capacity {capacity} must be a multiple of the batch size {batch_size}, so that the "
                             "fixed-length baseline spends the same budget")
    if drafter not in DRAFTERS:
        raise InvalidRequest(f"unknown drafter {drafter!r}; choose from {', '.join(DRAFTERS)}")
    estimate = estimate or DRAFTERS[drafter]
    if generator is None:  # the shipped code pair: its draft shares the target's full vocabulary (Gemma's does not)
        generator = TextGenerator(*shipped_code_pair())
    prompts_path = prompts_path or benchmarks_dir() / "prompts" / "text.jsonl"
    texts = [p.prompt for p in load_prompts(prompts_path)]
    if requests and (requests < batch_size or steps):
        raise InvalidRequest("--requests needs at least --batch-size requests and no --steps")
    batch = [texts[i % len(texts)] for i in range(batch_size)]
    served = [texts[i % len(texts)] for i in range(requests)]  # the queue, when serving one
    vocab = generator.model.config.vocab_size

    def chain_drafter():
        if drafter == "ngram":
            return PromptLookupDrafter()
        return ModelDrafter(generator.draft_model, Processing(temperature=temperature), target_vocab_size=vocab)

    gamma = capacity // batch_size
    if slot_cost is None:  # the cut needs calibrated estimates: a row's acceptance rate is one, a confidence is not
        slot_cost = measure_slot_cost(generator, batch) if estimate == "history" else 0.0
    configs = {
        "ar": lambda: (None, FixedLength(0)),
        f"fixed (γ = {gamma})": lambda: (chain_drafter(), FixedLength(gamma)),
        f"tetris (≤ {max_draft})": lambda: (TetrisDrafter(chain_drafter(), capacity, estimate, slot_cost=slot_cost),
                                             FixedLength(max_draft)),
    }
    load_before = _load()
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    if steps:  # room for every row to commit max_draft + 1 tokens a step
        max_new_tokens = steps * (max_draft + 1)
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, steps=steps)
    if requests:
        batch, options["batch_size"] = served, batch_size
    _decode(generator, batch, *configs["ar"](), **options, seed=seed)  # warm-up
    with tqdm(total=repeats * len(configs), desc="bench tetris", unit="run", file=sys.stderr) as progress:
        for repeat in range(repeats):  # interleaved, so load drifts hit every config alike
            for name, make in configs.items():
                runs[name].append(_decode(generator, batch, *make(), **options, seed=seed + repeat))
                progress.update(1)
    reference = runs["ar"][0]["tokens"]
    table = {}
    for name, items in runs.items():
        table[name] = {key: statistics.median(r[key] for r in items)
                       for key in ("tokens_per_s", "wall_s", "steps", "drafted", "accepted", "tau", "draft_s",
                                   "verify_s")}
        if temperature == 0:  # within a step horizon, rows stop at different lengths: compare the common prefix
            table[name]["identical_to_ar"] = all(_agree(r["tokens"], reference) for r in items)
    ar_tps = table["ar"]["tokens_per_s"]
    for row in table.values():
        row["throughput_vs_ar"] = row["tokens_per_s"] / ar_tps
    fixed, tetris = (table[n] for n in list(configs)[1:])
    return {"table": table, "tetris_over_fixed": tetris["tokens_per_s"] / fixed["tokens_per_s"],
            "env": {"timestamp_utc": datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"), **source_state(),
                    "drafter": drafter, "estimate": estimate, "slot_cost": slot_cost, "batch_size": batch_size,
                    "capacity": capacity, "steps": steps, "requests": requests, "max_draft": max_draft, "gamma": gamma,
                    "max_new_tokens": max_new_tokens, "temperature": temperature, "repeats": repeats,
                    "prompts": str(prompts_path), "model": str(generator.model_path),
                    "draft": str(generator.draft_path), "threads": torch.get_num_threads(),
                    "cpu_model": _cpu_model(), "settings": settings.snapshot(), "load_before": load_before,
                    "load_after": _load()}}


def measure_slot_cost(generator, prompts: list[str], window: int = 5, repeats: int = 15) -> float:
    """A verified slot's cost in units of the rest of a step, t_slot / (t_step - rows t_slot): t_slot from the
    target's forwards over the batch with 1 and `window` slots per row, t_step from plain decoding of the batch
    (its whole step: the forward, the loop, the bookkeeping), so the cut weighs a slot against everything a step
    costs. Medians of `repeats` alternated measurements."""
    import time

    import torch

    from specgen.modalities.runtime.transformers_adapter import measure_batch_window_s
    from specgen.samplers.acceptance import make_rule
    from specgen.samplers.loop import speculative_generate
    from specgen.samplers.processing import Processing

    prompt_ids = [torch.as_tensor(generator.encode(p), dtype=torch.long) for p in prompts]
    target = generator.target(max(len(p) for p in prompt_ids) + 64)
    forward_s = lambda n: measure_batch_window_s(target, prompt_ids, n, repeats=1)  # noqa: E731

    def step_s(steps: int = 8) -> float:  # plain decoding's step, from its second step to its last
        processing, marks = Processing(), []
        for event in speculative_generate(target, None, make_rule("chain", processing), prompt_ids,
                                          processing=processing, max_new_tokens=steps + 1):
            if event.row == 0:
                marks.append(time.perf_counter())
        return (marks[-1] - marks[0]) / (len(marks) - 1)

    ones, wides, steps = [], [], []
    for _ in range(repeats):
        ones.append(forward_s(1))
        wides.append(forward_s(window))
        steps.append(step_s())
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    per_slot = max(median(wides) - median(ones), 0.0) / ((window - 1) * len(prompt_ids))
    rest = max(median(steps) - per_slot * len(prompt_ids), per_slot)
    return round(per_slot / rest, 4)


# Each drafter with the TETRIS estimate that suits it: a model's confidence, or the row's acceptance history for
# prompt lookup (point-mass drafts carry no law to be confident in).
DRAFTERS = {"model": "confidence", "ngram": "history"}
_DRAFTER_NAMES = {"model": "the code draft model", "ngram": "prompt lookup in each row's own context"}


def _agree(rows: list[list[int]], reference: list[list[int]]) -> bool:
    return all(a[:min(len(a), len(b))] == b[:min(len(a), len(b))] for a, b in zip(rows, reference))


def _setting(env: dict) -> str:
    if env.get("requests"):
        return (f"{env['requests']} requests ({env['max_new_tokens']} new tokens each, the prompts cycled) served "
                f"by continuous batching in {env['batch_size']} rows (a finished request's row takes the next one; "
                "throughput over the whole run)")
    if env.get("steps"):
        return (f"Batch of {env['batch_size']} different prompts run for {env['steps']} verification steps (rows "
                "never finish: the steady state of a server that always has requests)")
    return (f"Batch of {env['batch_size']} different prompts, {env['max_new_tokens']} new tokens each (static "
            "batch: the slowest row sets the number of steps)")


def render_markdown(result: dict) -> str:
    env = result["env"]
    lines = ["# TETRIS vs fixed-length drafting", "",
             f"{env['timestamp_utc']} · commit {(env.get('git_commit') or '?')[:12]} · {env['cpu_model']} · "
             f"{env['threads']} thread(s) · load {env['load_before']} → {env['load_after']}", "",
             _setting(env) + ", temperature "
             f"{env['temperature']}, at most {env['capacity']} drafted tokens verified per step "
             f"(fixed: γ = {env['gamma']} per row; TETRIS: up to {env['max_draft']} per row, best {env['capacity']} "
             f"kept); median of {env['repeats']} interleaved repeats.", "",
             f"Drafter: {_DRAFTER_NAMES.get(env.get('drafter', 'model'))}; TETRIS estimate: "
             f"{env.get('estimate', 'confidence')}; slot cost {env.get('slot_cost', 0)} (a verified slot's cost over a "
             "step's fixed cost: drafts whose estimate does not pay for their slot are not verified).", "",
             "| run | tokens/s | vs ar | steps | drafted | accepted | identical to ar |", "|---|---|---|---|---|---|---|"]
    for name, row in result["table"].items():
        same = row.get("identical_to_ar")
        lines.append(f"| {name} | {row['tokens_per_s']:.1f} | {row['throughput_vs_ar']:.2f}× | {row['steps']:.0f} | "
                     f"{row['drafted']:.0f} | {row['accepted']:.0f} | {'—' if same is None else same} |")
    lines += ["", f"TETRIS / fixed throughput: **{result['tetris_over_fixed']:.2f}×**", "",
              f"Command: `{env.get('command', 'python -m specgen.app.bench.tetris')}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(prog="python -m specgen.app.bench.tetris", description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--capacity", type=int, default=16, help="drafted tokens verified per step for the whole batch")
    p.add_argument("--max-draft", type=int, default=6, help="TETRIS: most tokens drafted per row")
    p.add_argument("--max-new-tokens", type=int, default=96, help="static batch (--steps 0): tokens per row")
    p.add_argument("--steps", type=int, default=0,
                   help="run this many verification steps instead, rows never finishing (default: 0, off)")
    p.add_argument("--requests", type=int, default=0,
                   help="serve this many requests (the prompts cycled) by continuous batching in --batch-size rows, "
                        "each to --max-new-tokens (default: 0, one batch)")
    p.add_argument("--drafter", choices=list(DRAFTERS), default="model",
                   help="model: the shipped code draft; ngram: prompt lookup in each row's own context")
    p.add_argument("--estimate", choices=["confidence", "history"], default=None,
                   help="TETRIS's acceptance estimate (default: confidence for model, history for ngram)")
    p.add_argument("--slot-cost", type=float, default=None,
                   help="TETRIS: a verified slot's cost over a step's fixed cost; slots whose estimate does not pay "
                        "for theirs are not verified (default: measured on the batch for the history estimate, 0 "
                        "(always fill the budget) for the confidence one, which is not a calibrated probability)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-dir", type=Path, default=None)
    a = p.parse_args(argv)
    use_threads(a.threads)
    result = run_bench_tetris(batch_size=a.batch_size, capacity=a.capacity, max_draft=a.max_draft,
                              max_new_tokens=a.max_new_tokens, temperature=a.temperature, repeats=a.repeats,
                              steps=a.steps, drafter=a.drafter, estimate=a.estimate, slot_cost=a.slot_cost,
                              requests=a.requests)
    result["env"]["command"] = "python -m specgen.app.bench.tetris " + " ".join(argv if argv is not None
                                                                                else sys.argv[1:])
    from specgen.app.bench.text import record_dirs

    runs_dir, latest_dir = record_dirs(a.out_dir)
    stamp = result["env"]["timestamp_utc"]
    kind = "serve" if a.requests else "steady" if a.steps else "static"
    for out, name in ((runs_dir, f"tetris-{kind}-{stamp}"), (latest_dir, f"tetris-{kind}-latest")):
        (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / f"{name}.md").write_text(render_markdown(result))
    print(render_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
