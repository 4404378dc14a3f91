"""SpecMemo's memory budget, measured: peak resident memory and throughput of served workloads, unconstrained and
under a budget of 0.6x the decoding memory they took unconstrained, each configuration in a fresh process.

    python benchmarks/memory_budget.py --out benchmarks/memory/budget-latest        # the code pair and Gemma 3

Per workload (continuous batching of 8 prompts, greedy): the process's resident memory before decoding (models
loaded, one warm-up request), its peak while decoding (VmHWM, reset before the run), the memory model's
prediction, tokens per second; then the same workload with `memory_budget_mb` = resident + 0.6 x (peak - resident)
and what the plan cut to fit. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["def main(", "import os\n\n", "class Parser:\n    def __init__(self", "for i in range(",
           "The old bridge over the river was", "Once upon a time", "import sys\n\ndef", "Question: what is 7 + 5?"]
WORKLOADS = [  # (model, method, rows, max_new_tokens)
    ("code", "draft", 8, 128), ("code", "sequoia", 8, 128), ("gemma", "draft", 8, 64), ("gemma", "ngram", 8, 64)]
FRACTION = 0.6


GRID = [(method, rows, length) for method in ("draft", "sequoia") for rows in (1, 4, 8) for length in (4, 16)]


def child(model: str, method: str, rows: int, max_new_tokens: int, budget: float | None,
          length: int | None = None) -> dict:
    """One configuration in this (fresh) process (`length`: the method's draft length or tree budget)."""
    from specgen.modalities import memory
    from specgen.modalities.text.generator import TextGenerator, shipped_code_pair

    generator = TextGenerator(*shipped_code_pair(), threads=1) if model == "code" else TextGenerator(threads=1)
    if method != "ngram":
        generator.draft_model  # noqa: B018 - loaded before the resident set is read
    generator.generate(PROMPTS[0], method="ar", max_new_tokens=4)  # warm-up: the runtime's first allocations
    knobs = {} if length is None else {_length_knob(method): length}
    params = knobs if budget is None else {**knobs, "memory_budget_mb": budget}
    _, _, unconstrained = generator.memory_plan(method, [generator.encode(p) for p in PROMPTS], max_new_tokens,
                                                rows, knobs, 1e9)
    resident = memory.resident_mb()
    memory.reset_peak()
    started = time.perf_counter()
    results = list(generator.serve(PROMPTS, rows=rows, method=method, max_new_tokens=max_new_tokens, **params))
    wall = time.perf_counter() - started
    peak = memory.peak_mb()
    tokens = sum(len(r.tokens) for _, r in results)
    stats = results[0][1].stats
    return {"resident_mb": resident, "peak_mb": peak, "decoding_mb": peak - resident, "wall_s": wall,
            "tokens": tokens, "tokens_per_s": tokens / wall,
            "tau": sum(r.stats["committed"] for _, r in results) / sum(r.stats["steps"] for _, r in results),
            "predicted_decoding_mb": unconstrained.footprint.total_mb, "plan": stats.get("memory"),
            "outputs": [r.tokens for _, r in sorted(results)]}


def _length_knob(method: str) -> str:
    return "tree_budget" if method == "sequoia" else "num_draft_tokens"


def run_child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=6, metavar=("MODEL", "METHOD", "ROWS", "TOKENS", "BUDGET", "LENGTH"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--no-grid", action="store_true", help="skip the memory model's check over rows x lengths")
    parser.add_argument("--models", default="code,gemma")
    parser.add_argument("--out", default="benchmarks/memory/budget-latest", help="path without suffix")
    args = parser.parse_args()
    if args.child:
        model, method, rows, tokens, budget, length = args.child
        print(json.dumps(child(model, method, int(rows), int(tokens), None if budget == "-" else float(budget),
                               None if length == "-" else int(length))))
        return
    grid = []
    for method, rows, length in ([] if args.no_grid else GRID):
        measured = run_child(["code", method, str(rows), "128", "-", str(length)])
        grid.append({"method": method, "rows": rows, _length_knob(method): length,
                     "measured_mb": measured["decoding_mb"], "predicted_mb": measured["predicted_decoding_mb"]})
        print(json.dumps(grid[-1]), flush=True)
    rows_out = []
    for model, method, rows, tokens in WORKLOADS:
        if model not in args.models.split(","):
            continue
        free = run_child([model, method, str(rows), str(tokens), "-", "-"])
        budget = free["resident_mb"] + FRACTION * free["decoding_mb"]
        try:
            bound = run_child([model, method, str(rows), str(tokens), f"{budget:.1f}", "-"])
        except RuntimeError as error:
            bound = {"error": str(error).strip().splitlines()[-1]}
        row = {"model": model, "method": method, "rows": rows, "max_new_tokens": tokens, "budget_mb": budget,
               "unconstrained": free, "budgeted": bound}
        if "error" not in bound:
            row.update(within_budget=bound["peak_mb"] <= budget,
                       throughput_ratio=bound["tokens_per_s"] / free["tokens_per_s"],
                       same_outputs=bound["outputs"] == free["outputs"])
        rows_out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("unconstrained", "budgeted")}), flush=True)
    command = "python benchmarks/memory_budget.py --models " + args.models + " --out " + args.out
    record = {"command": command, "fraction": FRACTION, "rows": rows_out, "grid": grid}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for row in rows_out:  # keep the records small: outputs were compared above
        for part in ("unconstrained", "budgeted"):
            row[part].pop("outputs", None)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    out.with_suffix(".md").write_text(render(record))
    print(render(record))


