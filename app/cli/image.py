"""`specgen generate image` and `specgen generate video` (`specgen train image` is train.py)."""

from __future__ import annotations

import time


def generate_image(args) -> int:
    from specgen.app.cli.media import print_saved, with_progress
    from specgen.app.cli.options import method_knobs, request_values
    from specgen.errors import InvalidRequest
    from specgen.modalities.image.generator import ImageGenerator
    from specgen.modalities.image.janus import is_janus
    from specgen.samplers.registry import default_method
    from specgen.samplers.stats import SpecStats

    modality = args.modality
    method = args.method or default_method(modality)
    knobs = method_knobs(args, modality, method)  # a knob the method lacks fails before any model loads
    if modality == "image" and args.model and is_janus(args.model):
        return generate_janus(args, method, knobs)
    generator = ImageGenerator(model=args.model, vq=args.vq, head=getattr(args, "head", None), threads=args.threads,
                               video=modality == "video")
    if generator.modality != modality:
        raise InvalidRequest(f"{generator.model_path} is {'a video' if generator.modality == 'video' else 'an image'} "
                             f"model; use `specgen generate {generator.modality}`")
    prompt = args.prompt or args.class_label
    request = request_values(args, modality)
    stats = SpecStats()
    tokens: list[list[int]] = [[] for _ in range(args.num_samples)]
    started = time.perf_counter()
    total = args.num_samples * generator.vocab.image_tokens
    events = generator.stream(prompt, method=method, stats=stats, **request, **knobs)
    for event in with_progress(events, total=total, method=method, quiet=args.json):
        tokens[event.row].extend(event.tokens)
    wall_s = time.perf_counter() - started
    summary = generator.summary(stats, method, wall_s,
                                generator.measure_step_s(prompt, guidance_scale=args.guidance_scale))
    images = generator.decode(tokens)
    if modality == "video":
        save_video_grid(images, args.out, fps=args.fps)
    else:
        grid_image(images).save(args.out)
    print_saved(args, {"tokens": tokens[0] if args.num_samples == 1 else tokens, "stats": summary},
                f"[{method}] tau {summary['tau']:.2f}, {summary['steps']} steps for {total} tokens, {wall_s:.1f} s")
    return 0


def generate_janus(args, method: str, knobs: dict) -> int:
    """`generate image --model DIR` with a Janus checkpoint folder: its processor encodes the prompt, its own VQ
    decoder makes the pixels; the Jacobi methods and `ar` serve it (guidance 5 unless --guidance says)."""
    from specgen.app.cli.media import print_saved, with_progress
    from specgen.app.cli.options import request_values
    from specgen.errors import InvalidRequest
    from specgen.modalities.image.janus import JanusImageGenerator
    from specgen.samplers.registry import get_method
    from specgen.samplers.stats import SpecStats
    from specgen.settings import use_threads

    if args.prompt is None:
        raise InvalidRequest("a Janus model takes a text prompt (--prompt), not a class")
    use_threads(args.threads)
    generator = JanusImageGenerator(args.model)
    stats, tokens = SpecStats(), [[] for _ in range(args.num_samples)]
    started = time.perf_counter()
    total = args.num_samples * generator.num_image_tokens
    events = generator.stream(args.prompt, method=method, stats=stats, **request_values(args, "image"), **knobs)
    for event in with_progress(events, total=total, method=method, quiet=args.json):
        tokens[event.row].extend(event.tokens)
    wall_s = time.perf_counter() - started
    summary = stats.summary(method=method, lossless=get_method("image", method).lossless, wall_s=wall_s)
    grid_image(generator.images(tokens)).save(args.out)
    print_saved(args, {"tokens": tokens[0] if args.num_samples == 1 else tokens, "stats": summary},
                f"[{method}] tau {summary['tau']:.2f}, {summary['steps']} steps for {total} tokens, {wall_s:.1f} s")
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
