"""TETRIS against fixed-length drafting for a batch of different requests, under the same verification budget.

    specgen bench tetris [--batch-size 8] [--capacity 16] [--max-draft 6] [--max-new-tokens 96]
                         [--steps N | --requests N]       (or python -m specgen.app.bench.tetris, the same)

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
equals plain greedy decoding. Written to tetris-{static,steady,serve}-<timestamp>.{json,md} under
$SPECGEN_HOME/runs and copied as benchmarks/tetris-<setting>-latest.{json,md} (`--out-dir DIR`: both in DIR).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from specgen.app.bench.prompts import load_prompts
from specgen.app.bench.records import benchmarks_dir, record_dirs, run_env, start_run
from specgen.app.bench.report import command_line, print_outcome, run_line, write_record
from specgen.app.bench.runner import progress, rounds
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
    """`ar`, fixed chains of γ = capacity / batch_size per row and TETRIS on one batch (or a served queue), in
    `repeats` interleaved rounds; the medians per run, and TETRIS's throughput over the fixed chains'."""
    from specgen.modalities.text.generator import TextGenerator, shipped_code_pair

    _check_budget(batch_size, capacity, max_draft, drafter)
    estimate = estimate or DRAFTERS[drafter]
    if generator is None:  # the shipped code pair: its draft shares the target's full vocabulary (Gemma's does not)
        generator = TextGenerator(*shipped_code_pair())
    prompts_path = prompts_path or benchmarks_dir() / "prompts" / "text.jsonl"
    texts = [p.prompt for p in load_prompts(prompts_path)]
    if requests and (requests < batch_size or steps):
        raise InvalidRequest("--requests needs at least --batch-size requests and no --steps")
    batch = [texts[i % len(texts)] for i in range(batch_size)]
    served = [texts[i % len(texts)] for i in range(requests)]  # the queue, when serving one
    gamma = capacity // batch_size
    if slot_cost is None:  # the cut needs calibrated estimates: a row's acceptance rate is one, a confidence is not
        slot_cost = measure_slot_cost(generator, batch) if estimate == "history" else 0.0
    configs = _configs(generator, drafter, temperature, capacity, gamma, max_draft, estimate, slot_cost)
    start = start_run()
    if steps:  # room for every row to commit max_draft + 1 tokens a step
        max_new_tokens = steps * (max_draft + 1)
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, steps=steps)
    if requests:
        batch, options["batch_size"] = served, batch_size
    _decode(generator, batch, *configs["ar"](), **options, seed=seed)  # warm-up
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    with progress(repeats * len(configs), "bench tetris") as bar:
        # interleaved in a fixed order, so load drifts hit every config alike
        for round_ in rounds([batch], list(configs), repeats, rotate=False):
            for name in round_.order:
                runs[name].append(_decode(generator, batch, *configs[name](), **options, seed=seed + round_.repeat))
                bar.update(1)
    table = _table(runs, temperature)
    fixed, tetris = (table[n] for n in list(configs)[1:])
    return {"table": table, "tetris_over_fixed": tetris["tokens_per_s"] / fixed["tokens_per_s"],
            "env": run_env(start, drafter=drafter, estimate=estimate, slot_cost=slot_cost, batch_size=batch_size,
                           capacity=capacity, steps=steps, requests=requests, max_draft=max_draft, gamma=gamma,
                           max_new_tokens=max_new_tokens, temperature=temperature, repeats=repeats,
                           prompts=str(prompts_path), model=str(generator.model_path),
                           draft=str(generator.draft_path))}


def _check_budget(batch_size: int, capacity: int, max_draft: int, drafter: str) -> None:
    if batch_size < 2 or capacity < batch_size or max_draft < 1:
        raise InvalidRequest("TETRIS needs batch_size >= 2, capacity >= batch_size and max_draft >= 1")
    if capacity % batch_size:
        raise InvalidRequest(f"capacity {capacity} must be a multiple of the batch size {batch_size}, so that the "
                             "fixed-length baseline spends the same budget")
    if drafter not in DRAFTERS:
        raise InvalidRequest(f"unknown drafter {drafter!r}; choose from {', '.join(DRAFTERS)}")


def _configs(generator, drafter: str, temperature: float, capacity: int, gamma: int, max_draft: int, estimate: str,
             slot_cost: float) -> dict:
    """run name -> a maker of its fresh (drafter, length policy): `ar`, the fixed chain and TETRIS."""
    from specgen.modalities.drafters.model import ModelDrafter
    from specgen.modalities.text.ngram import PromptLookupDrafter
    from specgen.samplers.tetris import TetrisDrafter
    from specgen.samplers.length_policies import FixedLength
    from specgen.samplers.processing import Processing

    vocab = generator.model.config.vocab_size

    def chain_drafter():
        if drafter == "ngram":
            return PromptLookupDrafter()
        return ModelDrafter(generator.draft_model, Processing(temperature=temperature), target_vocab_size=vocab)

    return {
        "ar": lambda: (None, FixedLength(0)),
        f"fixed (γ = {gamma})": lambda: (chain_drafter(), FixedLength(gamma)),
        f"tetris (≤ {max_draft})": lambda: (TetrisDrafter(chain_drafter(), capacity, estimate, slot_cost=slot_cost),
                                             FixedLength(max_draft)),
    }


def _table(runs: dict[str, list[dict]], temperature: float) -> dict[str, dict]:
    """Per run, the medians over repeats, its throughput over `ar`'s and (greedy) whether it equals `ar`."""
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
    return table


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
             run_line(env), "",
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


def bench_tetris(args) -> int:
    """`specgen bench tetris`: writes tetris-SETTING-STAMP.{json,md} and tetris-SETTING-latest.*, SETTING being
    serve (--requests), steady (--steps) or static."""
    runs_dir, latest_dir = record_dirs(args.out_dir)  # checked before any work
    result = run_bench_tetris(prompts_path=args.prompts, batch_size=args.batch_size, capacity=args.capacity,
                              max_draft=args.max_draft, max_new_tokens=args.max_new_tokens,
                              temperature=args.temperature, repeats=args.repeats, steps=args.steps,
                              drafter=args.drafter, estimate=args.estimate, slot_cost=args.slot_cost,
                              requests=args.requests)
    result["env"]["command"] = command_line(args)
    kind = "serve" if args.requests else "steady" if args.steps else "static"
    written = write_record(result, runs_dir, f"tetris-{kind}-{result['env']['timestamp_utc']}",
                           lambda names: render_markdown(result), latest=f"tetris-{kind}-latest",
                           latest_dir=latest_dir)
    print_outcome(result, written, args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m specgen.app.bench.tetris ARGS` is `specgen bench tetris ARGS`."""
    from specgen.app.cli import main as specgen

    return specgen(["bench", "tetris", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
