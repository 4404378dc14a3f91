"""Argument types and generated flags shared by every `specgen` command.

The flags of a request come from two tables: its options from `specgen.app.request_options` (`request_flags`) and
the knobs of the modality's methods from the registry (`knob_flags`). Only the standard library, `specgen.errors`
and those two torch-free tables load here, so `--help` stays fast. The `type=` callables raise
ArgumentTypeError, whose message argparse keeps as the one error line.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from specgen.app import request_options
from specgen.app.request_options import MAX_SEED  # noqa: F401  (the seed bound of every command)
from specgen.errors import InvalidRequest
from specgen.samplers import registry

EXIT_USAGE = 2  # every SpecgenError and every argument error
PEER_METHODS = ("hf", "hf-assisted", "hf-prompt-lookup")  # Hugging Face baselines, text bench only
KNOB_PREFIX = "knob_"  # the namespace prefix of generated knob flags (`--tree-budget` -> `knob_tree_budget`)
# a text request's own options: a method knob of the same name (EAGLE-2's `top_k`) cannot be a flag of its own
TEXT_REQUEST_OPTIONS = set(request_options.fields("text"))


def one_line(message: object) -> str:
    return " ".join(str(message).split())


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one `error:` line and exit 2 (no usage dump); subparsers inherit this."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"error: {one_line(message)}\n")


# ---- value checks ------------------------------------------------------------------------------------------------

def int_at_least(lowest: int, highest: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lowest or (highest is not None and value > highest):
            bound = f"between {lowest} and {highest}" if highest is not None else f">= {lowest}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return parse


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}" if not path.exists() else f"not a file: {text}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text}")
    return path


def output_path(*suffixes: str):
    """An output file whose folder exists (so a long run cannot fail at the end), with one of `suffixes`."""
    def parse(text: str) -> Path:
        path = Path(text)
        if suffixes and path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{text!r} must end in {' or '.join(suffixes)}")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a directory")
        if not path.parent.is_dir():
            raise argparse.ArgumentTypeError(f"folder {str(path.parent)!r} does not exist")
        return path
    return parse


def int_list(low: int, high: int):
    """`--windows 8,16,32`: distinct integers in [low, high], sorted."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if any(not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(f"every value must be in [{low}, {high}], got {text!r}")
        return sorted(set(values))
    return parse


def float_list(low: float, high: float, single: bool = False):
    """`--thetas 0.4,0.3`: distinct finite numbers in [low, high] (one number with single=True)."""
    def parse(text: str) -> list[float] | float:
        values = [finite_float(v) for v in text.split(",")]
        if single and len(values) != 1:
            raise argparse.ArgumentTypeError(f"expected one number, got {text!r}")
        if any(not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(f"every value must be in [{low:g}, {high:g}], got {text!r}")
        return values[0] if single else sorted(set(values), reverse=True)
    return parse


def shape_list(text: str) -> list[str]:
    """`--shape chain-2,chain-3`: distinct static tree names (`samplers.trees.named_shape`), in the order given."""
    from specgen.samplers.trees import named_shape

    names = list(dict.fromkeys(name.strip() for name in text.split(",")))
    for name in names:
        try:
            named_shape(name)
        except InvalidRequest as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return names


# ---- methods and their knobs -------------------------------------------------------------------------------------

def method_name(modality: str):
    def parse(name: str) -> str:
        try:
            return registry.get_method(modality, name).name
        except InvalidRequest as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def method_list(modality: str):
    """`--methods a,b,c` for bench: known names (plus the Hugging Face peers for text), no repeats."""
    known = registry.method_names(modality) + (list(PEER_METHODS) if modality == "text" else [])

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",")]
        if not all(names):
            raise argparse.ArgumentTypeError(f"expected comma-separated method names, got {text!r}")
        unknown = [name for name in names if name not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {modality} method(s) {', '.join(unknown)}; "
                                             f"choose from: {', '.join(known)}")
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"a method is listed twice in {text!r}")
        return names
    return parse


def method_help(modality: str) -> str:
    names = registry.method_names(modality)
    default = registry.default_method(modality)
    return f"one of: {', '.join(names)} (default: {default})"


def request_flags(parser: argparse.ArgumentParser, modality: str) -> None:
    """A flag for every request option of the modality (`specgen.app.request_options`), with its default."""
    for field in request_options.fields(modality).values():
        parser.add_argument(*field.flags, dest=field.name, type=_field_type(field), default=field.default,
                            metavar=field.metavar, help=field.help)


def _field_type(field: request_options.Field):
    def parse(text: str):
        try:
            return field.parse(text)
        except InvalidRequest as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def option_type(modality: str, name: str):
    """The argparse type of one request option (a flag that sets it outside `request_flags`, e.g. batch's)."""
    return _field_type(request_options.fields(modality)[name])


def request_values(args: argparse.Namespace, modality: str) -> dict:
    """The request options as generator keywords; one left unset (None) is the model's or generator's own."""
    return {name: getattr(args, name) for name in request_options.fields(modality)
            if getattr(args, name) is not None}


def knob_flags(parser: argparse.ArgumentParser, modality: str) -> None:
    """A flag for every knob of the modality's methods (`--tree-budget N` sets `tree_budget`), generated from the
    registry: no default (the method's own applies), the value checked by the knob once the method is known
    (`method_knobs`), so a knob the chosen method lacks is one error line. A knob named like a request option
    (EAGLE-2 would clash on `top_k`) or a hand-declared flag is left out."""
    taken = set(request_options.fields(modality))
    for name, owners in registry.knob_owners(modality).items():
        knob = next(k for k in registry.get_method(modality, owners[0]).knobs if k.name == name)
        flag = "--" + name.replace("_", "-")
        if name in taken or flag in parser._option_string_actions:
            continue
        choices = getattr(knob, "choices", ())  # shown, not enforced here: the knob's own message names them
        metavar = "{" + ",".join(choices) + "}" if choices else {int: "N", float: "X"}.get(knob.type, "VALUE")
        parser.add_argument(flag, dest=KNOB_PREFIX + name, metavar=metavar, type=_knob_form(knob.type),
                            help=f"{knob.help} (methods {', '.join(owners)}; default: the method's, "
                                 f"{knob.default!r} in the registry)")


def _knob_form(kind: type):
    """The text of a knob flag once it has the knob's form (a whole or a finite number), so a malformed value is
    an error naming the flag; the knob converts it and checks its range (`method_knobs`)."""
    def parse(text: str) -> str:
        if kind is int:
            try:
                int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        elif kind is float:
            finite_float(text)
        return text
    return parse


def method_knobs(args: argparse.Namespace, modality: str, method: str) -> dict:
    """The knob flags given, checked against `method` and converted (InvalidRequest names the methods that take
    a knob the method lacks, or the bad value)."""
    given = {dest[len(KNOB_PREFIX):]: value for dest, value in vars(args).items()
             if dest.startswith(KNOB_PREFIX) and value is not None}
    spec = registry.get_method(modality, method)
    own = {knob.name for knob in spec.knobs}
    for name in given:
        if name not in own:
            takers = registry.knob_owners(modality)[name]
            raise InvalidRequest(f"--{name.replace('_', '-')} applies to {', '.join(takers)}, not {method!r}")
    resolved = spec.resolve_knobs(given)  # a bad value is one error line before any model loads
    return {name: resolved[name] for name in given}


def threads_option(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("--threads", type=int_at_least(1), default=default, metavar="N",
                        help="torch threads for decoding (default: $SPECGEN_THREADS or 1)")
