"""Finding a target's trained drafter files (Kangaroo adapters, EAGLE heads, PosS specialists) by the target they were
trained on.

A file records the sha256 of its target's weights (`model_sha256`), and a drafter is served only beside those very
weights. Every request builds its drafter, and hashing the target (27 MB for the code target) or reading a file each
time would cost tens of milliseconds, so both are kept per file state (path, size, mtime).
"""

from __future__ import annotations

import os
from pathlib import Path

_SHA: dict[tuple, str] = {}


def file_stamp(path: Path) -> tuple:
    """(resolved path, size, mtime): changes when the file is replaced or rewritten."""
    stat = Path(path).stat()
    return (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def target_sha256(model_path: str) -> str:
    """The sha256 of the target folder's weights, computed once per state of its files."""
    from specgen.modalities.text.training.distill.windows import model_sha256

    # the folder's entries by name, size and mtime (scandir's stat, no path resolution: this runs per request)
    key = (str(model_path), tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns)
                                         for e in os.scandir(model_path) if e.is_file())))
    if key not in _SHA:
        _SHA[key] = model_sha256(model_path)
    return _SHA[key]


def trained_for(model_path: str, folders: list[Path], record_file: str, *, method: str, what: str) -> Path:
    """The first of `folders` whose `record_file` names the sha256 of the weights at `model_path`; where none does,
    ModelNotFound saying that method `method` needs `what` (e.g. "an EAGLE head") and how to train one."""
    import json

    from specgen.errors import ModelNotFound

    sha = target_sha256(model_path) if Path(model_path).is_dir() else None
    for folder in folders:
        record = folder / record_file
        if sha and record.exists() and json.loads(record.read_text()).get("target_sha256") == sha:
            return folder
    raise ModelNotFound(f"method {method!r} needs {what} trained for the target {model_path} (none in "
                        f"{' or '.join(str(f) for f in folders)}); train one with "
                        f"`specgen train head --method {method} --model PATH`")
