"""The options of a generation request, one table per modality: name, type, default and range of each field.

The command line builds its `generate` flags from these tables, `specgen batch` checks the "params" of every line
against them, and the web demo takes its widgets' starting values and limits from them, so an option means the
same everywhere. Method knobs are not here: they live with their method in `specgen.samplers.registry`.
Standard library only (the CLI reads this before torch loads).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from specgen.errors import InvalidRequest

MAX_SEED = 2**63 - 1  # seeds key a counter-based generator through int64 tensors
# the request field(s) that say what to generate; an image or video request takes either a prompt or a class
SOURCE_FIELDS = {"text": ("prompt",), "image": ("prompt", "class"), "video": ("prompt", "class"),
                 "speech": ("text",)}


@dataclass(frozen=True)
class Demo:
    """How the web demo shows a field: the value it starts at, a slider's (low, high, step) or None for a number
    box, the most an API client may send (a bound of the demo only: one request must not hold it for long), and
    the widget's label (default: the name) and hint."""

    start: object
    slider: tuple[float, float, float] | None = None
    limit: float | None = None
    label: str = ""
    info: str = ""


@dataclass(frozen=True)
class Field:
    """One request option. `default` None leaves it to the model's recipe or the generator; `alias` is the
    shorter name of the CLI flag and the demo widget (`guidance` for `guidance_scale`)."""

    name: str
    type: type  # int, float or str
    help: str
    default: object = None
    minimum: float | None = None
    maximum: float | None = None
    open_minimum: bool = False  # the range excludes its minimum: (minimum, maximum]
    index: bool = False  # a str field that also takes an index >= 0 (a voice by number)
    alias: str = ""
    metavar: str = "X"
    demo: Demo | None = None

    @property
    def flags(self) -> tuple[str, ...]:
        """The CLI spellings: the alias first, then the field's own name."""
        names = [self.alias, self.name] if self.alias else [self.name]
        return tuple("--" + name.replace("_", "-") for name in names)

    def rule(self) -> str:
        """What a value must be, for error messages ("an integer >= 1", "a number in (0, 1]")."""
        if self.type is str:
            return "a non-empty string" + (" or an integer >= 0" if self.index else "")
        what = "an integer" if self.type is int else "a number"
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            if self.type is int:
                return f"{what} between {low} and {high}"
            return f"{what} in {'(' if self.open_minimum else '['}{low:g}, {high:g}]"
        if low is not None:
            return f"{what} {'>' if self.open_minimum else '>='} {low:g}"
        return what if high is None else f"{what} <= {high:g}"

    def check(self, value):
        """`value` as the request carries it (JSON types), checked; InvalidRequest says what it must be."""
        if not self._valid(value):
            raise InvalidRequest(f"{self.name} must be {self.rule()}, got {json.dumps(value)}")
        return float(value) if self.type is float else value

    def parse(self, text: str):
        """`value` as typed on the command line, converted and checked."""
        try:
            value = self.type(text) if self.type is not str else text
        except ValueError:
            raise InvalidRequest(f"{self.name} must be {self.rule()}, got {text}") from None
        if not self._valid(value):
            raise InvalidRequest(f"{self.name} must be {self.rule()}, got {text}")
        return value

    def _valid(self, value) -> bool:
        if _is_int(value) and self.type is str:
            return self.index and value >= 0
        if self.type is str:
            return isinstance(value, str) and bool(value.strip())
        if not (_is_int(value) or (self.type is float and isinstance(value, float) and math.isfinite(value))):
            return False
        low_ok = self.minimum is None or (value > self.minimum if self.open_minimum else value >= self.minimum)
        return low_ok and (self.maximum is None or value <= self.maximum)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


SEED = Field("seed", int, "default: 0", 0, 0, MAX_SEED, metavar="SEED", demo=Demo(0))
TEMPERATURE = Field("temperature", float, "0 means greedy (default: 0)", 0.0, 0.0, metavar="T",
                    demo=Demo(0.0, (0.0, 2.0, 0.05), limit=5.0, info="0 means greedy"))
TOP_K = Field("top_k", int, "keep the K most likely tokens, 0 = all (default: 0)", 0, 0, metavar="K")
NUM_SAMPLES = Field("num_samples", int, "independent samples, batched internally (default: 1)", 1, 1, metavar="N")
MAX_NEW_TOKENS = Field("max_new_tokens", int, "default: 128", 128, 1, metavar="N",
                       demo=Demo(64, limit=1024))

TEXT = (
    MAX_NEW_TOKENS,
    TEMPERATURE,
    Field("top_p", float, "nucleus mass in (0, 1] (default: 1.0)", 1.0, 0.0, 1.0, open_minimum=True, metavar="P",
          demo=Demo(1.0, (0.05, 1.0, 0.05), label="top-p")),
    TOP_K,
    NUM_SAMPLES,
    SEED,
    Field("memory_budget_mb", float, "peak resident memory of the process in MB: the method's window and the batch "
          "rows are cut to what fits beside the loaded models (SpecMemo; default: no budget)", None, 0.0,
          open_minimum=True, alias="memory_budget", metavar="MB"),
)
IMAGE = (  # video too
    replace(TEMPERATURE, help="0 means greedy (default: 1.0)", default=1.0, demo=replace(TEMPERATURE.demo, start=1.0)),
    replace(TOP_K, help="keep the K most likely codes, 0 = all (default: the model's recipe)", default=None,
            demo=Demo(50, limit=100_000, label="top-k (0 = all codes)")),
    Field("guidance_scale", float, "classifier-free guidance scale, 1 = off (default: the model's recipe)",
          minimum=0.0, alias="guidance", metavar="S",
          demo=Demo(3.0, (0.0, 8.0, 0.25), limit=20.0, label="guidance scale (1 = off)")),
    replace(NUM_SAMPLES, help="independent samples, batched; saved as one grid (default: 1)"),
    SEED,
)
SPEECH = (
    Field("voice", str, "speaker (default: slt; the model's vocab.json lists its voices)", index=True,
          metavar="VOICE"),
    replace(MAX_NEW_TOKENS, help="acoustic tokens at most, 62.5 per second (default: from the text length)",
            default=None),
    replace(TEMPERATURE, help="0 means greedy (default: the model's recipe, 0.8)", default=None,
            demo=replace(TEMPERATURE.demo, start=0.8)),
    replace(TOP_K, help="keep the K most likely tokens, 0 = all (default: the model's recipe, 50)", default=None),
    SEED,
)
FIELDS = {"text": TEXT, "image": IMAGE, "video": IMAGE, "speech": SPEECH}


def fields(modality: str) -> dict[str, Field]:
    """The modality's request options by name, in the order the CLI lists them."""
    try:
        return {field.name: field for field in FIELDS[modality]}
    except KeyError:
        raise InvalidRequest(f"unknown modality {modality!r}; choose from: {', '.join(FIELDS)}") from None


def check_options(modality: str, options: dict) -> dict:
    """The request options among `options` (a batch line's "params"), checked; other names are left out."""
    table = fields(modality)
    return {name: table[name].check(value) for name, value in options.items() if name in table}
