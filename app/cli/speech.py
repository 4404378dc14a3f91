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
    from specgen.samplers.registry import knob_owners

    knobs = {name: getattr(args, name) for name in KNOB_FLAGS if getattr(args, name, None) is not None}
    own = {knob.name for knob in spec.knobs}
    for name in knobs:
        if name not in own:
            takers = knob_owners("speech")[name]
            raise InvalidRequest(f"{KNOB_FLAGS[name]} applies to {', '.join(takers)}, not {spec.name!r}")
    spec.resolve_knobs(knobs)
    return knobs


def generate_speech(args) -> int:
    from tqdm import tqdm

    from specgen.modalities.speech.codec import write_wav
    from specgen.modalities.speech.generator import SpeechGenerator
    from specgen.modalities.speech.models import DEFAULT_VOICE
    from specgen.samplers.registry import default_method, get_method
    from specgen.samplers.stats import SpecStats

    method = args.method or default_method("speech")
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
    # the acoustic tokens: EOS and (interleaved layout) the characters spoken again are not frames
    groups = generator.vocab.acoustic_tags(tokens, groups)
    tokens = generator.vocab.acoustic(tokens)
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


SWAP_UTTERANCES = 48  # held-out corpus utterances in the token-swap stress test
REFERENCE_PER_VOICE = 8  # training utterances per voice behind the speaker-similarity profiles


