"""Finding a target's trained drafter files (Kangaroo adapters, EAGLE heads, PosS specialists, early-exit modules) by
the target they were trained on, and the self-describing safetensors files some of them are (fp16 weights, the config
and a training record in the metadata).

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


def save_described(path: Path, module, config, record: dict | None = None) -> Path:
    """`module`'s weights in fp16 with its config (a dataclass) and `record` (e.g. held-out numbers) in the
    safetensors metadata; written beside `path`, made readable by every user, then renamed over it."""
    import json
    from dataclasses import asdict

    from safetensors.torch import save_file

    tensors = {name: p.detach().half().contiguous() for name, p in module.state_dict().items()}
    metadata = {"config": json.dumps(asdict(config)), "record": json.dumps(record or {})}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.chmod(0o644)
    tmp.replace(path)
    return path


def load_described(path: Path, build):
    """`build(config dict)`'s module with the file's weights in float32 (a file `save_described` wrote)."""
    import json

    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        module = build(json.loads(f.metadata()["config"]))
        module.load_state_dict({name: f.get_tensor(name).float() for name in f.keys()})
    return module.eval()


_RECORDS: dict[tuple, dict] = {}  # per file state (file_stamp)


def read_record(path: Path) -> dict:
    """(config, record) metadata of a `save_described` file, without its weights; read once per state of the file
    (every request looks its target's files up; callers never modify it)."""
    import json

    from safetensors import safe_open

    key = file_stamp(path)
    if key not in _RECORDS:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
        _RECORDS[key] = {"config": json.loads(meta["config"]), "record": json.loads(meta.get("record", "{}"))}
    return _RECORDS[key]


def described_for(model_path: str, folders: list[Path], name: str) -> Path | None:
    """The first `folder/name` (a `save_described` file) trained on the weights at `model_path`, or None."""
    if not Path(model_path).is_dir():
        return None
    sha = target_sha256(model_path)
    for folder in folders:
        path = Path(folder) / name
        if path.exists() and read_record(path)["config"].get("target_sha256") == sha:
            return path
    return None


_LOADED: dict[tuple, object] = {}  # per loader and file state (file_stamp)


def load_once(path: Path, load):
    """`load(path)` (a module's file loader), kept while the file is unchanged: every request builds its drafter or
    target, and reading the weights each time would cost milliseconds (callers never modify what it returns)."""
    key = (load.__qualname__, *file_stamp(path))
    if key not in _LOADED:
        _LOADED[key] = load(path)
    return _LOADED[key]
