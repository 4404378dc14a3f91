"""The demo's Text tab: the output coloured by token source as it is committed, the method's knobs from the
registry (starting from the text model's preferences), and the comparison with plain decoding."""

from __future__ import annotations

import inspect
import sys
import time

from specgen.app import request_options
from specgen.app.ui.detokenizer import IncrementalDetokenizer
from specgen.app.ui.models import LazyGenerator, warm_default_paths
from specgen.app.ui.widgets import (COLOR_MAP, COMPARING_NOTE, PLAIN_LABEL, PLAIN_NOTE, SOURCE_LABELS, LiveStats,
                                    acceptance_frame, acceptance_plot, check_option, compare_with_plain, jsonable,
                                    method_params, option_widget, run_controls, shown_in_ui, stats_json,
                                    stats_markdown, timed)
from specgen.errors import SpecgenError
from specgen.samplers import registry

OPTIONS = ("temperature", "top_p", "seed", "max_new_tokens")  # the request options the tab shows, in this order
# at most this often a live update while decoding: each one re-sends and re-renders the whole coloured output on the
# cores that decode (a Gemma request sent ~40 a second, and its measured speedup read 1.02 in the browser against
# 1.5 in a script); ten a second still reads as a live stream
UPDATE_S = 0.1


# ---- the text models ---------------------------------------------------------------------------------------------

class TextModels(LazyGenerator):
    """The text generator, loaded on first use, or the one it was given."""

    def __init__(self, generator=None, *, model: str | None = None, draft: str | None = None,
                 threads: int | None = 1, online_draft: int | None = None):
        def load():
            from specgen.modalities.text import gemma
            from specgen.modalities.text.generator import TextGenerator, default_models

            if (model or default_models()[0]) == gemma.ALIAS:  # a first use converts it: show the stages
                gemma.resolve(log=self._converting)
            loaded = TextGenerator(model, draft, threads=threads)
            warm_default_paths(loaded, loaded.example_prompt, max_new_tokens=16)
            if online_draft is not None:  # online speculative decoding across every request the demo serves
                loaded.learn_online(interval=online_draft)
            return loaded

        super().__init__(load, "text models", generator)
        self._model, self._draft, self.online_draft = model, draft, online_draft
        self.default_target = generator is None and model is None  # the header says why this target
        self.conversion: str | None = None  # the latest conversion line while Gemma is converted on first use

    def default_method(self) -> str:
        """The Text tab's preselected method, known without loading anything."""
        from specgen.modalities.text.generator import default_method

        loaded = getattr(self._generator, "default_method", None)
        return loaded or default_method(self._model, self._draft)

    def example_prompt(self) -> str:
        """The Text tab's first prompt, suited to the text model (prose for Gemma, Python for the code pair)."""
        from specgen.modalities.text.generator import example_prompt

        loaded = getattr(self._generator, "example_prompt", None)
        return loaded if isinstance(loaded, str) else example_prompt(self._model)

    def knob_value(self, knob, method: str):
        """What the Text tab shows for `knob` under `method`: the text model's own preference (Gemma's measured
        draft lengths), else the registry's default; known without loading anything."""
        from specgen.modalities.text.generator import knob_defaults

        if method not in registry.method_names("text"):
            return knob.default
        model = self._generator.model_path if self._generator is not None else self._model
        return knob_defaults(model, registry.get_method("text", method)).get(knob.name, knob.default)

    def _converting(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)
        self.conversion = message

    def paths(self) -> tuple[str, str | None]:
        if self._generator is not None:
            return self._generator.model_path, self._generator.draft_path
        from specgen.modalities.text.generator import default_models  # torch import: only when asked

        target, draft = default_models()
        return self._model or target, self._draft or (draft if self._model is None else None)


# ---- knobs -------------------------------------------------------------------------------------------------------

