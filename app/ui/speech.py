"""The demo's Speech tab: live statistics while the acoustic tokens are committed, the audio when the utterance is
done, and a comparison with plain decoding of the same request. The lossy methods show their knobs (pcg: theta and
the residual; ssd: beta) and, next to their acceptance, what exact token-level sampling reached on the same drafts."""

from __future__ import annotations

import time

from specgen.app import request_options
from specgen.app.ui.models import LazyGenerator, warm_default_paths
from specgen.app.ui.widgets import (COMPARING_NOTE, PLAIN_NOTE, LiveStats, acceptance_frame, acceptance_plot,
                                    check_option, compare_with_plain, jsonable, method_params, option_widget,
                                    run_controls, shown_in_ui, stats_json, stats_markdown, timed)
from specgen.errors import SpecgenError
from specgen.modalities.speech.models import EXAMPLE_TEXT
from specgen.samplers import registry

OPTIONS = ("temperature", "seed")  # the request options the tab shows besides the voice, in this order


UPDATE_S = 0.25  # at most this often a live update of the statistics


class SpeechModels(LazyGenerator):
    def __init__(self, generator=None, *, threads: int | None = 1):
        def load():
            from specgen.modalities.speech.generator import SpeechGenerator

            generator = SpeechGenerator(threads=threads)
            warm_default_paths(generator, EXAMPLE_TEXT)  # the tab's first request, with auto and plain decoding
            return generator

        super().__init__(load, "speech models", generator)

    def describe(self) -> str:
        path = self._generator.model_path if self._generator is not None else "assets/speech/target"
        return f"**Speech model** ({self.state()}): `{path}`"


def make_speech_runner(speech_models: SpeechModels):
    import gradio as gr

    options = request_options.fields("speech")

    def run_speech(text, method, compare, voice, temperature, seed, theta=None, beta=None, residual=None):
        if not isinstance(text, str) or not text.strip():
            raise gr.Error("Enter some text to speak first.")
        if method not in registry.method_names("speech"):
            raise gr.Error(f"unknown speech method {method!r}; choose from: "
                           f"{', '.join(registry.method_names('speech'))}")
        request = {"voice": voice, **{name: check_option(gr, options[name], value)
                                      for name, value in zip(OPTIONS, (temperature, seed))}}
        spec = registry.get_method("speech", method)
        params = method_params(spec, {"theta": theta, "beta": beta, "residual": residual})

        def body():
            resolved = spec.resolve_knobs(params)  # a bad value is shown as one error message
            generator = speech_models.get()
            generator.vocab.prompt_ids(text.strip(), voice)
            yield from stream_speech(generator, text.strip(), method, spec, compare,
                                     {name: resolved[name] for name in params}, request)

        yield from shown_in_ui(gr, "speech", body())

    return run_speech


def stream_speech(generator, text, method, spec, compare, knobs, options):
    """The tab's updates (no audio yet, stats panel, acceptance plot, stats) while the acoustic tokens are
    committed, then the audio with the comparison with plain decoding when asked."""
    from specgen.samplers.stats import SpecStats

    stats, live = SpecStats(), LiveStats()
    tokens: list[int] = []
    events, busy = timed(generator.stream(text, method=method, stats=stats, **options, **knobs))
    # the first live update waits UPDATE_S too: the browser's first render of the panels (the plot's library
    # starting up) takes a core for a moment, and at the first step it would land inside the timed decoding
    shown = time.perf_counter()
    for event in events:
        if event.row == 0:
            live.update(event)
            tokens.extend(event.tokens)
            # a step here takes milliseconds; an update is rendered and sent by another thread, which would slow
            # the decoding it reports (and the comparison with plain decoding, which sends none): a few per second
            if time.perf_counter() - shown < UPDATE_S:
                continue
            shown = time.perf_counter()
            current = {**live.summary(busy[0]), "lossless": spec.lossless}
            yield (None, stats_markdown(current, method=method, running=True),
                   acceptance_frame(current["per_position_acceptance"]), current)
    summary = stats.summary(method=method, lossless=spec.lossless, wall_s=busy[0],
                            ar_step_s=generator.measure_step_s(text, options["voice"]))
    audio = (generator.sample_rate, generator.decode(generator.vocab.acoustic(tokens)))
    compared, note = None, ""
    if compare and spec.drafter is not None:  # the statistics first, then the comparison's runs
        yield (None, stats_markdown(summary, method=method, running=True, note=COMPARING_NOTE),
               acceptance_frame(summary["per_position_acceptance"]), jsonable(summary))
        compared = compare_with_plain(generator, text, options, tokens, busy[0],
                                      again=lambda: generator.stream(text, method=method, **options, **knobs))
        summary = {**summary, **compared}
    elif compare:
        note = PLAIN_NOTE
    note = " ".join(filter(None, [relaxed_note(summary), note]))
    yield (audio, stats_markdown(summary, method=method, running=False, compare=compared, note=note),
           acceptance_frame(summary["per_position_acceptance"]), jsonable(summary))


