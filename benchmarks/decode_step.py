"""The compiled float32 step (`kernels/decode_step.py`) against the torch path it replaces, on a served text target.

    python benchmarks/decode_step.py [--model assets/code/target] [--repeats 15] [--threads 1]
        [--out benchmarks/decode-step-latest]

One forward of n new slots (a plain step for n = 1, a verified chain of n - 1 drafts otherwise) after a
200-token context, and a prompt's prefill, each timed on both paths in alternation in one process (median of
the repeats; the context is rebuilt before each prefill). Also checks that the kernel scores every slot of the
widest window bit for bit as one-slot steps do, which MKL's float32 products do not promise. Writes OUT.json and
OUT.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = (1, 2, 4, 8, 13, 16, 32)
PREFILLS = (64, 256, 600)
CONTEXT = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "assets" / "code" / "target"))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "decode-step-latest")
    args = parser.parse_args()

    import torch

    from specgen.app.bench.records import script_record
    from specgen.app.bench.report import save_record
    from specgen.kernels import cpu_build
    from specgen.modalities.text.generator import load_causal_lm
    from specgen.modalities.runtime.transformers_adapter import TransformersTarget

    from specgen.settings import use_threads

    use_threads(args.threads)
    model = load_causal_lm(args.model)
    vocab = model.config.vocab_size
    ids = torch.randint(5, vocab, (max(PREFILLS) + max(WINDOWS),), generator=torch.Generator().manual_seed(0))
    engines = {path: TransformersTarget(model, decode_kernel=path == "kernel") for path in ("torch", "kernel")}
    forward = {path: {n: [] for n in WINDOWS} for path in engines}
    prefill = {path: {n: [] for n in PREFILLS} for path in engines}
    for _ in range(args.repeats):
        for path, engine in engines.items():
            for n in PREFILLS:
                started = time.perf_counter()
                engine.prefill([ids[:n]])
                prefill[path][n].append(time.perf_counter() - started)
            engine.prefill([ids[:CONTEXT]])
            for n in WINDOWS:  # the same slots each time: nothing is committed
                tokens, positions = ids[CONTEXT - 1:CONTEXT - 1 + n][None], (CONTEXT - 1 + torch.arange(n))[None]
                started = time.perf_counter()
                engine.score(tokens, positions, torch.tensor([0]))
                forward[path][n].append(time.perf_counter() - started)

    kernel = engines["kernel"]
    kernel.prefill([ids[:CONTEXT]])
    widest = max(WINDOWS)
    window = kernel.score(ids[CONTEXT - 1:CONTEXT - 1 + widest][None], (CONTEXT - 1 + torch.arange(widest))[None],
                          torch.tensor([0]))[0]
    single = TransformersTarget(model, decode_kernel=True)
    single.prefill([ids[:CONTEXT]])
    bitwise = True
    for j in range(widest):
        logits = single.score(ids[CONTEXT - 1 + j:CONTEXT + j][None], torch.tensor([[CONTEXT - 1 + j]]),
                              torch.tensor([0]))[0, 0]
        bitwise &= bool(torch.equal(logits, window[j]))
        single.commit(torch.ones(1, 1, dtype=torch.bool), torch.tensor([0]))

    def ms(samples):
        return round(1e3 * statistics.median(samples), 3)

    result = {
        **script_record("decode_step.py", args), "model": args.model, "context": CONTEXT, "repeats": args.repeats,
        "forward_ms": {path: {n: ms(v) for n, v in rows.items()} for path, rows in forward.items()},
        "prefill_ms": {path: {n: ms(v) for n, v in rows.items()} for path, rows in prefill.items()},
        "kernel_window_equals_single_steps": bitwise,
        # the tiling differs: 4 rows x 4 outputs per pass with AVX-512, 2 x 2 with AVX2 only
        "kernel_flags": " ".join(cpu_build.compile_flags()),
    }
    save_record(args.out, result, markdown)


def markdown(result: dict) -> str:
    fwd, pre = result["forward_ms"], result["prefill_ms"]
    lines = [
        "# Compiled float32 step vs the torch path", "", f"`{result['command']}`", "",
        f"Model `{result['model']}`, {result['threads']} thread(s), CPU {result['cpu']} (kernel built with "
        f"`{result.get('kernel_flags', '?')}`), torch {result['torch']}; median "
        f"of {result['repeats']} alternating runs. A forward of n new slots after a {result['context']}-token "
        "context: n = 1 is a plain decoding step, n = k + 1 verifies a chain of k drafts.", "",
        "| new slots | torch (ms) | kernel (ms) | torch ÷ kernel | kernel ÷ its 1-slot step |", "|---|---|---|---|---|"]
    one = fwd["kernel"][1]
    for n in fwd["torch"]:
        lines.append(f"| {n} | {fwd['torch'][n]:.2f} | {fwd['kernel'][n]:.2f} | "
                     f"{fwd['torch'][n] / fwd['kernel'][n]:.2f}× | {fwd['kernel'][n] / one:.2f}× |")
    lines += ["", "| prefill (tokens) | torch (ms) | kernel (ms) | torch ÷ kernel |", "|---|---|---|---|"]
    for n in pre["torch"]:
        lines.append(f"| {n} | {pre['torch'][n]:.1f} | {pre['kernel'][n]:.1f} | {pre['torch'][n] / pre['kernel'][n]:.2f}× |")
    lines += ["", "Every slot of the widest kernel window equals a one-slot kernel step bit for bit: "
              f"**{'yes' if result['kernel_window_equals_single_steps'] else 'NO'}**.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
