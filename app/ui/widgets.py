"""What the demo's tabs share: the live statistics and their panel, the request-option widgets and their checks
(from `specgen.app.request_options`), the run controls, and the comparison with plain decoding."""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from dataclasses import dataclass, field

from specgen.app.request_options import Field
from specgen.modalities.memory import release_freed
from specgen.errors import SpecgenError

log = logging.getLogger("specgen.app.ui")

MODEL_WORK = "model"  # the one concurrency_id for every event that runs a model
SOURCE_LABELS = ("accepted", "recovered", "bonus")  # TokenSource order
PLAIN_LABEL = "target"  # tokens of plain decoding (no draft): every one comes from the target
COLOR_MAP = {"accepted": "#22c55e", "recovered": "#f97316", "bonus": "#3b82f6", PLAIN_LABEL: "#a1a1aa"}
PLAIN_NOTE = "_`ar` is plain decoding: there is nothing to compare it with._"
COMPARING_NOTE = "_running plain decoding of the same request for comparison…_"


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


def timed(iterator):
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


COMPARE_S = 3.0  # short requests are compared again until this much time has gone into the comparison
COMPARE_RUNS = 3  # at most this many ratios


def compare_with_plain(generator, prompt: str, options: dict, tokens: list[int], busy_s: float,
                       again=None) -> dict:
    """Plain decoding (`ar`) of the same request, sample 0: its speed, the measured speedup (tokens per second of
    the method over those of plain decoding) and, at temperature 0, whether the tokens are the same.

    `again()` streams the method's request once more, quietly. Where given, the speedup compares quiet runs only:
    the streamed run shared the cores with the page's live updates (rendered by the browser and sent by the
    server's thread, which holds the interpreter lock while it encodes them), and on a 2-core machine its Gemma
    ratio read 1.1 where quiet runs read 1.5. The method runs once more after the plain run, and a short request (a
    sentence of speech decodes in half a second, where a moment of load elsewhere moves one timing by a fifth) is
    timed again as (method, plain) pairs until COMPARE_S has gone into the comparison or there are COMPARE_RUNS
    ratios; the speedup is their median. Without `again` (the text tab while an online draft learns: a re-run would
    teach it twice) the streamed run's ratio is the speedup."""
    ar_tokens, ar_s = _quietly(generator.stream(prompt, method="ar", **options))
    if again is None:
        ratios = [_ratio(tokens, busy_s, ar_tokens, ar_s)]
    else:
        method_tokens, method_s = _quietly(again())
        ratios = [_ratio(method_tokens, method_s, ar_tokens, ar_s)]
        spent = method_s + ar_s
        while spent < COMPARE_S and len(ratios) < COMPARE_RUNS:
            method_tokens, method_s = _quietly(again())
            plain_tokens, plain_s = _quietly(generator.stream(prompt, method="ar", **options))
            ratios.append(_ratio(method_tokens, method_s, plain_tokens, plain_s))
            spent += method_s + plain_s
    known = [r for r in ratios if r is not None]
    return {"ar_tokens_per_s": len(ar_tokens) / ar_s if ar_s > 0 else None, "ar_wall_s": ar_s,
            "speedup_vs_ar": statistics.median(known) if known else None, "speedup_runs": len(known),
            "identical_to_ar": (ar_tokens == tokens) if options.get("temperature") == 0 else None}


def _quietly(events) -> tuple[list[int], float]:
    """(sample 0's tokens, seconds spent inside the generator) of a stream run to its end."""
    tokens: list[int] = []
    events, busy = timed(events)
    for event in events:
        if event.row == 0:
            tokens.extend(event.tokens)
    return tokens, busy[0]


def _ratio(tokens: list[int], seconds: float, ar_tokens: list[int], ar_seconds: float) -> float | None:
    if seconds <= 0 or ar_seconds <= 0 or not ar_tokens:
        return None
    return (len(tokens) / seconds) / (len(ar_tokens) / ar_seconds)


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
        release_freed()


def jsonable(stats: dict) -> dict:
    """Stats as JSON would carry them (window sizes become string keys)."""
    return json.loads(json.dumps(stats))


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
    if stats.get("auto"):
        lines += ["", auto_timeline_markdown(stats["auto"])]
    if note:
        lines += ["", note]
    return "\n".join(lines)