def render(record: dict) -> str:
    lines = ["# Memory budget (SpecMemo): peak resident memory and throughput", "", f"`{record['command']}`", "",
             f"Each configuration in a fresh process, 1 thread, greedy, 8 prompts by continuous batching. Decoding "
             f"memory = peak resident (VmHWM, reset before decoding) − resident before decoding (models loaded, "
             f"one warm-up request). Budget = resident + {record['fraction']} × the unconstrained decoding memory.",
             "", "| model | method | rows | resident MB | decoding MB (predicted) | tok/s | budget MB | plan under the "
             "budget | peak MB | within | tok/s (ratio) | same tokens |", "|---|---|---:|---:|---:|---:|---:|---|---:|"
             "---|---:|---|"]
    for row in record["rows"]:
        free, bound = row["unconstrained"], row["budgeted"]
        head = (f"| {row['model']} | {row['method']} | {row['rows']} | {free['resident_mb']:.0f} | "
                f"{free['decoding_mb']:.1f} ({free['predicted_decoding_mb']:.1f}) | {free['tokens_per_s']:.1f} | "
                f"{row['budget_mb']:.0f} |")
        if "error" in bound:
            lines.append(head + f" refused: {bound['error']} | | | | |")
            continue
        plan = bound["plan"]
        cut = ", ".join(plan["reduced"]) or "nothing"
        lines.append(head + f" {cut} | {bound['peak_mb']:.0f} | {'yes' if row['within_budget'] else '**no**'} | "
                     f"{bound['tokens_per_s']:.1f} ({row['throughput_ratio']:.2f}) | "
                     f"{'yes' if row['same_outputs'] else 'no'} |")
    if record["grid"]:
        lines += ["", "## The memory model against measured peaks (code pair, 128 new tokens, 8 prompts)", "",
                  "| method | rows | draft length / tree budget | measured decoding MB | predicted MB | "
                  "predicted - measured |",
                  "|---|---:|---:|---:|---:|---:|"]
        for g in record["grid"]:
            length = g.get("num_draft_tokens", g.get("tree_budget"))
            lines.append(f"| {g['method']} | {g['rows']} | {length} | {g['measured_mb']:.1f} | "
                         f"{g['predicted_mb']:.1f} | {g['predicted_mb'] - g['measured_mb']:+.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
