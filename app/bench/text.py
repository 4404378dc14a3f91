"""`specgen bench text`: our text methods and the Hugging Face peers, side by side in one process.

For every prompt and repeat, every method runs once, in an order rotated from round to round so that no
method always runs first (caches, frequency scaling and neighbours' load then hit all methods alike). All runs
are greedy with the same `max_new_tokens`, the same token ids (our `TextGenerator.encode`) and the same stop
token. Speedups are ratios inside one round (tokens/s of a method over tokens/s of our `ar` in that round),
summarised as the median over prompts with a bootstrap confidence interval that resamples prompts.

The peers (`text_runner`) run at their defaults and at our draft length; both settings are reported, and
comparisons of ours against a peer use its faster one. Every output is checked token for token against our `ar`
output of the same prompt; a divergence is measured against the tie margin (`text_runner.TIE_MARGIN`).
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specgen import __version__
from specgen.app.bench.prompts import Prompt, load_prompts
from specgen.app.bench.records import (RunStart, benchmarks_dir, load_average, record_dirs, run_env, sha256,
                                       start_run)
from specgen.app.bench.report import Written, command_line, write_record
from specgen.app.bench.runner import progress as progress_bar
from specgen.app.bench.runner import rounds
from specgen.app.bench.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from specgen.app.bench.text_report import plot_png, render_markdown, summarise
from specgen.app.bench.text_runner import (TIE_MARGIN, Outcome, Runner, Variant, first_divergence, plan_variants,
                                           top2_margin)
from specgen.errors import InvalidRequest
from specgen.samplers.registry import get_method
from specgen.samplers.stats import SpecStats

DEFAULT_MAX_NEW_TOKENS = 128
LOAD_FLAG = 1.5  # 1-minute load average above which timings are flagged as contended
WARMUP_TOKENS = 32


def run_bench(*, prompts_path: Path | None, methods: list[str] | None, max_new_tokens: int | None, repeats: int,
              model: str | None, draft: str | None, threads: int, out_dir: Path | None, command: str,
              progress: Callable[[int], object] = progress_bar) -> tuple[dict, Written]:
    """Run the benchmark; returns the result object and the files written."""
    from specgen.modalities.text.generator import TextGenerator

    prompts_path = Path(prompts_path) if prompts_path else benchmarks_dir() / "prompts" / "text.jsonl"
    prompts = load_prompts(prompts_path)  # fails before any model loads
    runs_dir, latest_dir = record_dirs(out_dir)
    max_new_tokens = max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    generator = TextGenerator(model=model, draft=draft, threads=threads)
    resolve = lambda spec: generator.resolve_knobs(spec, {})  # noqa: E731 - the served model's defaults apply
    draft_length, lookup_length = (int(resolve(get_method("text", name))["num_draft_tokens"])
                                   for name in ("draft", "ngram"))
    variants = plan_variants(methods, draft_length, lookup_length, resolve)
    if methods is None:  # the default set: the methods this model can serve (`kangaroo` needs a trained adapter)
        from specgen.modalities.pipeline import servable

        variants = [v for v in variants if not v.ours or servable(generator, get_method("text", v.method))]
    runner = Runner(generator)
    if any(v.method == "hf-assisted" or (v.ours and (get_method("text", v.method).drafter or "").startswith("model"))
           for v in variants):
        runner.draft  # loads it now: a missing or mismatched draft fails before any timing
    encoded = [generator.encode(p.prompt) for p in prompts]
    _check_context(generator, prompts, encoded, max_new_tokens)

    start, load_samples = start_run(), []
    bar = progress(len(variants) * (1 + len(prompts) * repeats))
    warmup = min(WARMUP_TOKENS, max_new_tokens)
    for v in variants:  # first calls pay for lazy initialisation; keep that out of the timings
        bar.set_description(f"warm-up {v.name}")
        runner.run(v, prompts[0], encoded[0], warmup)
        bar.update(1)
    items: list[dict] = []
    pooled = {v.name: SpecStats() for v in variants}
    for round_ in rounds(prompts, variants, repeats):
        prompt, ids = round_.prompt, encoded[round_.index]
        outcomes: dict[str, tuple[int, Outcome]] = {}
        for position, v in enumerate(round_.order):
            bar.set_description(f"{prompt.id} {v.name}")
            outcomes[v.name] = (position, runner.run(v, prompt, ids, max_new_tokens))
            bar.update(1)
        items += _round_items(generator, variants, prompt, ids, round_.repeat, outcomes, pooled)
        sample = load_average() if round_.last else None
        if sample:
            load_samples.append(sample[0])
    bar.close()

    result = {"methods": summarise(items, variants, pooled), "items": items,
              "env": environment(runner, start, command=command, prompts_path=prompts_path, prompts=prompts,
                                 max_new_tokens=max_new_tokens, repeats=repeats,
                                 draft_length={"draft": draft_length, "ngram": lookup_length},
                                 load_samples=load_samples, variants=variants)}
    from specgen.modalities.text import gemma

    label = "text-gemma" if gemma.is_served(generator.model_path) else "text"
    return result, write_outputs(result, runs_dir, start.timestamp, label, latest_dir)


def _check_context(generator, prompts: list[Prompt], encoded: list, max_new_tokens: int) -> None:
    capacity = getattr(generator.model.config, "max_position_embeddings", 2048)
    for p, ids in zip(prompts, encoded):
        if len(ids) + max_new_tokens > capacity:
            raise InvalidRequest(f"prompt {p.id!r} has {len(ids)} tokens: with {max_new_tokens} new tokens it "
                                 f"exceeds the model's context of {capacity}")


def _round_items(generator, variants: list[Variant], prompt: Prompt, ids: torch.Tensor, repeat: int,
                 outcomes: dict[str, tuple[int, Outcome]], pooled: dict[str, SpecStats]) -> list[dict]:
    """Items of one round, with stats that need the round's `ar` run (its step time and its tokens)."""
    ar = outcomes["ar"][1]
    ar_step_s = ar.stats.verify_s / ar.stats.steps if ar.stats.steps else None
    ar_rate = len(ar.tokens) / ar.wall_s
    items = []
    for v in variants:
        position, outcome = outcomes[v.name]
        pool_stats(pooled[v.name], outcome.stats)
        stats = outcome.stats.summary(method=v.method, lossless=True, wall_s=outcome.wall_s,
                                      ar_step_s=ar_step_s if v.ours else None)
        if v.ours:
            stats["lossless"] = get_method("text", v.method).lossless
        index, compared = first_divergence(outcome.tokens, ar.tokens)
        margin, tie = top2_margin(generator.model, ids, ar.tokens[:index]) if index is not None else (None, None)
        rate = len(outcome.tokens) / outcome.wall_s if outcome.wall_s > 0 else None
        speedup = rate / ar_rate if rate else None
        predicted = stats.get("predicted_speedup_measured")
        item = {"name": v.name, **stats, "variant": v.variant, "prompt_id": prompt.id, "category": prompt.category,
                "repeat": repeat, "order": position, "prompt_tokens": len(ids), "new_tokens": len(outcome.tokens),
                "tokens_per_s": rate, "speedup_vs_ar": speedup,
                "measured_over_predicted": speedup / predicted if speedup and predicted else None,
                "identical_to_ar": index is None, "compared_tokens": compared, "first_divergence": index,
                "divergence_margin": margin, "divergence_tie_margin": tie,
                "divergence_tokens": None if index is None else {"ar": ar.tokens[index],
                                                                  v.name: outcome.tokens[index]}}
        if v.name == "ar":  # what the model wrote, once per round, for readers of the JSON
            item["text"] = generator.tokenizer.decode(ar.tokens, skip_special_tokens=True)
        items.append(item)
    return items


