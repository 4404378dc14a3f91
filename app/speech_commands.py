"""`specgen generate speech`, `specgen bench speech` and `specgen train speech`."""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

DEFAULT_METHODS = ("ar", "sd", "ssd", "pcg")


def _check_voice_and_text(generator, text: str, voice: str) -> None:
    generator.vocab.prompt_ids(text, voice)


KNOB_FLAGS = {"num_draft_tokens": "--num-draft-tokens", "theta": "--theta", "beta": "--beta"}


def _method_knobs(spec, args) -> dict:
    """The method knobs given as flags, checked against the method (a flag it does not take is an error)."""
    from specgen.errors import InvalidRequest

    knobs = {name: getattr(args, name) for name in KNOB_FLAGS if getattr(args, name, None) is not None}
    own = {knob.name for knob in spec.knobs}
    for name in knobs:
        if name not in own:
            raise InvalidRequest(f"{KNOB_FLAGS[name]} applies to {', '.join(_methods_with(name))}, not {spec.name!r}")
    spec.resolve_knobs(knobs)
    return knobs


def _methods_with(knob: str) -> list[str]:
    from specgen.samplers.registry import get_method, method_names

    return [m for m in method_names("speech") if any(k.name == knob for k in get_method("speech", m).knobs)]


def generate_speech(args) -> int:
    from tqdm import tqdm

    from specgen.modalities.speech.codec import write_wav
    from specgen.modalities.speech.generator import SpeechGenerator
    from specgen.modalities.speech.models import DEFAULT_VOICE
    from specgen.samplers.registry import get_method
    from specgen.samplers.stats import SpecStats

    method = args.method or "sd"
    spec = get_method("speech", method)
    knobs = _method_knobs(spec, args)  # before any model loads: a bad knob is a quick one-line error
    generator = SpeechGenerator(model=args.model, draft=args.draft, codec=args.codec, threads=args.threads)
    voice = args.voice or DEFAULT_VOICE
    # check the whole request before the progress bar starts, so an error stays one line
    _check_voice_and_text(generator, args.text, voice)
    limit = generator.max_new_tokens_for(args.text, voice, args.max_new_tokens)
    processing = generator.processing(temperature=args.temperature, top_k=args.top_k)
    if spec.drafter is not None:
        generator.draft_model  # noqa: B018 - load (and check) the draft before decoding starts
    generator.rule(method, processing, spec.resolve_knobs(knobs))  # builds (or loads) pcg's groups up front
    stats, tokens, groups = SpecStats(), [], []
    started = time.perf_counter()
    with tqdm(total=limit, desc=method, unit="tok", file=sys.stderr, disable=args.json) as progress:
        for event in generator.stream(args.text, method=method, voice=voice, max_new_tokens=args.max_new_tokens,
                                      temperature=args.temperature, top_k=args.top_k, seed=args.seed, stats=stats,
                                      **knobs):
            tokens.extend(event.tokens)
            groups.extend(event.extra.get("groups", ()))  # pcg: the group of every committed token
            progress.update(len(event.tokens))
    wall_s = time.perf_counter() - started
    summary = stats.summary(method=method, lossless=spec.lossless, wall_s=wall_s,
                            ar_step_s=generator.measure_step_s(args.text, voice))
    groups = [g for t, g in zip(tokens, groups) if t != generator.vocab.eos]
    tokens = [t for t in tokens if t != generator.vocab.eos]
    summary["audio_s"] = len(tokens) / generator.codec.cfg.frame_rate
    write_wav(args.out, generator.decode(tokens), generator.sample_rate)
    if args.json:
        print(json.dumps({"out": str(args.out), "tokens": tokens, **({"groups": groups} if groups else {}),
                          "stats": summary}))
    else:
        print(str(args.out))
        print(f"[{method}] tau {summary['tau']:.2f}, {summary['steps']} steps for {len(tokens)} tokens "
              f"({summary['audio_s']:.2f} s of audio), {wall_s:.1f} s{_relaxed_note(summary)}", file=sys.stderr)
    return 0


def _relaxed_note(summary: dict) -> str:
    """For lossy rules: their alpha_hat next to that of exact token-level sampling on the same drafts."""
    if "acceptance_level" not in summary or summary.get("alpha_hat") is None:
        return ""
    exact = summary.get("exact_alpha_hat")
    return (f"; {summary['acceptance_level']}-level alpha_hat {summary['alpha_hat']:.2f}, exact sampling's "
            f"{'—' if exact is None else f'{exact:.2f}'} on the same drafts")


# ---- bench -------------------------------------------------------------------------------------------------------


