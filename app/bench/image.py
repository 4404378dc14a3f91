"""`specgen bench image` and `specgen bench video`: plain decoding and Jacobi decoding (SJD, MC-SJD,
Gumbel-coupled) of the shipped visual token model (image or video), side by side in one process, on
`benchmarks/prompts/{image,video}.jsonl`.

Every prompt and repeat runs `ar` once and every Jacobi method once per window L, with the same seed. A run is one
whole image (grid * grid tokens) or one whole video (frames * grid * grid). Reported per method and L: steps (target forward passes), step compression
(AR steps / steps), tokens changed per step (how unsettled the window is), the measured wall-clock speedup over
`ar` in the same round, and the speedup the cost model predicts from the measured steps and the measured cost of a
window, `(AR steps / steps) * T_window(1) / T_window(L)`. Per category: the target's mean token entropy (what
limits acceptance). Exactness: at temperature 0 every method must reproduce `ar` token for token (checked on every
prompt); at temperature 1 the methods are exact by construction (tests/samplers/test_jacobi.py).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from specgen import settings
from specgen.app.bench.text import (Prompt, _cpu_model, _load, benchmarks_dir, bootstrap_median_ci, load_prompts,
                                    source_state)
from specgen.errors import InvalidRequest
from specgen.samplers.registry import get_method, method_names

WINDOWS = {"image": (2, 4, 8, 16, 32, 64), "video": (8, 16, 32, 64, 128)}
WINDOW_REPEATS = 5  # timing repeats of one window forward (median)
DEFAULT_METHODS = ("ar", "sjd", "mc-sjd", "gumbel-sjd")


def token_entropy(generator, prompt: str, tokens: list[int]) -> float:
    """Mean entropy (nats) of the processed target law over the image slots, teacher-forced on `tokens`."""
    from specgen.samplers.guided import GuidedTarget

    processing = generator.processing()
    target = generator.engine()
    if processing.guidance_scale is not None:
        target = GuidedTarget(target, lambda _: generator.vocab.uncond_ids())
    ids = generator.vocab.prompt_ids(prompt)
    target.prefill([ids])
    window = torch.tensor([[int(ids[-1]), *tokens[:-1]]])
    positions = (len(ids) - 1 + torch.arange(window.shape[1]))[None]
    scores = target.score(window, positions, torch.tensor([0]))
    cond, uncond = scores if isinstance(scores, tuple) else (scores, None)
    probs = processing(cond, positions + 1, uncond).double()
    return float(-(probs * probs.clamp(min=1e-300).log()).sum(-1).mean())


def run_bench_image(*, prompts_path: Path | None = None, methods: list[str] | None = None, repeats: int = 1,
                    windows=None, generator=None, samples_out: Path | None = None, modality: str = "image",
                    model: str | Path | None = None) -> dict:
    from tqdm import tqdm

    from specgen.modalities.image.generator import ImageGenerator

    generator = generator or ImageGenerator(model, video=modality == "video")
    if generator.modality != modality:
        raise InvalidRequest(f"{generator.model_path} is {'a video' if generator.modality == 'video' else 'an image'}"
                             f" model; use `specgen bench {generator.modality}`")
    windows = tuple(windows or WINDOWS[modality])
    prompts_path = prompts_path or benchmarks_dir() / "prompts" / f"{modality}.jsonl"
    prompts = load_prompts(prompts_path, classes=True)
    methods = list(methods or [m for m in DEFAULT_METHODS if m in method_names(modality)])
    if "ar" not in methods:
        methods.insert(0, "ar")  # the baseline of every ratio
    jacobi = [m for m in methods if get_method(modality, m).drafter is not None]
    tokens_per_image = generator.vocab.image_tokens
    load_before = _load()
    generator.generate(prompts[0].prompt, method="ar")  # warm-up: first-call allocations
    runs, exact, entropy, window_s = [], [], {}, {}
    total = len(prompts) * repeats * (1 + len(jacobi) * len(windows)) + len(prompts) * (1 + len(jacobi))
    gallery = {}
    with tqdm(total=total, desc=f"bench {modality}", unit="run", file=sys.stderr) as progress:
        for prompt in prompts:
            window_s[prompt.id] = {L: generator.measure_window_s(prompt.prompt, L, repeats=WINDOW_REPEATS)
                                   for L in (1, *windows)}
            for repeat in range(repeats):
                ar = generator.generate(prompt.prompt, method="ar", seed=repeat)
                progress.update(1)
                if repeat == 0:
                    entropy[prompt.id] = token_entropy(generator, prompt.prompt, ar.tokens[0])
                    gallery.setdefault("ar", []).append(ar.image)
                runs.append(_record(prompt, repeat, "ar", 1, ar, ar))
                for method in jacobi:
                    for L in windows:
                        result = generator.generate(prompt.prompt, method=method, seed=repeat, window=L)
                        runs.append(_record(prompt, repeat, method, L, result, ar))
                        if repeat == 0 and L == max(windows):
                            gallery.setdefault(method, []).append(result.image)
                        progress.update(1)
            greedy = generator.generate(prompt.prompt, method="ar", temperature=0).tokens[0]
            progress.update(1)
            for method in jacobi:
                out = generator.generate(prompt.prompt, method=method, temperature=0).tokens[0]
                exact.append({"prompt": prompt.id, "method": method, "identical_to_ar": out == greedy})
                progress.update(1)
    load_after = _load()
    result = summarise(runs, exact, entropy, window_s, prompts, methods, windows, tokens_per_image)
    result["modality"], result["frames"] = modality, generator.vocab.frames
    result["env"] = {
        "timestamp_utc": datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"), **source_state(),
        "prompts": str(prompts_path), "repeats": repeats, "windows": list(windows), "threads": torch.get_num_threads(),
        "cpu_model": _cpu_model(), "settings": settings.snapshot(), "load_before": load_before,
        "load_after": load_after, "torch": torch.__version__,
        "sampling": {"temperature": 1.0, "top_k": generator.processing().top_k,
                     "guidance_scale": generator.processing().guidance_scale},
        "model": str(generator.model_path), "vq": str(generator.vq_path)}
    if samples_out is not None:
        _save_gallery(gallery, [p.id for p in prompts], samples_out)
    return result


def _record(prompt: Prompt, repeat: int, method: str, window: int, result, ar) -> dict:
    stats = result.stats
    return {"prompt": prompt.id, "category": prompt.category, "repeat": repeat, "method": method, "window": window,
            "steps": stats["steps"], "wall_s": stats["wall_s"], "tau": stats["tau"],
            "changed_per_step": stats.get("changed_per_step"),
            "speedup": ar.stats["wall_s"] / stats["wall_s"], "step_compression": ar.stats["steps"] / stats["steps"],
            "stats": stats}


def summarise(runs, exact, entropy, window_s, prompts, methods, windows, tokens_per_image) -> dict:
    by = {}
    for run in runs:
        by.setdefault((run["method"], run["window"]), []).append(run)
    table = []
    for (method, window), items in by.items():
        predicted = [i["step_compression"] * window_s[i["prompt"]][1] / window_s[i["prompt"]][window] for i in items]
        speedups = [i["speedup"] for i in items]
        median, low, high = bootstrap_median_ci(speedups)
        ci = [low, high] if len(speedups) > 1 else None
        changed = [i["changed_per_step"] for i in items if i["changed_per_step"] is not None]
        table.append({"method": method, "window": window, "runs": len(items),
                      "steps": statistics.median(i["steps"] for i in items),
                      "step_compression": statistics.median(i["step_compression"] for i in items),
                      "tau": statistics.median(i["tau"] for i in items),
                      "changed_per_step": statistics.median(changed) if changed else None,
                      "speedup": median, "speedup_ci95": ci,
                      "predicted_speedup": statistics.median(predicted),
                      "measured_over_predicted": median / statistics.median(predicted)})
    best = {}
    for row in table:
        if row["method"] != "ar" and (row["method"] not in best or row["speedup"] > best[row["method"]]["speedup"]):
            best[row["method"]] = row
    categories = {}
    for prompt in prompts:
        cat = categories.setdefault(prompt.category, {"prompts": 0, "entropy": [], "step_compression": {}})
        cat["prompts"] += 1
        cat["entropy"].append(entropy[prompt.id])
    for method, row in best.items():
        for name, cat in categories.items():
            values = [r["step_compression"] for r in runs
                      if r["method"] == method and r["window"] == row["window"] and r["category"] == name]
            cat["step_compression"][method] = statistics.median(values)
    for cat in categories.values():
        cat["entropy"] = statistics.mean(cat["entropy"])
    windows_cost = {str(L): statistics.median(window_s[p.id][L] for p in prompts) for L in (1, *windows)}
    per_method = {}
    for method in methods:
        row = best.get(method) or next(r for r in table if r["method"] == method)
        chosen = [r for r in runs if r["method"] == method and r["window"] == row["window"]]
        per_method[method] = {**_median_stats([r["stats"] for r in chosen]), "window": row["window"],
                              "speedup_vs_ar": row["speedup"], "step_compression": row["step_compression"],
                              "predicted_speedup_measured": row["predicted_speedup"],
                              "identical_to_ar": all(e["identical_to_ar"] for e in exact if e["method"] == method)}
    return {"methods": per_method, "items": runs, "tokens_per_image": tokens_per_image, "table": table,
            "best": {m: {"window": r["window"], "speedup": r["speedup"], "step_compression": r["step_compression"],
                         "measured_over_predicted": r["measured_over_predicted"]} for m, r in best.items()},
            "categories": categories, "window_s": windows_cost, "exactness": exact,
            "all_identical_to_ar": all(e["identical_to_ar"] for e in exact)}


def _median_stats(stats: list[dict]) -> dict:
    """Per key: the median of numbers over runs, the first run's value for anything else (names, flags, lists)."""
    out = {}
    for key, value in stats[0].items():
        numbers = [s[key] for s in stats if isinstance(s.get(key), (int, float)) and not isinstance(s[key], bool)]
        out[key] = statistics.median(numbers) if len(numbers) == len(stats) else value
    return out


