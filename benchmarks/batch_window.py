"""A forward's cost by how its slots split into rows: R rows of n slots against one row of R * n, on a served text
target. `auto` prices a batch's step as one row's window of R times the width (samplers/auto.py); this checks it.

    python benchmarks/batch_window.py [--model gemma|code|PATH] [--repeats 7] [--threads 1] [--out OUT]

`--model gemma` is Gemma 3 270M served batch-invariant (the `gemma` extra), `code` the shipped code target, or a
path (default OUT: benchmarks/batch-window-NAME-latest, NAME gemma, code or the path's last part). Each pair is
timed in alternation after a prefill of the model's example prompt (median of the repeats;
`measure_batch_window_s`, nothing committed). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPLITS = ((8, 1), (4, 4), (8, 2), (8, 4), (8, 8), (8, 17))  # (rows, slots a row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from specgen.app.bench.records import script_record
    from specgen.app.bench.report import save_record
    from specgen.modalities.runtime.transformers_adapter import measure_batch_window_s
    from specgen.modalities.text.generator import TextGenerator
    from specgen.settings import use_threads

    use_threads(args.threads)
    model = {"gemma": None, "code": str(ROOT / "assets" / "code" / "target")}.get(args.model, args.model)
    generator = TextGenerator(model=model, threads=args.threads) if model else TextGenerator(threads=args.threads)
    prompt = generator.encode(generator.example_prompt)
    target = generator.target(None)
    measure_batch_window_s(target, [prompt], 2, 2)  # first touch
    times = {split: ([], []) for split in SPLITS}
    for _ in range(args.repeats):
        for rows, slots in SPLITS:
            batch, single = times[rows, slots]
            batch.append(measure_batch_window_s(target, [prompt] * rows, slots, 1))
            single.append(measure_batch_window_s(target, [prompt], rows * slots, 1))
    ms = lambda samples: round(1e3 * statistics.median(samples), 2)  # noqa: E731
    result = {**script_record("batch_window.py", args), "model_path": str(generator.model_path),
              "splits": [{"rows": r, "slots": n, "batch_ms": ms(b), "one_row_ms": ms(s)}
                         for (r, n), (b, s) in times.items()]}
    name = args.model if args.model in ("gemma", "code") else Path(args.model).name
    out = args.out or ROOT / "benchmarks" / f"batch-window-{name}-latest"
    save_record(out, result, markdown)


def markdown(result: dict) -> str:
    lines = ["# A forward's cost: R rows of n slots against one row of R · n", "", f"`{result['command']}`", "",
             f"Target `{result['model_path']}`, {result['threads']} thread(s), CPU {result['cpu']}, torch "
             f"{result['torch']}; median of the repeats, the two shapes timed in alternation.", "",
             "| rows × slots | slots | R rows (ms) | one row (ms) | R rows ÷ one row |", "|---|---|---|---|---|"]
    for s in result["splits"]:
        lines.append(f"| {s['rows']} × {s['slots']} | {s['rows'] * s['slots']} | {s['batch_ms']:.2f} | "
                     f"{s['one_row_ms']:.2f} | {s['batch_ms'] / s['one_row_ms']:.2f} |")
    return "\n".join(lines + [""])


if __name__ == "__main__":
    main()
