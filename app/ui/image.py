"""The demo's Image and Video tabs: an image (or a video's frames, side by side) decoding live as Jacobi decoding
commits its tokens (uncommitted codes dimmed), the live stats panel (τ, steps, acceptance per window position,
tokens changed per step), and a comparison with plain decoding of the same request (measured speedup next to the one
the measured τ predicts). A finished video is shown as a looping GIF."""

from __future__ import annotations

import time
from pathlib import Path

from specgen.app import request_options
from specgen.app.ui.models import LazyGenerator, warm_default_paths
from specgen.app.ui.widgets import (COMPARING_NOTE, PLAIN_NOTE, LiveStats, acceptance_frame, acceptance_plot,
                                    check_option, compare_with_plain, jsonable, method_params, option_widget,
                                    run_controls, shown_in_ui, stats_json, stats_markdown, timed)
from specgen.samplers import registry

UPDATE_S = 0.25  # at most this often a live update of image and statistics
# live previews take at most this share of a run: a clip's preview decodes all 8 frames (0.18 s on this machine), and
# every 0.25 s its 57 previews took 10.6 of the streamed run's 20 s (3.6 s decoding quietly)
PREVIEW_SHARE = 0.2
DISPLAY_SCALE = 4  # 64x64 images are shown at 256x256 (nearest neighbour)
OPTIONS = ("temperature", "top_k", "guidance_scale", "seed")  # the request options the tab shows, in this order


class ImageModels(LazyGenerator):
    def __init__(self, generator=None, *, model: str | None = None, vq: str | None = None, threads: int | None = 1,
                 video: bool = False):
        def load():
            from specgen.modalities.image.generator import ImageGenerator

            generator = ImageGenerator(model, vq, threads=threads, video=video)
            generator.measure_window_s("K", 32)  # warm up: the first forward of a window size allocates
            generator.measure_step_s("K")
            from specgen.modalities.image import conditions

            examples = conditions.VIDEO_EXAMPLE_PROMPTS if video else conditions.EXAMPLE_PROMPTS
            warm_default_paths(generator, examples[0])  # the tab's first request, with auto and plain decoding
            partial_image(generator, [])  # and its first preview: the decoder's first call took 2.2 s on a clip
            return generator

        self.modality = "video" if video else "image"
        super().__init__(load, f"{self.modality} models", generator)
        self._model = model

    def model_path(self):
        """The token model's folder, known before it is loaded."""
        from specgen.modalities.image.models import default_paths

        if self._generator is not None:
            return self._generator.model_path
        return self._model or default_paths()["video" if self.modality == "video" else "target"]

    def describe(self) -> str:
        from specgen.modalities.image.models import assets_dir

        path = Path(self.model_path())
        if path.parent == assets_dir():  # a shipped model: its short name
            path = Path("assets/image", path.name)
        return f"**{self.modality.capitalize()} model** ({self.state()}): `{path}`"


def partial_image(generator, tokens: list[int]):
    """The image of the committed tokens so far: uncommitted codes are filled with the last committed one and
    their pixels dimmed, so the picture fills in as tokens are committed. A video shows its frames in rows of four."""
    import numpy as np
    from PIL import Image

    from specgen.modalities.image.video import filmstrip

    grid, total = generator.vocab.grid, generator.vocab.image_tokens
    filler = tokens[-1] if tokens else 0
    codes = (tokens + [filler] * (total - len(tokens)))[:total]
    decoded = generator.decode([codes])[0]
    frames = decoded if isinstance(decoded, list) else [decoded]
    committed = np.zeros(total, dtype=bool)
    committed[:len(tokens)] = True
    shown = []
    for k, frame in enumerate(frames):
        array = np.asarray(frame).astype(np.float32)
        scale = array.shape[0] // grid
        mask = np.kron(committed[k * grid * grid:(k + 1) * grid * grid].reshape(grid, grid),
                       np.ones((scale, scale), dtype=bool))
        array[~mask] = 0.25 * array[~mask] + 0.75 * 200.0  # a light veil over what is not committed yet
        shown.append(Image.fromarray(array.clip(0, 255).astype(np.uint8)))
    image = shown[0] if len(shown) == 1 else filmstrip(shown, columns=4)
    zoom = DISPLAY_SCALE if len(shown) == 1 else DISPLAY_SCALE // 2
    return image.resize((image.width * zoom, image.height * zoom), Image.NEAREST)


