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

With `quality=True` (`--quality`) every generated image or clip is also scored by the independent judge
(modalities/image/judge.py: Tesseract OCR of the glyph, palette colours of glyph and background, and for clips the
direction of motion), per method, beside the same checks on true renders of the same prompts (the judge's ceiling).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import torch

from specgen.app.bench.prompts import Prompt, load_prompts
from specgen.app.bench.records import RunStart, benchmarks_dir, record_dirs, run_env, start_run
from specgen.app.bench.report import Written, command_line, fmt, font, print_outcome, run_line, write_record
from specgen.app.bench.runner import progress, rounds
from specgen.app.bench.stats import median_ci, prompt_medians, slowdowns
from specgen.errors import InvalidRequest
from specgen.samplers.registry import get_method, method_names

WINDOWS = {"image": (2, 4, 8, 16, 32, 64), "video": (8, 16, 32, 64, 128)}
WINDOW_REPEATS = 5  # timing repeats of one window forward (median)
CEILING_RENDERS = 4  # true renders judged per prompt for the judge's ceiling
DEFAULT_METHODS = ("ar", "sjd", "mc-sjd", "gumbel-sjd", "auto")


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
                    model: str | Path | None = None, start: RunStart | None = None, quality: bool = False) -> dict:
    """Every prompt and repeat: `ar`, then every Jacobi method at every window, same seed; then per prompt the
    greedy exactness check. `samples_out`: where the first repeat's images are drawn, one row per method.
    `quality`: judge every generated image (OCR, colours, motion) and true renders of the same prompts."""
    from specgen.modalities.image import judge
    from specgen.modalities.image.generator import ImageGenerator
    from specgen.modalities.image.models import glyph_style_of

    tesseract = judge.require_tesseract() if quality else None  # before any model loads
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
    start = start or start_run()
    generator.generate(prompts[0].prompt, method="ar")  # warm-up: first-call allocations
    # auto picks its own method and window: one variant, window 0
    variants = [("ar", 1), *((method, L) for method in jacobi if method != "auto" for L in windows),
                *((("auto", 0),) if "auto" in jacobi else ())]
    runs, exact, entropy, window_s, gallery = [], [], {}, {}, {}
    bar = progress(len(prompts) * (repeats * len(variants) + 1 + len(jacobi)), f"bench {modality}")
    for round_ in rounds(prompts, variants, repeats, rotate=False):  # ar first: every run is measured against it
        prompt = round_.prompt
        if round_.repeat == 0:
            window_s[prompt.id] = {L: generator.measure_window_s(prompt.prompt, L, repeats=WINDOW_REPEATS)
                                   for L in (1, *windows)}
        for method, L in round_.order:
            result = generator.generate(prompt.prompt, method=method, seed=round_.repeat,
                                        **({"window": L} if method not in ("ar", "auto") else {}))
            if method == "ar":
                ar = result
            runs.append(_record(prompt, round_.repeat, method, L, result, ar))
            if quality:
                runs[-1]["quality"] = judge_sample(result.image, prompt.prompt)
            if round_.repeat == 0 and method == "ar":
                entropy[prompt.id] = token_entropy(generator, prompt.prompt, ar.tokens[0])
            if round_.repeat == 0 and (method in ("ar", "auto") or L == max(windows)):
                gallery.setdefault(method, []).append(result.image)
            bar.update(1)
        if round_.last:
            exact += _greedy_exactness(generator, prompt, jacobi, bar)
    bar.close()
    result = summarise(runs, exact, entropy, window_s, prompts, methods, windows, generator.vocab.image_tokens)
    result["modality"], result["frames"] = modality, generator.vocab.frames
    processing = generator.processing()
    result["env"] = run_env(start, prompts=str(prompts_path), repeats=repeats, windows=list(windows),
                            sampling={"temperature": 1.0, "top_k": processing.top_k,
                                      "guidance_scale": generator.default_guidance},
                            model=str(generator.model_path), vq=str(generator.vq_path))
    if quality:
        result["quality"] = quality_summary(runs, prompts, methods, generator.vocab.frames, generator.vq,
                                            glyph_style_of(generator.model_path))
        result["env"]["tesseract"] = tesseract
    if samples_out is not None:
        _save_gallery(gallery, [p.id for p in prompts], samples_out)
    return result


def judge_sample(media, prompt: str) -> dict | None:
    """The judge's scores of one generated image (PIL) or clip (list of PIL frames) against its prompt; None for a
    prompt with nothing to judge (photos, grey scanned digits)."""
    from dataclasses import asdict

    from specgen.modalities.image import judge

    ask = judge.parse_prompt(prompt)
    if not ask.judgeable:
        return None
    verdict = judge.judge_clip(media) if isinstance(media, list) else judge.judge_image(media)
    return {**judge.score(verdict, ask), "verdict": asdict(verdict)}


