"""The demo's Speech tab: live statistics while the acoustic tokens are committed, the audio when the utterance is
done, and a comparison with plain decoding of the same request. The lossy methods show their knobs (pcg: theta and
the residual; ssd: beta) and, next to their acceptance, what exact token-level sampling reached on the same drafts."""

from __future__ import annotations

from specgen.app.ui.models import LazyGenerator
from specgen.errors import SpecgenError
from specgen.samplers import registry


class SpeechModels(LazyGenerator):
    def __init__(self, generator=None, *, threads: int | None = 1):
        def load():
            from specgen.modalities.speech.generator import SpeechGenerator

            return SpeechGenerator(threads=threads)

        super().__init__(load, "speech models", generator)

    def describe(self) -> str:
        path = self._generator.model_path if self._generator is not None else "assets/speech/target"
        return f"**Speech model** ({self.state()}): `{path}`"


def make_speech_runner(speech_models: SpeechModels):
    import gradio as gr

    from specgen.app.ui import (LiveStats, _check_number, _jsonable, _timed, acceptance_frame, shown_in_ui,
                                stats_markdown)

    def run_speech(text, method, compare, voice, temperature, seed, theta=None, beta=None, residual=None):
        if not isinstance(text, str) or not text.strip():
            raise gr.Error("Enter some text to speak first.")
        if method not in registry.method_names("speech"):
            raise gr.Error(f"unknown speech method {method!r}; choose from: "
                           f"{', '.join(registry.method_names('speech'))}")
        temperature = _check_number(gr, "temperature", temperature, 0.0, 5.0)
        seed = _check_number(gr, "seed", seed, 0, 2**63 - 1, integer=True)
        spec = registry.get_method("speech", method)
        knobs = _method_knobs(spec, {"theta": theta, "beta": beta, "residual": residual})

        def body():
            spec.resolve_knobs(knobs)  # a bad value is shown as one error message
            generator = speech_models.get()
            generator.vocab.prompt_ids(text.strip(), voice)
            options = dict(voice=voice, temperature=temperature, seed=seed)
            stats, live = _spec_stats(), LiveStats()
            tokens: list[int] = []
            events, busy = _timed(generator.stream(text.strip(), method=method, stats=stats, **options, **knobs))
            for event in events:
                if event.row == 0:
                    live.update(event)
                    tokens.extend(event.tokens)
                    current = {**live.summary(busy[0]), "lossless": spec.lossless}
                    yield (None, stats_markdown(current, method=method, running=True),
                           acceptance_frame(current["per_position_acceptance"]), current)
            summary = stats.summary(method=method, lossless=spec.lossless, wall_s=busy[0],
                                    ar_step_s=generator.measure_step_s(text.strip(), voice))
            audio = (generator.sample_rate, generator.decode(generator.vocab.acoustic(tokens)))
            compared, note = None, ""
            if compare and spec.drafter is not None:
                ar_tokens: list[int] = []
                ar_events, ar_busy = _timed(generator.stream(text.strip(), method="ar", **options))
                for event in ar_events:
                    if event.row == 0:
                        ar_tokens.extend(event.tokens)
                compared = {"ar_tokens_per_s": len(ar_tokens) / ar_busy[0] if ar_busy[0] > 0 else None,
                            "speedup_vs_ar": ar_busy[0] / busy[0] * len(tokens) / max(len(ar_tokens), 1)
                            if busy[0] > 0 else None,
                            "identical_to_ar": (ar_tokens == tokens) if temperature == 0 else None}
                summary = {**summary, **compared}
            elif compare:
                note = "_`ar` is plain decoding: there is nothing to compare it with._"
            note = " ".join(filter(None, [relaxed_note(summary), note]))
            yield (audio, stats_markdown(summary, method=method, running=False, compare=compared, note=note),
                   acceptance_frame(summary["per_position_acceptance"]), _jsonable(summary))

        yield from shown_in_ui(gr, "speech", body())

    return run_speech


def _method_knobs(spec, values: dict) -> dict:
    """The demo's knob widgets that belong to this method (the others keep their values but are not sent)."""
    own = {knob.name for knob in spec.knobs}
    return {name: value for name, value in values.items() if name in own and value is not None and value != ""}


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


def _spec_stats():
    from specgen.samplers.stats import SpecStats

    return SpecStats()


def build_speech_tab(gr, speech_models: SpeechModels, *, concurrency_limit: int, concurrency_id: str):
    """The Speech tab's components and events (call inside `gr.Blocks`)."""
    methods = registry.method_names("speech")
    with gr.Tab("Speech", id="speech", elem_id="tab-speech"):
        with gr.Row():
            with gr.Column(scale=1):
                text = gr.Textbox(label="Text to speak", lines=3, value="The quick brown fox jumps over the lazy dog.",
                                  elem_id="speech-text")
                method = gr.Dropdown(methods, value=registry.default_method("speech"), label="Method",
                                     elem_id="speech-method")
                compare = gr.Checkbox(value=True, label="compare with plain decoding", elem_id="speech-compare")
                with gr.Row():
                    run = gr.Button("Run", variant="primary", elem_id="speech-run")
                    stop = gr.Button("Stop", variant="stop", elem_id="speech-stop")
                with gr.Accordion("Settings", open=True):
                    from specgen.modalities.speech.data import VOICES  # names only: no torch

                    voice = gr.Dropdown(list(VOICES), value=next(iter(VOICES)), allow_custom_value=True,
                                        label="voice", elem_id="speech-voice")
                    temperature = gr.Slider(0.0, 2.0, value=0.8, step=0.05, label="temperature",
                                            info="0 means greedy", elem_id="speech-temperature")
                    seed = gr.Number(value=0, precision=0, minimum=0, label="seed", elem_id="speech-seed")
                    knob_widgets = _knob_widgets(gr, registry.default_method("speech"))
            with gr.Column(scale=2):
                output = gr.Audio(label="Speech", elem_id="speech-output", interactive=False, type="numpy")
                with gr.Row():
                    stats_panel = gr.Markdown("_run a text to see τ, acceptance and the speedup_",
                                              elem_id="speech-stats")
                    plot = gr.BarPlot(None, x="draft position", y="acceptance", y_lim=[0, 1],
                                      title="acceptance per draft position", elem_id="speech-acceptance", height=260)
                with gr.Accordion("all statistics (JSON)", open=False):
                    stats_json = gr.JSON(elem_id="speech-stats-json")
    event = run.click(make_speech_runner(speech_models), [text, method, compare, voice, temperature, seed,
                                                          *knob_widgets.values()],
                      [output, stats_panel, plot, stats_json], api_name="generate_speech",
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