def finished_video(generator, tokens: list[int]) -> str:
    """The decoded video as a looping GIF in a fresh temporary folder (the demo serves it from there)."""
    import tempfile
    from pathlib import Path

    from specgen.modalities.image.video import save_video

    folder = Path(tempfile.mkdtemp(prefix="specgen-video-"))
    return str(save_video(generator.decode([tokens])[0], folder / "video.gif"))


def make_image_runner(image_models: ImageModels):
    import gradio as gr

    modality = image_models.modality
    example = "red K moving right on blue" if modality == "video" else "red K on blue"
    options = request_options.fields(modality)

    def run_image(prompt, method, compare, window, init, temperature, top_k, guidance, seed, lam=None):
        if not isinstance(prompt, str) or not prompt.strip():
            raise gr.Error(f"Enter a prompt or class first, e.g. {example!r}.")
        if method not in registry.method_names(modality):
            raise gr.Error(f"unknown {modality} method {method!r}; choose from: "
                           f"{', '.join(registry.method_names(modality))}")
        request = {name: check_option(gr, options[name], value)
                   for name, value in zip(OPTIONS, (temperature, top_k, guidance, seed))}
        spec = registry.get_method(modality, method)
        params = method_params(spec, {"window": window, "init": init, "lam": lam})

        def body():
            generator = image_models.get()
            knobs = spec.resolve_knobs(params)
            generator.vocab.prompt_ids(prompt.strip())
            yield from stream_image(generator, prompt.strip(), method, spec, compare, knobs, request)

        yield from shown_in_ui(gr, modality, body())

    return run_image


def stream_image(generator, prompt, method, spec, compare, knobs, options):
    """The tab's updates (partial image, stats panel, acceptance plot, stats), at most every UPDATE_S while
    decoding, then the finished image or video with the comparison with plain decoding when asked."""
    from specgen.samplers.stats import SpecStats

    stats, live = SpecStats(), LiveStats()
    tokens: list[int] = []
    events, busy = timed(generator.stream(prompt, method=method, stats=stats, **options, **knobs))
    shown, preview_s = 0.0, 0.0
    for event in events:
        if event.row != 0:
            continue
        live.update(event)
        tokens.extend(event.tokens)
        # each update is PNG-encoded and sent by another thread: fewer of them leave the CPU to decoding
        if time.perf_counter() - shown < max(UPDATE_S, preview_s / PREVIEW_SHARE):
            continue
        started = time.perf_counter()
        preview = partial_image(generator, tokens)
        shown = time.perf_counter()
        preview_s = shown - started
        current = {**live.summary(busy[0]), "lossless": spec.lossless}
        yield (preview, stats_markdown(current, method=method, running=True),
               acceptance_frame(current["per_position_acceptance"]), current)
    summary = _summary(generator, prompt, method, spec, stats, knobs, options, busy[0])
    image = partial_image(generator, tokens) if generator.modality == "image" else finished_video(generator, tokens)
    compared, note = None, ""
    if compare and spec.drafter is not None:
        yield (image, stats_markdown(summary, method=method, running=True, note=COMPARING_NOTE),
               acceptance_frame(summary["per_position_acceptance"]), jsonable(summary))
        compared = compare_with_plain(generator, prompt, options, tokens, busy[0],
                                      again=lambda: generator.stream(prompt, method=method, **options, **knobs))
        summary = {**summary, **compared}
    elif compare:
        note = PLAIN_NOTE
    yield (image, stats_markdown(summary, method=method, running=False, compare=compared, note=_notes(summary, note)),
           acceptance_frame(summary["per_position_acceptance"]), jsonable(summary))


def _summary(generator, prompt, method, spec, stats, knobs, options, wall_s: float) -> dict:
    ar_step_s = generator.measure_step_s(prompt, guidance_scale=options["guidance_scale"])
    summary = generator.summary(stats, method, wall_s, ar_step_s)
    if (spec.drafter or "").startswith("jacobi"):  # Jacobi's cost model: tau * T_window(1) / T_window(L)
        window_s = generator.measure_window_s(prompt, knobs["window"], guidance_scale=options["guidance_scale"])
        summary["predicted_speedup_measured"] = summary["tau"] * ar_step_s / window_s
    return summary


