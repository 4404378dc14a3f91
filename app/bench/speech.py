"""`specgen bench speech` (and `specgen bench speech-frontier`): the speech methods side by side in one process on
`benchmarks/prompts/speech.jsonl`.

Every method (pcg once per theta, ssd once per beta) runs on every prompt and repeat in rotated order with the
repeat's seed; speedups are ratios to the `ar` (and `sd`) run of the same round, summarised per prompt and then
as the median over prompts with a bootstrap interval. After a prompt's rounds every method decodes it greedily
once: the lossless ones must equal `ar` token for token. With quality scoring, every sampled run is decoded and
scored after its clock stopped, and the speed/quality frontier of the relaxed methods is reported
(`speech_scoring`, `speech_frontier`).
"""

from __future__ import annotations

from pathlib import Path

from specgen.app.bench.prompts import load_speech_prompts
from specgen.app.bench.records import RunStart, benchmarks_dir, record_dirs, run_env, start_run
from specgen.app.bench.report import Written, command_line, fmt, print_outcome, run_line, write_record
from specgen.app.bench.runner import Round, progress, rounds
from specgen.app.bench.speech_frontier import DEFAULT_THETAS, SWEPT_KNOBS, Variant, sweep_variants
from specgen.app.bench.stats import median, median_ci, prompt_medians, slowdowns

DEFAULT_METHODS = ("ar", "sd", "ssd", "pcg", "auto")
SWAP_UTTERANCES = 48  # held-out corpus utterances in the token-swap stress test
REFERENCE_PER_VOICE = 8  # training utterances per voice behind the speaker-similarity profiles


def run_bench_speech(*, prompts_path: Path | None = None, methods: list[str] | None = None, repeats: int = 1,
                     max_new_tokens: int | None = None, generator=None, greedy_check: bool = True,
                     thetas: list[float] | None = None, betas: list[float] | None = None, quality: bool = False,
                     corpus: Path | None = None, swap_utterances: int = SWAP_UTTERANCES, swap_rate: float = 1.0,
                     reference_per_voice: int = REFERENCE_PER_VOICE, start: RunStart | None = None) -> dict:
    """Every method (pcg once per theta, ssd once per beta) on every prompt and repeat, in rotated order with the
    same seed. With `quality`, each sampled run is also decoded and scored (WER, speaker-similarity proxy) and the
    token-swap stress test runs on held-out utterances of `corpus`; the frontier goes under "frontier"."""
    from specgen.app.bench.speech_scoring import QualityScorer, build_frontier
    from specgen.modalities.speech.generator import SpeechGenerator

    prompts_path = prompts_path or benchmarks_dir() / "prompts" / "speech.jsonl"
    prompts = load_speech_prompts(prompts_path)
    methods = _with_references(methods)
    sweeps = _checked_sweeps(methods, DEFAULT_THETAS if thetas is None and "pcg" in methods else thetas, betas)
    variants = sweep_variants(methods, sweeps, _knob_defaults())
    generator = generator or SpeechGenerator()
    _check_prompts(generator, prompts, max_new_tokens)
    thetas = [v.value for v in variants if v.method == "pcg"]
    for theta in thetas:  # groups are built (or loaded) before any timing
        generator.groups(theta)
    scorer = QualityScorer.build(generator, prompts, corpus, swap_utterances, reference_per_voice) if quality else None
    start = start or start_run()
    generator.generate(prompts[0]["text"], method="ar", max_new_tokens=8, decode=False)  # warm-up
    items, pooled = [], {v.key: [] for v in variants}
    bar = progress(len(prompts) * (repeats * len(variants) + (len(methods) if greedy_check else 0)), "bench speech")
    for round_ in rounds(prompts, variants, repeats):
        prompt = round_.prompt
        if round_.repeat == 0:
            ar_step_s = generator.measure_step_s(prompt["text"], prompt["voice"])
        items += _sampled_round(generator, round_, ar_step_s, max_new_tokens, scorer, pooled, bar)
        if greedy_check and round_.last:
            items += _greedy_check(generator, prompt, methods, max_new_tokens, bar)
    bar.close()
    summaries = {v.key: _pooled_summary(v.method, pooled[v.key], [i for i in items if i.get("variant") == v.key])
                 for v in variants}
    result = {"methods": _method_summaries(methods, variants, summaries, items), "items": items}
    if "pcg" in methods or "ssd" in methods:
        result["frontier"] = build_frontier(variants, summaries, items, scorer, generator, thetas, swap_rate)
    processing = generator.processing()
    result["env"] = run_env(start, prompts=str(prompts_path), repeats=repeats, max_new_tokens=max_new_tokens,
                            sampling={"temperature": processing.temperature, "top_k": processing.top_k},
                            model=str(generator.model_path), draft=str(generator.draft_path),
                            draft_tokens=_default_draft_tokens(), variants=[v.key for v in variants],
                            quality=quality)
    return result