def _f(value, digits=2, suffix=""):
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def render_markdown(result: dict, plot_name: str | None, samples_name: str | None) -> str:
    env = result["env"]
    modality = result.get("modality", "image")
    unit = "video" if modality == "video" else "image"
    lines = [f"# specgen bench {modality}", "",
             f"{env['timestamp_utc']} · commit {(env.get('git_commit') or '?')[:12]}"
             f"{' (with uncommitted changes)' if env.get('git_dirty') else ''} · {env['cpu_model']} · "
             f"{env['threads']} thread(s) · load {env.get('load_before')} → {env.get('load_after')}", "",
             f"Sampling: temperature {env['sampling']['temperature']}, top-k {env['sampling']['top_k']}, "
             f"guidance {env['sampling']['guidance_scale']}; {result['tokens_per_image']} tokens per {unit}"
             + (f" ({result['frames']} frames)" if result.get("frames", 1) > 1 else "") + "; "
             f"prompts `{env['prompts']}`, {env['repeats']} repeat(s).", "",
             "## Best window per method", "",
             "| method | best L | step compression | speedup vs ar | measured / predicted |", "|---|---|---|---|---|"]
    for method, row in result["best"].items():
        lines.append(f"| `{method}` | {row['window']} | {_f(row['step_compression'])}× | {_f(row['speedup'])}× | "
                     f"{_f(row['measured_over_predicted'])} |")
    lines += ["", "## Every window", "",
              "| method | L | steps | step compression | τ | changed / step | speedup (95% CI) | predicted | T_window |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(result["table"], key=lambda r: (r["method"] != "ar", r["method"], r["window"])):
        ci = row["speedup_ci95"]
        ci_text = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        lines.append(f"| `{row['method']}` | {row['window']} | {row['steps']:.0f} | {_f(row['step_compression'])}× | "
                     f"{_f(row['tau'])} | {_f(row['changed_per_step'], 1)} | {_f(row['speedup'])}×{ci_text} | "
                     f"{_f(row['predicted_speedup'])}× | {1e3 * result['window_s'][str(row['window'])]:.1f} ms |")
    lines += ["", "## Per category", "", "| category | prompts | mean token entropy (nats) | step compression at best L |",
              "|---|---|---|---|"]
    for name, cat in result["categories"].items():
        sc = ", ".join(f"{m} {v:.2f}×" for m, v in cat["step_compression"].items())
        lines.append(f"| {name} | {cat['prompts']} | {cat['entropy']:.2f} | {sc} |")
    same = sum(e["identical_to_ar"] for e in result["exactness"])
    lines += ["", f"Greedy exactness: {same} of {len(result['exactness'])} method × prompt runs reproduce `ar` token "
                  f"for token.", "",
              "Predicted speedup = (AR steps / steps) × T_window(1) / T_window(L), from the measured steps and the "
              "measured median cost of one target forward over L slots (guided: two rows).", ""]
    if plot_name:
        lines += [f"![speedup by window]({plot_name})", ""]
    if samples_name:
        lines += [f"Samples (first repeat; rows: methods at the largest L, columns: prompts): ![samples]({samples_name})", ""]
    return "\n".join(lines)


def plot_png(path: Path, result: dict) -> None:
    """Two panels over log2(L): wall-clock speedup (solid: measured, dotted: predicted) and step compression.
    Drawn with Pillow (matplotlib is not a dependency)."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=13)
    except TypeError:
        font = ImageFont.load_default()
    colours = [(70, 130, 180), (200, 90, 40), (60, 150, 80), (150, 70, 160)]
    methods = sorted({r["method"] for r in result["table"]} - {"ar"})
    windows = sorted({r["window"] for r in result["table"] if r["method"] != "ar"})
    panel_w, panel_h, pad = 460, 300, 50
    image = Image.new("RGB", (2 * panel_w + 3 * pad, panel_h + 2 * pad + 20 * (len(methods) + 1)), "white")
    draw = ImageDraw.Draw(image)
    import math

    for panel, (key, title) in enumerate((("speedup", "wall-clock speedup over ar (dotted: predicted)"),
                                          ("step_compression", "step compression (AR steps / steps)"))):
        left, top = pad + panel * (panel_w + pad), pad
        values = [r[key] for r in result["table"] if r["method"] != "ar"]
        if key == "speedup":
            values += [r["predicted_speedup"] for r in result["table"] if r["method"] != "ar"]
        high = max([1.0, *values]) * 1.1
        x = lambda L: left + (math.log2(L) - math.log2(windows[0])) / max(1e-9, math.log2(windows[-1] / windows[0])) * panel_w  # noqa: E731
        y = lambda v: top + panel_h - v / high * panel_h  # noqa: E731
        draw.rectangle([left, top, left + panel_w, top + panel_h], outline="black")
        draw.text((left, top - 20), title, fill="black", font=font)
        draw.line([left, y(1.0), left + panel_w, y(1.0)], fill=(170, 170, 170))
        for tick in (0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32):
            if tick < high:
                draw.line([left - 4, y(tick), left, y(tick)], fill="black")
                draw.text((left - 34, y(tick) - 7), f"{tick:g}x", fill="black", font=font)
        for L in windows:
            draw.text((x(L) - 6, top + panel_h + 4), str(L), fill="black", font=font)
        for colour, method in zip(colours, methods):
            rows = sorted((r for r in result["table"] if r["method"] == method), key=lambda r: r["window"])
            points = [(x(r["window"]), y(r[key])) for r in rows]
            draw.line(points, fill=colour, width=3)
            if key == "speedup":
                for (a, b) in zip(rows, rows[1:]):
                    draw.line([x(a["window"]), y(a["predicted_speedup"]), x(b["window"]), y(b["predicted_speedup"])],
                              fill=colour, width=1)
    legend_top = panel_h + 2 * pad
    draw.text((pad, legend_top - 16), "window L (log scale)", fill="black", font=font)
    for i, (colour, method) in enumerate(zip(colours, methods)):
        draw.rectangle([pad, legend_top + 8 + 20 * i, pad + 14, legend_top + 20 + 20 * i], fill=colour)
        draw.text((pad + 20, legend_top + 6 + 20 * i), method, fill="black", font=font)
    image.save(path)


def _save_gallery(gallery: dict, prompt_ids: list[str], path: Path) -> None:
    from PIL import Image

    from specgen.modalities.image.video import filmstrip

    # a video is shown as its frames in rows of four
    gallery = {m: [filmstrip(x, columns=4) if isinstance(x, list) else x for x in items] for m, items in gallery.items()}
    rows = list(gallery)
    first = gallery[rows[0]][0]
    w, h = first.size
    sheet = Image.new("RGB", (w * len(prompt_ids), h * len(rows)), "white")
    for r, method in enumerate(rows):
        for c, image in enumerate(gallery[method]):
            sheet.paste(image, (c * w, r * h))
    sheet.resize((sheet.width * 2, sheet.height * 2), Image.NEAREST).save(path)


def write_outputs(result: dict, out_dir: Path, plot: bool = True, latest_dir: Path | None = None) -> dict[str, Path]:
    """bench-MODALITY-STAMP.* in `out_dir`, MODALITY-latest.* in `latest_dir` (default: the same folder)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp, modality = result["env"]["timestamp_utc"], result.get("modality", "image")
    paths = {"json": out_dir / f"bench-{modality}-{stamp}.json", "md": out_dir / f"bench-{modality}-{stamp}.md"}
    plot_name = None
    if plot:
        paths["png"] = out_dir / f"bench-{modality}-{stamp}.png"
        plot_png(paths["png"], result)
        plot_name = paths["png"].name
    samples = out_dir / f"bench-{modality}-{stamp}-samples.png"
    samples_name = samples.name if samples.exists() else None
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["md"].write_text(render_markdown(result, plot_name, samples_name))
    write_latest(result, paths, latest_dir or out_dir, samples if samples_name else None)
    return paths


def write_latest(result: dict, paths: dict[str, Path], out_dir: Path, samples: Path | None) -> None:
    """MODALITY-latest.* in `out_dir`; the latest report points at the latest plot and samples."""
    import shutil

    latest = f"{result.get('modality', 'image')}-latest"
    for kind in ("json", "png"):
        if kind in paths:
            shutil.copyfile(paths[kind], out_dir / f"{latest}.{kind}")
    if samples is not None:
        shutil.copyfile(samples, out_dir / f"{latest}-samples.png")
    (out_dir / f"{latest}.md").write_text(render_markdown(
        result, f"{latest}.png" if "png" in paths else None,
        f"{latest}-samples.png" if samples is not None else None))


def bench_image(args) -> int:
    modality = getattr(args, "modality", "image")
    if getattr(args, "max_new_tokens", None) is not None:
        raise InvalidRequest(f"--max-new-tokens does not apply to {modality}: every run generates one whole {modality}")
    from specgen.app.bench.text import record_dirs

    out_dir, latest_dir = record_dirs(getattr(args, "out_dir", None))
    if modality == "image":
        from specgen.app.bench.lantern import HEAD_METHODS, bench_lantern

        head_methods = [m for m in (args.methods or HEAD_METHODS) if m in HEAD_METHODS]
        if head_methods:
            result = bench_lantern(args, head_methods)
            if args.methods and not [m for m in args.methods if m not in HEAD_METHODS and m != "ar"]:
                if args.json:
                    print(json.dumps(result))
                return 0  # only head methods were asked for
        args.methods = [m for m in args.methods if m not in HEAD_METHODS] if args.methods else None
    started = time.perf_counter()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    result = run_bench_image(prompts_path=args.prompts, methods=args.methods, repeats=args.repeats,
                             windows=getattr(args, "windows", None), modality=modality,
                             model=getattr(args, "model", None),
                             samples_out=Path(out_dir) / f"bench-{modality}-{stamp}-samples.png")
    result["env"]["timestamp_utc"] = stamp
    result["env"]["command"] = "specgen " + " ".join(getattr(args, "argv", []))
    result["env"]["wall_s"] = time.perf_counter() - started
    paths = write_outputs(result, Path(out_dir), latest_dir=latest_dir)
    if args.json:
        print(json.dumps(result))
    else:
        print(paths["md"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0
