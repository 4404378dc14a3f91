"""`specgen generate text`: streams committed text to stderr, prints the text (or one JSON object) on stdout."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext


def generate_text(args) -> int:
    import time

    from specgen.modalities.text.generator import TextGenerator
    from specgen.samplers.stats import SpecStats

    from specgen.app.cli.options import method_knobs, request_values

    if args.method:
        method_knobs(args, "text", args.method)  # a knob the method lacks fails before any model loads
    loading = time.perf_counter()
    generator = TextGenerator(model=args.model, draft=args.draft, threads=args.threads)
    method = args.method or generator.default_method
    knobs = method_knobs(args, "text", method)
    request = request_values(args, "text")
    if args.prompt is None:
        args.prompt = generator.example_prompt
        print(f"prompt (the model's example; choose another with --prompt): {args.prompt!r}", file=sys.stderr)
    # one plain step, timed for the cost model; the first one in a process also builds the compiled CPU kernels
    # (tens of seconds the first time on a machine), which belongs to loading, not to the decoding speed
    generator.check_length(generator.encode(args.prompt), args.max_new_tokens)  # a bad request fails first
    ar_step_s = generator.measure_step_s(args.prompt)
    for _ in generator.stream(args.prompt, method=method, max_new_tokens=2, **knobs):  # the draft's forwards too
        pass
    load_s = time.perf_counter() - loading
    stats = SpecStats()
    tokens: list[list[int]] = [[] for _ in range(args.num_samples)]
    shown = ""
    started = time.perf_counter()
    with (open(args.trace, "w") if args.trace else nullcontext()) as trace:
        for event in generator.stream(args.prompt, method=method, stats=stats, **request, **knobs):
            tokens[event.row].extend(event.tokens)
            if trace:
                trace.write(json.dumps(event.to_json()) + "\n")
                trace.flush()
            if event.row == 0:  # incremental detokenisation of the first sample, to stderr
                text = generator.tokenizer.decode(tokens[0], skip_special_tokens=True)
                if text.startswith(shown):
                    sys.stderr.write(text[len(shown):])
                    sys.stderr.flush()
                    shown = text
    sys.stderr.write("\n")
    wall_s = time.perf_counter() - started
    from specgen.samplers.registry import get_method

    summary = stats.summary(method=method, lossless=get_method("text", method).lossless, wall_s=wall_s,
                            ar_step_s=ar_step_s)
    summary["load_s"] = load_s  # loading and warming the models, apart from wall_s (decoding) and tokens_per_s
    samples = [{"text": generator.tokenizer.decode(t, skip_special_tokens=True), "tokens": t} for t in tokens]
    if args.compare:
        summary.update(_compare_with_plain(generator, args.prompt, request, tokens, wall_s))
    if args.json:
        out = ({"text": samples[0]["text"], "tokens": samples[0]["tokens"], "stats": summary} if args.num_samples == 1
               else {"samples": samples, "stats": summary})
        print(json.dumps(out))
    else:
        for sample in samples:
            print(sample["text"])
        exits = summary.get("early_exit")  # a dynamic depth's layers instead of draft acceptance
        depth = (f"{exits['layers_skipped']:.2f} of {exits['layers']} layers skipped per token, {exits['stops']} "
                 "stopped" if exits else f"tau {summary['tau']:.2f}")
        print(f"[{method}] {summary['committed']} tokens in {wall_s:.2f} s ({summary['tokens_per_s'] or 0:.1f} "
              f"tokens/s decoding), {depth}, {summary['steps']} steps; models loaded in {load_s:.1f} s",
              file=sys.stderr)
        if args.compare:
            print(_comparison_line(summary), file=sys.stderr)
    return 0


def _compare_with_plain(generator, prompt: str, request: dict, tokens: list[list[int]], wall_s: float) -> dict:
    """The same request decoded plainly (`ar`): the measured speedup and, at temperature 0, whether every sample's
    tokens are the same (they must be: the methods are exact; a difference is reported, not hidden)."""
    plain = generator.generate(prompt, method="ar", **request)
    result = {"ar_wall_s": plain.stats["wall_s"], "ar_tokens_per_s": plain.stats["tokens_per_s"],
              "speedup_vs_ar": plain.stats["wall_s"] / wall_s if wall_s > 0 else None}
    if request["temperature"] == 0:
        result["identical_to_ar"] = [s["tokens"] for s in plain.samples] == tokens
    return result


def _comparison_line(summary: dict) -> str:
    line = (f"[ar] plain decoding of the same request: {summary['ar_wall_s']:.2f} s "
            f"({summary['ar_tokens_per_s'] or 0:.1f} tokens/s); {summary['method']} is "
            f"{summary['speedup_vs_ar'] or 0:.2f}x as fast")
    if "identical_to_ar" in summary:
        differs = ", OUTPUT DIFFERS from plain decoding" if summary.get("lossless", True) else (
            ", output differs from plain decoding (a lossy method)")
        line += ", identical output" if summary["identical_to_ar"] else differs
    return line