def _with_references(methods: list[str] | None) -> list[str]:
    """The methods to run (default: every speech method), with `ar`, the baseline of every ratio, and `sd`, the
    exact reference of relaxed methods, added where missing."""
    from specgen.samplers.registry import method_names

    methods = list(methods or [m for m in DEFAULT_METHODS if m in method_names("speech")])
    relaxed = [m for m in ("pcg", "ssd") if m in methods]
    for needed in ("sd", "ar"):
        if needed not in methods and (needed == "ar" or relaxed):
            methods.insert(0, needed)
    return methods


def _check_prompts(generator, prompts: list[dict], max_new_tokens: int | None) -> None:
    """Every prompt gets its voice (the default where it names none) and is checked before any work."""
    from specgen.modalities.speech.models import DEFAULT_VOICE

    for p in prompts:
        p["voice"] = p["voice"] or DEFAULT_VOICE
        generator.max_new_tokens_for(p["text"], p["voice"], max_new_tokens)


def _sampled_round(generator, round_: Round, ar_step_s: float, max_new_tokens: int | None, scorer,
                   pooled: dict[str, list], bar) -> list[dict]:
    """One prompt and repeat: every variant in the round's order with the repeat's seed; each item carries its
    speedup over the round's `ar` (and `sd`) run."""
    prompt, walls, items = round_.prompt, {}, []
    for variant in round_.order:
        result = generator.generate(prompt["text"], voice=prompt["voice"], method=variant.method, seed=round_.repeat,
                                    max_new_tokens=max_new_tokens, ar_step_s=ar_step_s, decode=False, **variant.knobs)
        s = result.stats
        walls[variant.key] = s["wall_s"]
        pooled[variant.key].append(s)
        item = {"id": prompt["id"], "repeat": round_.repeat, "method": variant.method, "variant": variant.key,
                **variant.knobs, "tokens": len(result.tokens), "steps": s["steps"], "tau": s["tau"],
                "alpha_hat": s["alpha_hat"], "wall_s": s["wall_s"], "tokens_per_s": s["tokens_per_s"],
                "predicted_speedup_measured": s["predicted_speedup_measured"],
                "predicted_speedup_ideal": s["predicted_speedup_ideal"]}
        if scorer is not None:  # after the clock stopped: decoding and scoring are not timed
            item |= scorer.measure(generator.decode(result.tokens), prompt["text"], prompt["voice"])
        items.append(item)
        bar.update(1)
    for item in items:
        item["speedup_vs_ar"] = walls["ar"] / item["wall_s"] if item["wall_s"] else None
        if "sd" in walls:
            item["speedup_vs_sd"] = walls["sd"] / item["wall_s"] if item["wall_s"] else None
    return items


def _greedy_check(generator, prompt: dict, methods: list[str], max_new_tokens: int | None, bar) -> list[dict]:
    """Every method once at temperature 0 against `ar` (the first divergence where they differ)."""
    greedy = {m: generator.generate(prompt["text"], voice=prompt["voice"], method=m, temperature=0,
                                    max_new_tokens=max_new_tokens, decode=False).tokens for m in methods}
    bar.update(len(methods))
    entries = []
    for m in methods:
        same = greedy[m] == greedy["ar"]
        entry = {"id": prompt["id"], "method": m, "greedy": True, "identical_to_ar": same}
        if not same:
            entry["first_divergence"] = next((i for i, (a, b) in enumerate(zip(greedy[m], greedy["ar"])) if a != b),
                                             min(len(greedy[m]), len(greedy["ar"])))
        entries.append(entry)
    return entries


# ---- summaries ---------------------------------------------------------------------------------------------------