def run_bench_speech(*, prompts_path: Path | None = None, methods: list[str] | None = None, repeats: int = 1,
                     max_new_tokens: int | None = None, generator=None, greedy_check: bool = True,
                     thetas: list[float] | None = None, betas: list[float] | None = None, quality: bool = False,
                     corpus: Path | None = None, swap_utterances: int = SWAP_UTTERANCES, swap_rate: float = 1.0,
                     reference_per_voice: int = REFERENCE_PER_VOICE) -> dict:
    """Every method (pcg once per theta, ssd once per beta) on every prompt and repeat, in rotated order with the
    same seed. With `quality`, each sampled run is also decoded and scored (WER, speaker-similarity proxy) and the
    token-swap stress test runs on held-out utterances of `corpus`; the frontier goes under "frontier"."""
    import torch
    from tqdm import tqdm

    from specgen import settings
    from specgen.app.bench.text import _cpu_model, _load, benchmarks_dir, source_state
    from specgen.app.bench.speech_frontier import DEFAULT_THETAS, sweep_variants
    from specgen.modalities.speech.generator import SpeechGenerator
    from specgen.modalities.speech.models import DEFAULT_VOICE
    from specgen.samplers.registry import method_names

    prompts_path = prompts_path or benchmarks_dir() / "prompts" / "speech.jsonl"
    prompts = load_speech_prompts(prompts_path)
    methods = list(methods or [m for m in DEFAULT_METHODS if m in method_names("speech")])
    relaxed = [m for m in ("pcg", "ssd") if m in methods]
    for needed in ("sd", "ar"):  # ar: the baseline of every ratio; sd: the exact reference of relaxed methods
        if needed not in methods and (needed == "ar" or relaxed):
            methods.insert(0, needed)
    sweeps = _checked_sweeps(methods, DEFAULT_THETAS if thetas is None and "pcg" in methods else thetas, betas)
    variants = sweep_variants(methods, sweeps, _knob_defaults())
    generator = generator or SpeechGenerator()
    for p in prompts:  # every prompt is checked before any work
        p["voice"] = p["voice"] or DEFAULT_VOICE
        generator.max_new_tokens_for(p["text"], p["voice"], max_new_tokens)
    thetas = [v.value for v in variants if v.method == "pcg"]
    for theta in thetas:  # groups are built (or loaded) before any timing
        generator.groups(theta)
    scorer = _QualityScorer.build(generator, prompts, corpus, swap_utterances, reference_per_voice) if quality else None
    load_before = _load()
    generator.generate(prompts[0]["text"], method="ar", max_new_tokens=8, decode=False)  # warm-up
    items, pooled = [], {v.key: [] for v in variants}
    total = len(prompts) * (repeats * len(variants) + (len(methods) if greedy_check else 0))
    with tqdm(total=total, desc="bench speech", unit="run", file=sys.stderr) as progress:
        for k, prompt in enumerate(prompts):
            ar_step_s = generator.measure_step_s(prompt["text"], prompt["voice"])
            for repeat in range(repeats):
                shift = (k + repeat) % len(variants)
                walls, round_items = {}, []
                for variant in variants[shift:] + variants[:shift]:  # rotated order per prompt and repeat
                    result = generator.generate(prompt["text"], voice=prompt["voice"], method=variant.method,
                                                seed=repeat, max_new_tokens=max_new_tokens, ar_step_s=ar_step_s,
                                                decode=False, **variant.knobs)
                    s = result.stats
                    walls[variant.key] = s["wall_s"]
                    pooled[variant.key].append(s)
                    item = {"id": prompt["id"], "repeat": repeat, "method": variant.method, "variant": variant.key,
                            **variant.knobs, "tokens": len(result.tokens), "steps": s["steps"], "tau": s["tau"],
                            "alpha_hat": s["alpha_hat"], "wall_s": s["wall_s"], "tokens_per_s": s["tokens_per_s"],
                            "predicted_speedup_measured": s["predicted_speedup_measured"],
                            "predicted_speedup_ideal": s["predicted_speedup_ideal"]}
                    if scorer is not None:  # after the clock stopped: decoding and scoring are not timed
                        item |= scorer.measure(generator.decode(result.tokens), prompt["text"], prompt["voice"])
                    round_items.append(item)
                    progress.update(1)
                for item in round_items:
                    item["speedup_vs_ar"] = walls["ar"] / item["wall_s"] if item["wall_s"] else None
                    if "sd" in walls:
                        item["speedup_vs_sd"] = walls["sd"] / item["wall_s"] if item["wall_s"] else None
                items += round_items
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
    summaries = {v.key: _pooled_summary(v.method, pooled[v.key], [i for i in items if i.get("variant") == v.key])
                 for v in variants}
    summary = {}
    defaults = _knob_defaults()
    for method in methods:
        key = next(v.key for v in variants if v.method == method and (v.knob is None or v.value == defaults[method]))
        greedy = [i["identical_to_ar"] for i in items if i.get("greedy") and i["method"] == method]
        summary[method] = {**summaries[key], "method": method, "identical_to_ar": all(greedy) if greedy else None}
    result = {"methods": summary, "items": items}
    if relaxed:
        result["frontier"] = _frontier(variants, summaries, items, scorer, generator, thetas, swap_rate)
    load_after = _load()
    processing = generator.processing()
    result["env"] = {"timestamp_utc": datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"), **source_state(),
                     "prompts": str(prompts_path), "repeats": repeats, "threads": torch.get_num_threads(),
                     "cpu_model": _cpu_model(), "settings": settings.snapshot(), "load_before": load_before,
                     "load_after": load_after,
                     "torch": torch.__version__, "max_new_tokens": max_new_tokens,
                     "sampling": {"temperature": processing.temperature, "top_k": processing.top_k},
                     "model": str(generator.model_path), "draft": str(generator.draft_path),
                     "draft_tokens": _default_draft_tokens(), "variants": [v.key for v in variants],
                     "quality": quality}
    return result


def _knob_defaults() -> dict[str, float]:
    """The registry's default theta of pcg and beta of ssd."""
    from specgen.app.bench.speech_frontier import SWEPT_KNOBS
    from specgen.samplers.registry import get_method

    return {m: next(k.default for k in get_method("speech", m).knobs if k.name == knob)
            for m, knob in SWEPT_KNOBS.items()}


def _checked_sweeps(methods: list[str], thetas, betas) -> dict[str, list[float]]:
    """method -> knob values to sweep, each checked against the registry's bounds before any model loads."""
    from specgen.app.bench.speech_frontier import SWEPT_KNOBS
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
    from specgen.app.bench.text import bootstrap_median_ci

    per_prompt = {}
    for run in runs:
        per_prompt.setdefault(run["id"], []).append(run["speedup_vs_ar"])
    speedups = [statistics.median(v) for v in per_prompt.values()]
    median, low, high = bootstrap_median_ci(speedups)
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
        "speedup_vs_ar": median, "speedup_vs_ar_ci95": [low, high] if len(speedups) > 1 else None,
        "predicted_speedup_measured": _median([s["predicted_speedup_measured"] for s in stats]),
        "predicted_speedup_ideal": _median([s["predicted_speedup_ideal"] for s in stats]),
        **_pooled_exact(stats),
    }


