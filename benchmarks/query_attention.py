"""The per-query attention kernel against batched `scaled_dot_product_attention` (what it replaces; not
window-invariant) and its own torch twin (`query_attention.reference`, one SDPA call per query), on the image
target's and Gemma 3 270M's attention shapes, per number of queries (1 thread). Also checks, per shape, that a
query's output is the same bit for bit alone and in the window.

    python benchmarks/query_attention.py [--repeats 50] [--out benchmarks/query-attention-latest]

Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (name, rows, heads, kv_heads, head_dim, keys): guided image rows after half an image; Gemma after a prompt
SHAPES = [("image", 2, 4, 4, 64, 300), ("gemma", 1, 4, 1, 256, 200)]
QUERIES = (1, 4, 16, 32)


def _median_ms(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "query-attention-latest")
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F

    from specgen.kernels import query_attention

    from specgen.settings import use_threads

    use_threads(1)
    if not query_attention.available():
        raise SystemExit("the attention kernel cannot be built here (needs g++, ninja, AVX2/FMA)")
    results = []
    for name, rows, heads, kv_heads, dim, width in SHAPES:
        generator = torch.Generator().manual_seed(0)
        keys = torch.randn(rows, kv_heads, width, dim, generator=generator)
        values = torch.randn(rows, kv_heads, width, dim, generator=generator)
        for n in QUERIES:
            q = torch.randn(rows, heads, n, dim, generator=generator)
            mask = torch.ones(n, width, dtype=torch.bool).tril(width - n)  # slot j sees width - n + j + 1 keys
            additive = torch.zeros(n, width).masked_fill(~mask, float("-inf"))
            kernel = lambda: query_attention.attend_queries(q, keys, values, None, dim ** -0.5)  # noqa: E731
            batched = lambda: F.scaled_dot_product_attention(  # noqa: E731
                q, keys, values, attn_mask=additive, scale=dim ** -0.5, enable_gqa=heads != kv_heads)
            twin = lambda: query_attention.reference(q, keys, values, None, dim ** -0.5)  # noqa: E731
            window = kernel()
            alone = query_attention.attend_queries(q[:, :, -1:], keys, values, None, dim ** -0.5)
            results.append({"shape": name, "rows": rows, "heads": heads, "kv_heads": kv_heads, "head_dim": dim,
                            "keys": width, "queries": n, "kernel_ms": _median_ms(kernel, args.repeats),
                            "sdpa_batched_ms": _median_ms(batched, args.repeats),
                            "per_query_twin_ms": _median_ms(twin, args.repeats),
                            "last_query_same_bits_alone": bool(torch.equal(alone[:, 0], window[:, -1]))})
    from specgen import settings
    from specgen.kernels import cpu_build

    machine = {"cpu": settings.cpu_model(), "kernel_flags": " ".join(cpu_build.compile_flags())}
    args.out.with_suffix(".json").write_text(json.dumps({"command": "python benchmarks/query_attention.py",
                                                         "repeats": args.repeats, **machine, "results": results},
                                                        indent=1))
    lines = ["# Per-query attention kernel", "", f"`python benchmarks/query_attention.py --repeats {args.repeats}`"
             f" (1 thread, CPU {machine['cpu']}, kernel built with `{machine['kernel_flags']}`; median ms per call; "
             "SDPA batched is not window-invariant, the other two are)", "",
             "| shape | queries | keys | kernel | SDPA batched | per-query torch twin | a query alone = in the window |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['shape']} ({r['rows']}×{r['heads']} heads, d {r['head_dim']}) | {r['queries']} | "
                     f"{r['keys']} | {r['kernel_ms']:.3f} | {r['sdpa_batched_ms']:.3f} | {r['per_query_twin_ms']:.3f}"
                     f" | {r['last_query_same_bits_alone']} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
