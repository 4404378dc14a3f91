"""Triton kernels vs their torch twins on a CUDA device: correctness first, then median times.

    python benchmarks/kernels.py [--out benchmarks/kernels-<gpu>.json]

Shapes: batch 1-64, draft 4-16, vocab 32k-262k (chain rejection sampling; tree verification is checked for
identical outputs on a small tree). Times come from CUDA events (median of 50 runs after warm-up)
for the Triton kernel, the vectorised torch path, and a naive per-row Python loop over the torch path.
Needs a GPU; the CPU test suite checks the same kernels under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from specgen.kernels import reference, triton_ops

SHAPES = [(1, 4, 32_000), (8, 8, 32_000), (64, 8, 32_000), (1, 16, 262_144), (8, 8, 262_144), (64, 8, 262_144)]


def make_case(batch, k, vocab, device):
    g = torch.Generator(device=device).manual_seed(0)
    target = torch.rand(batch, k + 1, vocab, generator=g, device=device).pow_(4)
    target /= target.sum(-1, keepdim=True)
    draft = torch.rand(batch, k, vocab, generator=g, device=device).pow_(4)
    draft /= draft.sum(-1, keepdim=True)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    drafted = torch.full((batch,), k, device=device)
    return (tokens, draft, target, drafted, torch.rand(batch, k, generator=g, device=device, dtype=torch.float64),
            torch.rand(batch, k + 1, generator=g, device=device, dtype=torch.float64))


def timed(fn, repeats=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def naive(case):
    rows = case[0].shape[0]
    return [reference.rejection_sample(*(t[r:r + 1] for t in case)) for r in range(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; this benchmark needs a GPU")
    device, rows = "cuda", []
    for batch, k, vocab in SHAPES:
        case = make_case(batch, k, vocab, device)
        for point_mass in (False, True):
            args_ = case if not point_mass else (case[0], None, *case[2:])
            expected, got = reference.rejection_sample(*args_), triton_ops.rejection_sample(*args_)
            identical = all(torch.equal(a, b) for a, b in zip(expected, got))
            row = {"op": "rejection_sample", "batch": batch, "k": k, "vocab": vocab, "draft_probs": not point_mass,
                   "identical": identical,
                   "triton_ms": timed(lambda: triton_ops.rejection_sample(*args_)),
                   "torch_ms": timed(lambda: reference.rejection_sample(*args_)),
                   "naive_ms": timed(lambda: naive(args_), repeats=5)}
            row["speedup_vs_torch"] = row["torch_ms"] / row["triton_ms"]
            rows.append(row)
            print(f"{batch:3d} x {k:2d} x {vocab:7d} probs={not point_mass!s:5}  identical={identical}  "
                  f"triton {row['triton_ms']:.3f} ms  torch {row['torch_ms']:.3f} ms  naive {row['naive_ms']:.3f} ms  "
                  f"({row['speedup_vs_torch']:.2f}x)")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    out = args.out or f"benchmarks/kernels-{torch.cuda.get_device_name().replace(' ', '_')}.json"
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