class _QualityScorer:
    """Decoded speech -> {"edits", "words", "similarity"}: pocketsphinx with a unigram LM over the evaluation
    sentences' words (as `specgen.modalities.speech.evaluate`), and the speaker-similarity proxy against voice
    profiles built from training utterances of the corpus decoded through the same codec."""

    def __init__(self, recogniser, profiles, swap_set, corpus_path, references):
        self.recogniser, self.profiles, self.swap_set = recogniser, profiles, swap_set
        self.corpus_path, self.references = corpus_path, references

    @classmethod
    def build(cls, generator, prompts, corpus, swap_utterances: int, reference_per_voice: int) -> "_QualityScorer":
        from specgen.errors import InvalidRequest
        from specgen.modalities.speech.evaluate import Recogniser
        from specgen.modalities.speech.models import default_paths
        from specgen.modalities.speech.quality import VoiceProfiles, decoded_references, load_corpus, split_corpus
        from specgen.modalities.speech.train import VAL_UTTERANCES

        corpus = Path(corpus or default_paths()["codec"].parent / "corpus")
        training, held_out = split_corpus(load_corpus(corpus), VAL_UTTERANCES)
        if any(int(u.tokens.max(initial=0)) >= generator.vocab.num_tokens for u in training + held_out):
            raise InvalidRequest(f"the corpus {corpus} has tokens beyond the codebook's {generator.vocab.num_tokens}")
        missing = sorted({p["voice"] for p in prompts} - {u.voice for u in training})
        if missing:
            raise InvalidRequest(f"the corpus {corpus} has no utterances of voice(s) {', '.join(missing)}")
        recogniser = Recogniser([p["text"] for p in prompts] + [u.text for u in held_out])
        swap_set = [u for u in held_out if recogniser.covers(u.text)][:swap_utterances]  # words pocketsphinx knows
        references = decoded_references(generator.codec, training, reference_per_voice)
        return cls(recogniser, VoiceProfiles.fit(references, generator.codec.cfg), swap_set, corpus,
                   {v: len(a) for v, a in references.items()})

    def measure(self, audio, text: str, voice: str) -> dict:
        edits, words = self.recogniser.errors(audio, text)
        return {"edits": edits, "words": words, "similarity": self.profiles.similarity(audio, voice)}

    def describe(self) -> dict:
        from importlib.metadata import version

        from specgen.modalities.speech.quality import CEPSTRA

        return {"recogniser": f"pocketsphinx {version('pocketsphinx')} (en-us acoustic model and dictionary) with a "
                              "unigram LM over the words of the prompts and the held-out swap-test sentences",
                "speaker_proxy": f"cosine between the standardised mean and std of cepstra c1..c{CEPSTRA - 1} over "
                                 "speech frames and the voice's profile, the mean over "
                                 f"{min(self.references.values(), default=0)} corpus training utterances of that "
                                 "voice decoded through the same codec",
                "corpus": str(self.corpus_path), "references_per_voice": self.references}


def _frontier(variants, summaries, items, scorer, generator, thetas, swap_rate: float) -> dict:
    from specgen.app.bench.speech_frontier import (QualityBound, choose_theta, quality_deltas, speedup,
                                             summarise_swaps)
    from specgen.modalities.speech.quality import separation, swap_test

    rows = []
    for v in variants:
        s = summaries[v.key]
        row = {"variant": v.key, "label": v.label, "method": v.method, "knob": v.knob, "value": v.value,
               "lossless": s["lossless"], "runs": s["runs"], "tau": s["tau"], "alpha_hat": s["alpha_hat"],
               "exact_alpha_hat": s.get("exact_alpha_hat"), "acceptance_level": s.get("acceptance_level"),
               **speedup(items, v.key, "speedup_vs_ar"), **speedup(items, v.key, "speedup_vs_sd")}
        rows.append(row | (quality_deltas(items, v.key) if scorer is not None else {}))
    frontier = {"rows": rows, "swap_test": [], "swap_rows": [], "speaker_proxy": None, "choice": None,
                "setup": {"swap_rate": swap_rate, "thetas": list(thetas)}}
    if scorer is None:
        return frontier

    def measure(audio, utterance):
        return scorer.measure(audio, utterance.text, utterance.voice)

    swap_rows, decoded = swap_test(generator.codec, scorer.swap_set, {t: generator.groups(t) for t in thetas},
                                   measure, rate=swap_rate)
    swaps = summarise_swaps(swap_rows)
    frontier |= {"swap_test": swaps, "swap_rows": swap_rows, "speaker_proxy": separation(scorer.profiles, decoded),
                 "choice": choose_theta(rows, swaps, QualityBound()),
                 "setup": {**frontier["setup"], **scorer.describe()}}
    return frontier


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


