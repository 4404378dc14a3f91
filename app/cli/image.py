"""`specgen generate image`, `specgen generate video` and `specgen train image`."""

from __future__ import annotations

import json
import sys
import time


def generate_image(args) -> int:
    from tqdm import tqdm

    from specgen.modalities.image.generator import ImageGenerator
    from specgen.samplers.registry import default_method, get_method
    from specgen.samplers.stats import SpecStats

    modality = getattr(args, "modality", "image")
    generator = ImageGenerator(model=args.model, vq=args.vq, head=getattr(args, "head", None), threads=args.threads,
                               video=modality == "video")
    if generator.modality != modality:
        from specgen.errors import InvalidRequest

        raise InvalidRequest(f"{generator.model_path} is {'a video' if generator.modality == 'video' else 'an image'} "
                             f"model; use `specgen generate {generator.modality}`")
    method = args.method or default_method(modality)
    knobs = {k: v for k, v in (("window", args.window), ("init", args.init)) if v is not None}
    if knobs and not (get_method(modality, method).drafter or "").startswith("jacobi"):
        from specgen.errors import InvalidRequest

        raise InvalidRequest(f"--window and --init apply to Jacobi methods, not {method!r}")
    head_knobs = (("shape", "shape"), ("neighbours", "neighbours"), ("lam", "lam"), ("delta", "delta"))
    knobs.update({knob: getattr(args, arg) for knob, arg in head_knobs if getattr(args, arg, None) is not None})
    prompt = args.prompt or args.class_label
    # check the whole request before the progress bar starts, so an error stays one line
    generator.vocab.prompt_ids(prompt)
    generator.processing(temperature=args.temperature, top_k=args.top_k, guidance_scale=args.guidance)
    resolved = get_method(modality, method).resolve_knobs(knobs)
    if "shape" in resolved:
        from specgen.samplers.trees import named_shape

        named_shape(resolved["shape"])
        generator.head  # a missing head is an error before any work
    stats = SpecStats()
    tokens: list[list[int]] = [[] for _ in range(args.num_samples)]
    started = time.perf_counter()
    total = args.num_samples * generator.vocab.image_tokens
    with tqdm(total=total, desc=f"{method}", unit="tok", file=sys.stderr, disable=args.json) as progress:
        for event in generator.stream(prompt, method=method, temperature=args.temperature, top_k=args.top_k,
                                      guidance_scale=args.guidance, seed=args.seed, num_samples=args.num_samples,
                                      stats=stats, **knobs):
            tokens[event.row].extend(event.tokens)
            progress.update(len(event.tokens))
    wall_s = time.perf_counter() - started
    summary = generator.summary(stats, method, wall_s, generator.measure_step_s(prompt, guidance_scale=args.guidance))
    images = generator.decode(tokens)
    if modality == "video":
        save_video_grid(images, args.out, fps=args.fps)
    else:
        grid_image(images).save(args.out)
    if args.json:
        print(json.dumps({"out": str(args.out), "tokens": tokens[0] if args.num_samples == 1 else tokens,
                          "stats": summary}))
    else:
        print(str(args.out))
        print(f"[{method}] tau {summary['tau']:.2f}, {summary['steps']} steps for {total} tokens, "
              f"{wall_s:.1f} s", file=sys.stderr)
    return 0


def grid_image(images, columns: int | None = None):
    """PIL images of one size -> one image, `columns` per row (default: a near-square grid)."""
    from PIL import Image

    if len(images) == 1:
        return images[0]
    columns = columns or max(1, round(len(images) ** 0.5))
    width, height = images[0].size
    rows = -(-len(images) // columns)
    sheet = Image.new("RGB", (columns * width, rows * height), "white")
    for i, image in enumerate(images):
        sheet.paste(image, ((i % columns) * width, (i // columns) * height))
    return sheet


def save_video_grid(videos: list[list], path, fps: int | None = None):
    """Several samples' frames (one list of PIL frames per sample) as one video: frame t of the file shows frame t
    of every sample, in a grid."""
    from specgen.modalities.image.video import FPS, save_video

    frames = [grid_image([video[t] for video in videos]) for t in range(len(videos[0]))]
    return save_video(frames, path, fps=fps or FPS)


def train_image(args) -> int:
    from specgen.modalities.image.train import main as train_main

    argv = ["--role", args.role, "--seed", str(args.seed), "--threads", str(args.threads)]
    if args.steps:
        argv += ["--steps", str(args.steps)]
    if args.out:
        argv += ["--run-dir", str(args.out), "--out", str(args.out / "export")]
    return int(train_main(argv) or 0)
