"""Triton kernels vs their torch twins on a CUDA device: correctness first, then median times.

    python benchmarks/triton_kernels.py [--out benchmarks/kernels-<gpu>.json] [--ops coupled_resample gumbel_argmax]

Shapes: batch 1-64, draft 4-16, vocab 32k-262k (chain rejection sampling; tree verification is checked for
identical outputs on a small tree). Times come from CUDA events (median of 50 runs after warm-up)
for the Triton kernel, the vectorised torch path, and a naive per-row Python loop over the torch path.
`group_mass` runs at PCG and LANTERN++ shapes (GROUP_SHAPES).
The Jacobi ops (coupled_resample, gumbel_argmax) run at image shapes (batch 8, window 64, a 16,384-code
VQ vocabulary) and at text shapes (window 8, vocab 262k), on float64 laws as the Jacobi drafter keeps them,
with the target a perturbation of the draft law so that most slots keep their draft.
Needs a GPU; the CPU test suite checks the same kernels under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from specgen.kernels import reference, triton_ops

SHAPES = [(1, 4, 32_000), (8, 8, 32_000), (64, 8, 32_000), (1, 16, 262_144), (8, 8, 262_144), (64, 8, 262_144)]
OPS = ("rejection_sample", "coupled_resample", "gumbel_argmax", "group_mass")
JACOBI_SHAPES = [(8, 64, 16_384), (1, 8, 262_144), (8, 8, 262_144)]  # (batch, window, vocab)
# (rows, listed groups per row, vocab, members per group): PCG's accept test (one owner group per drafted token),
# its thinning rounds and explicit residual (W p over every group) on a 65k single-codebook vocabulary with
# ~140-token groups, and LANTERN++'s neighbour mass over an image window
GROUP_SHAPES = [(32, 1, 65_536, 140), (8, 16, 65_536, 140), (8, 65_536, 65_536, 140), (512, 1, 16_384, 100)]


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


def make_jacobi_case(batch, k, vocab, device):
    """(tokens, draft law, target law, keep uniforms, draw uniforms, exponential noise): the target is the draft
    law's logits moved by noise, as between consecutive Jacobi iterations."""
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(batch, k, vocab, generator=g, device=device, dtype=torch.float64) * 2
    draft = torch.softmax(logits, -1)
    target = torch.softmax(logits + torch.randn(logits.shape, generator=g, device=device, dtype=torch.float64), -1)
    tokens = torch.multinomial(draft.reshape(-1, vocab).float(), 1, generator=g).reshape(batch, k)
    uniforms = torch.rand(2, batch, k, generator=g, device=device, dtype=torch.float64)
    exponential = -torch.log(torch.rand(batch, k, vocab, generator=g, device=device, dtype=torch.float64))
    return tokens, draft, target, uniforms[0], uniforms[1], exponential


def make_group_case(rows, listed, vocab, members, device):
    """(probs, group ids, indptr, member ids, weights, max members): `members` random tokens per group, PCG's
    weights 1/|owners| approximated by uniform random weights (timing does not depend on their values)."""
    g = torch.Generator(device=device).manual_seed(0)
    probs = torch.rand(rows, vocab, generator=g, device=device).pow_(4)
    probs /= probs.sum(-1, keepdim=True)
    indptr = torch.arange(0, (vocab + 1) * members, members, device=device, dtype=torch.int32)
    member_ids = torch.randint(0, vocab, (vocab * members,), generator=g, device=device, dtype=torch.int32)
    weights = torch.rand(vocab * members, generator=g, device=device, dtype=torch.float64)
    group_ids = torch.randint(0, vocab, (rows, listed), generator=g, device=device)
    return probs, group_ids, indptr, member_ids, weights, members


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
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS, help="ops to check and time (default all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; this benchmark needs a GPU")
    device, rows = "cuda", []
    for batch, k, vocab in SHAPES if "rejection_sample" in args.ops else ():
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
    for batch, k, vocab in JACOBI_SHAPES:
        tokens, draft, target, keep_u, draw_u, exponential = make_jacobi_case(batch, k, vocab, device)
        ops = {"coupled_resample": (tokens, draft, target, keep_u, draw_u), "gumbel_argmax": (target, exponential)}
        for op, args_ in ops.items():
            if op not in args.ops:
                continue
            expected, got = getattr(reference, op)(*args_), getattr(triton_ops, op)(*args_)
            expected, got = (expected, got) if isinstance(expected, tuple) else ((expected,), (got,))
            identical = all(torch.equal(a, b) for a, b in zip(expected, got))
            row = {"op": op, "batch": batch, "k": k, "vocab": vocab, "identical": identical,
                   "triton_ms": timed(lambda: getattr(triton_ops, op)(*args_)),
                   "torch_ms": timed(lambda: getattr(reference, op)(*args_))}
            if op == "coupled_resample":
                row["keep_rate"] = float(expected[1].double().mean())
            row["speedup_vs_torch"] = row["torch_ms"] / row["triton_ms"]
            rows.append(row)
            extra = f"  kept {row['keep_rate']:.2f}" if "keep_rate" in row else ""
            print(f"{op:16s} {batch:3d} x {k:2d} x {vocab:7d}  identical={identical}  "
                  f"triton {row['triton_ms']:.3f} ms  torch {row['torch_ms']:.3f} ms  "
                  f"({row['speedup_vs_torch']:.2f}x){extra}")
    for batch, listed, vocab, members in GROUP_SHAPES if "group_mass" in args.ops else ():
        args_ = make_group_case(batch, listed, vocab, members, device)
        expected, got = reference.group_mass(*args_), triton_ops.group_mass(*args_)
        row = {"op": "group_mass", "batch": batch, "k": listed, "vocab": vocab, "members": members,
               "identical": bool(torch.allclose(expected, got, rtol=1e-12, atol=1e-15)),
               "triton_ms": timed(lambda: triton_ops.group_mass(*args_)),
               "torch_ms": timed(lambda: reference.group_mass(*args_))}
        row["speedup_vs_torch"] = row["torch_ms"] / row["triton_ms"]
        rows.append(row)
        print(f"group_mass       {batch:3d} x {listed:5d} x {vocab:7d} ({members} members)  "
              f"identical={row['identical']}  triton {row['triton_ms']:.3f} ms  torch {row['torch_ms']:.3f} ms  "
              f"({row['speedup_vs_torch']:.2f}x)")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    out = args.out or f"benchmarks/kernels-{torch.cuda.get_device_name().replace(' ', '_')}.json"
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