def quality_summary(runs: list[dict], prompts: list[Prompt], methods: list[str], frames: int, vq=None,
                    glyph_style: str = "varied") -> dict:
    """Per method: the judge's accuracies over every run of it (all windows: the methods are exact, so every window
    samples the same law); `true renders`: the same checks on CEILING_RENDERS true renders per prompt (the judge's
    ceiling); with the `vq`, `through the tokenizer`: those renders encoded to codes and decoded (what a token model
    that put every code right would show: the tokenizer's ceiling); the renders are drawn in the model's training
    `glyph_style`; `chance`: `ar`'s images scored against the prompt half the file away (another glyph, other
    colours, another motion in the shipped files), the level a model that ignores its prompt would reach."""
    from specgen.modalities.image import judge

    per_method = {m: judge.summarise([r["quality"] for r in runs if r["method"] == m and r.get("quality")])
                  for m in methods}
    asks = {p.id: judge.parse_prompt(p.prompt) for p in prompts}
    judged = [p.id for p in prompts if asks[p.id].judgeable]
    other = {pid: asks[judged[(k + len(judged) // 2) % len(judged)]] for k, pid in enumerate(judged)}
    chance = [judge.score(judge.verdict_from_dict(r["quality"]["verdict"]), other[r["prompt"]])
              for r in runs if r["method"] == "ar" and r.get("quality") and len(judged) > 1]
    ceiling, coded = ceiling_scores([p.prompt for p in prompts], frames, vq, glyph_style)
    return {"methods": per_method, "true_renders": judge.summarise(ceiling), "chance": judge.summarise(chance),
            "renders_per_prompt": CEILING_RENDERS, "glyph_style": glyph_style,
            **({"through_tokenizer": judge.summarise(coded)} if coded else {})}


def ceiling_scores(prompts: list[str], frames: int, vq=None, glyph_style: str = "varied",
                   renders: int = CEILING_RENDERS) -> tuple[list[dict], list[dict]]:
    """The judge's scores of `renders` true renders per glyph prompt (clips where frames > 1, for prompts that ask
    for a motion) in `glyph_style`: as drawn, and with the `vq` encoded to codes and decoded (else empty)."""
    from specgen.modalities.image import judge
    from specgen.modalities.image.vq import reconstruct

    ceiling, coded = [], []
    for prompt in prompts:
        ask = judge.parse_prompt(prompt)
        if ask.char is None or (frames > 1 and ask.motion is None):
            continue  # the true renders are glyphs (scanned digits and photos are not judged for the ceiling)
        for sample in range(renders):
            rng = judge.render_rng(prompt, sample)
            if frames > 1:
                clip = judge.true_clip(ask, rng, frames, glyph_style)
                ceiling.append(judge.score_clip(judge.judge_clip(clip), ask))
                if vq is not None:
                    coded.append(judge.score_clip(judge.judge_clip(list(reconstruct(vq, clip))), ask))
            else:
                image = judge.true_image(ask, rng, glyph_style)
                ceiling.append(judge.score_image(judge.judge_image(image), ask))
                if vq is not None:
                    coded.append(judge.score_image(judge.judge_image(reconstruct(vq, image[None])[0]), ask))
    return ceiling, coded


def _window_ms(result: dict, window: int) -> str:
    cost = result["window_s"].get(str(window))
    return f"{1e3 * cost:.1f} ms" if cost is not None else "—"


def _greedy_exactness(generator, prompt: Prompt, jacobi: list[str], bar) -> list[dict]:
    """At temperature 0 every Jacobi method must reproduce `ar` token for token."""
    greedy = generator.generate(prompt.prompt, method="ar", temperature=0).tokens[0]
    bar.update(1)
    exact = []
    for method in jacobi:
        out = generator.generate(prompt.prompt, method=method, temperature=0).tokens[0]
        exact.append({"prompt": prompt.id, "method": method, "identical_to_ar": out == greedy})
        bar.update(1)
    return exact


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
        predicted = [i["step_compression"] * window_s[i["prompt"]][1] / window_s[i["prompt"]].get(window, window_s[i["prompt"]][1])
                     for i in items]
        speedups = [i["speedup"] for i in items]
        median, ci = median_ci(speedups)
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
                              "slowdowns": slowdowns(list(prompt_medians(chosen, "speedup", "prompt").values())),
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


def render_markdown(result: dict, plot_name: str | None, samples_name: str | None) -> str:
    env = result["env"]
    modality = result.get("modality", "image")
    unit = "video" if modality == "video" else "image"
    lines = [f"# specgen bench {modality}", "",
             run_line(env), "",
             f"Sampling: temperature {env['sampling']['temperature']}, top-k {env['sampling']['top_k']}, "
             f"guidance {env['sampling']['guidance_scale'] or 1.0}; {result['tokens_per_image']} tokens per {unit}"
             + (f" ({result['frames']} frames)" if result.get("frames", 1) > 1 else "") + "; "
             f"prompts `{env['prompts']}`, {env['repeats']} repeat(s).", "",
             "## Best window per method", "",
             "| method | best L | step compression | speedup vs ar | measured / predicted | slower than ar (prompts; "
             "worst) |", "|---|---|---|---|---|---|"]
    for method, row in result["best"].items():
        slow = result["methods"].get(method, {}).get("slowdowns")
        slower = f"{slow['slower_than_ar']}/{slow['prompts']}; {fmt(slow['worst_speedup'])}×" if slow else "—"
        lines.append(f"| `{method}` | {row['window'] or 'auto'} | {fmt(row['step_compression'])}× | {fmt(row['speedup'])}× | "
                     f"{fmt(row['measured_over_predicted'])} | {slower} |")
    lines += ["", "## Every window", "",
              "| method | L | steps | step compression | τ | changed / step | speedup (95% CI) | predicted | T_window |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(result["table"], key=lambda r: (r["method"] != "ar", r["method"], r["window"])):
        ci = row["speedup_ci95"]
        ci_text = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        lines.append(f"| `{row['method']}` | {row['window']} | {row['steps']:.0f} | {fmt(row['step_compression'])}× | "
                     f"{fmt(row['tau'])} | {fmt(row['changed_per_step'], 1)} | {fmt(row['speedup'])}×{ci_text} | "
                     f"{fmt(row['predicted_speedup'])}× | {_window_ms(result, row['window'])} |")
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
    if result.get("quality"):
        lines += quality_markdown(result)
    if plot_name:
        lines += [f"![speedup by window]({plot_name})", ""]
    if samples_name:
        lines += [f"Samples (first repeat; rows: methods at the largest L, columns: prompts): ![samples]({samples_name})", ""]
    return "\n".join(lines)


def quality_markdown(result: dict) -> list[str]:
    """The judge's table: one row per method and one for true renders (the ceiling), speedups beside."""
    quality, video = result["quality"], result.get("frames", 1) > 1

    def share(summary: dict, key: str) -> str:
        return f"{summary[key]:.2f}" if key in summary else "—"

    def group(summary: dict, name: str) -> str:
        g = summary.get(name)
        return f"{g['ocr_folded']:.2f} / {g['ocr_strict']:.2f} ({g['n']})" if g else "—"

    per_frame = "per-frame " if video else ""
    head = (f"| | {'clips' if video else 'images'} | {per_frame}OCR case-folded | {per_frame}OCR strict | uppercase "
            "| lowercase | digits | glyph colour | background colour |"
            + (" direction | monotonic |" if video else "") + " speedup vs ar |")
    lines = ["## Quality (independent judge)", "",
             "Tesseract reads the glyph (one character, the prompt alphabet), the palette colours of glyph and "
             "background are read from the pixels" + (", and the glyph's centroid over the frames gives the direction "
                                                      "of motion" if video else "") + " (modalities/image/judge.py). "
             "Shares of the samples the prompt's check applies to; OCR per class group as case-folded / strict "
             "(samples). Headline: case-folded (letters case-insensitive, 0 = O): a lone glyph's case is often "
             "undecidable. `true renders` is the judge on "
             f"{quality['renders_per_prompt']} renders per glyph prompt in the model's training style "
             f"(`{quality.get('glyph_style', 'varied')}` glyphs): its ceiling; `through the "
             "tokenizer`: the same renders encoded to codes and decoded by the VQ, what a token model putting every "
             "code right would show (the tokenizer's ceiling); `chance` "
             "scores `ar`'s images against the prompt half the file away: what ignoring the prompt scores. "
             "Methods pool every window (all are exact). The Fréchet distance is measured by `--quality-samples` "
             "for the head methods (benchmarks/image-lantern-latest.md).", "",
             head, "|---" * (head.count("|") - 1) + "|"]
    rows = [*((f"`{m}`", s, result["methods"].get(m, {}).get("speedup_vs_ar")) for m, s in quality["methods"].items()),
            ("true renders (ceiling)", quality["true_renders"], None),
            *((("true renders through the tokenizer", quality["through_tokenizer"], None),)
              if "through_tokenizer" in quality else ()),
            *((("`ar` vs another prompt (chance)", quality["chance"], None),) if quality["chance"]["samples"] else ())]
    for name, summary, speedup in rows:
        lines.append(f"| {name} | {summary['samples']} | {share(summary, 'ocr_folded')} | "
                     f"{share(summary, 'ocr_strict')} | {group(summary, 'uppercase')} | "
                     f"{group(summary, 'lowercase')} | {group(summary, 'digit')} | {share(summary, 'fg')} | "
                     f"{share(summary, 'bg')} |" + (f" {share(summary, 'direction')} | {share(summary, 'monotonic')} |"
                                                    if video else "") + f" {fmt(speedup, suffix='×')} |")
    return lines + [""]


def plot_png(path: Path, result: dict) -> None:
    """Two panels over log2(L): wall-clock speedup (solid: measured, dotted: predicted) and step compression.
    Drawn with Pillow (matplotlib is not a dependency)."""
    from PIL import Image, ImageDraw

    result = {**result, "table": [r for r in result["table"] if r["window"] > 0]}  # auto has no window to plot at
    label_font = font(13)
    colours = [(70, 130, 180), (200, 90, 40), (60, 150, 80), (150, 70, 160)]
    methods = sorted({r["method"] for r in result["table"]} - {"ar"})
    windows = sorted({r["window"] for r in result["table"] if r["method"] != "ar"})
    panel_w, panel_h, pad = 460, 300, 50
    image = Image.new("RGB", (2 * panel_w + 3 * pad, panel_h + 2 * pad + 20 * (len(methods) + 1)), "white")
    draw = ImageDraw.Draw(image)
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
        draw.text((left, top - 20), title, fill="black", font=label_font)
        draw.line([left, y(1.0), left + panel_w, y(1.0)], fill=(170, 170, 170))
        for tick in (0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32):
            if tick < high:
                draw.line([left - 4, y(tick), left, y(tick)], fill="black")
                draw.text((left - 34, y(tick) - 7), f"{tick:g}x", fill="black", font=label_font)
        for L in windows:
            draw.text((x(L) - 6, top + panel_h + 4), str(L), fill="black", font=label_font)
        for colour, method in zip(colours, methods):
            rows = sorted((r for r in result["table"] if r["method"] == method), key=lambda r: r["window"])
            points = [(x(r["window"]), y(r[key])) for r in rows]
            draw.line(points, fill=colour, width=3)
            if key == "speedup":
                for (a, b) in zip(rows, rows[1:]):
                    draw.line([x(a["window"]), y(a["predicted_speedup"]), x(b["window"]), y(b["predicted_speedup"])],
                              fill=colour, width=1)
    legend_top = panel_h + 2 * pad
    draw.text((pad, legend_top - 16), "window L (log scale)", fill="black", font=label_font)
    for i, (colour, method) in enumerate(zip(colours, methods)):
        draw.rectangle([pad, legend_top + 8 + 20 * i, pad + 14, legend_top + 20 + 20 * i], fill=colour)
        draw.text((pad + 20, legend_top + 6 + 20 * i), method, fill="black", font=label_font)
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


def write_outputs(result: dict, out_dir: Path, plot: bool = True, latest_dir: Path | None = None) -> Written:
    """bench-MODALITY-STAMP.* in `out_dir`, MODALITY-latest.* in `latest_dir` (default: the same folder); the sample
    sheet the run drew beside them (bench-MODALITY-STAMP-samples.png) is linked and copied too."""
    stem = f"bench-{result.get('modality', 'image')}-{result['env']['timestamp_utc']}"
    latest = f"{result.get('modality', 'image')}{'-quality' if result.get('quality') else ''}-latest"
    figures = {"png": lambda path: plot_png(path, result)} if plot else {}
    samples = out_dir / f"{stem}-samples.png"
    if samples.exists():
        figures["samples"] = samples
    return write_record(result, out_dir, stem, lambda names: render_markdown(result, names.get("png"),
                                                                             names.get("samples")),
                        figures, latest, latest_dir)


def bench_image(args) -> int:
    """`specgen bench image|video`; for image, the draft head's methods (eagle, lantern, lantern++) among
    --methods run in the head's bench (`lantern`)."""
    modality = getattr(args, "modality", "image")
    if getattr(args, "max_new_tokens", None) is not None:
        raise InvalidRequest(f"--max-new-tokens does not apply to {modality}: every run generates one whole {modality}")
    out_dir, latest_dir = record_dirs(getattr(args, "out_dir", None))
    quality = getattr(args, "quality", False)
    if quality:
        from specgen.modalities.image.judge import require_tesseract

        require_tesseract()  # one clear error before any model loads
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
    start = start_run()
    result = run_bench_image(prompts_path=args.prompts, methods=args.methods, repeats=args.repeats,
                             windows=getattr(args, "windows", None), modality=modality,
                             model=getattr(args, "model", None), start=start,
                             samples_out=out_dir / f"bench-{modality}-{start.timestamp}-samples.png",
                             quality=quality)
    result["env"]["command"] = command_line(args)
    print_outcome(result, write_outputs(result, out_dir, latest_dir=latest_dir), args.json)
    return 0