def relaxed_note(summary: dict) -> str:
    """What a lossy rule's acceptance means, with exact sampling's on the same drafts beside it."""
    level = summary.get("acceptance_level")
    if level is None:
        return ""
    exact, alpha = summary.get("exact_alpha_hat"), summary.get("alpha_hat")
    if exact is None or alpha is None:
        return ""
    what = {"group": "acceptance is tested on groups of similar tokens (exact in groups, not in tokens)",
            "tolerance": "acceptance has a tolerance beta (not exact)"}.get(level, level)
    return (f"_Lossy: {what}; α̂ {alpha:.2f}, where exact token-level sampling would reach {exact:.2f} on the same "
            "drafts._")


def build_speech_tab(gr, speech_models: SpeechModels, *, concurrency_limit: int, concurrency_id: str):
    """The Speech tab's components and events (call inside `gr.Blocks`)."""
    from specgen.modalities.speech.voices import VOICES  # names only: no torch

    default = registry.default_method("speech")
    options = request_options.fields("speech")
    with gr.Tab("Speech", id="speech", elem_id="tab-speech"):
        with gr.Row():
            with gr.Column(scale=1):
                text = gr.Textbox(label="Text to speak", lines=3, value=EXAMPLE_TEXT,
                                  elem_id="speech-text")
                method, compare, run, stop = run_controls(gr, "speech", registry.method_names("speech"), default)
                with gr.Accordion("Settings", open=True):
                    voice = gr.Dropdown(list(VOICES), value=next(iter(VOICES)), allow_custom_value=True,
                                        label="voice", elem_id="speech-voice")
                    request = [option_widget(gr, "speech", options[name]) for name in OPTIONS]
                    knob_widgets = _knob_widgets(gr, default)
            with gr.Column(scale=2):
                output = gr.Audio(label="Speech", elem_id="speech-output", interactive=False, type="numpy")
                with gr.Row():
                    stats_panel = gr.Markdown("_run a text to see τ, acceptance and the speedup_",
                                              elem_id="speech-stats")
                    plot = acceptance_plot(gr, "speech")
                json_panel = stats_json(gr, "speech")
    event = run.click(make_speech_runner(speech_models), [text, method, compare, voice, *request,
                                                          *knob_widgets.values()],
                      [output, stats_panel, plot, json_panel], api_name="generate_speech",
                      concurrency_limit=concurrency_limit, concurrency_id=concurrency_id)
    method.change(lambda name: [gr.update(visible=_takes(name, knob)) for knob in knob_widgets], method,
                  list(knob_widgets.values()), queue=False, api_name=False)
    stop.click(None, None, None, cancels=[event], api_name=False)
    return event


RELAXED_KNOBS = (("pcg", "theta"), ("ssd", "beta"), ("pcg", "residual"))  # the widgets, in the runner's order


def _takes(method: str, knob: str) -> bool:
    try:
        return any(k.name == knob for k in registry.get_method("speech", method).knobs)
    except SpecgenError:  # an unknown name shows no knob widgets
        return False


def _knob_widgets(gr, shown_method: str) -> dict:
    """One widget per relaxed-rule knob (theta, beta, residual), with the registry's default, range and help;
    each is visible while a method that takes it is selected."""
    widgets = {}
    for method, name in RELAXED_KNOBS:
        knob = next(k for k in registry.get_method("speech", method).knobs if k.name == name)
        common = dict(label=f"{name} ({method})", info=knob.help, visible=_takes(shown_method, name),
                      elem_id=f"speech-{name}")
        if knob.type is float:
            widgets[name] = gr.Slider(knob.minimum, knob.maximum, value=knob.default, step=0.01, **common)
        else:
            widgets[name] = gr.Dropdown(list(knob.choices), value=knob.default, **common)
    return widgets
