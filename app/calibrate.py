"""Measure Sequoia's acceptance-by-rank vector for a target/draft pair (the `accept_probs` knob of `sequoia`).

    python -m specgen.app.calibrate [--model M] [--draft D] [--width 8] [--temperature 0] [--prompts 8]
        [--max-new-tokens 64] [--threads 1] [--json]

Prompts are the openings (first 400 characters) of held-out corpus files (the code model's validation split), so
the benchmark prompts stay unseen. Prints the vector as the knob value and the Sequoia trees it implies.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specgen.app.calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--draft")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--prompts", type=int, default=8, help="held-out corpus files used as prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from specgen.modalities.text.corpus import load_corpus
    from specgen.modalities.text.generator import TextGenerator
    from specgen.modalities.tree_drafter import acceptance_by_rank
    from specgen.samplers import trees

    generator = TextGenerator(args.model, args.draft, threads=args.threads)
    texts = load_corpus().texts("val")[:args.prompts]
    prompts = [generator.encode(text[:400]) for text in texts]
    result = acceptance_by_rank(generator.model, generator.draft_model, prompts, width=args.width,
                                temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    probs = result["accept_probs"]
    result["knob"] = ",".join(f"{p:.4f}" for p in probs)
    result["trees"] = {str(n): {"parents": trees.sequoia_tree(probs, n, 6),
                                "expected_tau": trees.expected_accepted(trees.sequoia_tree(probs, n, 6), probs)}
                       for n in (4, 8, 16, 32)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"accept_probs={result['knob']}  ({result['steps']} steps)")
        for n, tree in result["trees"].items():
            print(f"budget {n:>2}: expected tau {tree['expected_tau']:.3f}  parents {tree['parents']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