def load_speech_prompts(path: Path) -> list[dict]:
    """JSON Lines of {"id", "text"} (optional "voice"); any problem is an InvalidRequest naming the line."""
    from specgen.app.jsonl import read_objects
    from specgen.errors import InvalidRequest

    prompts, seen = [], set()
    for number, item in read_objects(path, "prompts file"):
        where = f"{path} line {number}"
        for key in ("id", "text"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise InvalidRequest(f"{where}: {key!r} must be a non-empty string")
        if item["id"] in seen:
            raise InvalidRequest(f"{where}: id {item['id']!r} is used twice")
        if "voice" in item and not isinstance(item["voice"], str):
            raise InvalidRequest(f"{where}: 'voice' must be a string")
        seen.add(item["id"])
        prompts.append({"id": item["id"], "text": item["text"], "voice": item.get("voice")})
    if not prompts:
        raise InvalidRequest(f"prompts file {path} holds no prompts")
    return prompts


def run_bench_speech(*, prompts_path: Path | None = None, methods: list[str] | None = None, repeats: int = 1,
                     max_new_tokens: int | None = None, generator=None, greedy_check: bool = True) -> dict:
    import torch
    from tqdm import tqdm

    from specgen.app.bench_text import _cpu_model, _load, benchmarks_dir, bootstrap_median_ci, source_state
    from specgen.modalities.speech.generator import SpeechGenerator
    from specgen.modalities.speech.models import DEFAULT_VOICE
    from specgen.samplers.registry import method_names

    prompts_path = prompts_path or benchmarks_dir() / "prompts" / "speech.jsonl"
    prompts = load_speech_prompts(prompts_path)
    methods = list(methods or [m for m in DEFAULT_METHODS if m in method_names("speech")])
    if "ar" not in methods:
        methods.insert(0, "ar")  # the baseline of every ratio
    generator = generator or SpeechGenerator()
    for p in prompts:  # every prompt is checked before any work
        p["voice"] = p["voice"] or DEFAULT_VOICE
        generator.max_new_tokens_for(p["text"], p["voice"], max_new_tokens)
    load_before = _load()
    generator.generate(prompts[0]["text"], method="ar", max_new_tokens=8, decode=False)  # warm-up
    items, pooled = [], {m: [] for m in methods}
    total = len(prompts) * (repeats * len(methods) + (len(methods) if greedy_check else 0))
    with tqdm(total=total, desc="bench speech", unit="run", file=sys.stderr) as progress:
        for k, prompt in enumerate(prompts):
            ar_step_s = generator.measure_step_s(prompt["text"], prompt["voice"])
            for repeat in range(repeats):
                shift = (k + repeat) % len(methods)
                walls = {}
                for method in methods[shift:] + methods[:shift]:  # rotated order per prompt and repeat
                    result = generator.generate(prompt["text"], voice=prompt["voice"], method=method, seed=repeat,
                                                max_new_tokens=max_new_tokens, ar_step_s=ar_step_s, decode=False)
                    s = result.stats
                    walls[method] = s["wall_s"]
                    pooled[method].append(s)
                    items.append({"id": prompt["id"], "repeat": repeat, "method": method, "tokens": len(result.tokens),
                                  "steps": s["steps"], "tau": s["tau"], "alpha_hat": s["alpha_hat"],
                                  "wall_s": s["wall_s"], "tokens_per_s": s["tokens_per_s"],
                                  "predicted_speedup_measured": s["predicted_speedup_measured"],
                                  "predicted_speedup_ideal": s["predicted_speedup_ideal"]})
                    progress.update(1)
                for item in items[-len(methods):]:
                    item["speedup_vs_ar"] = walls["ar"] / item["wall_s"] if item["wall_s"] else None
            if greedy_check:
                greedy = {m: generator.generate(prompt["text"], voice=prompt["voice"], method=m, temperature=0,
                                                max_new_tokens=max_new_tokens, decode=False).tokens for m in methods}
                progress.update(len(methods))
                for m in methods:
                    same = greedy[m] == greedy["ar"]
                    entry = {"id": prompt["id"], "method": m, "greedy": True, "identical_to_ar": same}
                    if not same:
                        entry["first_divergence"] = next((i for i, (a, b) in enumerate(zip(greedy[m], greedy["ar"]))
                                                          if a != b), min(len(greedy[m]), len(greedy["ar"])))
                    items.append(entry)
    load_after = _load()
    summary = {}
    for method in methods:
        runs = [i for i in items if i["method"] == method and not i.get("greedy")]
        per_prompt = {}
        for run in runs:
            per_prompt.setdefault(run["id"], []).append(run["speedup_vs_ar"])
        speedups = [statistics.median(v) for v in per_prompt.values()]
        median, low, high = bootstrap_median_ci(speedups)
        stats = pooled[method]
        committed, steps = sum(s["committed"] for s in stats), sum(s["row_steps"] for s in stats)
        accepted, rejections = sum(s["accepted"] for s in stats), sum(s["rejections"] for s in stats)
        drafted = sum(s["drafted"] for s in stats)
        greedy = [i["identical_to_ar"] for i in items if i.get("greedy") and i["method"] == method]
        summary[method] = {
            "method": method, "lossless": stats[0]["lossless"], "runs": len(runs),
            "steps": sum(s["steps"] for s in stats), "drafted": drafted, "accepted": accepted,
            "committed": committed, "tau": committed / steps if steps else None,
            "acceptance_rate": accepted / drafted if drafted else None,
            "alpha_hat": accepted / (accepted + rejections) if accepted + rejections else None,
            "per_position_acceptance": _pooled_positions(stats),
            "wall_s": sum(s["wall_s"] for s in stats),
            "tokens_per_s": committed / sum(s["wall_s"] for s in stats),
            "speedup_vs_ar": median, "speedup_vs_ar_ci95": [low, high] if len(speedups) > 1 else None,
            "predicted_speedup_measured": _median([s["predicted_speedup_measured"] for s in stats]),
            "predicted_speedup_ideal": _median([s["predicted_speedup_ideal"] for s in stats]),
            "identical_to_ar": all(greedy) if greedy else None,
            **_pooled_exact(stats),
        }
    processing = generator.processing()
    env = {"timestamp_utc": datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"), **source_state(),
           "prompts": str(prompts_path), "repeats": repeats, "threads": torch.get_num_threads(),
           "cpu_model": _cpu_model(), "load_before": load_before, "load_after": load_after,
           "torch": torch.__version__, "max_new_tokens": max_new_tokens,
           "sampling": {"temperature": processing.temperature, "top_k": processing.top_k},
           "model": str(generator.model_path), "draft": str(generator.draft_path),
           "draft_tokens": _default_draft_tokens()}
    return {"methods": summary, "items": items, "env": env}


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


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _pooled_positions(stats: list[dict]) -> list:
    """Per draft depth: the runs' per-position acceptance, weighted by how often that depth was tested is not
    kept in the summaries, so this is the median over runs."""
    depth = max((len(s["per_position_acceptance"]) for s in stats), default=0)
    return [_median([s["per_position_acceptance"][d] for s in stats if d < len(s["per_position_acceptance"])])
            for d in range(depth)]


def _f(value, digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def render_markdown(result: dict) -> str:
    env = result["env"]
    lines = ["# specgen bench speech", "",
             f"{env['timestamp_utc']} · commit {env.get('commit') or '?'} · {env['cpu_model']} · "
             f"{env['threads']} thread(s) · load {env.get('load_before')} → {env.get('load_after')}", "",
             f"Command: `{env.get('command', '')}`. Sampling: temperature {env['sampling']['temperature']}, top-k "
             f"{env['sampling']['top_k']}; `sd` drafts {env['draft_tokens']} tokens per step; prompts "
             f"`{env['prompts']}`, {env['repeats']} repeat(s); target `{env['model']}`, draft `{env['draft']}`.", "",
             "| method | lossless | τ | α̂ | acceptance per position | steps | tokens/s | speedup vs ar (95% CI) | "
             "predicted (measured costs) | predicted (ideal) | greedy identical to ar |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in result["methods"].items():
        ci = m["speedup_vs_ar_ci95"]
        ci_text = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        positions = ", ".join(_f(v) for v in m["per_position_acceptance"]) or "—"
        same = {True: "yes", False: "NO" if m["lossless"] else "no (lossy)", None: "—"}[m["identical_to_ar"]]
        alpha = _f(m["alpha_hat"])
        if "exact_alpha_hat" in m:  # a lossy rule: its alpha_hat, and exact sampling's on the same drafts
            alpha += f" ({m['acceptance_level']}; exact {_f(m['exact_alpha_hat'])})"
        lines.append(f"| `{name}` | {'yes' if m['lossless'] else 'no'} | {_f(m['tau'])} | {alpha} | "
                     f"{positions} | {m['steps']} | {_f(m['tokens_per_s'], 1)} | {_f(m['speedup_vs_ar'])}×{ci_text} | "
                     f"{_f(m['predicted_speedup_measured'])}× | {_f(m['predicted_speedup_ideal'])}× | {same} |")
    lines += ["", "Speedup = median over prompts of (ar wall time / method wall time) in the same round, methods in "
                  "rotated order. Predicted (measured costs) = E(α̂, γ) · T_ar / (γ · T_draft + T_verify), from "
                  "this run's timings; τ and steps do not depend on the machine.", ""]
    return "\n".join(lines)


def bench_speech(args) -> int:
    from specgen.app.bench_text import benchmarks_dir

    started = time.perf_counter()
    result = run_bench_speech(prompts_path=args.prompts, methods=args.methods, repeats=args.repeats,
                              max_new_tokens=args.max_new_tokens)
    result["env"]["command"] = "specgen " + " ".join(getattr(args, "argv", []))
    result["env"]["wall_s"] = time.perf_counter() - started
    out_dir = Path(getattr(args, "out_dir", None) or benchmarks_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result["env"]["timestamp_utc"]
    paths = [out_dir / f"bench-speech-{stamp}.json", out_dir / f"bench-speech-{stamp}.md"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(render_markdown(result))
    if args.json:
        print(json.dumps(result))
    else:
        print(paths[1].read_text())
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


# ---- train -------------------------------------------------------------------------------------------------------


def train_speech(args) -> int:
    from specgen.modalities.speech.train import main as train_main

    argv = ["--role", args.role, "--seed", str(args.seed), "--threads", str(args.threads)]
    if args.steps:
        argv += ["--steps", str(args.steps)]
    if getattr(args, "tokens", None):
        argv += ["--tokens", str(args.tokens)]
    if args.out:
        argv += ["--run-dir", str(args.out), "--out", str(args.out / "export")]
    return int(train_main(argv) or 0)
