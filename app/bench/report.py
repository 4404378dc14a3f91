"""Writing a benchmark's record: the result as JSON, its figures, its Markdown report, and `*-latest` copies.

A run is written as STEM.json (first, so that nothing measured is lost to a failing plot), its figures (STEM.png,
STEM-samples.png) and STEM.md; the `*-latest` copies sit where the docs cite them, and their report links the
latest figures. The helpers every report shares live here too: the run line, number cells and the plot font.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union

# a figure's kind -> what follows the stem in its file name
FIGURE_SUFFIXES = {"png": ".png", "samples": "-samples.png"}
Figure = Union[Callable[[Path], None], Path]  # draws itself at a path, or was drawn there already


@dataclass(frozen=True)
class Written:
    """The files of one record: kind ("json", "md", "png", "samples") -> path."""

    runs: dict[str, Path]
    latest: dict[str, Path] = field(default_factory=dict)  # empty where the run has no *-latest copies


def write_record(result: dict, runs_dir: Path, stem: str, markdown: Callable[[dict[str, str]], str],
                 figures: dict[str, Figure] | None = None, latest: str | None = None,
                 latest_dir: Path | None = None) -> Written:
    """STEM.json, every figure and STEM.md in `runs_dir`; with `latest`, LATEST.* copies in `latest_dir` (default:
    `runs_dir`). `markdown(names)` renders the report given the file name of each figure beside it (kind -> name)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    runs = {"json": runs_dir / f"{stem}.json"}
    runs["json"].write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for kind, figure in (figures or {}).items():
        runs[kind] = runs_dir / (stem + FIGURE_SUFFIXES[kind])
        if callable(figure):
            figure(runs[kind])
        elif Path(figure) != runs[kind]:
            shutil.copyfile(figure, runs[kind])
    shown = [kind for kind in runs if kind != "json"]
    runs["md"] = runs_dir / f"{stem}.md"
    runs["md"].write_text(markdown({kind: runs[kind].name for kind in shown}), encoding="utf-8")
    if latest is None:
        return Written(runs)
    latest_dir = latest_dir or runs_dir
    latest_dir.mkdir(parents=True, exist_ok=True)
    copies = {kind: latest_dir / (latest + FIGURE_SUFFIXES.get(kind, f".{kind}")) for kind in runs}
    for kind in ("json", *shown):
        shutil.copyfile(runs[kind], copies[kind])
    copies["md"].write_text(markdown({kind: copies[kind].name for kind in shown}), encoding="utf-8")
    return Written(runs, copies)


def save_record(out: Path, result: dict, markdown) -> None:
    """A benchmark script's record: OUT.json and OUT.md (`markdown(result)`), the table printed as well."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def print_outcome(result: dict, written: Written, as_json: bool) -> None:
    """The CLI's answer: the result as one JSON object (--json) or the report on stdout; the files on stderr."""
    import sys

    print(json.dumps(result) if as_json else written.runs["md"].read_text())
    print("wrote " + ", ".join(str(p) for p in written.runs.values()), file=sys.stderr)


def command_line(args) -> str:
    """The `specgen ...` command a CLI run records (the arguments as given)."""
    import shlex
    import sys

    argv = getattr(args, "argv", None)
    return "specgen " + shlex.join(argv if argv is not None else sys.argv[1:])


# ---- what every report shares ------------------------------------------------------------------------------------

def run_line(env: dict) -> str:
    """When, at which commit, on what machine, with how many threads, under which load."""
    return (f"{env['timestamp_utc']} · commit {(env.get('git_commit') or '?')[:12]}"
            f"{' (with uncommitted changes)' if env.get('git_dirty') else ''} · {env['cpu_model']} · "
            f"{env['threads']} thread(s) · load {env.get('load_before')} → {env.get('load_after')}")


def fmt(value, digits: int = 2, suffix: str = "", missing: str = "—") -> str:
    """A number cell: `digits` decimals and `suffix`, or `missing` for None."""
    return missing if value is None else f"{value:.{digits}f}{suffix}"


def font(size: int = 13):
    """Pillow's bundled font at `size` (drawn with Pillow: matplotlib is not a dependency)."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        return ImageFont.load_default()
