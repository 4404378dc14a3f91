"""`specgen calibrate`: measure this machine's step costs for a model (what `auto` decides with) and cache them.

The first `auto` request measures them anyway; this command does it ahead of time, and `--force` measures again.
"""

from __future__ import annotations

import argparse
import json

from specgen.samplers import registry


def add_calibrate_parser(commands, command) -> None:
    p = command(commands, "calibrate", "measure this machine's step costs for a model (what the default method "
                "`auto` decides with), cached in the user cache", "calibrate", handler=_calibrate)
    p.add_argument("modality", nargs="?", default="text", choices=registry.MODALITIES,
                   help="default: text")
    p.add_argument("--model", help="target model (default: the modality's default)")
    p.add_argument("--draft", help="text or speech draft model (default: the model's shipped draft)")
    p.add_argument("--force", action="store_true", help="measure again even if a calibration is cached")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _calibrate(args: argparse.Namespace) -> int:
    import time

    from specgen.modalities import calibration
    from specgen.modalities.auto import calibration_paths

    generator, prompt = _generator(args)
    key = calibration.machine_key(generator.modality, calibration_paths(generator))
    if args.force:
        calibration.cache_path(key).unlink(missing_ok=True)
    started = time.perf_counter()
    pipeline = _pipeline(generator, prompt)
    record = calibration.load(key) or {}
    summary = {"file": str(calibration.cache_path(key)), "key": key, "seconds": round(time.perf_counter() - started, 2),
               "T_verify_ms": {n: round(s * 1e3, 3) for n, s in sorted(record.get("verify_s", {}).items(),
                                                                      key=lambda kv: int(kv[0]))},
               "draft_ms": {name: [round(v * 1e3, 3) for v in fixed_per_token]
                            for name, fixed_per_token in record.get("draft_s", {}).items()},
               "prior": record.get("prior", {}), "busy": bool(record.get("busy")),
               "first_choice": pipeline.drafter.run_summary()["auto"]["initial"]}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"calibration for {', '.join(key['models'])} on {key['cpu']} ({key['threads']} threads, torch "
          f"{key['torch']}): {summary['file']}")
    if record.get("busy"):
        print("  measured while other work shared the CPU: the first request on a quiet machine measures it again")
    print("  T_verify (ms) by window: " + ", ".join(f"{n}: {ms}" for n, ms in summary["T_verify_ms"].items()))
    for name, (fixed, per_token) in summary["draft_ms"].items():
        prior = summary["prior"].get(name, {})
        speedups = "/".join(f"{x:.2f}" for x in prior.get("speedups") or [prior.get("speedup") or 0.0])
        print(f"  {name}: drafting {fixed} ms + {per_token} ms/token, alpha {prior.get('alpha', 0):.2f}, "
              f"tau {prior.get('tau', 1):.2f}, speedup {speedups}x (per calibration prompt)")
    initial = summary["first_choice"]
    print(f"  auto's first choice for the example prompt: {initial['method']} (length {initial['length']}); "
          "predicted speedups: " + ", ".join(f"{n} {p:.2f}x" for n, p in initial["predicted"].items()))
    return 0


def _generator(args):
    if args.modality == "text":
        from specgen.modalities.text.generator import TextGenerator

        generator = TextGenerator(args.model, args.draft, threads=args.threads)
        return generator, generator.example_prompt
    if args.modality in ("image", "video"):
        from specgen.modalities.image.generator import ImageGenerator

        return ImageGenerator(args.model, threads=args.threads, video=args.modality == "video"), "red K on blue"
    from specgen.modalities.speech.generator import SpeechGenerator

    generator = SpeechGenerator(args.model, args.draft, threads=args.threads)
    return generator, generator.example_prompt


def _pipeline(generator, prompt: str):
    """An `auto` pipeline for the example request: building it measures what the cache lacks."""
    if generator.modality == "text":
        return generator.pipeline("auto", [generator.encode(prompt)], max_new_tokens=32)
    if generator.modality == "speech":
        from specgen.modalities.speech.models import DEFAULT_VOICE

        return generator._request(prompt, DEFAULT_VOICE, "auto", 1, None, None, {})[0]
    return generator.pipeline("auto", [generator.vocab.prompt_ids(prompt)])