def pool_stats(total: SpecStats, run: SpecStats) -> None:
    """Adds one run's counts and timings to `total` (per-depth counts too)."""
    for key in ("steps", "row_steps", "drafted", "accepted", "rejections", "committed", "draft_s", "verify_s"):
        setattr(total, key, getattr(total, key) + getattr(run, key))
    while len(total.tested_at) < len(run.tested_at):
        total.tested_at.append(0)
        total.accepted_at.append(0)
    for d, (tested, accepted) in enumerate(zip(run.tested_at, run.accepted_at)):
        total.tested_at[d] += tested
        total.accepted_at[d] += accepted


# ---- the record --------------------------------------------------------------------------------------------------

def _model_record(path: str | None) -> dict | None:
    if path is None:
        return None
    folder = Path(path)
    weights = folder / ("served.safetensors" if (folder / "served.safetensors").exists() else "model.safetensors")
    return {"path": str(folder.resolve()) if folder.exists() else path, "weights": weights.name,
            "sha256": sha256(weights)}


def environment(runner: Runner, start: RunStart, *, command: str, prompts_path: Path, prompts: list[Prompt],
                max_new_tokens: int, repeats: int, draft_length: dict, load_samples: list[float],
                variants: list[Variant]) -> dict:
    """The shared record (`records.run_env`) plus the text bench's: versions, the peak load, the models and
    their digests, the prompts and the settings of the run."""
    import transformers

    env = run_env(start, command=command)
    peaks = [x for x in [*(start.load_before or [])[:1], *load_samples, *(env["load_after"] or [])[:1]]
             if x is not None]
    generator = runner.generator
    env.update({
        "specgen": __version__, "transformers": transformers.__version__, "numpy": np.__version__,
        "platform": platform.platform(), "load_max_1min": max(peaks) if peaks else None,
        "load_flag_threshold": LOAD_FLAG, "load_flag": bool(peaks) and max(peaks) > LOAD_FLAG,
        "models": {"target": _model_record(generator.model_path), "draft": _model_record(generator.draft_path)},
        # looked up where load_tokenizer looks: the model folder, then its parent
        "tokenizer_sha256": sha256(Path(generator.model_path) / "tokenizer.json")
        or sha256(Path(generator.model_path).parent / "tokenizer.json"),
        "prompts": {"path": str(prompts_path), "sha256": sha256(prompts_path), "count": len(prompts)},
        "max_new_tokens": max_new_tokens, "repeats": repeats, "greedy": True, "draft_length": draft_length,
        "warmup_tokens": min(WARMUP_TOKENS, max_new_tokens), "order": "rotated per round",
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED, "unit": "prompt"},
        "tie_margin": TIE_MARGIN, "variants": [v.name for v in variants],
    })
    from specgen.modalities.runtime.int8_linear import Int8Linear, backend

    if isinstance(generator.model.get_output_embeddings(), Int8Linear):
        env["int8_kernel"] = backend()
    if any(v.method == "hf-assisted" for v in variants):
        env["hf_assistant_defaults"] = runner.assistant_settings()
    return env