def auto_timeline_markdown(report: dict) -> str:
    """What `auto` chose and every switch, each with the predicted speedup of every candidate behind it."""
    def choice(entry: dict) -> str:
        name = "plain decoding (ar)" if entry["method"] == "ar" else f"`{entry['method']}`"
        return name + (f" (length {entry['length']})" if entry["method"] != "ar" else "")

    def why(entry: dict) -> str:
        ranked = sorted(entry["predicted"].items(), key=lambda kv: -kv[1])
        return ", ".join(f"{name} {speedup:.2f}×" for name, speedup in ranked)

    entries = [report["initial"], *report.get("switches", [])] if report.get("initial") else []
    lines = [f"**auto chose** {choice(entries[0]) if entries else '`ar`'}"
             + ("; steps per method: " + ", ".join(f"{n} {c}" for n, c in report.get("steps_by_method", {}).items())
                if report.get("steps_by_method") else ""),
             "", "| step | auto runs | predicted speedup of each candidate |", "|---|---|---|"]
    lines += [f"| {e['step']} | {choice(e)} | {why(e)} |" for e in entries[:12]]
    if len(entries) > 12:
        lines.append(f"| … | {len(entries) - 12} more switches | |")
    return "\n".join(lines)


def acceptance_frame(per_position: list):
    import pandas as pd

    values = [v if v is not None else 0.0 for v in per_position]
    if not values:  # nothing drafted yet (or plain decoding): an empty plot, not an empty frame
        return None  # (an empty frame would fix the axis types before the first bar arrives)
    width = 2 if len(values) > 9 else 1  # the plot sorts labels as text: #02 before #10
    return pd.DataFrame({"draft position": [f"#{i + 1:0{width}d}" for i in range(len(values))],
                         "acceptance": values})


# ---- request options ---------------------------------------------------------------------------------------------

def check_number(gr, name: str, value, low: float, high: float, *, integer: bool = False, low_open=False):
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


def check_option(gr, option: Field, value):
    """A request option's widget value, within the option's range and the demo's limit for it."""
    limits = [bound for bound in (option.maximum, option.demo.limit) if bound is not None]
    return check_number(gr, option.name, value, option.minimum, min(limits), integer=option.type is int,
                        low_open=option.open_minimum)


def method_params(spec, values: dict) -> dict:
    """The knob widgets' values that belong to the method (the others keep their values but are not sent); the
    method's knobs check them when the run starts."""
    own = {knob.name for knob in spec.knobs}
    return {name: value for name, value in values.items() if name in own and value is not None and value != ""}


def option_widget(gr, tab: str, option: Field):
    """The widget of a request option: a slider or a number box starting at the demo's value."""
    demo = option.demo
    common = dict(label=demo.label or option.name.replace("_", " "), elem_id=f"{tab}-{_dashed(option)}")
    if demo.info:
        common["info"] = demo.info
    if demo.slider is not None:
        low, high, step = demo.slider
        return gr.Slider(low, high, value=demo.start, step=step, **common)
    number = dict(precision=0) if option.type is int else {}
    if demo.limit is not None:
        number["maximum"] = demo.limit
    return gr.Number(value=demo.start, minimum=option.minimum, **number, **common)


def _dashed(option: Field) -> str:
    return (option.alias or option.name).replace("_", "-")


def run_controls(gr, tab: str, methods: list[str], default: str, **method_options):
    """The method picker, the comparison checkbox and the Run and Stop buttons of a tab."""
    method = gr.Dropdown(methods, value=default, label="Method", elem_id=f"{tab}-method", **method_options)
    compare = gr.Checkbox(value=True, label="compare with plain decoding", elem_id=f"{tab}-compare",
                          info="re-runs the same request with `ar` and measures the speedup")
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id=f"{tab}-run")
        stop = gr.Button("Stop", variant="stop", elem_id=f"{tab}-stop")
    return method, compare, run, stop


def acceptance_plot(gr, tab: str, title: str = "acceptance per draft position"):
    return gr.BarPlot(None, x="draft position", y="acceptance", y_lim=[0, 1], title=title,
                      elem_id=f"{tab}-acceptance", height=260)


def stats_json(gr, tab: str):
    with gr.Accordion("all statistics (JSON)", open=False):
        return gr.JSON(elem_id=f"{tab}-stats-json")