def render_markdown(result: dict, plot_name: str | None = None) -> str:
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
    if result.get("frontier"):
        from specgen.app.bench.speech_frontier import render_frontier_markdown

        lines.append(render_frontier_markdown(result["frontier"], plot_name))
    return "\n".join(lines)


def bench_speech(args) -> int:
    from specgen.app.bench.text import record_dirs

    runs_dir, latest_dir = record_dirs(getattr(args, "out_dir", None))  # checked before any work
    started = time.perf_counter()
    result = run_bench_speech(prompts_path=args.prompts, methods=args.methods, repeats=args.repeats,
                              max_new_tokens=args.max_new_tokens, thetas=getattr(args, "thetas", None),
                              betas=getattr(args, "betas", None), quality=not getattr(args, "no_quality", False),
                              corpus=getattr(args, "corpus", None),
                              swap_utterances=getattr(args, "swap_utterances", None) or SWAP_UTTERANCES,
                              swap_rate=1.0 if getattr(args, "swap_rate", None) is None else args.swap_rate)
    result["env"]["command"] = "specgen " + " ".join(getattr(args, "argv", []))
    result["env"]["wall_s"] = time.perf_counter() - started
    paths = write_bench_speech(result, runs_dir, latest_dir)
    if args.json:
        print(json.dumps(result))
    else:
        print(paths["md"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0


def write_bench_speech(result: dict, out_dir: Path, latest_dir: Path | None = None) -> dict[str, Path]:
    """bench-speech-<time>.{json,md} (and .png with a quality frontier) in `out_dir`; a run with a quality frontier
    also becomes speech-frontier-latest.{json,md,png} in `latest_dir` (default: the same folder)."""
    import shutil

    from specgen.app.bench.speech_frontier import plot_frontier_png

    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result["env"]["timestamp_utc"]
    paths = {"json": out_dir / f"bench-speech-{stamp}.json", "md": out_dir / f"bench-speech-{stamp}.md"}
    frontier = result.get("frontier")
    if frontier and frontier.get("choice") is not None:  # a plot needs the quality axis
        paths["png"] = out_dir / f"bench-speech-{stamp}.png"
        plot_frontier_png(paths["png"], frontier)
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["md"].write_text(render_markdown(result, paths["png"].name if "png" in paths else None))
    if "png" in paths:
        latest_dir = latest_dir or out_dir
        latest = {kind: latest_dir / f"speech-frontier-latest.{kind}" for kind in ("json", "png")}
        for kind, path in latest.items():
            shutil.copyfile(paths[kind], path)
        (latest_dir / "speech-frontier-latest.md").write_text(render_markdown(result, latest["png"].name))
    return paths


# ---- train -------------------------------------------------------------------------------------------------------


def train_speech(args) -> int:
    from specgen.modalities.speech.train import main as train_main

    argv = ["--role", args.role, "--seed", str(args.seed), "--threads", str(args.threads)]
    if args.steps:
        argv += ["--steps", str(args.steps)]
    if getattr(args, "tokens", None):
        argv += ["--tokens", str(args.tokens)]
    argv += ["--layout", getattr(args, "layout", "auto")] + (["--bf16"] if getattr(args, "bf16", False) else [])
    argv += ["--teacher", str(args.teacher)] if getattr(args, "teacher", None) else []
    if args.out:
        argv += ["--run-dir", str(args.out), "--out", str(args.out / "export")]
    return int(train_main(argv) or 0)
