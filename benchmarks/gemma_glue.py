"""The served Gemma's compiled layer glue (`kernels/gemma_layer.py`) against the torch calls it replaces.

    python benchmarks/gemma_glue.py [--repeats 30] [--threads 1] [--out benchmarks/gemma-glue-latest]

One forward of n new slots (a plain step for n = 1, a verified chain of n - 1 drafts otherwise) after a
200-token context, on the same served model and engine with the glue on and off in alternation (median and
fastest of the repeats: this CPU is shared, and the fastest run shows the cost with the least interference),
next to the int8 products alone on the same rows. Also checks that both paths give every slot of the widest
window the same logits bit for bit. Needs the gemma extra. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = (1, 2, 4, 5, 8)
CONTEXT = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gemma-glue-latest")
    args = parser.parse_args()

    import torch

    from specgen.app.bench.records import script_record
    from specgen.app.bench.report import save_record
    from specgen.kernels import int8_rows
    from specgen.modalities.text import gemma
    from specgen.modalities.runtime.transformers_adapter import TransformersTarget

    from specgen.settings import use_threads

    use_threads(args.threads)
    model = gemma.load_served(gemma.resolve(print))
    engine = TransformersTarget(model, capacity=1024)
    runner = engine.runner
    if not runner.uses_glue():
        raise SystemExit("error: the compiled glue does not build here (needs g++, ninja and the int8 kernel)")
    ids = torch.randint(5, model.config.vocab_size, (CONTEXT + max(WINDOWS),), generator=torch.Generator().manual_seed(0))
    engine.prefill([ids[:CONTEXT]])
    row = torch.tensor([0])

    def forward(n: int, glue: bool) -> tuple[float, torch.Tensor]:
        runner._glue = glue
        tokens, positions = ids[CONTEXT - 1:CONTEXT - 1 + n][None], (CONTEXT - 1 + torch.arange(n))[None]
        started = time.perf_counter()
        logits = engine.score(tokens, positions, row)  # nothing is committed: the same slots each time
        return time.perf_counter() - started, logits

    linears = [layer[name] for layer in runner.layers for name in ("qkv", "out", "gate_up", "down")] + [runner.lm_head]

    def products(n: int) -> float:
        inputs = [torch.randn(n, linear.in_features) for linear in linears]
        started = time.perf_counter()
        for x, linear in zip(inputs, linears):
            int8_rows.int8_rows_mm(x, linear.qweight, linear.scales)
        return time.perf_counter() - started

    times = {path: {n: [] for n in WINDOWS} for path in ("torch", "glue", "products")}
    for _ in range(args.repeats):
        for n in WINDOWS:
            times["torch"][n].append(forward(n, False)[0])
            times["glue"][n].append(forward(n, True)[0])
            times["products"][n].append(products(n))
    widest = max(WINDOWS)
    bitwise = bool(torch.equal(forward(widest, False)[1], forward(widest, True)[1]))
    runner._glue = None

    def ms(samples, how):
        return round(1e3 * how(samples), 2)

    result = {
        **script_record("gemma_glue.py", args), "context": CONTEXT, "repeats": args.repeats,
        "median_ms": {path: {n: ms(v, statistics.median) for n, v in rows.items()} for path, rows in times.items()},
        "fastest_ms": {path: {n: ms(v, min) for n, v in rows.items()} for path, rows in times.items()},
        "glue_equals_torch_bitwise": bitwise,
    }
    save_record(args.out, result, markdown)


def markdown(result: dict) -> str:
    median, fastest = result["median_ms"], result["fastest_ms"]
    lines = [
        "# Served Gemma: the compiled layer glue vs torch calls", "", f"`{result['command']}`", "",
        f"Gemma 3 270M served as int8 rows, {result['threads']} thread(s), CPU {result['cpu']}, torch "
        f"{result['torch']}; {result['repeats']} alternating runs. A forward of n new slots after a "
        f"{result['context']}-token context: n = 1 is a plain decoding step, n = k + 1 verifies a chain of k drafts. "
        "'Outside the products' is the forward minus the int8 products alone on the same number of rows.", "",
        "| new slots | torch calls: median / fastest (ms) | glue: median / fastest (ms) | int8 products alone, fastest (ms) "
        "| outside the products, fastest: torch → glue (ms) |", "|---|---|---|---|---|"]
    for n in median["torch"]:
        products = fastest["products"][n]
        lines.append(f"| {n} | {median['torch'][n]:.1f} / {fastest['torch'][n]:.1f} | "
                     f"{median['glue'][n]:.1f} / {fastest['glue'][n]:.1f} | {products:.1f} | "
                     f"{fastest['torch'][n] - products:.1f} → {fastest['glue'][n] - products:.1f} |")
    lines += ["", "Both paths give every slot of the widest window the same logits bit for bit: "
              f"**{'yes' if result['glue_equals_torch_bitwise'] else 'NO'}**.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
