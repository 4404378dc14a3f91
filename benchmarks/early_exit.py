"""`early-exit` (dynamic inference, lossy) on held-out code against full decoding of the same target, side by side.

    python benchmarks/early_exit.py [--model code] [--contexts 40] [--prompt-tokens 96] [--max-new-tokens 32]
        [--variants defaults 'exit_threshold=0.5,stop_threshold=1' ...] [--seed 0] [--threads 1]
        [--out benchmarks/early_exit/code-latest]

Contexts: `--contexts` windows of the code corpus's validation split (files the target, the exit heads and the
controllers never trained on; starts drawn by `--seed`): the first `--prompt-tokens` tokens are the prompt, the next
`--max-new-tokens` the reference completion. Each context is completed greedily by plain decoding (`ar`) and by
`early-exit` at each variant's thresholds, in rotated order, in one process (one warm-up first). Per variant:
layers run per emitted token (and skipped, of the target's L), stopped completions, tokens identical to `ar`'s,
ROUGE-L F1 (token LCS) of the completion against the reference beside `ar`'s, wall time per completion and per
token against `ar`'s (median ratio over contexts, worst context). The teacher-forced accuracy and stop precision
at the same thresholds come from the modules' held-out replay (their card). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAPER = "paper (GPT-2 / CodeGen, 16 layers): 1.7 layers skipped, +11.2 % speed, -1.1 % ROUGE-L"


def rouge_l(candidate: list[int], reference: list[int]) -> float:
    """ROUGE-L F1 over tokens: the longest common subsequence against both lengths."""
    if not candidate or not reference:
        return 0.0
    previous = [0] * (len(reference) + 1)
    for token in candidate:
        current = [0]
        for j, ref in enumerate(reference):
            current.append(previous[j] + 1 if token == ref else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(candidate), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)


def parse_variant(text: str) -> dict:
    """'exit_threshold=0.5,decision_layers=1/2' -> knobs (numbers as floats; '/' separates a list's layers)."""
    knobs = {}
    for key, _, value in (item.partition("=") for item in text.split(",") if item):
        try:
            knobs[key.strip()] = float(value)
        except ValueError:
            knobs[key.strip()] = value.replace("/", ",")
    return knobs


def contexts(generator, count: int, prompt_tokens: int, new_tokens: int,
             seed: int = 0) -> list[tuple[list[int], list[int]]]:
    from specgen.modalities.text.training.distill import windows as window_data

    cache = window_data.cache_folder(generator.model_path)
    cache.mkdir(parents=True, exist_ok=True)
    stream = window_data.corpus_stream(generator.tokenizer, "val", None, cache)
    windows = window_data.corpus_windows(stream, count, prompt_tokens, new_tokens, seed).tokens
    return [(row[:prompt_tokens].tolist(), row[prompt_tokens:].tolist()) for row in windows]


def run_one(generator, method: str, prompt: list[int], new_tokens: int, params: dict):
    import torch

    prompts = [torch.tensor(prompt)]
    began = time.perf_counter()
    result = generator.pipeline(method, prompts, max_new_tokens=new_tokens, params=dict(params)).generate(prompts)
    return result.tokens[0], time.perf_counter() - began, result.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="code")
    parser.add_argument("--contexts", type=int, default=40)
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--variants", nargs="+", default=["defaults", "stop_threshold=0.99", "decision_layers=",
                                                          "exit_threshold=1,stop_threshold=0.99"])
    parser.add_argument("--seed", type=int, default=0, help="which contexts (tune on another seed than you judge on)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "early_exit" / "code-latest")
    parser.add_argument("--replot", action="store_true", help="redraw OUT.png and OUT.md from OUT.json, run nothing")
    args = parser.parse_args()
    if args.replot:
        from specgen.modalities.text.generator import TextGenerator, shipped_code_pair

        record = json.loads(args.out.with_suffix(".json").read_text())
        model = shipped_code_pair()[0] if args.model == "code" else args.model
        return write(args.out, record, modules_replay(TextGenerator(model, threads=args.threads)))

    from tqdm import tqdm

    from specgen.modalities.text.generator import TextGenerator, shipped_code_pair

    model = shipped_code_pair()[0] if args.model == "code" else args.model
    generator = TextGenerator(model, threads=args.threads)
    eos = generator.tokenizer.eos_token_id
    # a variant "defaults" runs the registry's knob defaults
    variants = {"ar": ("ar", {}), **{text: ("early-exit", {} if text == "defaults" else parse_variant(text))
                                     for text in args.variants}}
    cases = contexts(generator, args.contexts, args.prompt_tokens, args.max_new_tokens, args.seed)
    for name, (method, params) in variants.items():  # warm-up: kernels built, weights touched
        run_one(generator, method, cases[0][0], 4, params)
    rows = {name: [] for name in variants}
    for index, (prompt, reference) in enumerate(tqdm(cases, desc="early-exit vs ar")):
        names = list(variants)
        names = names[index % len(names):] + names[:index % len(names)]
        outcome = {}
        for name in names:
            method, params = variants[name]
            outcome[name] = run_one(generator, method, prompt, args.max_new_tokens, params)
        ar_tokens, ar_s, _ = outcome["ar"]
        for name in variants:
            tokens, wall_s, stats = outcome[name]
            text = [t for t in tokens if t != eos]
            same = next((i for i, (a, b) in enumerate(zip(text, ar_tokens)) if a != b), min(len(text), len(ar_tokens)))
            summary = stats.get("early_exit", {})
            rows[name].append({"context": index, "tokens": len(text), "stopped": bool(tokens and tokens[-1] == eos
                                                                                     and name != "ar"),
                               "rouge_l": rouge_l(text, reference), "same_prefix": same, "wall_s": wall_s,
                               "s_per_token": wall_s / max(len(tokens), 1), "time_vs_ar": wall_s / ar_s,
                               "token_time_vs_ar": (wall_s / max(len(tokens), 1)) / (ar_s / len(ar_tokens)),
                               "decode_ms_per_token": 1000 * stats["verify_s"] / max(len(tokens), 1),
                               "decode_time_vs_ar": (stats["verify_s"] / max(len(tokens), 1))
                               / (outcome["ar"][2]["verify_s"] / len(ar_tokens)),
                               "mean_layers": summary.get("mean_layers")})
    record = {"command": "python benchmarks/early_exit.py " + " ".join(
                  f"--{k.replace('_', '-')} {' '.join(v) if isinstance(v, list) else v}"
                  for k, v in vars(args).items() if k not in ("out",)),
              "model": generator.model_path, "layers": generator.model.config.num_hidden_layers,
              "contexts": len(cases), "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens,
              "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "paper": PAPER, "variants": {name: aggregate(rows[name], rows["ar"], generator) for name in variants},
              "per_context": rows}
    write(args.out, record, modules_replay(generator))


def write(out: Path, record: dict, replay: list[dict]) -> None:
    """OUT.json, OUT.md and OUT.png."""
    out.parent.mkdir(parents=True, exist_ok=True)
    record["plot"] = out.with_suffix(".png").name
    plot_png(out.with_suffix(".png"), record, replay)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    out.with_suffix(".md").write_text(markdown(record))
    print(markdown(record))


def aggregate(rows: list[dict], ar_rows: list[dict], generator) -> dict:
    layers = generator.model.config.num_hidden_layers
    emitted = sum(r["tokens"] for r in rows)
    weighted = [r["mean_layers"] * r["tokens"] for r in rows if r["mean_layers"] is not None]
    mean_layers = sum(weighted) / emitted if weighted and emitted else float(layers)
    return {"completions": len(rows), "stopped": sum(r["stopped"] for r in rows), "tokens": emitted,
            "mean_layers": round(mean_layers, 3), "layers_skipped": round(layers - mean_layers, 3),
            "identical_to_ar": sum(r["same_prefix"] == r["tokens"] == a["tokens"] for r, a in zip(rows, ar_rows)),
            "rouge_l": round(statistics.mean(r["rouge_l"] for r in rows), 4),
            "completion_time_vs_ar": round(statistics.median(r["time_vs_ar"] for r in rows), 3),
            "token_time_vs_ar": round(statistics.median(r["token_time_vs_ar"] for r in rows), 3),
            "worst_token_time_vs_ar": round(max(r["token_time_vs_ar"] for r in rows), 3),
            "decode_time_vs_ar": round(statistics.median(r["decode_time_vs_ar"] for r in rows), 3),
            "worst_decode_time_vs_ar": round(max(r["decode_time_vs_ar"] for r in rows), 3),
            "decode_ms_per_token": round(statistics.median(r["decode_ms_per_token"] for r in rows), 3),
            "ms_per_token": round(1000 * sum(r["wall_s"] for r in rows) / max(sum(max(r["tokens"], 1)
                                                                                   for r in rows), 1), 3)}


def plot_png(path: Path, record: dict, replay: list[dict]) -> None:
    """Two panels (Pillow: matplotlib is no dependency): the modules' held-out replay, layers per token against
    agreement with the target at each exit threshold; and each measured variant, decoding time per token against
    plain decoding's and ROUGE-L."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=14)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        font = ImageFont.load_default()
    width, height, panel, top, bottom = 1100, 520, 550, 50, 60
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)

    def frame(x0: int, title: str, xs: tuple, ys: tuple, xlabel: str, ylabel: str):
        left, right = x0 + 70, x0 + panel - 30
        draw.text((x0 + 10, 12), title, fill="black", font=font)
        draw.rectangle([left, top, right, height - bottom], outline="black")
        for k in range(5):
            fx, fy = xs[0] + (xs[1] - xs[0]) * k / 4, ys[0] + (ys[1] - ys[0]) * k / 4
            x = left + (right - left) * k / 4
            y = height - bottom - (height - top - bottom) * k / 4
            draw.line([left, y, right, y], fill=(230, 230, 230))
            draw.text((x0 + 8, y - 7), f"{fy:.3f}", fill="black", font=font)
            draw.text((x - 12, height - bottom + 6), f"{fx:.2f}", fill="black", font=font)
        draw.text(((left + right) / 2 - 60, height - 28), xlabel, fill="black", font=font)
        draw.text((left + 6, top + 4), ylabel, fill="black", font=font)
        return lambda fx, fy: (left + (fx - xs[0]) / (xs[1] - xs[0]) * (right - left),
                               height - bottom - (fy - ys[0]) / (ys[1] - ys[0]) * (height - top - bottom))

    def bounds(values, pad):
        low, high = min(values), max(values)
        return low - pad * max(high - low, 1e-3), high + pad * max(high - low, 1e-3)

    points = [(e["mean_layers"], e["agreement"], e["exit_threshold"]) for e in replay]
    xy = frame(0, "held-out replay (teacher-forced): each exit threshold", bounds([p[0] for p in points], 0.1),
               bounds([p[1] for p in points], 0.1), "layers run per token", "agreement with the target")
    draw.line([xy(x, y) for x, y, _ in points], fill=(31, 119, 180), width=2)
    labelled = []
    for x, y, threshold in points:
        cx, cy = xy(x, y)
        draw.ellipse([cx - 4, cy - 4, cx + 4, cy + 4], fill=(31, 119, 180))
        if all(abs(cx - lx) + abs(cy - ly) > 40 for lx, ly in labelled):  # no label on top of another
            draw.text((cx - 8, cy + 8), f"{threshold:g}", fill=(31, 119, 180), font=font)
            labelled.append((cx, cy))
    variants = record["variants"]
    xs = [v["decode_time_vs_ar"] for v in variants.values()]
    ys = [v["rouge_l"] for v in variants.values()]
    xy = frame(panel, f"{record['contexts']} held-out contexts, {record['max_new_tokens']} new tokens",
               bounds(xs + [1.0], 0.15), bounds(ys, 0.3), "decoding time per token vs ar", "ROUGE-L")
    palette = [(60, 60, 60), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (23, 190, 207)]
    for k, (name, v) in enumerate(variants.items()):
        cx, cy = xy(v["decode_time_vs_ar"], v["rouge_l"])
        colour = palette[k % len(palette)]
        draw.ellipse([cx - 5, cy - 5, cx + 5, cy + 5], fill=colour)
        label = name or "every layer"
        shift = -8 - 7 * len(label) if cx > width - 200 else 8  # labels near the right edge go to the left
        draw.text((cx + shift, cy - 8 + 14 * (k % 2)), label, fill=colour, font=font)
    image.save(path)


def modules_replay(generator) -> list[dict]:
    from specgen.modalities.text.early_exit import find_modules, read_record

    return read_record(find_modules(generator.model_path))["record"].get("calibration", {}).get("exits", [])


def markdown(record: dict) -> str:
    lines = [f"# early-exit on held-out code ({record['date']})", "",
             f"`{record['command']}` — {record['contexts']} contexts of the code corpus's validation split, "
             f"{record['prompt_tokens']}-token prompts, {record['max_new_tokens']} new tokens, greedy, "
             f"{record['threads']} thread(s); the target has {record['layers']} layers. Time ratios: the median over "
             "contexts of early-exit's time over `ar`'s on the same context (below 1 is faster), the worst context "
             "in brackets; a completion's time includes building the request and the prompt's prefill, decoding "
             "time is the loop's steps alone (the target's forward, the choice of the token, the cache commit).", "",
             "| variant | layers run / token | layers skipped | stopped | identical to ar | ROUGE-L | "
             "time per completion vs ar | time per token vs ar (worst) | decoding time per token vs ar (worst) | "
             "decoding ms per token |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, v in record["variants"].items():
        lines.append(f"| `{name}` | {v['mean_layers']:.2f} | {v['layers_skipped']:.2f} | {v['stopped']}/"
                     f"{v['completions']} | {v['identical_to_ar']}/{v['completions']} | {v['rouge_l']:.3f} | "
                     f"{v['completion_time_vs_ar']:.2f} | {v['token_time_vs_ar']:.2f} "
                     f"({v['worst_token_time_vs_ar']:.2f}) | {v['decode_time_vs_ar']:.2f} "
                     f"({v['worst_decode_time_vs_ar']:.2f}) | {v['decode_ms_per_token']:.2f} |")
    lines += ["", f"Beside the {record['paper']}.", "", f"![trade-offs]({record.get('plot', '')})", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