def text_knobs() -> list:
    """Every distinct method knob of the text registry (each shown only for methods that have it)."""
    seen, knobs = set(), []
    for name in registry.method_names("text"):
        for knob in registry.get_method("text", name).knobs:
            if knob.name not in seen:
                seen.add(knob.name)
                knobs.append(knob)
    # TETRIS's knobs came last to the registry: after the others, so the demo API's positional arguments keep
    # their order for existing clients
    batch = {knob.name for knob in registry.TETRIS_KNOBS}
    auto = {knob.name for knob in registry.AUTO_KNOBS}  # auto's came later still: after TETRIS's
    later = {"output_rows", "head", "vocabulary"}  # eagle's, later again; then eagle2's head and mtp's vocabulary
    latest = {"exit_layers", "draft_exit"}  # DEL's, after those
    newest = {"exit_threshold", "stop_threshold", "decision_layers"}  # early-exit's, after those
    shallow = {"shallow_pass"}  # kangaroo's verification choice, last
    groups = (batch, auto, later, latest, newest, shallow)
    return ([k for k in knobs if not any(k.name in group for group in groups)]
            + [k for group in groups for k in knobs if k.name in group])


def method_info(name: str) -> str:
    try:
        spec = registry.get_method("text", name)
    except SpecgenError:
        return ""
    return f"{spec.summary} ({'lossless' if spec.lossless else 'lossy'})"


def _knob_choices(knob) -> list | None:
    """Named choices of a string knob: its own, or the length schedules the core resolves by name."""
    if getattr(knob, "choices", ()):
        return list(knob.choices)
    if knob.name == "length_schedule":
        try:
            from specgen.samplers.length_policies import POLICIES

            return list(POLICIES)
        except (ImportError, AttributeError):
            return None
    return None


def knob_widget(gr, knob, visible: bool, value=None):
    """One widget per registry knob: a slider for bounded integers, a dropdown for named choices. `value`: the
    initial value (default: the registry's)."""
    label, elem_id = knob.name.replace("_", " "), f"text-{knob.name.replace('_', '-')}"
    value = knob.default if value is None else value
    common = dict(label=label, info=knob.help, visible=visible, elem_id=elem_id)
    if knob.type is int and knob.minimum is not None and knob.maximum is not None:
        return gr.Slider(int(knob.minimum), int(knob.maximum), value=value, step=1, **common)
    if knob.type in (int, float):
        return gr.Number(value=value, **common)
    choices = _knob_choices(knob)
    if choices and value in choices:
        return gr.Dropdown(choices, value=value, **common)
    return gr.Textbox(value=str(value), **common)


# ---- running -----------------------------------------------------------------------------------------------------