def write_outputs(result: dict, out_dir: Path, timestamp: str, label: str = "text",
                  latest_dir: Path | None = None) -> Written:
    """bench-<label>-<timestamp>.{json,md,png} in `out_dir` and copies as <label>-latest.* in `latest_dir` (default:
    the same folder); the label is `text-gemma` for Gemma 3 270M so its figures sit beside the code model's."""
    return write_record(result, out_dir, f"bench-{label}-{timestamp}",
                        lambda names: render_markdown(result, names.get("png")),
                        {"png": lambda path: plot_png(path, result["methods"])}, f"{label}-latest", latest_dir)


def bench_text(args) -> int:
    """The CLI handler: JSON (only) on stdout with --json, else the Markdown report; progress on stderr."""
    result, files = run_bench(prompts_path=args.prompts, methods=args.methods, max_new_tokens=args.max_new_tokens,
                              repeats=args.repeats, model=args.model, draft=args.draft, threads=args.threads,
                              out_dir=args.out_dir, command=command_line(args))
    if args.json:
        print(json.dumps(result))
    else:
        print(render_markdown(result, files.runs["png"].name), end="")
    runs = files.runs
    print(f"wrote {runs['json']}, {runs['md']}, {runs['png']} (and {files.latest['md'].stem}.* beside them)",
          file=sys.stderr)
    return 0
