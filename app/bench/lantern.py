"""`specgen bench image` for the draft head's methods: plain decoding, exact tree decoding with the EAGLE-style
head (`eagle`), LANTERN (delta) and LANTERN++ at each lambda of the sweep, side by side in one process on
`benchmarks/prompts/image.jsonl`. Writes bench-image-lantern-STAMP.{json,md,png} under $SPECGEN_HOME/runs and
copies it as benchmarks/image-lantern-latest.* (`--out-dir DIR`: both in DIR).

Speed: per prompt and repeat every setting runs once after `ar`, same seed; reported per setting: steps, tau
(tokens per step), the share of accepted codes the exact test would have rejected, and the wall-clock speedup
over `ar` of the same round (median with a bootstrap 95 % interval). Greedy `eagle` must reproduce `ar` token
for token on every prompt.

The judge (--quality): Tesseract OCR and palette colours of every image of the speed runs, per setting and as the
difference from `ar` with a 95 % interval (`judge_summary`).

Quality (--quality-samples N): N images per setting over the prompts of the first N/20 validation items (20
samples each, one batch), scored by the shipped classifier (assets/image/classifier): the Fréchet distance of
its features to the VQ reconstructions of the first N validation images, the AR-vs-AR floor (a second AR set
with another seed), and accuracy on the requested class. Generated codes are cached per setting and prompt under
$SPECGEN_HOME/bench-lantern/KEY (KEY: the target and head weights and the tree), so an interrupted run resumes.
The target: a lambda with speedup >= 2 whose FD exceeds AR's by at most max(0.1 FD_AR, 2 x floor).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from specgen.app.bench.prompts import load_prompts
from specgen.app.bench.records import benchmarks_dir, record_dirs, run_env, start_run
from specgen.app.bench.report import command_line, font, run_line, write_record
from specgen.app.bench.runner import progress as progress_bar
from specgen.app.bench.runner import rounds
from specgen.app.bench.stats import median_ci

HEAD_METHODS = ("eagle", "lantern", "lantern++")
LAMBDAS = (1.5, 2.0, 3.0, 5.0, 10.0)
DELTAS = (0.1,)
SAMPLES_PER_PROMPT = 20
GRID_COLUMNS = 8  # samples shown per setting in the report's grid


def method_settings(methods, lambdas, deltas, shapes=()) -> list[tuple[str, dict]]:
    """(method, knobs) per setting; with several `shapes` every setting runs at each (a `shape` knob)."""
    out = []
    if "eagle" in methods:
        out.append(("eagle", {}))
    if "lantern" in methods:
        out += [("lantern", {"delta": d}) for d in deltas]
    if "lantern++" in methods:
        out += [("lantern++", {"lam": lam}) for lam in lambdas]
    if len(shapes) > 1:
        out = [(method, {**knobs, "shape": shape}) for shape in shapes for method, knobs in out]
    return out


def label(method: str, knobs: dict) -> str:
    extra = ", ".join(f"{'λ' if k == 'lam' else 'δ' if k == 'delta' else k} {v:g}" if isinstance(v, float)
                      else f"{k} {v}" for k, v in knobs.items())
    return f"{method} ({extra})" if extra else method


def run_speed(generator, prompts, chosen, repeats: int, shape: str | None, progress, judged: bool = False) -> dict:
    """Per prompt: greedy `eagle` against greedy `ar` (exactness), then every repeat `ar` and every setting with
    the repeat's seed, each setting's speedup measured against the `ar` run of its round. `judged`: the independent
    judge scores every image (`judge_summary`)."""
    from specgen.app.bench.image import judge_sample

    runs, exact, ar_scores = [], [], []
    extra = {"shape": shape} if shape else {}
    for round_ in rounds(prompts, [("ar", {}), *chosen], repeats, rotate=False):
        prompt, repeat = round_.prompt, round_.repeat
        if repeat == 0:
            ar_greedy = generator.generate(prompt.prompt, method="ar", temperature=0.0, seed=0)
            for method, knobs in chosen:
                if method == "eagle":
                    greedy = generator.generate(prompt.prompt, method="eagle", temperature=0.0, seed=0,
                                                **knobs, **extra)
                    exact.append({"prompt": prompt.id, "setting": label(method, knobs),
                                  "identical_to_ar": greedy.tokens == ar_greedy.tokens})
        for method, knobs in round_.order:
            result = generator.generate(prompt.prompt, method=method, seed=repeat,
                                        **({} if method == "ar" else {**knobs, **extra}))
            progress.update(1)
            score = judge_sample(result.image, prompt.prompt) if judged else None
            if method == "ar":
                ar = result
                ar_scores.append(score)
                continue
            stats = result.stats
            runs.append({"prompt": prompt.id, "category": prompt.category, "repeat": repeat,
                         "setting": label(method, knobs), "method": method, "knobs": knobs,
                         "steps": stats["steps"], "tau": stats["tau"], "wall_s": stats["wall_s"],
                         "relaxed_share": stats.get("relaxed_share"),
                         "speedup": ar.stats["wall_s"] / stats["wall_s"], "ar_wall_s": ar.stats["wall_s"],
                         **({"quality": score} if judged else {})})
    table = []
    for name in dict.fromkeys(r["setting"] for r in runs):
        items = [r for r in runs if r["setting"] == name]
        median, ci = median_ci([r["speedup"] for r in items])
        shares = [r["relaxed_share"] for r in items if r["relaxed_share"] is not None]
        table.append({"setting": name, "method": items[0]["method"], "knobs": items[0]["knobs"], "runs": len(items),
                      "steps": statistics.median(r["steps"] for r in items),
                      "tau": statistics.median(r["tau"] for r in items),
                      "relaxed_share": statistics.median(shares) if shares else None,
                      "speedup": median, "speedup_ci95": ci})
    return {"table": table, "items": runs, "exactness": exact,
            "all_identical_to_ar": all(e["identical_to_ar"] for e in exact),
            **({"judge": judge_summary(runs, ar_scores)} if judged else {})}


def judge_summary(runs: list[dict], ar_scores: list) -> dict:
    """Per setting (and `ar`): the judge's shares over its judged images, and each share's difference from `ar`'s
    with a 95 % interval (Agresti-Caffo: one success and one failure added to each side, so shares of 0 or 1 still
    get a width): an exact method's interval holds 0 but for chance, a relaxed one shows what its relaxation costs in
    letters and colours."""
    from specgen.modalities.image import judge

    rows = {"ar": judge.summarise([s for s in ar_scores if s])}
    for name in dict.fromkeys(r["setting"] for r in runs):
        rows[name] = judge.summarise([r["quality"] for r in runs if r["setting"] == name and r.get("quality")])
    base = rows["ar"]
    for name, row in rows.items():
        if name == "ar":
            continue
        row["vs_ar"] = {}
        for key in ("ocr_folded", "fg", "bg"):
            if key in row and key in base:
                (a, n), (b, m) = ((r[key] * r[f"{key}_n"] + 1, r[f"{key}_n"] + 2) for r in (row, base))
                centre, half = a / n - b / m, 1.96 * (a / n * (1 - a / n) / n + b / m * (1 - b / m) / m) ** 0.5
                row["vs_ar"][key] = [round(row[key] - base[key], 4), round(centre - half, 4), round(centre + half, 4)]
    return rows


# ---- quality ------------------------------------------------------------------------------------------------------

def quality_prompts(n: int):
    from specgen.modalities.image.training.images import make_item

    items = [make_item(i, split="val") for i in range(max(1, n // SAMPLES_PER_PROMPT))]
    return [(item.prompt, item.cls) for item in items]


def sample_set(generator, method: str, knobs: dict, n: int, seed: int, cache: Path, progress) -> np.ndarray:
    """Codes [n, 256] of `method` over the quality prompts, cached per prompt (resumable)."""
    from specgen.modalities.training import atomic_write

    folder = cache / f"{label(method, knobs).replace(' ', '_')}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    codes = []
    for index, (prompt, _) in enumerate(quality_prompts(n)):
        path = folder / f"{index:05d}.npy"
        if not path.exists():
            result = generator.generate(prompt, method=method, seed=seed * 100_000 + index,
                                        num_samples=SAMPLES_PER_PROMPT, **knobs)
            array = np.array(result.tokens, dtype=np.int16)
            atomic_write(path, lambda p, a=array: np.save(p.open("wb"), a))
        codes.append(np.load(path))
        progress.update(1)
    return np.concatenate(codes)[:n]


def cache_key(generator, shape: str) -> str:
    """Samples depend on the target, the head, the tree and the sampling defaults: a cache folder per such set."""
    import hashlib

    digest = hashlib.sha256()
    for path in (generator.model_path / "model.safetensors", generator.head_path / "model.safetensors",
                 generator.head_path / "fc.safetensors"):
        digest.update(path.read_bytes())
    digest.update(f"{shape}|{SAMPLES_PER_PROMPT}|{generator.default_guidance}".encode())
    return digest.hexdigest()[:16]


def run_quality(generator, chosen, n: int, cache: Path, progress, extra: dict | None = None) -> dict:
    """`extra`: knobs every setting is generated with (the tree shape); results are named as in the speed table."""
    extra = extra or {}
    from specgen.modalities.image.models import assets_dir
    from specgen.modalities.image.training.quality import classifier as clf
    from specgen.modalities.image.training.quality.frechet import frechet_distance
    from specgen.modalities.image import vq as vq_codec
    from specgen.modalities.image.training.images import make_dataset

    model = clf.load(assets_dir() / "classifier")
    names = {name: i for i, name in enumerate(clf.class_names())}
    wanted = np.repeat([names[c] for _, c in quality_prompts(n)], SAMPLES_PER_PROMPT)[:n]
    real = vq_codec.reconstruct(generator.vq, make_dataset(n, split="val").images)
    real_features, _ = clf.embed(model, real)

    def score(codes):
        images = vq_codec.decode(generator.vq, torch.as_tensor(codes.astype(np.int64)).reshape(-1, 16, 16))
        features, probs = clf.embed(model, images)
        return features, float((probs.argmax(-1) == wanted).mean())

    shown = {}  # a few samples per set, side by side in the report: one per prompt of the first prompts

    def first(name, codes):
        shown[name] = codes[::SAMPLES_PER_PROMPT][:GRID_COLUMNS]
        return codes

    ar_a, ar_accuracy = score(first("ar", sample_set(generator, "ar", {}, n, 0, cache, progress)))
    ar_b, _ = score(sample_set(generator, "ar", {}, n, 1, cache, progress))
    fd_ar = frechet_distance(ar_a, real_features)
    out = {"samples": n, "fd_ar": fd_ar, "fd_ar_second_seed": frechet_distance(ar_b, real_features),
           "floor_ar_vs_ar": frechet_distance(ar_a, ar_b), "accuracy_ar": ar_accuracy, "settings": {}}
    out["allowed_excess"] = max(0.1 * fd_ar, 2 * out["floor_ar_vs_ar"])
    for method, knobs in chosen:
        features, accuracy = score(first(label(method, knobs), sample_set(generator, method, {**knobs, **extra}, n,
                                                                          0, cache, progress)))
        fd = frechet_distance(features, real_features)
        out["settings"][label(method, knobs)] = {"fd": fd, "fd_excess": fd - fd_ar, "fd_to_ar": frechet_distance(
            features, ar_a), "accuracy": accuracy, "within_bound": fd - fd_ar <= out["allowed_excess"]}
    out["shown"] = {name: codes.tolist() for name, codes in shown.items()}
    return out


def samples_grid(generator, shown: dict, path: Path) -> None:
    """One row per setting (the same prompts and seeds across rows), enlarged 2x, labelled on the left."""
    from PIL import Image, ImageDraw

    from specgen.modalities.image import vq as vq_codec

    rows = list(shown)
    size, margin = 128, 150
    sheet = Image.new("RGB", (margin + GRID_COLUMNS * size, len(rows) * size), "white")
    draw = ImageDraw.Draw(sheet)
    for r, name in enumerate(rows):
        codes = torch.as_tensor(np.array(shown[name], dtype=np.int64)).reshape(-1, 16, 16)
        for c, pixels in enumerate(vq_codec.decode(generator.vq, codes)):
            sheet.paste(Image.fromarray(pixels).resize((size, size), Image.NEAREST), (margin + c * size, r * size))
        draw.text((6, r * size + size // 2 - 6), _ascii(name), fill="black")
    sheet.save(path)


# ---- report -------------------------------------------------------------------------------------------------------

def _ascii(name: str) -> str:
    return name.replace("λ", "lambda").replace("δ", "delta")  # Pillow's default font has no Greek


def plot_frontier(path: Path, result: dict) -> None:
    """Speedup over ar against the FD excess over AR (with the allowed excess shaded), or against lambda when
    quality was not measured. Pillow only."""
    from PIL import Image, ImageDraw

    label_font = font(13)
    quality = result.get("quality")
    rows = [r for r in result["speed"]["table"] if not quality or r["setting"] in quality["settings"]]
    w, h, pad = 620, 380, 60
    image = Image.new("RGB", (w + 2 * pad, h + 2 * pad + 20), "white")
    draw = ImageDraw.Draw(image)
    xs = [quality["settings"][r["setting"]]["fd_excess"] for r in rows] if quality else list(range(len(rows)))
    low_x, high_x = min([0.0, *xs]), max([1e-9, *xs]) * 1.15 + 1e-9
    high_y = max([2.2, *(r["speedup"] for r in rows)]) * 1.1
    x = lambda v: pad + (v - low_x) / (high_x - low_x) * w  # noqa: E731
    y = lambda v: pad + h - v / high_y * h  # noqa: E731
    if quality:
        draw.rectangle([x(low_x), pad, x(min(quality["allowed_excess"], high_x)), pad + h], fill=(225, 240, 225))
    draw.rectangle([pad, pad, pad + w, pad + h], outline="black")
    for tick in (0.5, 1, 1.5, 2, 3, 4):
        if tick < high_y:
            draw.line([pad, y(tick), pad + w, y(tick)], fill=(220, 220, 220) if tick != 2 else (200, 120, 120))
            draw.text((pad - 34, y(tick) - 7), f"{tick:g}x", fill="black", font=label_font)
    title = ("speedup over ar vs FD excess over AR (green: allowed)" if quality
             else "speedup over ar per setting (run with --quality-samples for the FD axis)")
    draw.text((pad, pad - 24), title, fill="black", font=label_font)
    for value, row in zip(xs, rows):
        cx, cy = x(value), y(row["speedup"])
        draw.ellipse([cx - 5, cy - 5, cx + 5, cy + 5], fill=(70, 130, 180))
        draw.text((cx + 7, cy - 7), _ascii(row["setting"]), fill="black", font=label_font)
    if quality:
        for value in (low_x, high_x):
            draw.text((x(value) - 10, pad + h + 6), f"{value:.2f}", fill="black", font=label_font)
    image.save(path)


def render_markdown(result: dict, plot_name: str | None) -> str:
    env, speed = result["env"], result["speed"]
    lines = ["# specgen bench image: EAGLE head, LANTERN, LANTERN++", "",
             run_line(env), "",
             f"Command: `{env.get('command', '')}` · trees: {env['shape']} · neighbours k = {env['neighbours']} · "
             f"{len(result['prompts'])} prompts × {env['repeats']} repeat(s); temperature 1, top-k 50, "
             f"guidance {env.get('guidance', 3.0):g}.",
             "", "| setting | steps | τ | relaxed share | speedup vs ar [95 % CI] |", "|---|---|---|---|---|"]
    for row in speed["table"]:
        ci = row["speedup_ci95"]
        share = "—" if row["relaxed_share"] is None else f"{row['relaxed_share']:.2f}"
        lines.append(f"| {row['setting']} | {row['steps']:.0f} | {row['tau']:.2f} | {share} | "
                     f"{row['speedup']:.2f}×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") + " |")
    lines += ["", f"Greedy `eagle` identical to `ar` on every prompt: {speed['all_identical_to_ar']}."]
    if speed.get("judge"):
        lines += ["", "## The independent judge", "",
                  "Tesseract OCR of the glyph and its palette colours on every image of the runs above "
                  "(modalities/image/judge.py; prompts with nothing to judge left out), and each setting's "
                  "difference from `ar` with a 95 % interval:", "",
                  "| setting | images | OCR case-folded | glyph colour | background colour | Δ OCR vs ar | "
                  "Δ glyph colour | Δ background |", "|---|---|---|---|---|---|---|---|"]

        def share(row, key):
            return f"{row[key]:.2f}" if key in row else "—"

        def delta(row, key):
            d = row.get("vs_ar", {}).get(key)
            return f"{d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}]" if d else "—"

        for name, row in speed["judge"].items():
            lines.append(f"| {name} | {row['samples']} | {share(row, 'ocr_folded')} | {share(row, 'fg')} | "
                         f"{share(row, 'bg')} | {delta(row, 'ocr_folded')} | {delta(row, 'fg')} | "
                         f"{delta(row, 'bg')} |")
    quality = result.get("quality")
    if quality:
        lines += ["", f"## Quality ({quality['samples']} samples per setting)", "",
                  f"Fréchet distance on the classifier's features to VQ reconstructions of {quality['samples']} "
                  f"validation images: AR {quality['fd_ar']:.3f} (second AR seed {quality['fd_ar_second_seed']:.3f}); "
                  f"AR-vs-AR floor {quality['floor_ar_vs_ar']:.3f}; allowed excess "
                  f"max(0.1 FD_AR, 2 floor) = {quality['allowed_excess']:.3f}. Accuracy on the requested class: "
                  f"AR {quality['accuracy_ar']:.3f}.", "",
                  "| setting | FD | FD − FD_AR | within bound | FD to AR set | accuracy | speedup |",
                  "|---|---|---|---|---|---|---|"]
        speedups = {r["setting"]: r["speedup"] for r in speed["table"]}
        for name, q in quality["settings"].items():
            lines.append(f"| {name} | {q['fd']:.3f} | {q['fd_excess']:+.3f} | {'yes' if q['within_bound'] else 'no'} "
                         f"| {q['fd_to_ar']:.3f} | {q['accuracy']:.3f} | {speedups.get(name, float('nan')):.2f}× |")
        met = [n for n, q in quality["settings"].items() if q["within_bound"] and speedups.get(n, 0) >= 2
               and n.startswith("lantern++")]
        lines += ["", f"Target (lantern++ ≥ 2× within the FD bound): {'met by ' + ', '.join(met) if met else 'not met'}."]
    if plot_name:
        lines += ["", f"![frontier]({plot_name})"]
    if quality:
        lines += ["", "Samples, one row per setting, the same prompts and seeds in every column:", "",
                  f"![samples]({plot_name.replace('.png', '-samples.png') if plot_name else ''})"]
    return "\n".join(lines) + "\n"


def bench_lantern(args, methods) -> dict:
    """The head's methods (`methods`, among HEAD_METHODS) with the image bench's arguments; writes
    bench-image-lantern-STAMP.* and image-lantern-latest.*."""
    from specgen.modalities.assets import cache_dir
    from specgen.modalities.image.generator import ImageGenerator
    from specgen.samplers.registry import get_method

    start = start_run()
    out_dir, latest_dir = record_dirs(getattr(args, "out_dir", None))
    generator = ImageGenerator(getattr(args, "model", None), head=getattr(args, "head", None), threads=args.threads)
    if generator.modality != "image":
        from specgen.errors import InvalidRequest

        raise InvalidRequest(f"{generator.model_path} is a video model; use `specgen bench video`")
    prompts = load_prompts(args.prompts or benchmarks_dir() / "prompts" / "image.jsonl", classes=True)
    defaults = {m: get_method("image", m).resolve_knobs({}) for m in HEAD_METHODS}
    shapes = getattr(args, "shape", None) or []  # none: each method's own default tree
    chosen = method_settings(methods, args.lambdas or LAMBDAS, args.deltas or DELTAS, shapes)
    shape = shapes[0] if len(shapes) == 1 else None  # several: a knob of each setting instead
    own = {m: knobs["shape"] for m, knobs in defaults.items()}
    trees = ",".join(shapes) or ", ".join(f"{m} {own[m]}" for m in methods)
    generator.generate(prompts[0].prompt, method="eagle")  # warm-up
    quality_n = getattr(args, "quality_samples", None) or 0
    quality_methods = getattr(args, "quality_methods", None) or HEAD_METHODS
    measured = [(m, k) for m, k in chosen if m in quality_methods]
    total = len(prompts) * args.repeats * (1 + len(chosen))
    if quality_n:
        total += (2 + len(measured)) * len(quality_prompts(quality_n))
    with progress_bar(total, "bench image (head)") as progress:
        speed = run_speed(generator, prompts, chosen, args.repeats, shape, progress,
                          judged=getattr(args, "quality", False))
        cache = cache_dir() / "bench-lantern" / cache_key(generator, ",".join(shapes) or str(own))
        quality = (run_quality(generator, measured, quality_n, cache, progress, {"shape": shape} if shape else {})
                   if quality_n else None)
    result = {"speed": speed, "quality": quality, "prompts": [p.id for p in prompts],
              "env": run_env(start, repeats=args.repeats, shape=trees,
                             neighbours=defaults["lantern++"]["neighbours"], head=str(generator.head_path),
                             guidance=generator.default_guidance,
                             command=command_line(args))}
    figures = {"png": lambda path: plot_frontier(path, result)}
    if quality:
        figures["samples"] = lambda path: samples_grid(generator, quality["shown"], path)
    written = write_record(result, out_dir, f"bench-image-lantern-{start.timestamp}",
                           lambda names: render_markdown(result, names.get("png")), figures, "image-lantern-latest",
                           latest_dir)
    print(f"wrote {', '.join(str(p) for p in written.runs.values())}", file=sys.stderr)
    return result


def lantern_command(args) -> int:
    """`specgen bench lantern`: the head's methods alone (--methods among HEAD_METHODS; `ar` always runs); the
    report on stdout, or the result as one JSON object with --json."""
    from specgen.errors import InvalidRequest

    others = [m for m in args.methods or () if m not in HEAD_METHODS and m != "ar"]
    if others:
        raise InvalidRequest(f"{', '.join(others)}: not among the head's methods ({', '.join(HEAD_METHODS)}); use "
                             "`specgen bench image`")
    result = bench_lantern(args, [m for m in args.methods or HEAD_METHODS if m in HEAD_METHODS])
    print(json.dumps(result) if args.json else render_markdown(result, None))
    return 0