def make_text_runner(text_models: TextModels, knobs: list):
    import gradio as gr

    options = request_options.fields("text")

    def run_text(prompt, method, compare, temperature, top_p, seed, max_new_tokens, *knob_values):
        if not isinstance(prompt, str) or not prompt.strip():
            raise gr.Error("Enter a prompt first.")
        if method not in registry.method_names("text"):
            raise gr.Error(f"unknown text method {method!r}; choose from: {', '.join(registry.method_names('text'))}")
        request = {name: check_option(gr, options[name], value)
                   for name, value in zip(OPTIONS, (temperature, top_p, seed, max_new_tokens))}
        spec = registry.get_method("text", method)
        params = method_params(spec, {knob.name: value for knob, value in zip(knobs, knob_values)})

        def body():
            resolved = spec.resolve_knobs(params)
            generator = text_models.get()
            yield from stream_text(gr, generator, prompt, method, spec, compare, resolved, request)

        yield from shown_in_ui(gr, "text", body())

    # Name the knob parameters after the knobs, so API clients can pass them by keyword.
    fixed = list(inspect.signature(run_text).parameters.values())[:-1]
    run_text.__signature__ = inspect.Signature(
        fixed + [inspect.Parameter(k.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in knobs])
    return run_text


def stream_text(gr, generator, prompt, method, spec, compare, params, options):
    """The tab's updates (coloured pieces, stats panel, acceptance plot, stats) while `method` runs, then the
    comparison with plain decoding when asked."""
    from specgen.samplers.stats import SpecStats

    plain = spec.drafter is None
    detok = IncrementalDetokenizer(generator.tokenizer, generator.encode(prompt).tolist())
    pieces: list[tuple[str, str | None]] = [(prompt, None)]
    pending_label = None
    stats, live = SpecStats(), LiveStats()
    tokens: list[int] = []
    events, busy = timed(generator.stream(prompt, method=method, stats=stats, **options, **params))
    shown = 0.0
    for event in events:
        if event.row != 0:
            continue
        live.update(event)
        for token, source in zip(event.tokens, event.sources):
            tokens.append(token)
            label = PLAIN_LABEL if plain else SOURCE_LABELS[source]
            piece = detok.push(token)
            if piece:
                pieces.append((piece, pending_label or label))
                pending_label = None
            else:  # an unfinished character: it shows with the token that completes it
                pending_label = pending_label or label
        if time.perf_counter() - shown < UPDATE_S:
            continue
        shown = time.perf_counter()
        current = {**live.summary(busy[0]), "lossless": spec.lossless}
        yield (list(pieces), stats_markdown(current, method=method, running=True),
               acceptance_frame(current["per_position_acceptance"]), current)
    rest = detok.flush()
    if rest:
        pieces.append((rest, pending_label or PLAIN_LABEL))
    summary = stats.summary(method=method, lossless=spec.lossless, wall_s=busy[0],
                            ar_step_s=generator.measure_step_s(prompt))
    online = getattr(generator, "online", None)
    if online is not None and method == "draft":  # the stream, run to its end, taught the draft (OSD)
        summary["online_updates"] = online.updates
    compared = None
    if compare and not plain:
        yield (list(pieces), stats_markdown(summary, method=method, running=True, note=COMPARING_NOTE),
               acceptance_frame(summary["per_position_acceptance"]), jsonable(summary))
        # quiet re-runs of both (their median is the speedup), unless a run teaches an online draft
        again = (lambda: generator.stream(prompt, method=method, **options, **params)) if online is None else None
        compared = compare_with_plain(generator, prompt, options, tokens, busy[0], again=again)
        summary = {**summary, **compared}
    note = PLAIN_NOTE if compare and plain else ""
    yield (list(pieces), stats_markdown(summary, method=method, running=False, compare=compared, note=note),
           acceptance_frame(summary["per_position_acceptance"]), jsonable(summary))


# ---- the tab -----------------------------------------------------------------------------------------------------

def build_text_tab(gr, text_models: TextModels, *, concurrency_limit: int, concurrency_id: str):
    """The Text tab's components and events (call inside `gr.Blocks`); returns the run event."""
    methods, knobs = registry.method_names("text"), text_knobs()
    default = text_models.default_method()
    default = default if default in methods else methods[0]
    default_own = {k.name for k in registry.get_method("text", default).knobs}
    options = request_options.fields("text")
    with gr.Tab("Text", id="text", elem_id="tab-text"):
        with gr.Row():
            with gr.Column(scale=1):
                prompt = gr.Textbox(label="Prompt", lines=4, elem_id="text-prompt", value=text_models.example_prompt())
                method, compare, run, stop = run_controls(gr, "text", methods, default, info=method_info(default))
                with gr.Accordion("Settings", open=True):
                    knob_inputs = [knob_widget(gr, knob, knob.name in default_own,
                                               text_models.knob_value(knob, default)) for knob in knobs]
                    request = [option_widget(gr, "text", options[name]) for name in OPTIONS]
            with gr.Column(scale=2):
                output = gr.HighlightedText(label="Output", color_map=COLOR_MAP, combine_adjacent=True,
                                            show_legend=True, show_inline_category=False, elem_id="text-output")
                with gr.Row():
                    stats_panel = gr.Markdown("_run a prompt to see τ, acceptance and speedup_", elem_id="text-stats")
                    plot = acceptance_plot(gr, "text")
                json_panel = stats_json(gr, "text")

    def show_knobs(name):
        own = {k.name for k in registry.get_method("text", name).knobs} if name in methods else set()
        # a method's knobs start from the text model's preferences (Gemma verifies short windows best)
        return [gr.update(info=method_info(name)),
                *(gr.update(visible=k.name in own, value=text_models.knob_value(k, name)) for k in knobs)]

    method.change(show_knobs, method, [method, *knob_inputs], queue=False, api_name=False)
    event = run.click(make_text_runner(text_models, knobs), [prompt, method, compare, *request, *knob_inputs],
                      [output, stats_panel, plot, json_panel], api_name="generate_text",
                      concurrency_limit=concurrency_limit, concurrency_id=concurrency_id)
    stop.click(None, None, None, cancels=[event], api_name=False)
    return event
