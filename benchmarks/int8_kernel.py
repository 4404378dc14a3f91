"""The served models' int8 CPU kernel on Gemma 3 270M's layer shapes: the 16-lane AVX-512 path against the
8-lane AVX2 path, per number of rows (1 thread). Both are row-invariant; this checks that too.

    python benchmarks/int8_kernel.py [--repeats 20] [--out benchmarks/int8-kernel-latest] [--before OLD.json]

Writes OUT.json and OUT.md; with --before (an earlier run's JSON, e.g. of the previous kernel source on the same
machine minutes before) also the time of each cell against it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (name, out_features N, in_features K): Gemma 3 270M's output layer and one layer's fused projections
SHAPES = [("lm_head", 262144, 640), ("qkv", 1536, 640), ("out", 640, 1024), ("gate_up", 4096, 640),
          ("down", 640, 2048)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "int8-kernel-latest")
    parser.add_argument("--before", type=Path, help="an earlier run's JSON to compare each cell with")
    args = parser.parse_args()
    import torch

    from specgen.kernels import int8_rows

    from specgen.settings import use_threads

    use_threads(1)
    if not int8_rows.available():
        raise SystemExit("the int8 kernel cannot be built here (needs g++, ninja, AVX2/FMA)")
    paths = [True, False] if int8_rows.wide() else [False]
    rows = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 64)  # decoding, verification windows and batches, prompts
    results = []
    for name, n, k in SHAPES:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=generator)
        scales = torch.rand(n, generator=generator)
        x = torch.randn(max(rows), k, generator=generator)
        for wide in paths:
            alone = torch.cat([int8_rows.int8_rows_mm(x[i:i + 1], weight, scales, wide) for i in range(max(rows))])
            for m in rows:
                out = int8_rows.int8_rows_mm(x[:m], weight, scales, wide)
                repeats = max(3, args.repeats // (20 if n > 100_000 else 1))
                started = time.perf_counter()
                for _ in range(repeats):
                    int8_rows.int8_rows_mm(x[:m], weight, scales, wide)
                seconds = (time.perf_counter() - started) / repeats
                results.append({"layer": name, "N": n, "K": k, "rows": m, "path": "avx512" if wide else "avx2",
                                "ms": seconds * 1e3, "gmac_per_s": m * n * k / seconds / 1e9,
                                "row_invariant": bool(torch.equal(out, alone[:m]))})
    record = {"command": "python benchmarks/int8_kernel.py --repeats " + str(args.repeats), "threads": 1,
              "wide_built": int8_rows.wide(), "results": results}
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    lines = ["# int8 CPU kernel: AVX-512 against AVX2 on Gemma 3 270M's shapes", "", f"`{record['command']}`", "",
             "Milliseconds per call, 1 thread; every result row-invariant bit for bit: "
             f"{all(r['row_invariant'] for r in results)}.", "",
             "| layer (N × K) | path | " + " | ".join(f"{m} rows" for m in rows) + " |",
             "|---|---|" + "---|" * len(rows)]
    for name, n, k in SHAPES:
        for path in ("avx512", "avx2"):
            cells = [r for r in results if r["layer"] == name and r["path"] == path]
            if cells:
                lines.append(f"| {name} ({n} × {k}) | {path} | " + " | ".join(f"{r['ms']:.3f}" for r in cells) + " |")
    if args.before:
        lines += _against(json.loads(args.before.read_text()), record, rows)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _against(before: dict, after: dict, rows) -> list[str]:
    """Markdown: each cell's time over the earlier run's (below 1: faster now), where both measured it."""
    earlier = {(r["layer"], r["path"], r["rows"]): r["ms"] for r in before["results"]}
    lines = ["", f"Against the earlier run ({before.get('label', 'the --before file')}): time now over time then.", "",
             "| layer | path | " + " | ".join(f"{m} rows" for m in rows) + " |", "|---|---|" + "---|" * len(rows)]
    for name, _, _ in SHAPES:
        for path in ("avx512", "avx2"):
            cells = {r["rows"]: r["ms"] for r in after["results"] if r["layer"] == name and r["path"] == path}
            if cells:
                lines.append(f"| {name} | {path} | " + " | ".join(
                    f"{cells[m] / earlier[name, path, m]:.2f}" if (name, path, m) in earlier and m in cells else "–"
                    for m in rows) + " |")
    return lines


if __name__ == "__main__":
    main()