def _method_summaries(methods: list[str], variants: list[Variant], summaries: dict, items: list[dict]) -> dict:
    """Per method, the summary of its variant at the registry's default knob, and its greedy exactness."""
    defaults, summary = _knob_defaults(), {}
    for method in methods:
        key = next(v.key for v in variants if v.method == method and (v.knob is None or v.value == defaults[method]))
        greedy = [i["identical_to_ar"] for i in items if i.get("greedy") and i["method"] == method]
        summary[method] = {**summaries[key], "method": method, "identical_to_ar": all(greedy) if greedy else None}
    return summary


def _knob_defaults() -> dict[str, float]:
    """The registry's default theta of pcg and beta of ssd."""
    from specgen.samplers.registry import get_method

    return {m: next(k.default for k in get_method("speech", m).knobs if k.name == knob)
            for m, knob in SWEPT_KNOBS.items()}


def _checked_sweeps(methods: list[str], thetas, betas) -> dict[str, list[float]]:
    """method -> knob values to sweep, each checked against the registry's bounds before any model loads."""
    from specgen.errors import InvalidRequest
    from specgen.samplers.registry import get_method

    sweeps = {}
    for method, values, flag in (("pcg", thetas, "--thetas"), ("ssd", betas, "--betas")):
        if not values:
            continue
        if method not in methods:
            raise InvalidRequest(f"{flag} sweeps {method}, which is not among the methods ({', '.join(methods)})")
        spec = get_method("speech", method)
        sweeps[method] = [float(spec.resolve_knobs({SWEPT_KNOBS[method]: v})[SWEPT_KNOBS[method]]) for v in values]
    return sweeps


def _pooled_summary(method: str, stats: list[dict], runs: list[dict]) -> dict:
    """The bench summary of one method (or one swept variant of it) over its sampled runs."""
    per_prompt = list(prompt_medians(runs, "speedup_vs_ar", "id").values())
    speedup, ci = median_ci(per_prompt)
    committed, steps = sum(s["committed"] for s in stats), sum(s["row_steps"] for s in stats)
    accepted, rejections = sum(s["accepted"] for s in stats), sum(s["rejections"] for s in stats)
    drafted = sum(s["drafted"] for s in stats)
    return {
        "method": method, "lossless": stats[0]["lossless"], "runs": len(runs),
        "steps": sum(s["steps"] for s in stats), "drafted": drafted, "accepted": accepted,
        "committed": committed, "tau": committed / steps if steps else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "alpha_hat": accepted / (accepted + rejections) if accepted + rejections else None,
        "per_position_acceptance": _pooled_positions(stats),
        "wall_s": sum(s["wall_s"] for s in stats),
        "tokens_per_s": committed / sum(s["wall_s"] for s in stats),
        "speedup_vs_ar": speedup, "speedup_vs_ar_ci95": ci, "slowdowns": slowdowns(per_prompt),
        "predicted_speedup_measured": median(s["predicted_speedup_measured"] for s in stats),
        "predicted_speedup_ideal": median(s["predicted_speedup_ideal"] for s in stats),
        **_pooled_exact(stats),
    }


def _slower(slow: dict | None) -> str:
    if not slow or not slow["prompts"]:
        return "—"
    return f"{slow['slower_than_ar']}/{slow['prompts']}; {fmt(slow['worst_speedup'])}×"


def _default_draft_tokens() -> int:
    from specgen.samplers.registry import get_method

    return next(k.default for k in get_method("speech", "sd").knobs if k.name == "num_draft_tokens")


def _pooled_exact(stats: list[dict]) -> dict:
    """Lossy rules (pcg, ssd): the acceptance level and exact token-level sampling's alpha_hat on the same drafts."""
    if "acceptance_level" not in stats[0]:
        return {}
    accepted = sum(s["exact_accepted"] for s in stats)
    tested = accepted + sum(s["exact_rejections"] for s in stats)
    return {"acceptance_level": stats[0]["acceptance_level"], "exact_alpha_hat": accepted / tested if tested else None}


def _pooled_positions(stats: list[dict]) -> list:
    """Per draft depth: the runs' per-position acceptance, weighted by how often that depth was tested is not
    kept in the summaries, so this is the median over runs."""
    depth = max((len(s["per_position_acceptance"]) for s in stats), default=0)
    return [median(s["per_position_acceptance"][d] for s in stats if d < len(s["per_position_acceptance"]))
            for d in range(depth)]


# ---- the record --------------------------------------------------------------------------------------------------

