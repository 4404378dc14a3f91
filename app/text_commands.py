"""`specgen generate text`: streams committed text to stderr, prints the text (or one JSON object) on stdout."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext


def generate_text(args) -> int:
    from specgen.modalities.text.generator import TextGenerator
    from specgen.samplers.stats import SpecStats
    import time

    generator = TextGenerator(model=args.model, draft=args.draft, threads=args.threads)
    method = args.method or generator.default_method
    stats = SpecStats()
    tokens: list[list[int]] = [[] for _ in range(args.num_samples)]
    shown = ""
    started = time.perf_counter()
    with (open(args.trace, "w") if args.trace else nullcontext()) as trace:
        for event in generator.stream(args.prompt, method=method, max_new_tokens=args.max_new_tokens,
                                      temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                                      num_samples=args.num_samples, stats=stats):
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
                            ar_step_s=generator.measure_step_s(args.prompt))
    samples = [{"text": generator.tokenizer.decode(t, skip_special_tokens=True), "tokens": t} for t in tokens]
    if args.json:
        out = ({"text": samples[0]["text"], "tokens": samples[0]["tokens"], "stats": summary} if args.num_samples == 1
               else {"samples": samples, "stats": summary})
        print(json.dumps(out))
    else:
        for sample in samples:
            print(sample["text"])
        print(f"[{method}] tau {summary['tau']:.2f}, {summary['steps']} steps, "
              f"{summary['tokens_per_s'] or 0:.1f} tokens/s", file=sys.stderr)
    return 0