def _notes(summary: dict, note: str) -> str:
    if "changed_per_step" in summary:
        note += f"\n\ntokens changed per step in the window: {summary['changed_per_step']:.1f}"
    if "relaxed_share" in summary:
        note += (f"\n\nrelaxed acceptance: {summary['relaxed_share']:.0%} of the accepted codes would have been "
                 "rejected by exact verification (latent neighbours lent them mass)")
    return note.strip()


def build_image_tab(gr, image_models: ImageModels, *, concurrency_limit: int, concurrency_id: str):
    """The Image tab (or, for video models, the Video tab): components and events (call inside `gr.Blocks`)."""
    from specgen.modalities.image import conditions

    modality = image_models.modality
    examples = conditions.VIDEO_EXAMPLE_PROMPTS if modality == "video" else conditions.EXAMPLE_PROMPTS
    default = registry.default_method(modality)
    knobs = registry.get_method(modality, registry.fixed_default_method(modality)).resolve_knobs({})  # Jacobi sliders
    options = with_model_guidance(request_options.fields(modality), image_models.model_path())
    with gr.Tab(modality.capitalize(), id=modality, elem_id=f"tab-{modality}"):
        with gr.Row():
            with gr.Column(scale=1):
                prompt = gr.Dropdown(list(examples), value=examples[0], allow_custom_value=True,
                                     label="Prompt or class", elem_id=f"{modality}-prompt",
                                     info="colour, character, motion (left, right, up, down) and background"
                                     if modality == "video" else
                                     "colour, character and background, a digit, or a photo name")
                method, compare, run, stop = run_controls(gr, modality, registry.method_names(modality), default)
                with gr.Accordion("Settings", open=True):
                    window = gr.Slider(2, 128, value=knobs.get("window", 32), step=1, label="window L",
                                       info="tokens scored per step (Jacobi methods)", elem_id=f"{modality}-window")
                    init = gr.Radio(["random", "left"], value=knobs.get("init", "random"), label="initial drafts",
                                    elem_id=f"{modality}-init")
                    lam = gr.Slider(1.0, 20.0, value=default_lam(), step=0.5, label="λ (lantern++)",
                                    info="p~ <= λ p: how much mass a code may borrow from its latent neighbours; "
                                         "1 = exact", elem_id=f"{modality}-lambda", visible=modality == "image")
                    request = [option_widget(gr, modality, options[name]) for name in OPTIONS]
            with gr.Column(scale=2):
                with gr.Row():
                    size = (280, 280) if modality == "image" else (300, 540)
                    output = gr.Image(label=modality.capitalize(), elem_id=f"{modality}-output", interactive=False,
                                      type="pil", format="png", height=size[0], width=size[1])  # png: lossless
                    plot = acceptance_plot(gr, modality, "acceptance per window position")
                stats_panel = gr.Markdown("_run a prompt to see τ, steps and the speedup_",
                                          elem_id=f"{modality}-stats")
                json_panel = stats_json(gr, modality)
    event = run.click(make_image_runner(image_models), [prompt, method, compare, window, init, *request, lam],
                      [output, stats_panel, plot, json_panel], api_name=f"generate_{modality}",
                      concurrency_limit=concurrency_limit, concurrency_id=concurrency_id)
    stop.click(None, None, None, cancels=[event], api_name=False)
    method.change(lambda name: jacobi_knob_defaults(gr, modality, name), [method], [window, init], api_name=False)
    return event


def with_model_guidance(options: dict, model_path) -> dict:
    """The request options with the guidance widget starting at the model's own default (its
    generation_config.json), read without loading the model."""
    from dataclasses import replace

    from specgen.modalities.image.models import default_guidance

    field = options["guidance_scale"]
    return {**options, "guidance_scale": replace(field, demo=replace(field.demo, start=default_guidance(model_path)))}


def default_lam() -> float:
    """lantern++'s registry default (the fastest lambda of the recorded sweep within its quality bound)."""
    return registry.get_method("image", "lantern++").resolve_knobs({})["lam"]


def jacobi_knob_defaults(gr, modality: str, method: str):
    """The window and initial drafts a method starts from, set when the method changes (the coupled methods copy
    the previous code, SJD draws at random); unchanged for methods without them."""
    knobs = registry.get_method(modality, method).resolve_knobs({}) if method in registry.method_names(modality) else {}
    return (gr.update(value=knobs["window"]) if "window" in knobs else gr.update(),
            gr.update(value=knobs["init"]) if "init" in knobs else gr.update())