def render_markdown(result: dict, plot_name: str | None = None) -> str:
    env = result["env"]
    lines = ["# specgen bench speech", "", run_line(env), "",
             f"Command: `{env.get('command', '')}`. Sampling: temperature {env['sampling']['temperature']}, top-k "
             f"{env['sampling']['top_k']}; `sd` drafts {env['draft_tokens']} tokens per step; prompts "
             f"`{env['prompts']}`, {env['repeats']} repeat(s); target `{env['model']}`, draft `{env['draft']}`.", "",
             "| method | lossless | τ | α̂ | acceptance per position | steps | tokens/s | speedup vs ar (95% CI) | "
             "predicted (measured costs) | predicted (ideal) | greedy identical to ar | slower than ar (prompts; "
             "worst) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in result["methods"].items():
        ci = m["speedup_vs_ar_ci95"]
        ci_text = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        positions = ", ".join(fmt(v) for v in m["per_position_acceptance"]) or "—"
        same = {True: "yes", False: "NO" if m["lossless"] else "no (lossy)", None: "—"}[m["identical_to_ar"]]
        alpha = fmt(m["alpha_hat"])
        if "exact_alpha_hat" in m:  # a lossy rule: its alpha_hat, and exact sampling's on the same drafts
            alpha += f" ({m['acceptance_level']}; exact {fmt(m['exact_alpha_hat'])})"
        lines.append(f"| `{name}` | {'yes' if m['lossless'] else 'no'} | {fmt(m['tau'])} | {alpha} | "
                     f"{positions} | {m['steps']} | {fmt(m['tokens_per_s'], 1)} | "
                     f"{fmt(m['speedup_vs_ar'])}×{ci_text} | {fmt(m['predicted_speedup_measured'])}× | "
                     f"{fmt(m['predicted_speedup_ideal'])}× | {same} | {_slower(m.get('slowdowns'))} |")
    lines += ["", "Speedup = median over prompts of (ar wall time / method wall time) in the same round, methods in "
                  "rotated order. Predicted (measured costs) = E(α̂, γ) · T_ar / (γ · T_draft + T_verify), from "
                  "this run's timings; τ and steps do not depend on the machine.", ""]
    if result.get("frontier"):
        from specgen.app.bench.speech_frontier import render_frontier_markdown

        lines.append(render_frontier_markdown(result["frontier"], plot_name))
    return "\n".join(lines)


def write_bench_speech(result: dict, out_dir: Path, latest_dir: Path | None = None) -> Written:
    """bench-speech-<time>.{json,md} (and .png with a quality frontier) in `out_dir`, and a copy in `latest_dir`
    (default: the same folder): speech-frontier-latest.{json,md,png} for a run with a quality frontier, else
    speech-latest.{json,md}."""
    from specgen.app.bench.speech_frontier import plot_frontier_png

    frontier = result.get("frontier")
    plotted = bool(frontier and frontier.get("choice") is not None)  # a plot needs the quality axis
    return write_record(result, out_dir, f"bench-speech-{result['env']['timestamp_utc']}",
                        lambda names: render_markdown(result, names.get("png")),
                        {"png": lambda path: plot_frontier_png(path, frontier)} if plotted else None,
                        "speech-frontier-latest" if plotted else "speech-latest", latest_dir)


def bench_speech(args) -> int:
    """`specgen bench speech` and `specgen bench speech-frontier` (the same options; the frontier's defaults)."""
    runs_dir, latest_dir = record_dirs(getattr(args, "out_dir", None))  # checked before any work
    result = run_bench_speech(prompts_path=args.prompts, methods=args.methods, repeats=args.repeats,
                              max_new_tokens=args.max_new_tokens, thetas=getattr(args, "thetas", None),
                              betas=getattr(args, "betas", None), quality=not getattr(args, "no_quality", False),
                              corpus=getattr(args, "corpus", None),
                              swap_utterances=getattr(args, "swap_utterances", None) or SWAP_UTTERANCES,
                              swap_rate=1.0 if getattr(args, "swap_rate", None) is None else args.swap_rate,
                              start=start_run())
    result["env"]["command"] = command_line(args)
    print_outcome(result, write_bench_speech(result, runs_dir, latest_dir), args.json)
    return 0


def bench_speech_frontier(args) -> int:
    """`specgen bench speech-frontier`: `bench speech` with quality scoring on the frontier prompts
    (benchmarks/prompts/speech-frontier.jsonl unless --prompts), the run behind speech-frontier-latest.*."""
    args.prompts = args.prompts or benchmarks_dir() / "prompts" / "speech-frontier.jsonl"
    return bench_speech(args)
