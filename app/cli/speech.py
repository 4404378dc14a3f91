"""`specgen generate speech` (`specgen bench speech` is app/bench/speech.py, `specgen train speech` train.py)."""

from __future__ import annotations

import time


def generate_speech(args) -> int:
    from specgen.app.cli.media import print_saved, with_progress
    from specgen.app.cli.options import method_knobs, request_values
    from specgen.modalities.speech.codec import write_wav
    from specgen.modalities.speech.generator import SpeechGenerator
    from specgen.modalities.speech.models import DEFAULT_VOICE
    from specgen.samplers.registry import default_method, get_method
    from specgen.samplers.stats import SpecStats

    method = args.method or default_method("speech")
    spec = get_method("speech", method)
    knobs = method_knobs(args, "speech", method)  # before any model loads: a bad knob is a quick one-line error
    generator = SpeechGenerator(model=args.model, draft=args.draft, codec=args.codec, threads=args.threads)
    request = {**request_values(args, "speech"), "voice": args.voice or DEFAULT_VOICE}
    # check the whole request before the progress bar starts, so an error stays one line
    generator.vocab.prompt_ids(args.text, request["voice"])
    limit = generator.max_new_tokens_for(args.text, request["voice"], args.max_new_tokens)
    processing = generator.processing(temperature=args.temperature, top_k=args.top_k)
    if spec.drafter is not None:
        generator.draft_model  # noqa: B018 - load (and check) the draft before decoding starts
    if spec.rule != "auto":  # auto builds its candidates' rules itself
        generator.rule(method, processing, spec.resolve_knobs(knobs))  # builds (or loads) pcg's groups up front
    stats, tokens, groups = SpecStats(), [], []
    started = time.perf_counter()
    events = generator.stream(args.text, method=method, stats=stats, **request, **knobs)
    for event in with_progress(events, total=limit, method=method, quiet=args.json):
        tokens.extend(event.tokens)
        groups.extend(event.extra.get("groups", ()))  # pcg: the group of every committed token
    wall_s = time.perf_counter() - started
    summary = stats.summary(method=method, lossless=spec.lossless, wall_s=wall_s,
                            ar_step_s=generator.measure_step_s(args.text, request["voice"]))
    # the acoustic tokens: EOS and (interleaved layout) the characters spoken again are not frames
    groups = generator.vocab.acoustic_tags(tokens, groups)
    tokens = generator.vocab.acoustic(tokens)
    summary["audio_s"] = len(tokens) / generator.codec.cfg.frame_rate
    write_wav(args.out, generator.decode(tokens), generator.sample_rate)
    print_saved(args, {"tokens": tokens, **({"groups": groups} if groups else {}), "stats": summary},
                f"[{method}] tau {summary['tau']:.2f}, {summary['steps']} steps for {len(tokens)} tokens "
                f"({summary['audio_s']:.2f} s of audio), {wall_s:.1f} s{_relaxed_note(summary)}")
    return 0


def _relaxed_note(summary: dict) -> str:
    """For lossy rules: their alpha_hat next to that of exact token-level sampling on the same drafts."""
    if "acceptance_level" not in summary or summary.get("alpha_hat") is None:
        return ""
    exact = summary.get("exact_alpha_hat")
    return (f"; {summary['acceptance_level']}-level alpha_hat {summary['alpha_hat']:.2f}, exact sampling's "
            f"{'—' if exact is None else f'{exact:.2f}'} on the same drafts")
